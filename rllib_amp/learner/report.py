"""What a learner reports about its scalers after each update, and when it warns.

Per module, into RLlib's learner results (``result["learners"][module_id]``, keys in
``rllib_amp.learner.metrics``) and Ray's metrics; and a WARNING with advice when a module keeps
skipping optimizer steps. A sweep's user does not see the learner's log
(``log_to_driver=False``): the results carry ``amp_skip_warning`` = 1 for the iteration, and
the sweep's summary repeats it per trial (``skip_advice``).

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
from collections.abc import Mapping, Sequence
from typing import Any

from ray.rllib.utils.metrics.metrics_logger import DEFAULT_STATS_CLS_LOOKUP, MetricsLogger
from ray.rllib.utils.metrics.stats import ItemStats
from ray.rllib.utils.metrics.stats.base import StatsBase

from rllib_amp.learner import metrics as amp_metrics
from rllib_amp.log_events import event
from rllib_amp.scaling.scaler import PolicyScaler
from rllib_amp.settings import AmpSettings

logger = logging.getLogger(__name__)

# The reduce method that keeps the latest value across any merge (``LastItemStats``).
LAST = "amp_last"


class LastItemStats(ItemStats):
    """RLlib's "item" stat (the latest value) that also merges several results at once.

    ``ItemStats`` refuses to merge several results at once (several learners, or an async
    learner group's ready results), and RLlib's "mean" averages over the iteration. This keeps
    the last result's value (scalers are identical under DDP; ready results come oldest first).

    Example:
        >>> a, b, root = (LastItemStats(), LastItemStats(), LastItemStats(is_leaf=False))
        >>> a.push(4.0); b.push(2.0)
        >>> root.merge([a, b]); root.peek()
        2.0
    """

    stats_cls_identifier = LAST

    @property
    def values(self) -> list[float]:
        # As a series stat's: a checkpoint of an older rllib-amp restores into a mean stat,
        # which reads this (and keeps averaging).
        item = self.get_state()["item"]
        return [] if item is None else [item]

    def merge(self, incoming_stats: Sequence[StatsBase]) -> None:
        items = [s.get_state()["item"] for s in incoming_stats]
        items = [item for item in items if item is not None]
        if items:
            self.push(items[-1])


# RLlib's documented way to add a reduce method: the default lookup, which every config
# refers to unless the user passes a lookup of their own (``report_update`` adds it there).
DEFAULT_STATS_CLS_LOOKUP.setdefault(LAST, LastItemStats)

# Monotonic counters: the max is the latest value, on any number of learners.
_COUNTER: dict[str, Any] = {"reduce": "max", "window": 1}


def report_update(
    metrics: MetricsLogger, scalers: Mapping[str, PolicyScaler], *, merged_results: bool, trial: str
) -> None:
    """Logs each module's AMP metrics for the update that just ended; warns when due.

    ``trial`` tags the Ray metrics; ``merged_results``: the algorithm merges several learner
    results into one iteration (several learners, or an asynchronous learner).
    """
    # The scale after the iteration's last update, in every algorithm: RLlib's "item" where
    # no results are merged, else ours, which also merges several (``LastItemStats``).
    lookup = getattr(metrics, "stats_cls_lookup", None)
    if merged_results and lookup is not None:
        lookup.setdefault(LAST, LastItemStats)
    reduce_by_key: dict[str, dict[str, Any]] = {
        amp_metrics.GRAD_SCALE: {"reduce": LAST if merged_results else "item"},
        amp_metrics.SKIP_FRACTION: {"window": 1},
        amp_metrics.SKIP_WARNING: {"reduce": "max"},  # over the iteration's updates (and learners)
    }
    for module_id, scaler in scalers.items():
        steps, skipped = scaler.pop_window()
        values = _lifetime_values(scaler)
        if steps:
            # Averaged over an iteration's updates (each the same number of steps).
            values[amp_metrics.SKIP_FRACTION] = skipped / steps
        warn = scaler.check_persistent_skips(steps, skipped)
        values[amp_metrics.SKIP_WARNING] = 1.0 if warn else 0.0
        for key, value in values.items():
            metrics.log_value((module_id, key), value, **reduce_by_key.get(key, _COUNTER))
        if warn:
            fraction = skipped / steps
            cause = skip_cause(
                nonfinite_loss_steps=scaler.nonfinite_loss_steps_lifetime, scaling=scaler.scaling
            )
            logger.warning(
                "rllib_amp: module %r skipped %.0f%% of its optimizer steps (inf/nan gradients) "
                "in %d consecutive updates; grad scale now %g. Advice: %s.",
                module_id,
                100 * fraction,
                scaler.troubled_updates,
                scaler.get_scale(),
                skip_advice(cause, scaler.settings),
                extra=event(
                    "persistent_skips",
                    module_id=module_id,
                    skip_fraction=fraction,
                    updates=scaler.troubled_updates,
                    grad_scale=scaler.get_scale(),
                    cause=cause,
                ),
            )
        amp_metrics.publish(values, trial=trial, module=module_id)


def _lifetime_values(scaler: PolicyScaler) -> dict[str, float]:
    return {
        amp_metrics.GRAD_SCALE: scaler.get_scale(),
        amp_metrics.SKIPPED_STEPS_LIFETIME: scaler.skipped_steps_lifetime,
        amp_metrics.OPTIMIZER_STEPS_LIFETIME: scaler.optimizer_steps_lifetime,
        amp_metrics.NONFINITE_LOSS_STEPS_LIFETIME: scaler.nonfinite_loss_steps_lifetime,
    }


def values_without_an_update(scalers: Mapping[str, PolicyScaler]) -> dict[str, dict[str, float]]:
    """Each module's AMP metrics for an iteration in which no update finished (an async
    learner waiting for its first batch): the scaler as it stands, no step skipped; the window
    of steps is left to the next update's report.

    Example:
        >>> scalers = {"p0": PolicyScaler(AmpSettings(init_scale=8.0), "cpu", scaling=True)}
        >>> values_without_an_update(scalers)["p0"]["amp_grad_scale"]
        8.0
    """
    return {
        module_id: {
            **_lifetime_values(scaler),
            amp_metrics.SKIP_FRACTION: 0.0,
            amp_metrics.SKIP_WARNING: 0.0,
        }
        for module_id, scaler in scalers.items()
    }


def skip_cause(*, nonfinite_loss_steps: float, scaling: bool) -> str:
    """Why a module keeps skipping steps: ``nonfinite_loss`` (bad data), ``overflow`` (float16
    gradients beyond the scale), ``nonfinite_gradients`` (no scaler: bfloat16 nan/inf).

    Example:
        >>> skip_cause(nonfinite_loss_steps=0, scaling=True)
        'overflow'
    """
    if nonfinite_loss_steps:
        return "nonfinite_loss"
    return "overflow" if scaling else "nonfinite_gradients"


def skip_advice(cause: str, settings: AmpSettings | None = None) -> str:
    """What to change for ``cause`` (``skip_cause``); with ``settings``, the values now.

    Example:
        >>> skip_advice("nonfinite_gradients")
        'bfloat16 needs no scaling: lower the learning rate or set grad_clip'
    """
    if cause == "nonfinite_loss":
        return (
            "the loss itself has been nan/inf: check observations and rewards for nan, "
            "and lower the learning rate"
        )
    if cause == "overflow":
        s = settings
        now = "init_scale or growth_factor, or raise growth_interval"
        if s is not None:
            now = (
                f"init_scale (now {s.init_scale:g}) or growth_factor (now {s.growth_factor:g}), "
                f"or raise growth_interval (now {s.growth_interval})"
            )
        falling = "if the scale keeps falling, lower the learning rate or use dtype bfloat16"
        return f"lower {now}; {falling}"
    return "bfloat16 needs no scaling: lower the learning rate or set grad_clip"
