"""What a learner reports about its scalers after each update, and when it warns.

Per module, into RLlib's learner results (``result["learners"][module_id]``, keys in
``rllib_amp.learner.metrics``) and Ray's metrics; and one WARNING with advice when a module keeps
skipping optimizer steps.

Example:
    >>> from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
    >>> from rllib_amp.scaling.scaler import PolicyScaler
    >>> from rllib_amp.settings import AmpSettings
    >>> logger = MetricsLogger()
    >>> scalers = {"p0": PolicyScaler(AmpSettings(init_scale=8.0), "cpu", scaling=True)}
    >>> report_update(logger, scalers, merged_results=False, trial="t")
    >>> logger.peek(("p0", "amp_grad_scale"))
    8.0
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from rllib_amp.learner import metrics as M
from rllib_amp.log_events import event
from rllib_amp.scaling.scaler import PolicyScaler

logger = logging.getLogger(__name__)

# Monotonic counters: the max is the latest value, on any number of learners.
_COUNTER: dict[str, Any] = {"reduce": "max", "window": 1}


def report_update(
    metrics: Any, scalers: Mapping[str, PolicyScaler], *, merged_results: bool, trial: str
) -> None:
    """Logs each module's AMP metrics for the update that just ended; warns when due.

    ``metrics`` is the learner's MetricsLogger; ``trial`` tags the Ray metrics;
    ``merged_results``: the algorithm merges several learner results into one iteration
    (several learners, or an asynchronous learner).
    """
    # RLlib's "item" reduce keeps the latest value (the scale after the iteration's last
    # update) but cannot merge several results; where results are merged the scale is
    # averaged over the iteration's updates instead (DDP learners' scalers are identical).
    reduce_by_key = {
        M.GRAD_SCALE: {"window": 1} if merged_results else {"reduce": "item"},
        M.SKIP_FRACTION: {"window": 1},
    }
    for module_id, scaler in scalers.items():
        steps, skipped = scaler.pop_window()
        values: dict[str, float] = {
            M.GRAD_SCALE: scaler.get_scale(),
            M.SKIPPED_STEPS_LIFETIME: scaler.skipped_steps_lifetime,
            M.OPTIMIZER_STEPS_LIFETIME: scaler.optimizer_steps_lifetime,
            M.NONFINITE_LOSS_STEPS_LIFETIME: scaler.nonfinite_loss_steps_lifetime,
        }
        if steps:
            # Averaged over an iteration's updates (each the same number of steps).
            values[M.SKIP_FRACTION] = skipped / steps
        for key, value in values.items():
            metrics.log_value((module_id, key), value, **reduce_by_key.get(key, _COUNTER))
        if scaler.check_persistent_skips(steps, skipped):
            _warn_persistent_skips(module_id, scaler, skipped / steps)
        M.publish(values, trial=trial, module=module_id)


def _warn_persistent_skips(module_id: str, scaler: PolicyScaler, fraction: float) -> None:
    s = scaler.settings
    if scaler.nonfinite_loss_steps_lifetime:
        cause = "nonfinite_loss"
        advice = (
            "the loss itself has been nan/inf: check observations and rewards for nan, "
            "and lower the learning rate"
        )
    elif scaler.scaling:
        cause = "overflow"
        advice = (
            f"lower init_scale (now {s.init_scale:g}) or growth_factor (now "
            f"{s.growth_factor:g}), or raise growth_interval (now {s.growth_interval}); if "
            f"the scale keeps falling, lower the learning rate or use dtype bfloat16"
        )
    else:
        cause = "nonfinite_gradients"
        advice = "bfloat16 needs no scaling: lower the learning rate or set grad_clip"
    logger.warning(
        "rllib_amp: module %r skipped %.0f%% of its optimizer steps (inf/nan gradients) in "
        "%d consecutive updates; grad scale now %g. Advice: %s.",
        module_id,
        100 * fraction,
        scaler.troubled_updates,
        scaler.get_scale(),
        advice,
        extra=event(
            "persistent_skips",
            module_id=module_id,
            skip_fraction=fraction,
            updates=scaler.troubled_updates,
            grad_scale=scaler.get_scale(),
            cause=cause,
        ),
    )
