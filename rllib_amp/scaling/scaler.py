"""The per-policy loss scaler: a torch GradScaler plus the counters rllib-amp reports.

One ``PolicyScaler`` per ModuleID. In float16 it scales the loss, unscales the gradients
before clipping and skips the optimizer step on inf/nan gradients (backing the scale off).
In bfloat16 no scaling is needed, but a non-finite gradient still skips the step and the
same counters are kept, so every AMP run reports the same metrics.

Example:
    >>> import torch
    >>> from rllib_amp.settings import AmpSettings
    >>> s = PolicyScaler(AmpSettings(init_scale=8.0), "cpu", scaling=True)
    >>> s.get_scale()
    8.0
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TypedDict

import torch

from rllib_amp.settings import STATE_VERSION, AmpSettings, scaler_state_defects


# What ``PolicyScaler.state_dict`` returns; "torch" is the GradScaler's own state dict.
class ScalerState(TypedDict):
    version: int
    scaling: bool
    torch: dict[str, float]
    optimizer_steps_lifetime: int
    skipped_steps_lifetime: int
    nonfinite_loss_steps_lifetime: int


def _grads(optimizers: Iterable[torch.optim.Optimizer]) -> list[torch.Tensor]:
    return [
        p.grad
        for opt in optimizers
        for group in opt.param_groups
        for p in group["params"]
        if p.grad is not None
    ]


def grads_are_finite(optimizers: Iterable[torch.optim.Optimizer]) -> bool:
    """True when no gradient of these optimizers holds an inf or nan (one host sync).

    GradScaler's own fused kernel, with a factor of 1.0, per device and dtype: for a tiny
    network several times faster than a reduction per tensor (docs/performance.md, "Figures
    behind the code's thresholds"). Sparse gradients take one ``isfinite`` each.
    """
    grads = _grads(optimizers)
    if not grads:
        return True
    groups: dict[tuple[torch.device, torch.dtype], list[torch.Tensor]] = {}
    for g in grads:
        if not g.is_sparse:
            groups.setdefault((g.device, g.dtype), []).append(g)
    found = [
        (~torch.isfinite(g.coalesce().values()).all()).float().view(1) for g in grads if g.is_sparse
    ]
    for (device, _), tensors in groups.items():
        found.append(flag := torch.zeros(1, device=device))
        torch._amp_foreach_non_finite_check_and_unscale_(
            tensors, flag, torch.ones(1, device=device)
        )
    first = found[0].device
    total = found[0] if len(found) == 1 else sum(f.to(first) for f in found)
    return not bool(total)


def _recorded_found_inf(
    grad_scaler: torch.amp.GradScaler, optimizers: Iterable[torch.optim.Optimizer]
) -> bool | None:
    """Whether GradScaler's ``unscale_`` of ``optimizers`` met an inf/nan; None unknown."""
    states = getattr(grad_scaler, "_per_optimizer_states", None)
    flags: list[torch.Tensor] = []
    for opt in optimizers:
        record = states.get(id(opt)) if isinstance(states, Mapping) else None
        per_device = record.get("found_inf_per_device") if isinstance(record, Mapping) else None
        if not isinstance(per_device, Mapping) or not per_device:
            return None
        flags += list(per_device.values())
    if not flags:
        return False
    first = flags[0].device
    return bool(sum(f.to(first) for f in flags))


class _Scale:
    """One GradScaler (live scale, growth tracker), shared under ``shared_scaler``: it
    updates once per step, when the last member that unscaled has stepped or discarded."""

    def __init__(self, grad_scaler: torch.amp.GradScaler) -> None:
        self.grad_scaler = grad_scaler
        self.pending: set[int] = set()  # id() of the members that unscaled since update()

    def done(self, member: int) -> None:
        self.pending.discard(member)
        if not self.pending:
            self.grad_scaler.update()


class PolicyScaler:
    """Loss scaling and step skipping for one policy (RLModule).

    Per optimizer step: ``scale(loss)`` -> backward -> ``unscale_(optimizers)`` (all of the
    module's) -> clipping -> ``step(optimizers)``: every optimizer or none, then one update.

    ``share_scale_with``: use that scaler's live scale (``AmpSettings.shared_scaler``); each
    module still steps or skips on its own gradients and keeps its own counters.
    """

    def __init__(
        self,
        settings: AmpSettings,
        device: torch.device | str,
        *,
        scaling: bool,
        share_scale_with: PolicyScaler | None = None,
    ):
        self.settings = settings
        self.scaling = scaling
        self._device_type = torch.device(device).type
        if share_scale_with is not None and share_scale_with.scaling != scaling:
            raise ValueError(
                "PolicyScaler: share_scale_with must have the same scaling "
                f"({share_scale_with.scaling}), got scaling={scaling}"
            )
        self._scale: _Scale
        if share_scale_with is not None:
            self._scale = share_scale_with._scale
        else:
            self._scale = _Scale(
                torch.amp.GradScaler(
                    self._device_type,
                    init_scale=settings.init_scale,
                    growth_factor=settings.growth_factor,
                    backoff_factor=settings.backoff_factor,
                    growth_interval=settings.growth_interval,
                    enabled=scaling,
                )
            )
        self.optimizer_steps_lifetime = 0
        self.skipped_steps_lifetime = 0
        self.nonfinite_loss_steps_lifetime = 0  # skipped on a loss inf/nan before scaling
        # Consecutive updates above settings.skip_warning_fraction, and whether we warned.
        self.troubled_updates = 0
        self.warned = False
        self._window_steps = self._window_skipped = 0  # since the last pop_window()
        # What unscale_ found for the pending step; None: no unscale_ since the last step.
        self._found_inf: bool | None = None
        # ids of the optimizers torch's GradScaler unscaled since its last update().
        self._torch_unscaled: set[int] = set()

    @property
    def _scaler(self) -> torch.amp.GradScaler:
        return self._scale.grad_scaler

    def shares_scale_with(self, other: PolicyScaler) -> bool:
        """True when both use one live scale (``AmpSettings.shared_scaler``, or the same)."""
        return self._scale is other._scale

    # -- the update step -------------------------------------------------------------------
    def scale(self, loss: torch.Tensor) -> torch.Tensor:
        return self._scaler.scale(loss) if self.scaling else loss

    def unscale_(self, optimizers: list[torch.optim.Optimizer]) -> None:
        """Unscales the gradients in place and records whether any is inf/nan.

        Call right after the backward, before clipping (clipping by value would hide an
        inf), at most once per step: GradScaler refuses a second ``unscale_`` before
        ``update()``.
        """
        if self._found_inf is not None:
            raise RuntimeError(
                "PolicyScaler.unscale_: already called for this step; call step() first"
            )
        found: bool | None = None
        if self.scaling:
            unscaled = [opt for opt in optimizers if _grads([opt])]
            for opt in unscaled:
                self._scaler.unscale_(opt)
                self._torch_unscaled.add(id(opt))
            if self._torch_unscaled:
                self._scale.pending.add(id(self))
            # What unscale_ found: the optimizers without gradients have nothing to check.
            found = _recorded_found_inf(self._scaler, unscaled)
        # Checked over all of the module's optimizers so that they step together or not at
        # all (GradScaler alone decides per optimizer).
        self._found_inf = not grads_are_finite(optimizers) if found is None else found

    @property
    def unscaled(self) -> bool:
        """True between ``unscale_`` and the ``step`` that consumes it."""
        return self._found_inf is not None

    def step(self, optimizers: list[torch.optim.Optimizer], *, recheck: bool = False) -> bool:
        """Steps all ``optimizers`` unless a gradient is inf/nan. Returns True if skipped.

        After ``unscale_``: skips on what it found, then updates the scale once
        (``recheck``: the gradients were replaced since, so they are checked again, and an
        inf/nan there does not back the scale off). Without ``unscale_`` the gradients are
        true-scale: checked here, the scale untouched. A skipped step changes nothing.
        """
        after_unscale = self._found_inf is not None
        stepping = [opt for opt in optimizers if _grads([opt])]
        skipped = self._found_inf if after_unscale else not grads_are_finite(stepping)
        if recheck and after_unscale and not skipped:
            skipped = not grads_are_finite(stepping)
        self._found_inf = None
        if not skipped:
            # A plain step, also after the GradScaler's unscale_: it found no inf, and its
            # own step() would only ask again (one more host sync per optimizer). update()
            # reads what unscale_ recorded.
            for opt in stepping:
                opt.step()
        self._release_scale()
        if not stepping:
            return False
        self.optimizer_steps_lifetime += 1
        self._window_steps += 1
        if skipped:
            self.skipped_steps_lifetime += 1
            self._window_skipped += 1
        return bool(skipped)

    def discard_pending(self) -> None:
        """Forgets an ``unscale_`` whose step never came; the scale still updates (torch
        allows one unscale per ``update()``), so an overflow it found backs off."""
        self._release_scale()
        self._found_inf = None

    def _release_scale(self) -> None:
        # Once per step per live scale; backs the scale off when an unscale_ recorded an inf.
        if self._torch_unscaled:
            self._torch_unscaled.clear()
            self._scale.done(id(self))

    # -- reporting -------------------------------------------------------------------------
    def get_scale(self) -> float:
        """The current loss scale; 1.0 when no scaling is done (bfloat16)."""
        return float(self._scaler.get_scale()) if self.scaling else 1.0

    @property
    def growth_tracker(self) -> int:
        return int(self._scaler.state_dict().get("_growth_tracker", 0)) if self.scaling else 0

    def check_persistent_skips(self, steps: int, skipped: int) -> bool:
        """Counts updates that skipped too much; True once, when a warning is due."""
        if steps and skipped / steps > self.settings.skip_warning_fraction:
            self.troubled_updates += 1
        else:
            self.troubled_updates = 0
            self.warned = False  # recovered: warn again if trouble comes back
        if self.troubled_updates >= self.settings.skip_warning_updates and not self.warned:
            self.warned = True
            return True
        return False

    def pop_window(self) -> tuple[int, int]:
        """(optimizer steps, skipped steps) since the last call; resets the window."""
        out = (self._window_steps, self._window_skipped)
        self._window_steps = self._window_skipped = 0
        return out

    # -- checkpointing ---------------------------------------------------------------------
    def state_dict(self) -> ScalerState:
        return {
            "version": STATE_VERSION,
            "scaling": self.scaling,
            "torch": self._scaler.state_dict() if self.scaling else {},
            "optimizer_steps_lifetime": self.optimizer_steps_lifetime,
            "skipped_steps_lifetime": self.skipped_steps_lifetime,
            "nonfinite_loss_steps_lifetime": self.nonfinite_loss_steps_lifetime,
        }

    def load_state_dict(self, state: ScalerState) -> None:
        """Continues from a saved state: its scale, growth tracker and counters; the factors
        and interval stay this run's (PBT's rules, docs/update-step.md)."""
        self.load_counters(state)
        seed = saved_scale(state)
        if seed is not None:
            self.seed(*seed)

    def load_counters(self, state: ScalerState) -> None:
        """The counters of a saved state, nothing of its scale."""
        _check_state(state)
        self.optimizer_steps_lifetime = int(state["optimizer_steps_lifetime"])
        self.skipped_steps_lifetime = int(state["skipped_steps_lifetime"])
        self.nonfinite_loss_steps_lifetime = int(state.get("nonfinite_loss_steps_lifetime", 0))

    def seed(self, scale: float, growth_tracker: int) -> None:
        """Sets the live scale and growth tracker (no-op without scaling).

        The tracker is capped at ``growth_interval - 1``: torch grows when it *equals* the
        interval, so one saved under a longer interval would never grow again.

        Example:
            >>> s = PolicyScaler(AmpSettings(growth_interval=10), "cpu", scaling=True)
            >>> s.seed(512.0, 40)
            >>> s.get_scale(), s.growth_tracker
            (512.0, 9)
        """
        if not self.scaling:
            return
        merged = self._scaler.state_dict()
        merged["scale"] = float(scale)
        merged["_growth_tracker"] = min(max(int(growth_tracker), 0), merged["growth_interval"] - 1)
        self._scaler.load_state_dict(merged)


def _check_state(state: object) -> None:
    if any(field in ("", "version") for field, _ in scaler_state_defects(state)):
        raise ValueError(
            f"scaler state: expected a dict with version {STATE_VERSION}, got "
            f"{type(state).__name__}; was this checkpoint written by rllib-amp?"
        )


def saved_scale(state: ScalerState) -> tuple[float, int] | None:
    """(scale, growth tracker) of a saved PolicyScaler state; None if it did not scale.

    Example:
        >>> s = PolicyScaler(AmpSettings(init_scale=8.0), "cpu", scaling=True)
        >>> saved_scale(s.state_dict())
        (8.0, 0)
    """
    _check_state(state)
    saved = state.get("torch") or {}
    if not state.get("scaling") or "scale" not in saved:
        return None
    return float(saved["scale"]), int(saved.get("_growth_tracker", 0))


def seed_scalers(
    scalers: Mapping[str, PolicyScaler], seeds: Mapping[str, tuple[float, int]]
) -> None:
    """Seeds each scaler in ``seeds``; modules sharing a scale get the smallest seed (the one
    scale must suit the module with the largest gradients).

    Example:
        >>> a = PolicyScaler(AmpSettings(), "cpu", scaling=True)
        >>> b = PolicyScaler(AmpSettings(), "cpu", scaling=True, share_scale_with=a)
        >>> seed_scalers({"a": a, "b": b}, {"a": (64.0, 3), "b": (4096.0, 0)})
        >>> b.get_scale(), b.growth_tracker
        (64.0, 3)
    """
    chosen: dict[int, tuple[PolicyScaler, tuple[float, int]]] = {}
    for module_id, seed in seeds.items():
        scaler = scalers[module_id]
        key = id(scaler._scale)
        if key not in chosen or seed[0] < chosen[key][1][0]:
            chosen[key] = (scaler, seed)
    for scaler, seed in chosen.values():
        scaler.seed(*seed)
