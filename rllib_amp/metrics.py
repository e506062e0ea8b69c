"""Metric keys rllib-amp reports, in one place.

Per module, in the learner results (``result["learners"][module_id][KEY]``), so Tune,
TensorBoard and the Ray dashboard see them.

Example:
    >>> GRAD_SCALE
    'amp_grad_scale'
"""

from __future__ import annotations

# The loss scale after the learner's last update (1.0 when no scaling: bfloat16).
GRAD_SCALE = "amp_grad_scale"
# Optimizer steps skipped because a gradient was inf/nan, since the run started.
SKIPPED_STEPS_LIFETIME = "amp_skipped_steps_lifetime"
# Optimizer steps taken or skipped, since the run started.
OPTIMIZER_STEPS_LIFETIME = "amp_optimizer_steps_lifetime"
# Skipped / optimizer steps of the last iteration (mean over its learner updates, which all
# take the same number of optimizer steps).
SKIP_FRACTION = "amp_skip_fraction"

ALL_KEYS: tuple[str, ...] = (
    GRAD_SCALE,
    SKIPPED_STEPS_LIFETIME,
    OPTIMIZER_STEPS_LIFETIME,
    SKIP_FRACTION,
)
