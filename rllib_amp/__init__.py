"""rllib-amp: mixed-precision training for Ray RLlib's PPO, DQN and APPO learners.

The names below load on first use: ``python -m rllib_amp.tune`` imports this package first,
and an eager import of the learners would pull in torch and RLlib before ``--help`` can print.

Example:
    >>> from ray.rllib.algorithms.ppo import PPOConfig
    >>> from rllib_amp import with_amp
    >>> config = with_amp(PPOConfig().environment("CartPole-v1"))  # precision "auto"
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rllib_amp.lazy import lazy_exports

if TYPE_CHECKING:
    from rllib_amp.algorithms import (
        AmpAPPOTorchLearner,
        AmpDQNTorchLearner,
        AmpPPOTorchLearner,
        amp_learner_class,
    )
    from rllib_amp.api import with_amp
    from rllib_amp.learner.mixin import AmpLearnerMixin
    from rllib_amp.settings import AmpSettings

__version__ = "0.1.0"

# Exported name -> the module that defines it.
_EXPORTS = {
    "AmpAPPOTorchLearner": "rllib_amp.algorithms",
    "AmpDQNTorchLearner": "rllib_amp.algorithms",
    "AmpLearnerMixin": "rllib_amp.learner.mixin",
    "AmpPPOTorchLearner": "rllib_amp.algorithms",
    "AmpSettings": "rllib_amp.settings",
    "amp_learner_class": "rllib_amp.algorithms",
    "with_amp": "rllib_amp.api",
}

__all__ = [
    "AmpAPPOTorchLearner",
    "AmpDQNTorchLearner",
    "AmpLearnerMixin",
    "AmpPPOTorchLearner",
    "AmpSettings",
    "amp_learner_class",
    "with_amp",
]


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
