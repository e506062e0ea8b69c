"""Resuming past a damaged checkpoint: the newest intact one of a trial, at restore time.

A Tune trial resumes from the latest checkpoint its experiment state records; when that one is
damaged (a node died mid-upload, a full disk, bit rot), RLlib's restore fails on every retry.

- ``newest_intact_checkpoint(trial_dir)``: the newest ``checkpoint_NNNNNN`` that passes
  ``verify_checkpoint``, and the damaged ones skipped (``move_damaged=True`` renames those to
  ``checkpoint_NNNNNN.damaged``: kept for inspection, never deleted).
- ``intact_checkpoint_before(fs, checkpoint)``: what ``AmpAlgorithmMixin.restore`` restores
  instead of a damaged ``checkpoint``; Tune's experiment state is never rewritten.
- ``resume_from_intact_checkpoints(experiment_dir)``, before ``Tuner.restore``: says which
  trial falls back to which checkpoint, keeps the damaged ones aside, and refuses a resume
  in which a trial has no intact checkpoint at all.

All take a local folder or a pyarrow URI (``s3://``, ``gs://``, ``file://``).

Example:
    >>> choice = newest_intact_checkpoint("/runs/sweep/PPO_CartPole-v1_0")  # doctest: +SKIP
    >>> choice.intact, [d.path for d in choice.damaged]  # doctest: +SKIP
    ('/runs/sweep/PPO_CartPole-v1_0/checkpoint_000001', ['.../checkpoint_000002'])
"""

from __future__ import annotations

import dataclasses
import json
import logging
import posixpath
from dataclasses import dataclass
from typing import Any

import pyarrow.fs

from rllib_amp.checkpoint_files import (
    MANIFEST_FILE_NAME,
    CheckpointError,
    Location,
    verify_checkpoint,
)
from rllib_amp.checkpoint_manifest import fail
from rllib_amp.fs import (
    CHECKPOINT_FOLDER,
    EXPERIMENT_STATE_GLOB,
    checkpoint_folders,
    display_path,
    experiment_state_file,
    is_dir,
    is_file,
    read_bytes,
    resolve,
    write_bytes,
)
from rllib_amp.log_events import event

logger = logging.getLogger(__name__)

DAMAGED_SUFFIX = ".damaged"
# Written into a damaged checkpoint whose copy was kept aside (its text: where the copy is):
# restores pass it over unread. Next to the folder a ".damaged" name could be an older
# folder's, moved aside before Tune wrote a new checkpoint under the same name.
KEPT_ASIDE_FILE = "rllib_amp_kept_aside.txt"


@dataclass(frozen=True)
class DamagedCheckpoint:
    """A checkpoint folder that failed verification: ``file`` the damaged file, ``reason``
    CheckpointError's message, ``moved_to`` where it was moved aside (or None), ``problem``
    what is wrong with the file, without its path or advice."""

    path: str
    file: str
    reason: str
    moved_to: str | None = None
    problem: str = ""


@dataclass(frozen=True)
class CheckpointChoice:
    """A trial's newest intact checkpoint (or None), and the newer damaged ones skipped."""

    trial_dir: str
    intact: str | None
    damaged: tuple[DamagedCheckpoint, ...] = ()

    def describe(self, *, restarted: bool = False) -> str:
        """One line naming the damaged checkpoints and the one used instead (``restarted``:
        none is intact, and the trial runs again from scratch).

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
            then = "cannot resume from one"
            if restarted:
                then = "runs again from scratch (--restart-damaged)"
            return f"{self.trial_dir}: no intact checkpoint, the trial {then}: {skipped}"
        return (
            f"{self.trial_dir}: resuming from {self.intact} instead of the damaged "
            f"{', '.join(d.path for d in self.damaged)}: {skipped}"
        )


def newest_intact_checkpoint(
    trial_dir: Location,
    *,
    filesystem: pyarrow.fs.FileSystem | None = None,
    move_damaged: bool = False,
) -> CheckpointChoice:
    """The newest checkpoint of a Tune trial folder that passes ``verify_checkpoint``.

    Read newest first until one is intact. ``move_damaged=True``: once one is, the damaged
    ones are renamed to ``<name>.damaged`` (``-2``... if taken); nothing is deleted.
    FileNotFoundError if ``trial_dir`` is no folder.

    Example:
        >>> newest_intact_checkpoint("s3://bucket/sweep/trial_0").intact  # doctest: +SKIP
        's3://bucket/sweep/trial_0/checkpoint_000003'
    """
    fs, root = resolve(trial_dir, filesystem)
    if not is_dir(fs, root):
        raise FileNotFoundError(f"{display_path(fs, root)}: no such trial folder")
    found, damaged = _first_intact(fs, checkpoint_folders(fs, root))
    intact = None if found is None else display_path(fs, found)
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


def _first_intact(
    fs: pyarrow.fs.FileSystem, folders: list[str]
) -> tuple[str | None, list[tuple[str, CheckpointError]]]:
    """The first of ``folders`` (newest first) that verifies, and the damaged ones before it."""
    damaged: list[tuple[str, CheckpointError]] = []
    for i, folder in enumerate(folders):
        try:
            verified = verify_checkpoint(folder, filesystem=fs, announce_missing_manifest=False)
            # Without a manifest where the trial's older checkpoints have one: rllib-amp
            # writes it before Tune uploads, so this upload was cut off.
            manifest = MANIFEST_FILE_NAME
            if verified is not None and verified.manifest is None:
                older = (o for o in folders[i + 1 :] if is_file(fs, posixpath.join(o, manifest)))
                if (witness := next(older, None)) is not None:
                    fail(
                        fs,
                        posixpath.join(folder, manifest),
                        f"is missing while the trial's older {posixpath.basename(witness)} has "
                        f"one: the checkpoint's save or upload was cut off (a full disk, a "
                        f"killed process)",
                    )
        except CheckpointError as e:
            damaged.append((folder, e))
            continue
        return folder, damaged
    return None, damaged


def _move_aside(fs: pyarrow.fs.FileSystem, folder: str, *, copy: bool = False) -> str:
    """``folder`` renamed to ``.damaged`` (``-2``... if taken), or copied there once and
    marked (``KEPT_ASIDE_FILE``)."""
    mark = posixpath.join(folder, KEPT_ASIDE_FILE)
    if copy and is_file(fs, mark):
        return read_bytes(fs, mark).decode("utf-8")
    target, n = folder + DAMAGED_SUFFIX, 1
    while fs.get_file_info(target).type != pyarrow.fs.FileType.NotFound:
        n += 1
        target = f"{folder}{DAMAGED_SUFFIX}-{n}"
    if copy:
        pyarrow.fs.copy_files(folder, target, source_filesystem=fs, destination_filesystem=fs)
        write_bytes(fs, mark, display_path(fs, target).encode("utf-8"))
        return display_path(fs, target)
    try:
        fs.move(folder, target)
    except (OSError, NotImplementedError):
        # Object stores have no folder rename: copy every file, then remove the originals.
        pyarrow.fs.copy_files(folder, target, source_filesystem=fs, destination_filesystem=fs)
        fs.delete_dir(folder)
    return display_path(fs, target)


class NoIntactCheckpointError(CheckpointError):
    """Trials Tune would resume have no intact checkpoint left (``stranded``: their choices)."""

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

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        return (type(self), (self.stranded,))


def intact_checkpoint_before(fs: pyarrow.fs.FileSystem, checkpoint: str) -> str | None:
    """The newest intact checkpoint of ``checkpoint``'s trial older than it, else None;
    those a resume found damaged (``is_kept_aside``) are passed over unread.

    Example:
        >>> intact_checkpoint_before(pyarrow.fs.LocalFileSystem(), "/t/checkpoint_000000")
    """
    trial, name = posixpath.split(checkpoint.rstrip("/"))
    index = _index(name)
    older = [
        f
        for f in checkpoint_folders(fs, trial)
        if _index(posixpath.basename(f)) < index and not is_kept_aside(fs, f)
    ]
    return _first_intact(fs, older)[0]


def is_kept_aside(fs: pyarrow.fs.FileSystem, checkpoint: str) -> bool:
    """Whether a resume found ``checkpoint`` damaged and kept a copy of it aside."""
    return is_file(fs, posixpath.join(checkpoint.rstrip("/"), KEPT_ASIDE_FILE))


def _index(name: str) -> int:
    match = CHECKPOINT_FOLDER.match(name)
    return int(match.group(1)) if match else -1


def resume_from_intact_checkpoints(
    experiment_dir: Location,
    *,
    filesystem: pyarrow.fs.FileSystem | None = None,
    restart_damaged: bool = False,
) -> list[CheckpointChoice]:
    """Before a resume: each trial's damaged checkpoints are found, said and kept aside.

    Per trial folder with checkpoints: the newest intact one, the damaged newer ones kept
    aside as ``<name>.damaged`` and one WARNING. Tune's experiment state still names a damaged
    checkpoint; the trial's restore (``AmpAlgorithmMixin.restore``) takes
    ``intact_checkpoint_before`` it. So the damaged ones Tune recorded are copied aside (Tune
    deletes them past ``num_to_keep``); newer ones it never recorded are moved (Tune writes
    its next checkpoint under such a name). FileNotFoundError without an experiment state.

    A trial Tune would resume (not finished, not errored) with no intact checkpoint:
    NoIntactCheckpointError, before anything is kept aside; with ``restart_damaged=True`` its
    damaged checkpoints are kept aside too, and it runs again from its first iteration.

    Example:
        >>> for c in resume_from_intact_checkpoints("/runs/sweep"):  # doctest: +SKIP
        ...     if c.damaged:
        ...         print(c.describe())
    """
    fs, root = resolve(experiment_dir, filesystem)
    # Tune resumes from the newest state file.
    if (state_file := experiment_state_file(fs, root)) is None:
        raise FileNotFoundError(
            f"{display_path(fs, root)}: no {EXPERIMENT_STATE_GLOB} here, so no Tune experiment "
            f"to resume; pass the experiment folder (storage path / name)"
        )
    state = json.loads(read_bytes(fs, state_file))
    choices, fs_paths = [], {}
    for info in fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=False)):
        if info.type == pyarrow.fs.FileType.Directory and checkpoint_folders(fs, info.path):
            choices.append(newest_intact_checkpoint(info.path, filesystem=fs))
            fs_paths[choices[-1].trial_dir] = info.path
    records = _latest_recorded_checkpoints(state["trial_data"])
    stranded = [
        c
        for c in choices
        if c.damaged
        and c.intact is None
        and records.get(posixpath.basename(c.trial_dir), (None, ""))[0] == "resumed"
    ]
    if stranded and not restart_damaged:
        raise NoIntactCheckpointError(tuple(stranded))
    restarted = {c.trial_dir for c in stranded}
    # Damaged checkpoints of a trial with none intact stay as they are unless that trial starts
    # again: they are all it has.
    choices = [
        _kept_aside(fs, fs_paths[c.trial_dir], c, records)
        if c.damaged and (c.intact is not None or c.trial_dir in restarted)
        else c
        for c in choices
    ]
    for c in choices:
        if c.damaged:
            logger.warning(
                "rllib_amp: %s",
                c.describe(restarted=c.trial_dir in restarted),
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


def _kept_aside(
    fs: pyarrow.fs.FileSystem,
    fs_trial_dir: str,
    choice: CheckpointChoice,
    records: dict[str, tuple[str, str]],
) -> CheckpointChoice:
    latest = _index(records.get(posixpath.basename(choice.trial_dir), ("", ""))[1])
    kept = []
    for d in choice.damaged:
        name = posixpath.basename(d.path)
        moved = _move_aside(fs, posixpath.join(fs_trial_dir, name), copy=_index(name) <= latest)
        kept.append(dataclasses.replace(d, moved_to=moved))
    return dataclasses.replace(choice, damaged=tuple(kept))


def _latest_recorded_checkpoints(trial_data: list[list[str]]) -> dict[str, tuple[str, str]]:
    """Trial folder name -> ("resumed" or "done", the folder name of the latest checkpoint
    Tune recorded for it). "done": finished or errored; the refusal leaves those out."""
    # Tune's own (private) class reads a trial's run metadata: its format is Tune's.
    from ray.tune.trainable.metadata import _TrainingRunMetadata

    records = {}
    for entry in trial_data:
        status = json.loads(entry[0]).get("status")
        manager: Any = _TrainingRunMetadata.from_json_state(entry[1]).checkpoint_manager
        latest = manager.latest_checkpoint_result if manager is not None else None
        if latest is not None:
            trial, name = posixpath.split(latest.checkpoint.path.rstrip("/"))
            done = status in ("TERMINATED", "ERROR")
            records[posixpath.basename(trial)] = ("done" if done else "resumed", name)
    return records
