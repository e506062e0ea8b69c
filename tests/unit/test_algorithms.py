"""The registry's rows: every class and result key follows from the algorithm's name."""

from __future__ import annotations

import pickle

import pytest
from ray.rllib.algorithms.appo import APPO, APPOConfig
from ray.rllib.algorithms.appo.torch.appo_torch_learner import APPOTorchLearner
from ray.rllib.algorithms.dqn import DQN, DQNConfig, dqn_learner
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.algorithms.ppo import PPO, PPOConfig, ppo
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core.learner import learner as rllib_learner

from rllib_amp import algorithms
from rllib_amp.algorithms import ALGORITHMS
from rllib_amp.checkpoints.algorithm import AmpAlgorithmMixin
from rllib_amp.learner.mixin import AmpLearnerMixin


@pytest.mark.parametrize(
    ("name", "config", "learner", "algorithm"),
    [
        ("PPO", PPOConfig, PPOTorchLearner, PPO),
        ("DQN", DQNConfig, DQNTorchLearner, DQN),
        ("APPO", APPOConfig, APPOTorchLearner, APPO),
    ],
)
def test_a_rows_classes_are_derived_from_its_name(name, config, learner, algorithm):
    row = ALGORITHMS[name]
    assert (row.config_class, row.learner, row.algorithm_class) == (config, learner, algorithm)
    assert row.module.__name__ == f"Default{name}TorchRLModule"
    made = (row.amp_learner, row.amp_algorithm, row.uint8_module, row.batchnorm_module)
    assert [c.__name__ for c in made] == [
        f"Amp{name}TorchLearner",
        f"Amp{name}",
        f"Uint8Default{name}TorchRLModule",
        f"BatchNormDefault{name}TorchRLModule",
    ]
    assert issubclass(row.amp_learner, (AmpLearnerMixin, learner))
    assert issubclass(row.amp_algorithm, (AmpAlgorithmMixin, algorithm))
    for cls in made:  # module-level names: pickled by reference
        assert getattr(algorithms, cls.__name__) is cls
        assert pickle.loads(pickle.dumps(cls)) is cls


def test_result_keys_are_rllibs_constants():
    def values(keys):
        return [algorithms.rllib_value(k) for k in keys]

    assert values(ALGORITHMS["PPO"].learner_keys) == [
        rllib_learner.POLICY_LOSS_KEY,
        rllib_learner.VF_LOSS_KEY,
        rllib_learner.ENTROPY_KEY,
        ppo.LEARNER_RESULTS_KL_KEY,
        ppo.LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY,
    ]
    assert values(ALGORITHMS["DQN"].learner_keys)[0] == dqn_learner.QF_LOSS_KEY
    assert ALGORITHMS["DQN"].scopes == ("replay_buffer",)
    assert len(values(ALGORITHMS["APPO"].top_keys)) == 3


def test_the_registry_lists_every_module_level_name():
    assert sorted(algorithms._RLLIB_NAMES) == sorted(
        f"{prefix}{name}{suffix}"
        for name in ALGORITHMS
        for prefix, suffix in (
            ("Amp", "TorchLearner"),
            ("Amp", ""),
            ("Uint8Default", "TorchRLModule"),
            ("BatchNormDefault", "TorchRLModule"),
        )
    )
    assert set(algorithms._RLLIB_NAMES) <= set(dir(algorithms))
    assert ALGORITHMS["PPO"].module is DefaultPPOTorchRLModule
