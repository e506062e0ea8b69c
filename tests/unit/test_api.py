"""with_amp and amp_learner_class: what they accept, what they refuse, what they set."""

from __future__ import annotations

import functools

import pytest
import torch
from ray.rllib.algorithms.appo import APPOConfig
from ray.rllib.algorithms.dqn import DQNConfig
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.algorithms.sac import SACConfig

from rllib_amp import (
    AmpAPPOTorchLearner,
    AmpDQNTorchLearner,
    AmpPPOTorchLearner,
    AmpSettings,
    amp_learner_class,
    with_amp,
)
from rllib_amp.learner.env_runner import AmpMultiAgentEnvRunner, AmpSingleAgentEnvRunner
from rllib_amp.settings import settings_from_config


@pytest.mark.parametrize(
    "config_cls, learner_cls",
    [
        (PPOConfig, AmpPPOTorchLearner),
        (DQNConfig, AmpDQNTorchLearner),
        (APPOConfig, AmpAPPOTorchLearner),
    ],
)
def test_supported_algorithms_get_their_amp_learner(config_cls, learner_cls):
    cfg = with_amp(config_cls(), AmpSettings(dtype="bfloat16"), init_scale=8.0)
    assert cfg.learner_class is learner_cls
    s = settings_from_config(cfg)
    assert (s.dtype, s.init_scale) == ("bfloat16", 8.0)
    assert cfg.env_runner_cls is AmpSingleAgentEnvRunner


def test_multi_agent_config_gets_the_multi_agent_env_runner():
    cfg = PPOConfig().multi_agent(policies={"a", "b"}, policy_mapping_fn=lambda aid, *a, **k: "a")
    assert with_amp(cfg).env_runner_cls is AmpMultiAgentEnvRunner


def test_other_algorithms_are_refused_with_the_supported_list():
    with pytest.raises(
        ValueError,
        match=r"SACConfig is not supported; supported algorithms: PPO \(PPOConfig\), DQN",
    ):
        with_amp(SACConfig())


def test_bad_arguments_are_refused_clearly():
    with pytest.raises(TypeError, match="expected an RLlib AlgorithmConfig"):
        with_amp({"algo": "PPO"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="amp.init_scale"):
        with_amp(PPOConfig(), init_scale=-1)
    with pytest.raises(TypeError, match="settings must be an AmpSettings"):
        with_amp(PPOConfig(), {"dtype": "float16"})  # type: ignore[arg-type]
    stock_scaler = PPOConfig().experimental(
        _torch_grad_scaler_class=functools.partial(torch.amp.GradScaler, "cpu")
    )
    with pytest.raises(ValueError, match="_torch_grad_scaler_class"):
        with_amp(stock_scaler)


def test_amp_learner_refuses_rllibs_own_scaler_at_build():
    """amp_learner_class bypasses with_amp's check; the learner itself refuses to scale twice."""
    import gymnasium as gym

    from rllib_amp.settings import store_in_config

    cfg = PPOConfig().experimental(
        _torch_grad_scaler_class=functools.partial(torch.amp.GradScaler, "cpu")
    )
    cfg.learners(learner_class=amp_learner_class(PPOTorchLearner))
    store_in_config(cfg, AmpSettings(dtype="float16"))
    spaces = {"default_policy": (gym.spaces.Box(-1, 1, (4,)), gym.spaces.Discrete(2))}
    with pytest.raises(ValueError, match="_torch_grad_scaler_class"):
        cfg.build_learner(spaces=spaces)


def test_a_learner_of_another_algorithm_is_refused():
    from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner

    with pytest.raises(
        ValueError,
        match=r"with_amp: PPOConfig\.learner_class is DQNTorchLearner, not a PPOTorchLearner "
        r"\(or subclass\)",
    ):
        with_amp(PPOConfig().learners(learner_class=DQNTorchLearner))

    class MyLearner(PPOTorchLearner):
        pass

    assert with_amp(PPOConfig().learners(learner_class=MyLearner)).learner_class.__name__ == (
        "AmpMyLearner"
    )


def test_amp_learner_class_wraps_user_learners_once():
    class MyLearner(PPOTorchLearner):
        pass

    cls = amp_learner_class(MyLearner)
    assert cls.__name__ == "AmpMyLearner" and issubclass(cls, MyLearner)
    assert amp_learner_class(MyLearner) is cls
    assert amp_learner_class(cls) is cls
    assert amp_learner_class(PPOTorchLearner) is AmpPPOTorchLearner
    with pytest.raises(TypeError, match="TorchLearner"):
        amp_learner_class(int)


def test_with_amp_twice_keeps_the_settings_already_in_the_config():
    cfg = with_amp(with_amp(PPOConfig(), init_scale=1024, dtype="float16"))
    s = settings_from_config(cfg)
    assert (s.init_scale, s.dtype) == (1024.0, "float16")

    cfg2 = with_amp(PPOConfig(), init_scale=1024)
    with_amp(cfg2, growth_interval=5)
    s = settings_from_config(cfg2)
    assert (s.init_scale, s.growth_interval) == (1024.0, 5)
    assert s.growth_factor == AmpSettings().growth_factor  # nothing else moved


def test_with_amp_settings_replace_the_stored_ones_entirely():
    cfg = with_amp(PPOConfig(), init_scale=1024, growth_interval=5)
    with_amp(cfg, AmpSettings(dtype="bfloat16"))
    assert settings_from_config(cfg) == AmpSettings(dtype="bfloat16")
    # Keywords still apply on top of the settings given.
    with_amp(cfg, AmpSettings(dtype="float16"), init_scale=8)
    assert settings_from_config(cfg) == AmpSettings(dtype="float16", init_scale=8)


def test_with_amp_twice_keeps_tune_samplers_unless_the_field_is_given():
    from ray import tune

    from rllib_amp.settings import AMP_CONFIG_KEY, store_in_config

    sampler = tune.loguniform(2.0**8, 2.0**16)
    grid = tune.grid_search([10, 100])
    cfg = with_amp(PPOConfig(), dtype="float16")
    store_in_config(
        cfg,
        AmpSettings(dtype="float16"),
        searched={"init_scale": sampler, "growth_interval": grid},
    )
    with_amp(cfg, growth_interval=5)
    block = cfg.learner_config_dict[AMP_CONFIG_KEY]
    assert block["init_scale"] is sampler  # kept
    assert block["growth_interval"] == 5  # replaced by the value given
    assert block["dtype"] == "float16"


@pytest.mark.parametrize(
    "config_cls, algo_cls_name",
    [(PPOConfig, "AmpPPO"), (DQNConfig, "AmpDQN"), (APPOConfig, "AmpAPPO")],
)
def test_with_amp_sets_an_algorithm_class_with_verified_restores(config_cls, algo_cls_name):
    from rllib_amp.checkpoints.algorithm import AmpAlgorithmMixin

    stock = config_cls().algo_class
    cfg = with_amp(config_cls())
    assert cfg.algo_class.__name__ == algo_cls_name
    assert issubclass(cfg.algo_class, stock) and issubclass(cfg.algo_class, AmpAlgorithmMixin)
    assert with_amp(cfg).algo_class is cfg.algo_class  # not wrapped twice


def test_amp_algorithm_class_wraps_user_algorithms_once():
    from ray.rllib.algorithms.ppo import PPO

    from rllib_amp.algorithms import AmpPPO, amp_algorithm_class

    class MyPPO(PPO):
        pass

    cls = amp_algorithm_class(MyPPO)
    assert cls.__name__ == "AmpMyPPO" and issubclass(cls, MyPPO)
    assert amp_algorithm_class(MyPPO) is cls and amp_algorithm_class(cls) is cls
    assert amp_algorithm_class(PPO) is AmpPPO
    assert with_amp(PPOConfig(algo_class=MyPPO)).algo_class is cls
    with pytest.raises(TypeError, match="Algorithm"):
        amp_algorithm_class(int)
