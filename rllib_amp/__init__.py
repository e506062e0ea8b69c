"""rllib-amp: mixed-precision training for Ray RLlib's PPO, DQN and APPO learners.

Example:
    >>> from ray.rllib.algorithms.ppo import PPOConfig
    >>> from rllib_amp import with_amp
    >>> config = with_amp(PPOConfig().environment("CartPole-v1"))  # precision "auto"
"""

from rllib_amp.algorithms import (
    AmpAPPOTorchLearner,
    AmpDQNTorchLearner,
    AmpPPOTorchLearner,
    amp_learner_class,
)
from rllib_amp.api import with_amp
from rllib_amp.learner.mixin import AmpLearnerMixin
from rllib_amp.settings import AmpSettings

__all__ = [
    "AmpAPPOTorchLearner",
    "AmpDQNTorchLearner",
    "AmpLearnerMixin",
    "AmpPPOTorchLearner",
    "AmpSettings",
    "amp_learner_class",
    "with_amp",
]
__version__ = "0.1.0"
