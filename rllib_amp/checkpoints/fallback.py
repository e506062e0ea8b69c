"""Resuming past a damaged checkpoint: the newest intact one of a trial, and Tune pointed at it.

A Tune trial resumes from the latest checkpoint recorded in the experiment state
(``experiment_state-*.json``). When that checkpoint is damaged (a node died mid-upload, a
disk filled up, bit rot), the restore fails with ``CheckpointError`` on every retry.

- ``newest_intact_checkpoint(trial_dir)`` reads a trial's ``checkpoint_NNNNNN`` folders newest
  first (``checkpoint_files.verify_checkpoint``) and returns the first intact one with the
  damaged ones it skipped. With ``move_damaged=True`` those are renamed to
  ``checkpoint_NNNNNN.damaged``: kept for inspection, never deleted.
- ``resume_from_intact_checkpoints(experiment_dir)`` does that for every trial and rewrites
  the experiment state so that Tune restores each trial from its intact checkpoint. The old
  state file is kept next to it as ``experiment_state-*.json.before-fallback`` (a later
  fallback's as ``.before-fallback.1``, ``.2``, ...: never overwritten). Call it
  before ``Tuner.restore``.

Both take a local folder or a pyarrow URI (``s3://``, ``gs://``, ``file://``).

Example:
    >>> choice = newest_intact_checkpoint("/runs/sweep/PPO_CartPole-v1_0")  # doctest: +SKIP
    >>> choice.intact, [d.path for d in choice.damaged]  # doctest: +SKIP
    ('/runs/sweep/PPO_CartPole-v1_0/checkpoint_000001', ['.../checkpoint_000002'])
"""

from __future__ import annotations

import json
import logging
import posixpath
from dataclasses import dataclass
from typing import Any

import pyarrow.fs

from rllib_amp.checkpoint_files import MANIFEST_FILE_NAME, CheckpointError, verify_checkpoint
from rllib_amp.fs import (
    EXPERIMENT_STATE_GLOB,
    checkpoint_folders,
    display_path,
    experiment_state_file,
    is_dir,
    is_file,
    read_bytes,
    resolve,
)
from rllib_amp.log_events import event

logger = logging.getLogger(__name__)

DAMAGED_SUFFIX = ".damaged"
STATE_BACKUP_SUFFIX = ".before-fallback"


@dataclass(frozen=True)
class DamagedCheckpoint:
    """A checkpoint folder that failed verification.

    ``file``: the damaged file; ``reason``: CheckpointError's message; ``moved_to``: its new
    name when it was moved aside, else None; ``problem``: what is wrong with the file, without
    its path or advice.
    """

    path: str
    file: str
    reason: str
    moved_to: str | None = None
    problem: str = ""


@dataclass(frozen=True)
class CheckpointChoice:
    """The newest intact checkpoint of a trial folder (None if none is) and the newer damaged
    ones skipped to reach it, newest first."""

    trial_dir: str
    intact: str | None
    damaged: tuple[DamagedCheckpoint, ...] = ()

    def describe(self) -> str:
        """One line naming the damaged checkpoints and the one used instead.

        Example:
            >>> CheckpointChoice("t", "t/checkpoint_000001", ()).describe()
            't: resuming from t/checkpoint_000001'
        """
        if not self.damaged:
            return f"{self.trial_dir}: resuming from {self.intact or '(no checkpoint)'}"
        skipped = "; ".join(
            d.reason + (f" (kept as {d.moved_to})" if d.moved_to else "") for d in self.damaged
        )
        if self.intact is None:
            return (
                f"{self.trial_dir}: no intact checkpoint, the trial cannot resume from one: "
                f"{skipped}"
            )
        return (
            f"{self.trial_dir}: resuming from {self.intact} instead of the damaged "
            f"{', '.join(d.path for d in self.damaged)}: {skipped}"
        )


def newest_intact_checkpoint(
    trial_dir: Any,
    *,
    filesystem: pyarrow.fs.FileSystem | None = None,
    move_damaged: bool = False,
) -> CheckpointChoice:
    """The newest checkpoint of a Tune trial folder that passes ``verify_checkpoint``.

    Checkpoints are read newest first (by their ``checkpoint_NNNNNN`` index) until one is
    intact; older ones are not read. With ``move_damaged=True`` and an intact checkpoint
    found, the damaged ones are renamed to ``<name>.damaged`` (``.damaged-2``, ... if taken);
    nothing is deleted. Without an intact checkpoint nothing is moved. FileNotFoundError if
    ``trial_dir`` is no folder.

    Example:
        >>> newest_intact_checkpoint("s3://bucket/sweep/trial_0").intact  # doctest: +SKIP
        's3://bucket/sweep/trial_0/checkpoint_000003'
    """
    fs, root = resolve(trial_dir, filesystem)
    if not is_dir(fs, root):
        raise FileNotFoundError(f"{display_path(fs, root)}: no such trial folder")
    damaged: list[tuple[str, CheckpointError]] = []
    intact = None
    folders = checkpoint_folders(fs, root)
    for i, folder in enumerate(folders):
        try:
            verified = verify_checkpoint(folder, filesystem=fs, announce_missing_manifest=False)
            if verified is not None and verified.manifest is None:
                _check_not_cut_off(fs, folder, folders[i + 1 :])
        except CheckpointError as e:
            damaged.append((folder, e))
            continue
        intact = display_path(fs, folder)
        break
    move = move_damaged and intact is not None
    skipped = tuple(
        DamagedCheckpoint(
            display_path(fs, folder),
            e.path,
            str(e),
            _move_aside(fs, folder) if move else None,
            e.problem or str(e),
        )
        for folder, e in damaged
    )
    return CheckpointChoice(display_path(fs, root), intact, skipped)


def _check_not_cut_off(fs: Any, folder: str, older: list[str]) -> None:
    """CheckpointError for a checkpoint without a manifest in a trial whose older
    checkpoints have one: rllib-amp writes the manifest into every checkpoint before Tune
    uploads it, so this upload was cut off (a full disk, a killed process) and files that
    parse may still be missing."""
    manifest = MANIFEST_FILE_NAME
    witness = next((o for o in older if is_file(fs, posixpath.join(o, manifest))), None)
    if witness is None:
        return
    problem = (
        f"is missing while the trial's older {posixpath.basename(witness)} has one: the "
        f"checkpoint's save or upload was cut off (a full disk, a killed process)"
    )
    shown = display_path(fs, posixpath.join(folder, manifest))
    raise CheckpointError(
        f"{shown}: checkpoint file {problem}; nothing was restored. Restore from another "
        f"checkpoint.",
        path=shown,
        problem=problem,
    )


def _free_backup_path(fs: Any, state_path: str) -> str:
    """``<state>.before-fallback``, else the first free ``<state>.before-fallback.N`` (N = 1, 2,
    ...): every fallback keeps its own backup, none overwrites an earlier one."""
    target, n = state_path + STATE_BACKUP_SUFFIX, 0
    while fs.get_file_info(target).type != pyarrow.fs.FileType.NotFound:
        n += 1
        target = f"{state_path}{STATE_BACKUP_SUFFIX}.{n}"
    return target


def _move_aside(fs: Any, folder: str) -> str:
    target, n = folder + DAMAGED_SUFFIX, 1
    while fs.get_file_info(target).type != pyarrow.fs.FileType.NotFound:
        n += 1
        target = f"{folder}{DAMAGED_SUFFIX}-{n}"
    try:
        fs.move(folder, target)
    except (OSError, NotImplementedError):
        # Object stores have no folder rename: copy every file, then remove the originals.
        pyarrow.fs.copy_files(folder, target, source_filesystem=fs, destination_filesystem=fs)
        fs.delete_dir(folder)
    return display_path(fs, target)


class NoIntactCheckpointError(CheckpointError):
    """Trials Tune would resume have no intact checkpoint left: a resume would fail on every
    retry. ``stranded``: one CheckpointChoice per such trial (``intact`` None)."""

    def __init__(self, stranded: tuple[CheckpointChoice, ...]) -> None:
        self.stranded = stranded
        names = ", ".join(posixpath.basename(c.trial_dir) for c in stranded)
        damaged = "; ".join(
            f"{posixpath.basename(d.path)}/{posixpath.basename(d.file)} {d.problem or d.reason}"
            for c in stranded
            for d in c.damaged
        )
        super().__init__(
            " ".join(f"trial {names} has no intact checkpoint left ({damaged})".split()),
            stranded[0].damaged[0].file if stranded[0].damaged else "",
        )

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.stranded,))


def resume_from_intact_checkpoints(
    experiment_dir: Any,
    *,
    filesystem: pyarrow.fs.FileSystem | None = None,
    restart_damaged: bool = False,
) -> list[CheckpointChoice]:
    """Points a Tune experiment's trials at their newest intact checkpoints before a resume.

    For each trial folder with checkpoints: finds the newest intact one, moves the damaged
    newer ones aside (``<name>.damaged``) and records the intact one as the trial's latest
    checkpoint in the newest ``experiment_state-*.json``, so that ``Tuner.restore`` resumes
    from it. The previous state file is kept with the suffix ``.before-fallback`` (or
    ``.before-fallback.N``, the first free N, when an earlier fallback's backup is there). Logs one
    WARNING per trial that falls back. Returns one CheckpointChoice per trial folder with
    checkpoints. FileNotFoundError if the folder holds no experiment state.

    A trial Tune would resume (not finished, not errored) from a checkpoint when none of its
    checkpoints is intact: NoIntactCheckpointError, before anything is moved or rewritten.
    With ``restart_damaged=True`` such a trial instead loses its checkpoint record, so Tune
    runs it again from its first iteration; its damaged checkpoints are moved aside too.

    Example:
        >>> for c in resume_from_intact_checkpoints("/runs/sweep"):  # doctest: +SKIP
        ...     if c.damaged:
        ...         print(c.describe())
    """
    fs, root = resolve(experiment_dir, filesystem)
    state_path = _newest_experiment_state(fs, root)
    choices, fs_paths = [], {}
    for info in fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=False)):
        if info.type == pyarrow.fs.FileType.Directory and checkpoint_folders(fs, info.path):
            choices.append(newest_intact_checkpoint(info.path, filesystem=fs))
            fs_paths[choices[-1].trial_dir] = info.path
    no_intact = {
        posixpath.basename(c.trial_dir): c for c in choices if c.damaged and c.intact is None
    }
    original = read_bytes(fs, state_path)
    state = json.loads(original)
    stranded = [no_intact[t] for t in _trials_resumed_from_a_checkpoint(state) if t in no_intact]
    if stranded and not restart_damaged:
        raise NoIntactCheckpointError(tuple(stranded))
    restarted = {posixpath.basename(c.trial_dir) for c in stranded}
    # Damaged checkpoints of a trial with none intact stay in place unless that trial starts
    # again: they are all it has.
    choices = [
        _moved_aside(fs, fs_paths[c.trial_dir], c)
        if c.intact is not None or posixpath.basename(c.trial_dir) in restarted
        else c
        for c in choices
    ]
    repoint = {
        posixpath.basename(c.trial_dir): c
        for c in choices
        if c.damaged and (c.intact is not None or posixpath.basename(c.trial_dir) in restarted)
    }
    if repoint and _repoint_experiment_state(state, repoint):
        with fs.open_output_stream(_free_backup_path(fs, state_path)) as f:
            f.write(original)
        with fs.open_output_stream(state_path) as f:
            f.write(json.dumps(state).encode("utf-8"))
    for c in choices:
        if c.damaged:
            restart = posixpath.basename(c.trial_dir) in restarted
            logger.warning(
                "rllib_amp: %s",
                (
                    f"{c.trial_dir}: no intact checkpoint, the trial runs again from scratch "
                    f"(--restart-damaged): "
                    + "; ".join(f"{d.reason} (kept as {d.moved_to})" for d in c.damaged)
                )
                if restart
                else c.describe(),
                extra=event(
                    "checkpoint_fallback",
                    trial_dir=c.trial_dir,
                    intact=c.intact,
                    damaged=[d.path for d in c.damaged],
                    files=[d.file for d in c.damaged],
                    moved_to=[d.moved_to for d in c.damaged],
                ),
            )
    return choices


def _moved_aside(fs: Any, fs_trial_dir: str, choice: CheckpointChoice) -> CheckpointChoice:
    moved = tuple(
        DamagedCheckpoint(
            d.path,
            d.file,
            d.reason,
            _move_aside(fs, posixpath.join(fs_trial_dir, posixpath.basename(d.path))),
            d.problem,
        )
        for d in choice.damaged
    )
    return CheckpointChoice(choice.trial_dir, choice.intact, moved)


def _trials_resumed_from_a_checkpoint(state: dict[str, Any]) -> list[str]:
    """The folder names of the trials Tune would restore from a recorded checkpoint on a
    resume: neither finished nor errored (Tune reruns neither by default)."""
    from ray.tune.trainable.metadata import _TrainingRunMetadata

    names = []
    for entry in state["trial_data"]:
        status = json.loads(entry[0]).get("status")
        if status in ("TERMINATED", "ERROR"):
            continue
        manager: Any = _TrainingRunMetadata.from_json_state(entry[1]).checkpoint_manager
        latest = manager.latest_checkpoint_result if manager is not None else None
        if latest is not None:
            names.append(_folder_of(latest))
    return names


def _folder_of(result: Any) -> str:
    return posixpath.basename(posixpath.dirname(result.checkpoint.path.rstrip("/")))


def _newest_experiment_state(fs: Any, root: str) -> str:
    # Tune resumes from the newest state file (rllib_amp.fs.experiment_state_file).
    path = experiment_state_file(fs, root)
    if path is None:
        raise FileNotFoundError(
            f"{display_path(fs, root)}: no {EXPERIMENT_STATE_GLOB} here, so no Tune experiment "
            f"to resume; pass the experiment folder (storage path / name)"
        )
    return path


def _repoint_experiment_state(state: dict[str, Any], choices: dict[str, CheckpointChoice]) -> bool:
    """Makes each listed trial's latest checkpoint in Tune's experiment state the intact one
    (none, for a trial with no intact checkpoint: it starts again); True if it changed."""
    # Tune's own (private) class reads and writes a trial's run metadata, so that its format
    # round-trips; the rest of the file is plain JSON.
    from ray.tune.trainable.metadata import _TrainingRunMetadata

    changed = False
    for entry in state["trial_data"]:
        metadata = _TrainingRunMetadata.from_json_state(entry[1])
        manager: Any = metadata.checkpoint_manager
        if manager is not None and _repoint_trial(manager, choices):
            metadata.checkpoint_manager = manager  # drops its cached JSON
            entry[1] = metadata.get_json_state()
            changed = True
    return changed


def _repoint_trial(manager: Any, choices: dict[str, CheckpointChoice]) -> bool:
    """Edits one trial's Tune checkpoint manager; True if it changed."""
    from ray.train import Checkpoint
    from ray.train._internal.session import _TrainingResult

    def name(result: Any) -> str:
        return posixpath.basename(result.checkpoint.path.rstrip("/"))

    latest = manager.latest_checkpoint_result
    if latest is None:
        return False
    folder = posixpath.dirname(latest.checkpoint.path.rstrip("/"))
    choice = choices.get(posixpath.basename(folder))
    if choice is None:
        return False
    damaged = {posixpath.basename(d.path) for d in choice.damaged}
    if name(latest) not in damaged:
        return False  # Tune never recorded the damaged ones: it resumes from an intact one
    if choice.intact is None:
        # No checkpoint to restore: Tune starts the trial's actor afresh.
        manager._checkpoint_results = []
        manager._latest_checkpoint_result = None
        return True
    intact_name = posixpath.basename(choice.intact)
    kept = [r for r in manager._checkpoint_results if name(r) not in damaged]
    intact = next((r for r in kept if name(r) == intact_name), None)
    if intact is None:
        # On disk but no longer in Tune's records: Algorithm.set_state restores the
        # iteration count from the checkpoint itself.
        intact = _TrainingResult(
            checkpoint=Checkpoint(
                path=posixpath.join(folder, intact_name), filesystem=latest.checkpoint.filesystem
            ),
            metrics={},
        )
        kept.append(intact)
    manager._checkpoint_results = kept
    manager._latest_checkpoint_result = intact
    return True
