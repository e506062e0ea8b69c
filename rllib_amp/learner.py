"""Mixed-precision RLlib learners: a mixin, a class factory and the PPO / DQN / APPO learners.

The update step per minibatch (RLlib's own ``_torch_grad_scaler_class`` hook gets the steps
marked * wrong; see the project's DESIGN.md):

    autocast(dtype): module.forward_train -> compute_losses    (*no autocast in RLlib)
      outputs cast back to float32 before the loss maths
    scaler.scale(loss) per module -> backward (outside autocast)
    scaler.unscale_(optimizers) BEFORE gradient clipping       (*RLlib clips scaled grads)
    postprocess_gradients: grad_clip on true-scale gradients
    step every optimizer of the module, or none on inf/nan     (*RLlib nan_to_num hides inf)
    scaler.update() once per module per step                   (*RLlib: once per optimizer)

The scalers' state is part of ``Learner.get_state()`` and so of every checkpoint
(*RLlib drops it). With precision resolved to float32 every override defers to RLlib
unchanged: the run is bit-identical to stock RLlib.

Example:
    >>> from ray.rllib.algorithms.ppo import PPOConfig
    >>> from rllib_amp import with_amp
    >>> config = with_amp(PPOConfig().environment("CartPole-v1"), dtype="bfloat16")
    >>> config.learner_class.__name__
    'AmpPPOTorchLearner'
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from ray.rllib.core import COMPONENT_OPTIMIZER
from ray.rllib.core.learner.learner import Learner
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.annotations import override
from ray.rllib.utils.minibatch_utils import MiniBatchCyclicIterator

from rllib_amp import metrics as M
from rllib_amp.malloc import tune_cpu_malloc
from rllib_amp.minibatch import GatherMiniBatchIterator
from rllib_amp.precision import Precision, add_float32_islands, resolve, to_float32
from rllib_amp.scaler import PolicyScaler
from rllib_amp.settings import AmpSettings, settings_from_config

logger = logging.getLogger(__name__)

# The key of the scalers' state inside Learner.get_state().
AMP_STATE_KEY = "amp_scalers"


@contextlib.contextmanager
def _float32_value_outputs(modules: list[Any]) -> Iterator[None]:
    """Makes ``compute_values`` return float32 while inside autocast.

    The learner connector's value pass (GAE for PPO) runs the value net and hands the result
    to numpy, which has no bfloat16. The value net runs in low precision; its output is cast.
    """
    patched = []
    for module in modules:
        original = getattr(module, "compute_values", None)
        if original is None:
            continue

        def compute_values(*args: Any, _original: Any = original, **kwargs: Any) -> Any:
            return to_float32(_original(*args, **kwargs))

        module.compute_values = compute_values  # instance attribute shadows the method
        patched.append(module)
    try:
        yield
    finally:
        for module in patched:
            del module.compute_values


class CheckpointError(ValueError):
    """A checkpoint file cannot be read; nothing of it was restored."""


def verify_checkpoint_files(path: Any) -> None:
    """Reads every state file under a local checkpoint folder; raises CheckpointError naming
    the first one that is truncated or corrupted. Remote URIs are left to RLlib."""
    import os
    import pickle

    text = path if isinstance(path, str) else os.fspath(path)
    if "://" in text or not os.path.isdir(text):
        return
    for root, _dirs, files in os.walk(text):
        for name in sorted(files):
            file = os.path.join(root, name)
            try:
                if name.endswith(".pkl"):
                    with open(file, "rb") as f:
                        pickle.load(f)  # noqa: S301 - the user's own checkpoint (see README)
                elif name.endswith(".msgpack"):
                    import msgpack

                    with open(file, "rb") as f:
                        msgpack.load(f, strict_map_key=False)
            except Exception as e:  # any parse failure means a damaged file
                raise CheckpointError(
                    f"{file}: checkpoint file is truncated or corrupted ({type(e).__name__}: "
                    f"{e}); nothing was restored. Restore from another checkpoint."
                ) from None


def _fuse_adam(optimizer: torch.optim.Optimizer) -> bool:
    """Switches RLlib's default ``torch.optim.Adam`` to PyTorch's fused kernel.

    Same algorithm, one kernel for all parameters: on the Nature CNN the optimizer step
    drops from 17 ms to 1.7 ms on 2 CPU cores. Only a plain Adam whose implementation the user
    left unset (foreach/fused None), on float32 CPU or CUDA parameters, is touched.
    """
    if type(optimizer) is not torch.optim.Adam:
        return False
    groups = optimizer.param_groups
    if any(g.get("fused") is not None or g.get("foreach") is not None for g in groups):
        return False
    params = [p for g in groups for p in g["params"]]
    if not params or any(
        p.dtype != torch.float32 or p.device.type not in ("cpu", "cuda") for p in params
    ):
        return False
    for g in groups:
        g["fused"] = True
    optimizer.defaults["fused"] = True
    return True


def _unfuse_adams(learner: Any) -> None:
    """Puts Adams that an AMP run's checkpoint made fused back to RLlib's default."""
    for _, opt in learner.get_optimizers_for_module():
        if type(opt) is torch.optim.Adam:
            for g in opt.param_groups:
                if g.get("fused"):
                    g["fused"] = None
            opt.defaults["fused"] = None


# Type checkers see the mixin as a TorchLearner; at run time it is a plain mixin.
_MixinBase: Any = TorchLearner if TYPE_CHECKING else object


class AmpLearnerMixin(_MixinBase):
    """Mixed precision for any RLlib ``TorchLearner``: put it first in the bases.

    Use ``amp_learner_class(base)`` rather than subclassing by hand.
    """

    # Set in build(); None until then.
    _amp_precision: Precision | None = None
    _amp_settings: AmpSettings | None = None
    # The trial tag of the Ray metrics (set by metrics.tag_learners_with_trial under Tune).
    _amp_trial: str = "default"

    def set_amp_trial(self, trial: str) -> None:
        self._amp_trial = trial

    # -- setup -----------------------------------------------------------------------------
    @override(TorchLearner)
    def build(self) -> None:
        super().build()  # type: ignore[misc]
        self._amp_settings = settings_from_config(self.config)  # type: ignore[attr-defined]
        self._amp_precision = resolve(self._amp_settings, self._device)  # type: ignore[attr-defined]
        self._amp_scalers: dict[str, PolicyScaler] = {}
        self._amp_step_modules: list[str] = []
        self._amp_losses: dict[str, torch.Tensor] = {}
        if self.amp_enabled:
            if self._amp_settings.tune_cpu_malloc and self._amp_precision.device_type == "cpu":
                tune_cpu_malloc()
            for module_id in self.module.keys():  # type: ignore[attr-defined]  # noqa: SIM118
                self._amp_setup_module(module_id)
        else:
            logger.info("rllib_amp: all modules train in %s", self._amp_precision.describe())

    @property
    def amp_enabled(self) -> bool:
        """True when autocast is on (bfloat16 or float16)."""
        return self._amp_precision is not None and self._amp_precision.enabled

    @property
    def amp_precision(self) -> Precision | None:
        return self._amp_precision

    @property
    def amp_scalers(self) -> dict[str, PolicyScaler]:
        """ModuleID -> that policy's PolicyScaler (empty when AMP is off)."""
        return getattr(self, "_amp_scalers", {})

    def _amp_setup_module(self, module_id: str) -> None:
        precision = self._amp_precision
        assert precision is not None and self._amp_settings is not None
        self._amp_scalers[module_id] = PolicyScaler(
            self._amp_settings,
            self._device,
            scaling=precision.use_scaler,  # type: ignore[attr-defined]
        )
        module = self.module[module_id]  # type: ignore[attr-defined]
        islands = add_float32_islands(module) if isinstance(module, torch.nn.Module) else 0
        fused = sum(_fuse_adam(opt) for opt in self._amp_optimizers(module_id))
        logger.info(
            "rllib_amp: module %r trains in %s%s%s",
            module_id,
            precision.describe(),
            f"; {islands} normalisation layer(s) kept in float32" if islands else "",
            "; fused Adam" if fused else "",
        )

    @override(TorchLearner)
    def add_module(self, *, module_id: str, **kwargs: Any) -> Any:
        spec = super().add_module(module_id=module_id, **kwargs)  # type: ignore[misc]
        if self.amp_enabled:
            self._amp_setup_module(module_id)
        return spec

    @override(TorchLearner)
    def remove_module(self, module_id: str, **kwargs: Any) -> Any:
        spec = super().remove_module(module_id, **kwargs)  # type: ignore[misc]
        self.amp_scalers.pop(module_id, None)
        return spec

    # -- the update step -------------------------------------------------------------------
    @override(TorchLearner)
    def _uncompiled_update(self, batch: dict, **kwargs: Any) -> Any:
        if not self.amp_enabled:
            return super()._uncompiled_update(batch, **kwargs)  # type: ignore[misc]
        assert self._amp_precision is not None
        self._compute_off_policyness(batch)  # type: ignore[attr-defined]

        with self._amp_precision.autocast():
            # Loss maths (log-probs, ratios, KL, value / TD errors, entropy) see float32.
            fwd_out = to_float32(self.module.forward_train(batch))  # type: ignore[attr-defined]
            loss_per_module = to_float32(
                self.compute_losses(fwd_out=fwd_out, batch=batch)  # type: ignore[attr-defined]
            )
        # Backward runs outside autocast (compute_gradients).
        gradients = self.compute_gradients(loss_per_module)  # type: ignore[attr-defined]

        with contextlib.ExitStack() as stack:
            if self.config.num_learners > 1:  # type: ignore[attr-defined]
                for mod in self.module.values():  # type: ignore[attr-defined]
                    if isinstance(mod, torch.nn.Module):
                        stack.enter_context(mod.no_sync())  # type: ignore[operator]
            postprocessed_gradients = self.postprocess_gradients(gradients)  # type: ignore[attr-defined]
            self.apply_gradients(postprocessed_gradients)  # type: ignore[attr-defined]
        return fwd_out, loss_per_module, {}

    @override(TorchLearner)
    def compute_gradients(self, loss_per_module: dict[str, Any], **kwargs: Any) -> Any:
        if not self.amp_enabled:
            return super().compute_gradients(loss_per_module, **kwargs)  # type: ignore[misc]
        for optim in self._optimizer_parameters:  # type: ignore[attr-defined]
            optim.zero_grad(set_to_none=True)

        self._amp_step_modules = []
        self._amp_losses = {}
        scaled = []
        for module_id, loss in loss_per_module.items():
            scaler = self._amp_scalers.get(module_id)
            if scaler is None:
                raise RuntimeError(
                    f"rllib_amp: loss for {module_id!r}, which has no scaler; losses must be "
                    f"keyed by ModuleID (modules: {sorted(self._amp_scalers)})"
                )
            self._amp_step_modules.append(module_id)
            self._amp_losses[module_id] = loss.detach()
            scaled.append(scaler.scale(loss))
        if not scaled:
            return {}
        total_loss: torch.Tensor = torch.stack(scaled).sum() if len(scaled) > 1 else scaled[0]
        if total_loss.grad_fn is None:  # every parameter frozen
            self._amp_step_modules = []
            return {}
        total_loss.backward()
        return {pid: p.grad for pid, p in self._params.items()}  # type: ignore[attr-defined]

    @override(TorchLearner)
    def postprocess_gradients(self, gradients_dict: dict) -> dict:
        if self.amp_enabled:
            # Unscale in place (gradients_dict holds the .grad tensors) before any clipping,
            # and record whether this step overflowed before clipping can hide it.
            for module_id in self._amp_step_modules:
                self._amp_scalers[module_id].unscale_(self._amp_optimizers(module_id))
        return super().postprocess_gradients(gradients_dict)  # type: ignore[misc]

    @override(TorchLearner)
    def apply_gradients(self, gradients_dict: dict) -> None:
        if not self.amp_enabled:
            return super().apply_gradients(gradients_dict)  # type: ignore[misc]
        # Unlike RLlib, no nan_to_num: an overflow must reach the scaler, which skips the step.
        for pid, grad in gradients_dict.items():
            self._params[pid].grad = grad  # type: ignore[attr-defined]
        for module_id, optimizer_names in self._module_optimizers.items():  # type: ignore[attr-defined]
            for optimizer_name in optimizer_names:
                self._amp_maybe_build_lr_schedulers(module_id, optimizer_name)
            if module_id in self._amp_step_modules:
                scaler = self._amp_scalers[module_id]
                if scaler.step(self._amp_optimizers(module_id)):
                    self._amp_check_loss(module_id, scaler)
        self._amp_step_modules = []
        self._amp_losses = {}

    def _amp_check_loss(self, module_id: str, scaler: PolicyScaler) -> None:
        # Only on the (rare) skip path: one host sync to tell bad data from an overflow.
        loss = self._amp_losses.get(module_id)
        if loss is not None and not bool(torch.isfinite(loss).all()):
            scaler.nonfinite_loss_steps_lifetime += 1
            n = scaler.nonfinite_loss_steps_lifetime
            if n & (n - 1) == 0:  # 1st, 2nd, 4th, 8th, ... time: reported, never spammed
                logger.warning(
                    "rllib_amp: module %r: the loss itself is %s (before any loss scaling), so "
                    "this is not a float16 overflow: the batch likely holds nan/inf "
                    "observations or rewards. The step was skipped and the weights are "
                    "untouched (%d such step(s) so far).",
                    module_id,
                    "nan" if bool(torch.isnan(loss).any()) else "inf",
                    n,
                )

    def _amp_optimizers(self, module_id: str) -> list[torch.optim.Optimizer]:
        return [opt for _, opt in self.get_optimizers_for_module(module_id)]  # type: ignore[attr-defined]

    def _amp_maybe_build_lr_schedulers(self, module_id: str, optimizer_name: str) -> None:
        # Mirrors TorchLearner.apply_gradients, which builds torch lr schedulers lazily.
        classes = self._lr_scheduler_classes  # type: ignore[attr-defined]
        schedulers = self._lr_schedulers  # type: ignore[attr-defined]
        if classes is None or optimizer_name in schedulers.get(module_id, {}):
            return
        optim = self.get_optimizer(module_id, optimizer_name)  # type: ignore[attr-defined]
        per_module = classes[module_id] if isinstance(classes, dict) else classes
        schedulers[module_id] = {optimizer_name: [cls(optim) for cls in per_module]}

    @override(TorchLearner)
    def _make_batch_if_necessary(self, training_data: Any) -> Any:
        if not self.amp_enabled or training_data.episodes is None:
            return super()._make_batch_if_necessary(training_data)  # type: ignore[misc]
        assert self._amp_precision is not None
        # The learner connector's value pass (GAE) is a full forward pass of the value net:
        # on CPU about a third of the learner's time. Run it under autocast too.
        modules = list(self.module.values())  # type: ignore[attr-defined]
        with torch.no_grad(), self._amp_precision.autocast(), _float32_value_outputs(modules):
            return super()._make_batch_if_necessary(training_data)  # type: ignore[misc]

    @override(Learner)
    def _create_iterator_if_necessary(self, **kwargs: Any) -> Any:
        iterator = super()._create_iterator_if_necessary(**kwargs)  # type: ignore[misc]
        # RLlib's iterator shuffles the whole batch in place each epoch, then copies every
        # minibatch out of it again. Ours yields the same minibatches with one copy each
        # (see rllib_amp.minibatch): Atari PPO "full", bf16, 0.827 -> 0.787 s per update.
        if (
            self.amp_enabled
            and type(iterator) is MiniBatchCyclicIterator
            and GatherMiniBatchIterator.supports(iterator._batch)
        ):
            return GatherMiniBatchIterator.replacing(iterator)
        return iterator

    # -- metrics ---------------------------------------------------------------------------
    @override(TorchLearner)
    def after_gradient_based_update(self, *, timesteps: dict[str, Any]) -> None:
        super().after_gradient_based_update(timesteps=timesteps)  # type: ignore[misc]
        for module_id, scaler in self.amp_scalers.items():
            steps, skipped = scaler.pop_window()
            # RLlib's "item" reduce keeps the latest value (the scale after the iteration's
            # last update) but cannot merge several learners; their scalers are identical
            # (DDP), so there the scale is averaged over the iteration's updates instead.
            single = self.config.num_learners <= 1  # type: ignore[attr-defined]
            self.metrics.log_value(  # type: ignore[attr-defined]
                (module_id, M.GRAD_SCALE),
                scaler.get_scale(),
                **({"reduce": "item"} if single else {"window": 1}),
            )
            for key, value in (
                (M.SKIPPED_STEPS_LIFETIME, scaler.skipped_steps_lifetime),
                (M.OPTIMIZER_STEPS_LIFETIME, scaler.optimizer_steps_lifetime),
            ):
                # Monotonic counters: the max is the latest value, on any number of learners.
                self.metrics.log_value((module_id, key), value, reduce="max", window=1)
            self.metrics.log_value(  # type: ignore[attr-defined]
                (module_id, M.NONFINITE_LOSS_STEPS_LIFETIME),
                scaler.nonfinite_loss_steps_lifetime,
                reduce="max",
                window=1,
            )
            if scaler.check_persistent_skips(steps, skipped):
                self._amp_warn_persistent_skips(module_id, scaler, skipped / steps)
            published = {
                M.GRAD_SCALE: scaler.get_scale(),
                M.SKIPPED_STEPS_LIFETIME: scaler.skipped_steps_lifetime,
            }
            if steps:
                # Averaged over an iteration's updates (each the same number of steps).
                self.metrics.log_value(  # type: ignore[attr-defined]
                    (module_id, M.SKIP_FRACTION), skipped / steps, window=1
                )
                published[M.SKIP_FRACTION] = skipped / steps
            M.publish(published, trial=self._amp_trial, module=module_id)

    def _amp_warn_persistent_skips(
        self, module_id: str, scaler: PolicyScaler, fraction: float
    ) -> None:
        s = scaler.settings
        if scaler.nonfinite_loss_steps_lifetime:
            advice = (
                "the loss itself has been nan/inf: check observations and rewards for nan, "
                "and lower the learning rate"
            )
        elif scaler.scaling:
            advice = (
                f"lower init_scale (now {s.init_scale:g}) or growth_factor (now "
                f"{s.growth_factor:g}), or raise growth_interval (now {s.growth_interval}); if "
                f"the scale keeps falling, lower the learning rate or use dtype bfloat16"
            )
        else:
            advice = "bfloat16 needs no scaling: lower the learning rate or set grad_clip"
        logger.warning(
            "rllib_amp: module %r skipped %.0f%% of its optimizer steps (inf/nan gradients) in "
            "%d consecutive updates; grad scale now %g. Advice: %s.",
            module_id,
            100 * fraction,
            scaler.troubled_updates,
            scaler.get_scale(),
            advice,
        )

    # -- checkpoints -----------------------------------------------------------------------
    @override(TorchLearner)
    def get_state(
        self, components: Any = None, *, not_components: Any = None, **kwargs: Any
    ) -> dict[str, Any]:
        state = super().get_state(  # type: ignore[misc]
            components, not_components=not_components, **kwargs
        )
        if self.amp_scalers and self._check_component(  # type: ignore[attr-defined]
            AMP_STATE_KEY, components, not_components
        ):
            state[AMP_STATE_KEY] = {
                module_id: scaler.state_dict() for module_id, scaler in self.amp_scalers.items()
            }
        return state

    @override(TorchLearner)
    def restore_from_path(self, path: Any, *args: Any, **kwargs: Any) -> None:
        # RLlib loads the module weights before the learner's own state file: a damaged
        # state file would leave half a state behind. Read every file first.
        verify_checkpoint_files(path)
        super().restore_from_path(path, *args, **kwargs)  # type: ignore[misc]

    @override(TorchLearner)
    def set_state(self, state: dict[str, Any]) -> None:
        super().set_state(state)  # type: ignore[misc]
        if COMPONENT_OPTIMIZER in state:
            # Loaded optimizer state carries the saving run's implementation flags.
            for module_id in self.amp_scalers:
                for opt in self._amp_optimizers(module_id):
                    _fuse_adam(opt)
            if not self.amp_enabled:
                _unfuse_adams(self)
        saved = state.get(AMP_STATE_KEY)
        if saved is None:
            # Only a full learner state (a checkpoint: it carries optimizer state) is worth a
            # word; weight syncs pass module weights alone.
            if self.amp_enabled and COMPONENT_OPTIMIZER in state:
                logger.info(
                    "rllib_amp: the restored state has no AMP scaler state (stock RLlib or "
                    "AMP off when saved); modules %s start with fresh scalers",
                    sorted(self._amp_scalers),
                )
            return
        if not self.amp_enabled:
            logger.warning(
                "rllib_amp: the restored state carries AMP scaler state for modules %s, but "
                "this run trains in float32; the scaler state is ignored",
                sorted(saved),
            )
            return
        fresh = []
        for module_id, scaler in self._amp_scalers.items():
            if module_id in saved:
                scaler.load_state_dict(saved[module_id])
            else:
                fresh.append(module_id)
        if fresh:
            logger.info("rllib_amp: no saved scaler state for modules %s; they start fresh", fresh)
