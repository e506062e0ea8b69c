"""``AmpLearnerMixin``: mixed precision for any RLlib ``TorchLearner``, as a thin adapter.

Each override wraps RLlib's own method and hands the AMP part to the module that owns it:

    build / add_module             a warm-started scaler per module (or one shared) (scaling)
    _uncompiled_update             RLlib's update step, inside autocast
    compute_losses                 float32 into and out of the loss maths         (precision)
    compute_loss_for_module        APPO: V-trace bootstraps where fragments end   (vtrace)
    compute_gradients              scaled losses -> RLlib's backward -> unscale   (scaler_set)
    postprocess_gradients          RLlib's grad_clip, outside autocast
    apply_gradients                step or skip per module; no nan_to_num         (scaler_set)
    _make_batch_if_necessary       the GAE value pass under autocast              (value_pass)
    _create_iterator_if_necessary  one copy per minibatch                         (minibatch)
    after_gradient_based_update    metrics and skip warnings                      (report)
    update                         APPO: every result the learner thread queued (async_results)
    get_state / set_state          scaler state, Adam fusing     (scaling.state, fused_adam)
    restore_from_path              damaged files refused before any load (checkpoint_files)

The gradient methods run outside autocast. docs/update-step.md walks through the update step,
what RLlib's own ``_torch_grad_scaler_class`` hook gets wrong, and each public Learner method
with the scaler in the loop. In float32 every override defers to RLlib (bit-identical runs),
except APPO's V-trace fix, which is not about precision and holds in every one.

Example:
    >>> from ray.rllib.algorithms.ppo import PPOConfig
    >>> from rllib_amp import with_amp
    >>> config = with_amp(PPOConfig().environment("CartPole-v1"), dtype="bfloat16")
    >>> config.learner_class.__name__
    'AmpPPOTorchLearner'
"""

from __future__ import annotations

import logging
import pathlib
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING, Any

import pyarrow.fs
import torch
from ray.rllib.algorithms.impala import IMPALAConfig
from ray.rllib.algorithms.impala.impala_learner import IMPALALearner
from ray.rllib.core import ALL_MODULES, COMPONENT_OPTIMIZER
from ray.rllib.core.learner.learner import Learner
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.core.learner.training_data import TrainingData
from ray.rllib.core.rl_module.multi_rl_module import MultiRLModuleSpec
from ray.rllib.utils.annotations import override
from ray.rllib.utils.typing import ModuleID, ParamDict, ResultDict, StateDict, TensorType

from rllib_amp.checkpoint_files import rllib_restore_files, verify_checkpoint
from rllib_amp.learner.async_results import collect_pending, discard_pending
from rllib_amp.learner.fused_adam import fuse_adam, set_adam_fusing
from rllib_amp.learner.malloc import tune_cpu_malloc
from rllib_amp.learner.minibatch import gather_minibatches
from rllib_amp.learner.precision import Precision, add_float32_islands, resolve, to_float32
from rllib_amp.learner.report import report_update, values_without_an_update
from rllib_amp.learner.value_pass import value_pass
from rllib_amp.learner.vtrace import bootstrap_without_weight
from rllib_amp.log_events import event
from rllib_amp.scaling.scaler import PolicyScaler
from rllib_amp.scaling.scaler_set import ScalerSet, check_no_rllib_grad_scaler, outside_autocast
from rllib_amp.scaling.state import AMP_STATE_KEY, restore_scaler_state, scaler_state
from rllib_amp.scaling.warm_start import apply_warm_start
from rllib_amp.settings import AmpSettings, settings_from_config

logger = logging.getLogger(__name__)

# Type checkers see the mixin as a TorchLearner; at run time it is a plain mixin.
_MixinBase: Any = TorchLearner if TYPE_CHECKING else object


class AmpLearnerMixin(_MixinBase):
    """Mixed precision for any RLlib ``TorchLearner``: put it first in the bases.

    Use ``rllib_amp.algorithms.amp_learner_class(base)`` rather than subclassing by hand.
    """

    # Set in build(); None until then.
    _amp_precision: Precision | None = None
    _amp_settings: AmpSettings | None = None
    _amp_scaler_set: ScalerSet | None = None
    # The trial tag of the Ray metrics (set by metrics.tag_learners_with_trial under Tune).
    _amp_trial: str = "default"

    def set_amp_trial(self, trial: str) -> None:
        self._amp_trial = trial

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
        return self._amp_scaler_set.scalers if self._amp_scaler_set is not None else {}

    def amp_values_without_an_update(self) -> dict[str, dict[str, float]]:
        """ModuleID -> its AMP metrics as they stand (``values_without_an_update``)."""
        return values_without_an_update(self.amp_scalers)

    @override(TorchLearner)
    def build(self) -> None:
        super().build()
        self._amp_settings = settings_from_config(self.config)
        self._amp_precision = resolve(self._amp_settings, self.device)
        self._amp_scaler_set = ScalerSet()
        if isinstance(self, IMPALALearner):
            logger.info(
                "rllib_amp: V-trace bootstraps where rollout fragments end, unlike RLlib 2.60's "
                'APPO loss (docs/update-step.md, "APPO\'s V-trace")',
                extra=event("vtrace_bootstrap"),
            )
        if not self.amp_enabled:
            logger.info(
                "rllib_amp: all modules train in %s",
                self._amp_precision.describe(),
                extra=event("precision", dtype=self._amp_precision.name),
            )
            apply_warm_start({}, self._amp_settings.warm_start)  # says it is ignored
            return
        check_no_rllib_grad_scaler(self.config, where="rllib_amp learner")
        if self._amp_settings.tune_cpu_malloc and self._amp_precision.device_type == "cpu":
            tune_cpu_malloc()
        for module_id in self.module.keys():  # noqa: SIM118 - a MultiRLModule, not a dict
            self._amp_setup_module(module_id)
        # Before any restore: a restored checkpoint's own scaler state wins over it.
        apply_warm_start(self.amp_scalers, self._amp_settings.warm_start)

    def _amp_setup_module(self, module_id: str) -> None:
        precision, settings, scalers = self._amp_precision, self._amp_settings, self._amp_scaler_set
        assert precision is not None and settings is not None and scalers is not None
        # shared_scaler: every module, also one added later, uses the first module's scale.
        shared = next(iter(scalers.scalers.values()), None) if settings.shared_scaler else None
        scalers.add(
            module_id,
            PolicyScaler(
                settings, self.device, scaling=precision.use_scaler, share_scale_with=shared
            ),
        )
        module = self.module[module_id]
        islands = add_float32_islands(module) if isinstance(module, torch.nn.Module) else 0
        fused = sum(fuse_adam(opt) for _, opt in self.get_optimizers_for_module(module_id))
        logger.info(
            "rllib_amp: module %r trains in %s%s%s",
            module_id,
            precision.describe(),
            f"; {islands} normalisation layer(s) kept in float32" if islands else "",
            "; fused Adam" if fused else "",
            extra=event(
                "precision",
                module_id=module_id,
                dtype=precision.name,
                scaler=precision.use_scaler,
                float32_norm_layers=islands,
                fused_adam=bool(fused),
            ),
        )

    @override(TorchLearner)
    def add_module(self, *, module_id: ModuleID, **kwargs: object) -> MultiRLModuleSpec:
        spec = super().add_module(module_id=module_id, **kwargs)
        if self.amp_enabled:
            self._amp_setup_module(module_id)
        return spec

    @override(TorchLearner)
    def remove_module(self, module_id: ModuleID, **kwargs: object) -> MultiRLModuleSpec:
        spec = super().remove_module(module_id, **kwargs)
        if self._amp_scaler_set is not None:
            self._amp_scaler_set.remove(module_id)
        return spec

    @override(TorchLearner)
    def _uncompiled_update(self, batch: dict, **kwargs: object) -> tuple[dict, dict, dict]:
        if not self.amp_enabled:
            return super()._uncompiled_update(batch, **kwargs)
        assert self._amp_precision is not None
        with self._amp_precision.autocast():
            fwd_out, loss_per_module, results = super()._uncompiled_update(batch, **kwargs)
        # What leaves the autocast region is float32: numpy has no bfloat16.
        return to_float32(fwd_out), loss_per_module, results

    @override(Learner)
    def compute_losses(
        self, *, fwd_out: dict[str, object], batch: dict[str, object]
    ) -> dict[ModuleID, TensorType]:
        if not self.amp_enabled:
            return super().compute_losses(fwd_out=fwd_out, batch=batch)
        # Loss maths (log-probs, ratios, KL, value / TD errors, entropy) see float32.
        return to_float32(super().compute_losses(fwd_out=to_float32(fwd_out), batch=batch))

    @override(Learner)
    def compute_loss_for_module(
        self, *, module_id: ModuleID, config: Any, batch: dict[str, Any], fwd_out: dict[str, Any]
    ) -> TensorType:
        if isinstance(self, IMPALALearner):
            batch = bootstrap_without_weight(batch)
        return super().compute_loss_for_module(
            module_id=module_id, config=config, batch=batch, fwd_out=fwd_out
        )

    @override(TorchLearner)
    def compute_gradients(
        self, loss_per_module: dict[ModuleID, torch.Tensor], **kwargs: object
    ) -> ParamDict:
        if not self.amp_enabled:
            return super().compute_gradients(loss_per_module, **kwargs)
        scalers = self._amp_scaler_set
        assert scalers is not None and self._amp_precision is not None
        with outside_autocast(self._amp_precision.device_type):
            scaled = scalers.scaled_losses(loss_per_module)
            if scaled is not None:
                gradients = super().compute_gradients(scaled, **kwargs)
            else:
                scalers.backward_per_module(
                    loss_per_module,
                    self._amp_optimizers(),
                    zero=self._amp_module_optimizers(ALL_MODULES),
                )
                gradients = {pid: p.grad for pid, p in self._params.items()}
            scalers.gradients_computed()
            # Right after the backward, as torch's recipe has it: a caller (log norms, clip)
            # sees true-scale gradients (the .grad tensors, unscaled in place), and the inf/nan
            # check has run before any clipping could hide an overflow.
            scalers.unscale(self._amp_optimizers())
        return gradients

    @override(Learner)
    def postprocess_gradients(self, gradients_dict: ParamDict) -> ParamDict:
        if not self.amp_enabled:
            return super().postprocess_gradients(gradients_dict)
        assert self._amp_precision is not None
        with outside_autocast(self._amp_precision.device_type):
            return super().postprocess_gradients(gradients_dict)

    @override(TorchLearner)
    def apply_gradients(self, gradients_dict: ParamDict) -> None:
        if not self.amp_enabled:
            return super().apply_gradients(gradients_dict)
        scalers = self._amp_scaler_set
        assert scalers is not None and self._amp_precision is not None
        with outside_autocast(self._amp_precision.device_type):
            # Gradients other than the ones compute_gradients checked (RLlib's clipping works
            # in place) are checked again before any step.
            replaced = any(self._params[pid].grad is not g for pid, g in gradients_dict.items())
            # Unlike RLlib, no nan_to_num: an overflow must reach the scaler, which skips.
            for pid, grad in gradients_dict.items():
                self._params[pid].grad = grad
            self._amp_build_lr_schedulers()
            scalers.step(self._amp_optimizers(), replaced=replaced)
        # The weights changed in place: autocast must not reuse low-precision copies of them.
        torch.clear_autocast_cache()

    def _amp_optimizers(self) -> dict[ModuleID, list[torch.optim.Optimizer]]:
        return {
            mid: [opt for _, opt in self.get_optimizers_for_module(mid)] for mid in self.amp_scalers
        }

    def _amp_module_optimizers(self, *extra_ids: str) -> list[torch.optim.Optimizer]:
        # The optimizers of every module (and of ``extra_ids``, e.g. ALL_MODULES).
        module_ids = [*self.module.keys(), *extra_ids]  # noqa: SIM118 - a MultiRLModule
        return [opt for mid in module_ids for _, opt in self.get_optimizers_for_module(mid)]

    def _amp_build_lr_schedulers(self) -> None:
        # RLlib's TorchLearner.apply_gradients builds the torch lr schedulers lazily, mixed
        # with its optimizer steps; this is that part alone, same order and same replacement
        # of a module's dict. tests/unit/test_rllib_api.py pins RLlib's method by hash.
        classes = self._lr_scheduler_classes
        if classes is None:
            return
        for module_id, optimizer_names in self._module_optimizers.items():
            for optimizer_name in optimizer_names:
                if optimizer_name in self._lr_schedulers.get(module_id, {}):
                    continue
                optim = self.get_optimizer(module_id, optimizer_name)
                per_module = classes[module_id] if isinstance(classes, dict) else classes
                self._lr_schedulers[module_id] = {optimizer_name: [c(optim) for c in per_module]}

    @override(TorchLearner)
    def _make_batch_if_necessary(self, training_data: TrainingData) -> TrainingData:
        if not self.amp_enabled or training_data.episodes is None:
            return super()._make_batch_if_necessary(training_data)
        assert self._amp_precision is not None
        with value_pass(self._amp_precision, list(self.module.values())):
            return super()._make_batch_if_necessary(training_data)

    @override(Learner)
    def _create_iterator_if_necessary(self, **kwargs: object) -> Iterable:
        iterator = super()._create_iterator_if_necessary(**kwargs)
        return gather_minibatches(iterator) if self.amp_enabled else iterator

    @override(Learner)
    def update(self, *args: object, **kwargs: object) -> ResultDict:
        result = super().update(*args, **kwargs)
        if self.amp_enabled and isinstance(self, IMPALALearner):
            # RLlib's learner thread queues K results per call (APPO trains each batch K
            # times) and this call took one: without the rest, reported values lag ever more.
            result = collect_pending(
                self._learner_thread_out_queue,
                result,
                stats_cls_lookup=self.config.stats_cls_lookup,
            )
        return result

    @override(TorchLearner)
    def after_gradient_based_update(self, *, timesteps: dict[str, object]) -> None:
        super().after_gradient_based_update(timesteps=timesteps)
        report_update(
            self.metrics,
            self.amp_scalers,
            # Asynchronous learners (IMPALA-style) feed several update results into one iteration.
            merged_results=self.config.num_learners > 1 or isinstance(self.config, IMPALAConfig),
            trial=self._amp_trial,
        )

    @override(TorchLearner)
    def get_state(
        self,
        components: str | Collection[str] | None = None,
        *,
        not_components: str | Collection[str] | None = None,
        **kwargs: object,
    ) -> StateDict:
        state = super().get_state(components, not_components=not_components, **kwargs)
        if self.amp_scalers and self._check_component(AMP_STATE_KEY, components, not_components):
            state[AMP_STATE_KEY] = scaler_state(self.amp_scalers)
        return state

    @override(TorchLearner)
    def restore_from_path(
        self,
        path: str | pathlib.Path,
        *,
        component: str | None = None,
        filesystem: pyarrow.fs.FileSystem | None = None,
        **kwargs: object,
    ) -> None:
        # Before RLlib loads anything: Learner / LearnerGroup restores, and learners on other
        # nodes (a copy of their own folder only); an Algorithm restore checked it all already.
        required = (
            rllib_restore_files(self, path, filesystem=filesystem) if component is None else []
        )
        verify_checkpoint(
            path, filesystem=filesystem, announce_missing_manifest=False, required=required
        )
        super().restore_from_path(path, component=component, filesystem=filesystem, **kwargs)

    @override(TorchLearner)
    def set_state(self, state: StateDict) -> None:
        super().set_state(state)
        full = COMPONENT_OPTIMIZER in state
        if full and self.amp_enabled and isinstance(self, IMPALALearner):
            # Results of updates made before the restore describe the replaced state.
            discard_pending(getattr(self, "_learner_thread_out_queue", None))
        if full:
            set_adam_fusing(self._amp_module_optimizers(), fused=self.amp_enabled)
        restore_scaler_state(self.amp_scalers, state, amp_enabled=self.amp_enabled, full=full)
