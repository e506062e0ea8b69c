"""Metric keys rllib-amp reports, per module in the learner results
(``result["learners"][module_id][KEY]``); their Ray gauges; the trial a learner serves.

Example:
    >>> GRAD_SCALE
    'amp_grad_scale'
"""

from __future__ import annotations

import os
import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.rllib.core.learner.learner import Learner
    from ray.util.metrics import Gauge

# The loss scale after the learner's last update (1.0 when no scaling: bfloat16).
GRAD_SCALE = "amp_grad_scale"
# Optimizer steps skipped because a gradient was inf/nan, since the run started.
SKIPPED_STEPS_LIFETIME = "amp_skipped_steps_lifetime"
# Optimizer steps taken or skipped, since the run started.
OPTIMIZER_STEPS_LIFETIME = "amp_optimizer_steps_lifetime"
# Skipped / optimizer steps of the last iteration (mean over its learner updates, which all
# take the same number of optimizer steps).
SKIP_FRACTION = "amp_skip_fraction"

# Optimizer steps whose loss itself was inf/nan (bad data, not an fp16 overflow).
NONFINITE_LOSS_STEPS_LIFETIME = "amp_nonfinite_loss_steps_lifetime"
# 1 in an iteration whose learner logged the "keeps skipping optimizer steps" WARNING, else
# 0: that log line stays in the worker's log, and the sweep's summary repeats it from this.
SKIP_WARNING = "amp_skip_warning"

ALL_KEYS: tuple[str, ...] = (
    GRAD_SCALE,
    SKIPPED_STEPS_LIFETIME,
    OPTIMIZER_STEPS_LIFETIME,
    SKIP_FRACTION,
    NONFINITE_LOSS_STEPS_LIFETIME,
    SKIP_WARNING,
)


# Ray metrics, set by every learner after each update, tagged by trial and module; Ray exports
# them on each node's metrics endpoint as ray_<name> (e.g. ray_rllib_amp_grad_scale).
RAY_METRICS: dict[str, tuple[str, str]] = {
    GRAD_SCALE: ("rllib_amp_grad_scale", "Loss scale of the policy's GradScaler (1 = none)"),
    SKIPPED_STEPS_LIFETIME: (
        "rllib_amp_skipped_steps",
        "Optimizer steps skipped on inf/nan gradients, since the run started",
    ),
    SKIP_FRACTION: (
        "rllib_amp_skip_fraction",
        "Skipped / optimizer steps in the learner's last update",
    ),
}
TAG_KEYS = ("trial", "module")
_gauges: dict[str, Gauge] = {}


def publish(values: dict[str, float], *, trial: str, module: str) -> None:
    """Sets the Ray gauges for one module; does nothing outside a Ray worker or driver."""
    import ray

    if not ray.is_initialized():
        return
    from ray.util.metrics import Gauge

    for key in RAY_METRICS.keys() & values.keys():
        if key not in _gauges:
            _gauges[key] = Gauge(*RAY_METRICS[key], tag_keys=TAG_KEYS)
        _gauges[key].set(float(values[key]), tags={"trial": trial, "module": str(module)})


# Tune names a trial's folder "<trial name>_<experiment tag>_<date>", the trial name being
# "<trainable>_<trial id>" with ids like "f1412_00000" (variant generator) or 8 hex digits.
_TRIAL_IN_DIRNAME = re.compile(r"^(.+?_(?:[0-9a-f]{5}_\d{5}|[0-9a-f]{8}))(?:_|$)")


def trial_name(algorithm: object) -> str:
    """The Tune trial an Algorithm serves, or "default" outside Tune. RLlib drops Tune's trial
    info from the AlgorithmConfig (``Algorithm.trial_name`` is "default" in every trial); the
    trial's folder (``Trainable.logdir``: ``working_dirs/<trial folder>``) still names it.

    Example:
        >>> from types import SimpleNamespace
        >>> trial_name(SimpleNamespace(trial_name="default", logdir="/tmp/ray/exp/working_dirs/"
        ...     "PPO_CartPole-v1_f1412_00000_0_lr=0.001_2026-11-30_15-01-38"))
        'PPO_CartPole-v1_f1412_00000'
    """
    name = getattr(algorithm, "trial_name", None)
    if name and name != "default":
        return str(name)
    folder, dirname = os.path.split(str(getattr(algorithm, "logdir", None) or ""))
    if dirname and os.path.basename(folder) == "working_dirs":  # under Tune
        match = _TRIAL_IN_DIRNAME.match(dirname)
        return match.group(1) if match else dirname
    return "default"


def tag_learners_with_trial(*, algorithm: Algorithm, **kwargs: object) -> None:
    """RLlib ``on_algorithm_init`` callback: tells the learners which trial they serve."""
    trial = trial_name(algorithm)

    def tag(learner: Learner, _: object = None) -> None:
        if hasattr(learner, "set_amp_trial"):
            learner.set_amp_trial(trial)

    assert algorithm.learner_group is not None  # the new API stack: always built
    algorithm.learner_group.foreach_learner(tag)
