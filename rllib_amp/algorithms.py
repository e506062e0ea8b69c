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

from dataclasses import dataclass

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.algorithms.appo import APPOConfig
from ray.rllib.algorithms.appo.torch.appo_torch_learner import APPOTorchLearner
from ray.rllib.algorithms.appo.torch.default_appo_torch_rl_module import DefaultAPPOTorchRLModule
from ray.rllib.algorithms.dqn import DQNConfig
from ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module import DefaultDQNTorchRLModule
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core.learner.torch.torch_learner import TorchLearner

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
class Algorithm:
    """One supported algorithm and the classes rllib-amp uses for it."""

    name: str
    config_class: type[AlgorithmConfig]
    learner: type[TorchLearner]
    amp_learner: type[TorchLearner]
    module: type
    uint8_module: type
    batchnorm_module: type


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
        ),
        Algorithm(
            "DQN",
            DQNConfig,
            DQNTorchLearner,
            AmpDQNTorchLearner,
            DefaultDQNTorchRLModule,
            Uint8DefaultDQNTorchRLModule,
            BatchNormDefaultDQNTorchRLModule,
        ),
        Algorithm(
            "APPO",
            APPOConfig,
            APPOTorchLearner,
            AmpAPPOTorchLearner,
            DefaultAPPOTorchRLModule,
            Uint8DefaultAPPOTorchRLModule,
            BatchNormDefaultAPPOTorchRLModule,
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


_MADE: dict[type, type] = {}


def amp_learner_class(base_learner_cls: type) -> type:
    """The mixed-precision version of a TorchLearner subclass (yours or RLlib's).

    Example:
        >>> amp_learner_class(PPOTorchLearner).__name__
        'AmpPPOTorchLearner'
    """
    if not isinstance(base_learner_cls, type) or not issubclass(base_learner_cls, TorchLearner):
        raise TypeError(
            f"amp_learner_class: expected a subclass of RLlib's TorchLearner, got "
            f"{base_learner_cls!r}; pass e.g. PPOTorchLearner or your own TorchLearner subclass"
        )
    if issubclass(base_learner_cls, AmpLearnerMixin):
        return base_learner_cls
    for record in ALGORITHMS.values():
        if record.learner is base_learner_cls:
            return record.amp_learner
    if base_learner_cls not in _MADE:
        _MADE[base_learner_cls] = type(
            f"Amp{base_learner_cls.__name__}",
            (AmpLearnerMixin, base_learner_cls),
            {"__doc__": f"{base_learner_cls.__name__} with rllib-amp mixed precision."},
        )
    return _MADE[base_learner_cls]
