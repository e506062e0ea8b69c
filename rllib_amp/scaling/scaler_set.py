"""One learner's per-module scalers inside RLlib's gradient path.

``ScalerSet`` keeps a ``PolicyScaler`` per ModuleID and where the gradients stand between
RLlib's three public gradient methods, so each works on its own as RLlib documents it:

- ``compute_gradients(loss_per_module)``: every module's parameters get the gradient of the
  sum of all losses (RLlib's total) times their own module's scale; a loss under a key that
  is no ModuleID (``ALL_MODULES``, a name of your own) is over all modules. With one scale
  for all (one module, ``shared_scaler``, bfloat16) that is RLlib's one backward; with
  several float16 scales and such a shared loss, one backward per module, restricted to its
  parameters. ``unscale`` then unscales in place and records inf/nan per module, before any
  clipping can hide it.
- ``postprocess_gradients``: nothing to do; the gradients are already true-scale.
- ``apply_gradients(grads)``: each module with a gradient steps all its optimizers, or none
  on an inf/nan; each live scale then updates once (a shared one backs off if any module
  overflowed). Gradients the caller gave, or that replaced the computed ones, are checked
  the same way and leave the scale as it is. A skip is counted, and logged unless it is a
  float16 overflow.

Example:
    >>> import torch
    >>> from rllib_amp.settings import AmpSettings
    >>> scalers = ScalerSet()
    >>> scalers.add("p0", PolicyScaler(AmpSettings(init_scale=4.0), "cpu", scaling=True))
    >>> scalers.scaled_losses({"p0": torch.tensor(1.5)})["p0"].item()
    6.0
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

import torch

from rllib_amp.log_events import event, is_power_of_two
from rllib_amp.scaling.scaler import PolicyScaler

logger = logging.getLogger(__name__)

# ModuleID -> that module's optimizers (what ``Learner.get_optimizers_for_module`` returns).
Optimizers = Mapping[str, list[torch.optim.Optimizer]]


def check_no_rllib_grad_scaler(config: Any, *, where: str) -> None:
    """Refuses RLlib's own loss-scaling hook: with ours it would scale every loss twice.

    Example:
        >>> from ray.rllib.algorithms.ppo import PPOConfig
        >>> check_no_rllib_grad_scaler(PPOConfig(), where="with_amp")  # not set: fine
    """
    if config._torch_grad_scaler_class is not None:
        raise ValueError(
            f"{where}: config.experimental(_torch_grad_scaler_class=...) is set; rllib-amp "
            f"owns loss scaling: remove that setting (pass init_scale etc. to with_amp instead)"
        )


def outside_autocast(device_type: str) -> torch.autocast:
    """Backward, clipping and the optimizer step run outside the update's autocast region."""
    return torch.autocast(device_type=device_type, enabled=False)


class ScalerSet:
    """The ``PolicyScaler`` of every module of one learner, and the pending step's state."""

    def __init__(self) -> None:
        self.scalers: dict[str, PolicyScaler] = {}
        # Modules whose gradients a scaled backward produced and nothing unscaled yet.
        self._scaled: set[str] = set()
        # The losses behind each module's pending gradients (None: the caller gave them).
        self._losses: dict[str, list[torch.Tensor]] | None = None
        # Steps skipped on inf/nan gradients that the caller gave apply_gradients.
        self._given_nonfinite: dict[str, int] = {}

    def add(self, module_id: str, scaler: PolicyScaler) -> None:
        self.scalers[module_id] = scaler

    def remove(self, module_id: str) -> None:
        self.scalers.pop(module_id, None)
        self._scaled.discard(module_id)

    # -- compute_gradients -----------------------------------------------------------------
    def scaled_losses(
        self, loss_per_module: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor] | None:
        """The losses to hand RLlib's ``compute_gradients``; None when several float16
        modules share a loss (then call ``backward_per_module``)."""
        self._begin(loss_per_module)
        scaling = any(s.scaling for s in self.scalers.values())
        if not scaling:
            return dict(loss_per_module)
        shared = [key for key in loss_per_module if key not in self.scalers]
        if not shared:
            return {mid: self.scalers[mid].scale(loss) for mid, loss in loss_per_module.items()}
        first = next(iter(self.scalers.values()))
        if all(s.shares_scale_with(first) for s in self.scalers.values()):
            # One module, or one shared scale: the same factor everywhere, one backward.
            return {key: first.scale(loss) for key, loss in loss_per_module.items()}
        return None

    def backward_per_module(
        self,
        loss_per_module: Mapping[str, torch.Tensor],
        optimizers: Optimizers,
        *,
        zero: Iterable[torch.optim.Optimizer],
    ) -> None:
        """Each module's parameters get the total loss's gradient times its own scale: one
        backward per module, restricted to its parameters, after zeroing the ``zero``
        optimizers (all of the learner's, as RLlib does)."""
        for opt in zero:
            opt.zero_grad(set_to_none=True)
        total = sum(loss_per_module.values())
        if not torch.is_tensor(total) or total.grad_fn is None:
            return  # no loss, or every parameter frozen: nothing to differentiate
        targets = []
        for mid, opts in optimizers.items():
            params = [p for opt in opts for g in opt.param_groups for p in g["params"]]
            if trainable := [p for p in params if p.requires_grad]:
                targets.append((mid, trainable))
        for i, (mid, trainable) in enumerate(targets):
            torch.autograd.backward(
                self.scalers[mid].scale(total),
                inputs=trainable,
                retain_graph=i < len(targets) - 1,
            )

    def gradients_computed(self) -> None:
        """Marks every module's new gradients as scaled (for ``unscale``)."""
        self._scaled = set(self.scalers)

    def _begin(self, loss_per_module: Mapping[str, torch.Tensor]) -> None:
        for scaler in self.scalers.values():
            scaler.discard_pending()  # an unscale_ whose step never came
        losses = {
            key: loss.detach() for key, loss in loss_per_module.items() if torch.is_tensor(loss)
        }
        shared = [loss for key, loss in losses.items() if key not in self.scalers]
        # A module without a loss of its own got its gradients from the others' losses.
        self._losses = {
            mid: [losses[mid], *shared] if mid in losses else list(losses.values())
            for mid in self.scalers
        }
        self._scaled = set()

    def unscale(self, optimizers: Optimizers) -> None:
        """Unscales what is still scaled, in place, and records inf/nan per module; a
        module already unscaled is left alone (never divided twice)."""
        for mid, scaler in self.scalers.items():
            if mid in self._scaled:
                scaler.unscale_(optimizers.get(mid, []))
        self._scaled.clear()

    # -- apply_gradients -------------------------------------------------------------------
    def step(self, optimizers: Optimizers, *, replaced: bool = False) -> None:
        """Steps every module with gradients, or skips it on inf/nan (counted and logged).
        ``replaced``: not the gradients the backward wrote; checked again, reported as given.
        """
        self.unscale(optimizers)
        given = replaced or self._losses is None
        try:
            for mid, scaler in self.scalers.items():
                if scaler.step(optimizers.get(mid, []), recheck=replaced):
                    self._report_skip(mid, scaler, given=given)
        finally:
            self._losses = None

    def _report_skip(self, module_id: str, scaler: PolicyScaler, *, given: bool) -> None:
        # Only on the (rare) skip path: host syncs to tell bad data from an overflow.
        if given or self._losses is None:
            n = self._given_nonfinite[module_id] = self._given_nonfinite.get(module_id, 0) + 1
            if is_power_of_two(n):
                logger.warning(
                    "rllib_amp: module %r: the gradients given to apply_gradients hold inf/nan; "
                    "its optimizer step was skipped and the weights are untouched (%d such "
                    "step(s) so far).",
                    module_id,
                    n,
                    extra=event("nonfinite_gradients", module_id=module_id, count=n),
                )
            return
        bad = [loss for loss in self._losses.get(module_id, []) if not torch.isfinite(loss).all()]
        if not bad:
            return  # a float16 overflow: routine, counted and reported in the metrics
        scaler.nonfinite_loss_steps_lifetime += 1
        n = scaler.nonfinite_loss_steps_lifetime
        if is_power_of_two(n):
            value = "nan" if any(bool(torch.isnan(loss).any()) for loss in bad) else "inf"
            logger.warning(
                "rllib_amp: module %r: the loss itself is %s (before any loss scaling), so "
                "this is not a float16 overflow: the batch likely holds nan/inf observations "
                "or rewards. The step was skipped and the weights are untouched (%d such "
                "step(s) so far).",
                module_id,
                value,
                n,
                extra=event("nonfinite_loss", module_id=module_id, value=value, count=n),
            )
