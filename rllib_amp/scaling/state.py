"""Scaler state inside ``Learner.get_state()`` (checkpoint files are checked in checkpoint_files).

RLlib leaves the loss scale out of its learner state, so a restored run would restart at
``init_scale``. The learner adds ``{AMP_STATE_KEY: {module_id: PolicyScaler.state_dict()}}``
to its state; every checkpoint, weight sync and Tune restore carries it from there.

Example:
    >>> from rllib_amp.scaling.scaler import PolicyScaler, saved_scale, seed_scalers
    >>> from rllib_amp.settings import AmpSettings
    >>> scalers = {"p0": PolicyScaler(AmpSettings(init_scale=8.0), "cpu", scaling=True)}
    >>> scaler_state(scalers)["p0"]["torch"]["scale"]
    8.0
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from rllib_amp.log_events import event
from rllib_amp.scaling.scaler import PolicyScaler, ScalerState, saved_scale, seed_scalers

logger = logging.getLogger(__name__)

__all__ = ["AMP_STATE_KEY", "restore_scaler_state", "scaler_state"]

# The key of the scalers' state inside Learner.get_state().
AMP_STATE_KEY = "amp_scalers"


def scaler_state(scalers: Mapping[str, PolicyScaler]) -> dict[str, ScalerState]:
    """ModuleID -> that scaler's state dict: the value stored under AMP_STATE_KEY."""
    return {module_id: scaler.state_dict() for module_id, scaler in scalers.items()}


def restore_scaler_state(
    scalers: Mapping[str, PolicyScaler],
    state: Mapping[str, Any],
    *,
    amp_enabled: bool,
    full: bool,
) -> None:
    """Loads the scalers from a learner state, saying what it could not restore.

    The live scale, growth tracker and counters come from ``state``, the factors and interval
    are this run's (the PBT rules, docs/update-step.md); modules sharing one scale continue at
    the smallest saved one. A ``full`` state without scaler state gets one INFO line (weight
    syncs none), scaler state restored into a float32 run one WARNING.

    Args:
        scalers: ModuleID -> the learner's scaler, loaded in place.
        state: A learner state (``Learner.get_state()``'s form); its AMP_STATE_KEY entry is
            ModuleID -> scaler state.
        amp_enabled: Whether this run trains with AMP (a float32 run ignores scaler state).
        full: Whether ``state`` is a checkpoint's (with optimizer state), not a weight sync.
    """
    saved = state.get(AMP_STATE_KEY)
    if saved is None:
        if amp_enabled and full:
            logger.info(
                "rllib_amp: the restored state has no AMP scaler state (stock RLlib or AMP off "
                "when saved); modules %s start with fresh scalers",
                sorted(scalers),
                extra=event("fresh_scalers", modules=sorted(scalers), reason="none_saved"),
            )
        return
    if not amp_enabled:
        logger.warning(
            "rllib_amp: the restored state carries AMP scaler state for modules %s, but this "
            "run trains in float32; the scaler state is ignored",
            sorted(saved),
            extra=event("scaler_state_ignored", modules=sorted(saved)),
        )
        return
    fresh = [module_id for module_id in scalers if module_id not in saved]
    for module_id in (m for m in scalers if m in saved):
        scalers[module_id].load_counters(saved[module_id])
    seeds = {m: seed for m in scalers if m in saved and (seed := saved_scale(saved[m]))}
    seed_scalers(scalers, seeds)
    if fresh:
        logger.info(
            "rllib_amp: no saved scaler state for modules %s; they start fresh",
            fresh,
            extra=event("fresh_scalers", modules=fresh, reason="module_not_saved"),
        )
