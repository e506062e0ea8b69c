"""Algorithm checkpoints that restore all or nothing, and results that always carry the AMP
metrics; ``with_amp`` sets these classes (``rllib_amp.algorithms.amp_algorithm_class``).

RLlib's ``Algorithm.restore_from_path`` (where ``from_checkpoint`` and a Tune trial's restore
end) loads the learner group, then the env runner, then the algorithm's own state, so a
damaged file found on the way leaves half a state replaced. ``AmpAlgorithmMixin`` reads and
checks the whole checkpoint first (``verify_checkpoint``), including every state file
RLlib's restore will read (``rllib_restore_files``); every save writes a manifest of
checksums after RLlib's own files.

A restored algorithm with a replay buffer (DQN) fills it to
``num_steps_sampled_before_learning_starts`` env steps before it updates again, as at a run's
start: RLlib's checkpoints restore the count of steps sampled but not the buffer, so RLlib's DQN
would go on training at once on a nearly empty buffer
(``tests/integration/checkpoints/test_algorithm.py`` pins that).

A Tune trial whose checkpoint is damaged restores the newest intact older one of the same
trial instead (``fallback.intact_checkpoint_before``), on a resume and on Tune's own retries
alike. An iteration in which no update finished (APPO waits for its first batch) gets its
AMP metrics from the scalers as they stand instead of None.

Example:
    >>> from rllib_amp.algorithms import amp_algorithm_class
    >>> from ray.rllib.algorithms.ppo import PPO
    >>> amp_algorithm_class(PPO).__name__
    'AmpPPO'
"""

from __future__ import annotations

import logging
import math
import numbers
import pathlib
from typing import TYPE_CHECKING, Any

import pyarrow.fs
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.core.learner.learner import Learner
from ray.rllib.core.learner.learner_group import LearnerGroup
from ray.rllib.utils.annotations import override
from ray.rllib.utils.checkpoints import Checkpointable
from ray.rllib.utils.metrics import (
    ENV_RUNNER_RESULTS,
    LEARNER_RESULTS,
    NUM_AGENT_STEPS_SAMPLED_LIFETIME,
    NUM_ENV_STEPS_SAMPLED_LIFETIME,
)
from ray.rllib.utils.typing import ResultDict, StateDict
from ray.train import Checkpoint
from ray.tune import Trainable

from rllib_amp.checkpoint_files import (
    CheckpointError,
    Location,
    rllib_restore_files,
    verify_checkpoint,
    write_manifest,
)
from rllib_amp.checkpoints.fallback import intact_checkpoint_before, is_kept_aside
from rllib_amp.fs import display_path, resolve
from rllib_amp.log_events import event

logger = logging.getLogger(__name__)

# Type checkers see the mixin as an Algorithm; at run time it is a plain mixin.
_MixinBase: Any = Algorithm if TYPE_CHECKING else object


class AmpAlgorithmMixin(_MixinBase):
    """Verified restores, a checksum manifest per save and the AMP metrics in every result, for
    any RLlib Algorithm class.

    Use ``rllib_amp.algorithms.amp_algorithm_class(base)`` rather than subclassing by hand.
    """

    @override(Checkpointable)
    def save_to_path(
        self,
        path: Location | None = None,
        *,
        state: StateDict | None = None,
        filesystem: pyarrow.fs.FileSystem | None = None,
        use_msgpack: bool = False,
    ) -> str:
        if path is not None and filesystem is None:
            # Resolved once, so that RLlib and the manifest write to the same place.
            filesystem, path = resolve(path)
        saved = super().save_to_path(
            path, state=state, filesystem=filesystem, use_msgpack=use_msgpack
        )
        write_manifest(saved, filesystem=filesystem)
        return str(saved)

    @override(Algorithm)
    def restore_from_path(
        self,
        path: str | pathlib.Path,
        *,
        component: str | None = None,
        filesystem: pyarrow.fs.FileSystem | None = None,
        **kwargs: object,
    ) -> None:
        # A whole-algorithm restore reads each component's state file: all must be there
        # (with or without a manifest) before RLlib replaces the first of them.
        required = (
            rllib_restore_files(self, path, filesystem=filesystem) if component is None else []
        )
        verify_checkpoint(path, filesystem=filesystem, required=required)
        super().restore_from_path(path, component=component, filesystem=filesystem, **kwargs)
        if component is None:
            self._refill_until = self._refill_target()

    def _refill_target(self) -> int | None:
        """After a whole restore: the steps sampled at which a DQN may update again, as its
        buffer lacks steps (RLlib 2.60's new stack checkpoints no buffer and ignores
        ``store_buffer_in_checkpoints``); None when it holds enough or there is no buffer."""
        config = self.config
        start = getattr(config, "num_steps_sampled_before_learning_starts", None)
        buffer: Any = getattr(self, "local_replay_buffer", None)
        if not (start and buffer is not None and config.enable_env_runner_and_connector_v2):
            return None
        agents = config.count_steps_by == "agent_steps" and hasattr(
            buffer, "get_num_agent_timesteps"
        )
        missing = start - (
            buffer.get_num_agent_timesteps() if agents else buffer.get_num_timesteps()
        )
        if missing <= 0:  # a live algorithm (a PBT exploit that reuses it) keeps its buffer
            return None
        until = self._steps_sampled() + missing
        logger.info(
            "rllib_amp: no checkpoint holds the replay buffer: %s samples %d more steps into it "
            "(num_steps_sampled_before_learning_starts %d) before it updates again",
            type(self).__name__,
            missing,
            start,
            extra=event("replay_refill", steps=missing, until=until),
        )
        return until

    # After a restore: learning starts again once this many steps are sampled (None: as RLlib).
    _refill_until: int | None = None

    @override(Algorithm)
    def training_step(self) -> Any:
        until = self._refill_until
        if until is None:
            return super().training_step()
        # RLlib's DQN compares the steps sampled with this key: shifted, for this step only.
        algo: Any = self
        config = algo.config
        algo.config = config.copy(copy_frozen=False)
        algo.config.num_steps_sampled_before_learning_starts = until
        try:
            return super().training_step()
        finally:
            algo.config = config
            if self._steps_sampled() >= until:
                self._refill_until = None

    def _steps_sampled(self) -> int:
        """The lifetime steps sampled, as RLlib's DQN ``training_step`` counts them."""
        agents = self.config.count_steps_by == "agent_steps"
        key = NUM_AGENT_STEPS_SAMPLED_LIFETIME if agents else NUM_ENV_STEPS_SAMPLED_LIFETIME
        value = self.metrics.peek((ENV_RUNNER_RESULTS, key), default=0)
        return int(sum(value.values()) if isinstance(value, dict) else value)

    @override(Trainable)
    def restore(self, checkpoint_path: Any) -> None:
        # Tune passes its record (a _TrainingResult: a ray.tune.Checkpoint, metrics); a path
        # or Checkpoint from user code is restored as asked.
        checkpoint = getattr(checkpoint_path, "checkpoint", None)
        if not isinstance(checkpoint, Checkpoint):
            return super().restore(checkpoint_path)  # type: ignore[no-any-return]
        fs, path = checkpoint.filesystem, checkpoint.path
        error = None
        # One `--resume` found damaged (resume_from_intact_checkpoints) is not read again.
        if not is_kept_aside(fs, path):
            try:
                return super().restore(checkpoint_path)  # type: ignore[no-any-return]
            except CheckpointError as e:  # raised before anything was loaded
                error = e
        intact = intact_checkpoint_before(fs, path)
        if intact is None and error is not None:
            raise error
        shown = display_path(fs, path)
        fields = event("checkpoint_restore_fallback", damaged=shown, intact=intact)
        if intact is None:
            # Kept aside with no intact one left: `--resume --restart-damaged` asked for this.
            logger.warning(
                "rllib_amp: %s is damaged and no older checkpoint is intact: the trial runs "
                "again from its first iteration",
                shown,
                extra=fields,
            )
            return None
        logger.warning(
            "rllib_amp: restoring %s instead of the damaged %s",
            display_path(fs, intact),
            shown,
            extra=fields,
        )
        # Tune's record, pointed at the intact checkpoint: its time_total_s goes on instead of
        # restarting at 0; the iteration count comes from the checkpoint's own state.
        replacement = type(checkpoint_path)(
            checkpoint=type(checkpoint)(path=intact, filesystem=fs),
            metrics=dict(checkpoint_path.metrics),
        )
        return super().restore(replacement)  # type: ignore[no-any-return]

    # The AMP metric keys the learners report; None until asked, () when AMP is off.
    _amp_metric_keys: tuple[str, ...] | None = None

    @override(Algorithm)
    def step(self) -> ResultDict:
        result: ResultDict = super().step()
        if self._amp_metric_keys != ():
            self._amp_metric_keys = fill_amp_metrics(
                result, self.learner_group, self._amp_metric_keys
            )
        return result


def fill_amp_metrics(
    result: ResultDict, learner_group: LearnerGroup, keys: tuple[str, ...] | None
) -> tuple[str, ...] | None:
    """Gives each module's AMP metric that ``result`` lacks (or holds as None or NaN) its
    scaler's value now. ``keys``: None until the learners were first asked, asked again only
    when one is missing. Returns the keys (() when the learners have no scalers)."""
    learners = result.setdefault(LEARNER_RESULTS, {})
    entries = [v for k, v in learners.items() if k != "__all_modules__" and isinstance(v, dict)]
    if keys and entries and all(_known(entry.get(key)) for entry in entries for key in keys):
        return keys
    answers = learner_group.foreach_learner(_values_now)
    answered = [a.get() for a in answers if a.ok]
    if not answered:
        return keys  # ask again next time
    now: dict[str, dict[str, float]] = next((a for a in answered if a), {})  # DDP: all equal
    for module_id, values in now.items():
        entry = learners.setdefault(module_id, {})
        for key, value in values.items():
            if not _known(entry.get(key)):
                entry[key] = value
    return tuple(next(iter(now.values()), {}))


def _values_now(learner: Learner, _: object = None) -> dict[str, dict[str, float]]:
    values = getattr(learner, "amp_values_without_an_update", dict)
    return values()  # type: ignore[no-any-return]


def _known(value: object) -> bool:
    return isinstance(value, numbers.Real) and not math.isnan(value)
