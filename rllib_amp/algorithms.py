"""The algorithms rllib-amp supports: one record each, read by every other module.

A record names the algorithm, its RLlib config class, RLlib's torch learner, the rllib-amp
learner that replaces it, RLlib's default torch RLModule, that module taking uint8 image
observations (the native Atari path) and that one with BatchNorm. To support another
algorithm, add its AMP learner class and one record here.

Example:
    >>> ALGORITHMS["PPO"].amp_learner.__name__
    'AmpPPOTorchLearner'
    >>> algorithm_for_config(DQNConfig()).name
    'DQN'
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from ray.rllib.algorithms import appo, ppo
from ray.rllib.algorithms.algorithm import Algorithm as RLlibAlgorithm
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.algorithms.appo import APPO, APPOConfig
from ray.rllib.algorithms.appo.torch.appo_torch_learner import APPOTorchLearner
from ray.rllib.algorithms.appo.torch.default_appo_torch_rl_module import DefaultAPPOTorchRLModule
from ray.rllib.algorithms.dqn import DQN, DQNConfig, dqn_learner
from ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module import DefaultDQNTorchRLModule
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.algorithms.ppo import PPO, PPOConfig
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core.learner import learner as rllib_learner
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils import metrics as M

from rllib_amp.checkpoints.algorithm import AmpAlgorithmMixin
from rllib_amp.checks import suggest
from rllib_amp.envs.models import with_batchnorm, with_uint8_images
from rllib_amp.learner.mixin import AmpLearnerMixin


# The AMP learners and BatchNorm modules have module-level names so that Ray and RLlib's
# checkpoints pickle them by reference.
class AmpPPOTorchLearner(AmpLearnerMixin, PPOTorchLearner):
    """PPO's torch learner with autocast and a checkpointed GradScaler per policy."""


class AmpDQNTorchLearner(AmpLearnerMixin, DQNTorchLearner):
    """DQN's torch learner (target network, double Q) with autocast and per-policy scalers."""


class AmpAPPOTorchLearner(AmpLearnerMixin, APPOTorchLearner):
    """APPO's torch learner with autocast and a checkpointed GradScaler per policy."""


class AmpPPO(AmpAlgorithmMixin, PPO):
    """RLlib's PPO with verified restores and checksummed checkpoints."""


class AmpDQN(AmpAlgorithmMixin, DQN):
    """RLlib's DQN with verified restores and checksummed checkpoints."""


class AmpAPPO(AmpAlgorithmMixin, APPO):
    """RLlib's APPO with verified restores and checksummed checkpoints."""


Uint8DefaultPPOTorchRLModule = with_uint8_images(DefaultPPOTorchRLModule)
Uint8DefaultDQNTorchRLModule = with_uint8_images(DefaultDQNTorchRLModule)
Uint8DefaultAPPOTorchRLModule = with_uint8_images(DefaultAPPOTorchRLModule)
# BatchNorm modules take uint8 and float observations alike; their names predate uint8
# input and are kept, so existing checkpoints still find them.
BatchNormDefaultPPOTorchRLModule = with_batchnorm(
    Uint8DefaultPPOTorchRLModule, name="BatchNormDefaultPPOTorchRLModule"
)
BatchNormDefaultDQNTorchRLModule = with_batchnorm(
    Uint8DefaultDQNTorchRLModule, name="BatchNormDefaultDQNTorchRLModule"
)
BatchNormDefaultAPPOTorchRLModule = with_batchnorm(
    Uint8DefaultAPPOTorchRLModule, name="BatchNormDefaultAPPOTorchRLModule"
)
for _cls in (
    Uint8DefaultPPOTorchRLModule,
    Uint8DefaultDQNTorchRLModule,
    Uint8DefaultAPPOTorchRLModule,
    BatchNormDefaultPPOTorchRLModule,
    BatchNormDefaultDQNTorchRLModule,
    BatchNormDefaultAPPOTorchRLModule,
):
    _cls.__module__ = __name__


@dataclass(frozen=True)
class ResultKeys:
    """What one algorithm reports beyond the keys every algorithm reports."""

    top: tuple[str, ...] = ()
    scopes: tuple[str, ...] = ()
    # Per-module learner keys worth suggesting (the losses people stop or rank on).
    learner: tuple[str, ...] = ()


@dataclass(frozen=True)
class Algorithm:
    """One supported algorithm and the classes rllib-amp uses for it.

    ``minibatches``: the learner splits each train batch into minibatches
    (``minibatch_size``, ``num_epochs``); ``results``: the result keys it adds.
    """

    name: str
    config_class: type[AlgorithmConfig]
    learner: type[TorchLearner]
    amp_learner: type[TorchLearner]
    module: type
    uint8_module: type
    batchnorm_module: type
    algorithm_class: type[RLlibAlgorithm]
    amp_algorithm: type[RLlibAlgorithm]
    minibatches: bool
    results: ResultKeys


_POLICY_GRADIENT_LOSSES = (
    rllib_learner.POLICY_LOSS_KEY,
    rllib_learner.VF_LOSS_KEY,
    rllib_learner.ENTROPY_KEY,
)


# In the order messages list them.
ALGORITHMS: dict[str, Algorithm] = {
    a.name: a
    for a in (
        Algorithm(
            "PPO",
            PPOConfig,
            PPOTorchLearner,
            AmpPPOTorchLearner,
            DefaultPPOTorchRLModule,
            Uint8DefaultPPOTorchRLModule,
            BatchNormDefaultPPOTorchRLModule,
            PPO,
            AmpPPO,
            minibatches=True,
            results=ResultKeys(
                learner=(
                    *_POLICY_GRADIENT_LOSSES,
                    ppo.ppo.LEARNER_RESULTS_KL_KEY,
                    ppo.ppo.LEARNER_RESULTS_VF_EXPLAINED_VAR_KEY,
                ),
            ),
        ),
        Algorithm(
            "DQN",
            DQNConfig,
            DQNTorchLearner,
            AmpDQNTorchLearner,
            DefaultDQNTorchRLModule,
            Uint8DefaultDQNTorchRLModule,
            BatchNormDefaultDQNTorchRLModule,
            DQN,
            AmpDQN,
            minibatches=False,
            results=ResultKeys(
                scopes=("replay_buffer",),
                learner=(
                    dqn_learner.QF_LOSS_KEY,
                    dqn_learner.TD_ERROR_MEAN_KEY,
                    dqn_learner.QF_MEAN_KEY,
                ),
            ),
        ),
        Algorithm(
            "APPO",
            APPOConfig,
            APPOTorchLearner,
            AmpAPPOTorchLearner,
            DefaultAPPOTorchRLModule,
            Uint8DefaultAPPOTorchRLModule,
            BatchNormDefaultAPPOTorchRLModule,
            APPO,
            AmpAPPO,
            minibatches=True,
            results=ResultKeys(
                top=(
                    M.MEAN_NUM_LEARNER_GROUP_UPDATE_CALLED,
                    M.NUM_SYNCH_WORKER_WEIGHTS,
                    M.NUM_TRAINING_STEP_CALLS_SINCE_LAST_SYNCH_WORKER_WEIGHTS,
                ),
                scopes=("learner_group",),
                learner=(*_POLICY_GRADIENT_LOSSES, appo.appo.LEARNER_RESULTS_KL_KEY),
            ),
        ),
    )
}


def algorithm(name: str) -> Algorithm:
    """The record for ``name`` (case-insensitive); ValueError names the supported ones.

    Example:
        >>> algorithm("appo").config_class.__name__
        'APPOConfig'
    """
    record = ALGORITHMS.get(str(name).upper())
    if record is None:
        raise ValueError(
            f"algorithm: {name!r} is not supported{suggest(str(name), ALGORITHMS)}; "
            f"allowed: {', '.join(ALGORITHMS)}"
        )
    return record


def algorithm_for_config(config: AlgorithmConfig) -> Algorithm | None:
    """The record whose config class ``config`` is an instance of, most specific first."""
    matches = [a for a in ALGORITHMS.values() if isinstance(config, a.config_class)]
    # APPOConfig is no PPOConfig subclass in RLlib today; prefer the deepest class anyway.
    matches.sort(key=lambda a: len(a.config_class.__mro__), reverse=True)
    return matches[0] if matches else None


# One class per (mixin, base), so that Ray and checkpoints see the same class each time.
_SUBCLASSES: dict[tuple[type, type], type] = {}


def amp_subclass(
    mixin: type, base: Any, *, root: type, known: Mapping[type, type], doc: str, caller: str
) -> type:
    """``base`` (a subclass of RLlib's ``root``) with ``mixin`` in front: ``base`` itself if
    it has the mixin, the registry's class for RLlib's own ``base``, else ``Amp<base>``, made
    once per base. TypeError, naming ``caller``, for anything but a subclass of ``root``.

    Example:
        >>> amp_subclass(AmpLearnerMixin, PPOTorchLearner, root=TorchLearner, known={},
        ...              doc="", caller="f").__name__
        'AmpPPOTorchLearner'
    """
    if not isinstance(base, type) or not issubclass(base, root):
        raise TypeError(
            f"{caller}: expected a subclass of RLlib's {root.__name__}, got {base!r}; pass "
            f"e.g. {next(iter(known), root).__name__} or your own {root.__name__} subclass"
        )
    if issubclass(base, mixin):
        return base
    if base in known:
        return known[base]
    if (mixin, base) not in _SUBCLASSES:
        name, text = f"Amp{base.__name__}", f"{base.__name__} {doc}"
        _SUBCLASSES[mixin, base] = type(name, (mixin, base), {"__doc__": text})
    return _SUBCLASSES[mixin, base]


def amp_learner_class(base_learner_cls: type) -> type:
    """The mixed-precision version of a TorchLearner subclass (yours or RLlib's).

    Example:
        >>> amp_learner_class(PPOTorchLearner).__name__
        'AmpPPOTorchLearner'
    """
    return amp_subclass(
        AmpLearnerMixin,
        base_learner_cls,
        root=TorchLearner,
        known={a.learner: a.amp_learner for a in ALGORITHMS.values()},
        doc="with rllib-amp mixed precision.",
        caller="amp_learner_class",
    )


def amp_algorithm_class(base: type) -> type:
    """The version of an Algorithm class (RLlib's or yours) with all-or-nothing restores
    (``rllib_amp.checkpoints.algorithm``).

    Example:
        >>> from ray.rllib.algorithms.dqn import DQN
        >>> issubclass(amp_algorithm_class(DQN), DQN)
        True
    """
    return amp_subclass(
        AmpAlgorithmMixin,
        base,
        root=RLlibAlgorithm,
        known={a.algorithm_class: a.amp_algorithm for a in ALGORITHMS.values()},
        doc="with verified restores and checksummed checkpoints.",
        caller="amp_algorithm_class",
    )
