"""Experiment names and the resume rules: a run without ``--name`` gets the file's name and
its start time, so the same command again starts a new run, and ``--resume`` without
``--name`` continues the newest. A ``--name`` in use is refused (a new Tune experiment there
would orphan the old trials); a finished run is not continued.

Example:
    >>> import datetime
    >>> timestamped("tiny", datetime.datetime(2026, 12, 1, 16, 20, 3))
    'tiny_2026-12-01_16-20-03'
    >>> changed_keys({"amp": {"init_scale": 1.0}}, {"amp": {"init_scale": 2.0}})
    ['amp.init_scale: 1.0 -> 2.0']
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import logging
import os
import posixpath
import re
import shlex
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

import pyarrow.fs

from rllib_amp import fs as files
from rllib_amp.checks import dotted
from rllib_amp.cli import UsageError, root_error
from rllib_amp.sweep.lock import LOCK_FILE, check_unlocked, lock, unlock

if TYPE_CHECKING:
    from rllib_amp.experiment import Experiment

# The resolved experiment of the first start, beside results.parquet: --resume compares to it.
EXPERIMENT_FILE = "experiment.yaml"
STAMP_FORMAT = "%Y-%m-%d_%H-%M-%S"  # sorts in time order; no ':', so a folder name anywhere
_STAMP = r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d"
_NAME = re.compile(r"[\w][\w.+=-]{0,199}")
_MAX_NAME_TRIES = 1000  # each failed try is a name another run took
RESULTS_FILE = "results.parquet"  # beside the trials once sweep.main wrote the summary


def check_name(name: str, where: str = "--name") -> None:
    """UsageError unless ``name`` is one folder name (not ``..``, ``a/b``, what URIs misread).

    Example:
        >>> check_name("cartpole-amp_2")
        >>> check_name("../x")
        Traceback (most recent call last):
        rllib_amp.cli.UsageError: --name: got '../x'; ...
    """
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise UsageError(
            f"{where}: got {name!r}; an experiment name is a folder name, not a path: 1 to 200 "
            f"letters, digits, '.', '_', '-', '+', '=' (not starting with '.' or '-'), e.g. "
            f"--name cartpole-amp; choose the folder with --storage-path"
        )


def timestamped(base: str, when: datetime.datetime | None = None, n: int = 1) -> str:
    """``base_<when>`` (default: now), ``_n`` for the ``n``-th start within that second."""
    when = when or datetime.datetime.now()
    name = f"{base}_{when.strftime(STAMP_FORMAT)}"
    return name if n == 1 else f"{name}_{n}"


def runs_of(base: str, storage: str) -> list[str]:
    """The runs of file ``base`` in ``storage``, oldest first (a plain ``base`` first)."""
    pattern = re.compile(rf"{re.escape(base)}(?:_({_STAMP})(?:_(\d+))?)?")
    fs, path = files.resolve(storage)
    try:
        entries = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    except OSError:
        return []
    folders = (e.base_name for e in entries if e.type == pyarrow.fs.FileType.Directory)
    runs = [match for match in map(pattern.fullmatch, folders) if match]
    return [m[0] for m in sorted(runs, key=lambda m: (m[1] or "", int(m[2] or 1), m[0]))]


def newest_run(base: str, storage: str) -> str | None:
    """The newest run of file ``base`` in ``storage`` that holds anything, or None."""
    held = (n for n in reversed(runs_of(base, storage)) if taken(files.join(storage, n)))
    return next(held, None)


def new_run_name(base: str, storage: str) -> str:
    """A ``timestamped`` name no run in ``storage`` has, locked; on a local path its folder is
    made atomically, so two commands started at once never share one."""
    now = datetime.datetime.now()
    for n in range(1, _MAX_NAME_TRIES + 1):
        name = timestamped(base, now, n)
        location = files.join(storage, name)
        if files.is_uri(storage):
            if not files.exists(*files.resolve(location)):
                with contextlib.suppress(UsageError):  # another run took it just now
                    lock(storage, name)
                    return name
            continue
        try:
            os.makedirs(storage, exist_ok=True)
            os.mkdir(location)
        except FileExistsError:
            continue
        except OSError:
            return name  # not writable: the run's check_writable names the storage and fix
        lock(storage, name)
        return name
    raise UsageError(
        f"--name: {_MAX_NAME_TRIES} runs of {base!r} started at {now:%H:%M:%S} in {storage}; "
        f"pass --name NAME"
    )


def release(storage: str, name: str) -> None:
    """Unlocks a new run and removes its folder if empty (an empty folder is no run)."""
    unlock(files.join(storage, name, LOCK_FILE))
    if not files.is_uri(storage):
        with contextlib.suppress(OSError):  # it holds the run's files, or is gone
            os.rmdir(files.join(storage, name))


class Finished(Exception):
    """A ``--resume`` of a finished run: the line to print, then exit 0."""


def choose_name(base: str, storage: str, *, name: str | None, resume: bool) -> str | None:
    """This start's experiment name (None: a new run of file ``base``), or exit 2 for a bad or
    taken name or nothing to resume, or ``Finished``."""
    if name is not None:
        check_name(name)
        if not resume:
            refuse_taken(storage, name)
            return name
        check_unlocked(storage, name, "--resume")
        exp_dir = files.join(storage, name)
        if not can_restore(exp_dir):
            raise UsageError(
                f"--resume: no experiment at {exp_dir}; pass the --name and --storage-path of "
                f"the interrupted run"
            )
        _refuse_finished(name, exp_dir)
        return name
    check_name(base, "the config file's name")
    if not resume:
        return None
    newest = newest_run(base, storage)
    if newest is None or not can_restore(files.join(storage, newest)):
        where = files.join(storage, newest) if newest else f"{storage} (no folder {base}_<time>)"
        raise UsageError(
            f"--resume: no experiment of {base!r} to continue at {where}; pass the --name "
            f"and --storage-path of the interrupted run"
        )
    check_unlocked(storage, newest, "--resume")
    _refuse_finished(newest, files.join(storage, newest))
    print(f"--resume: continuing the newest run of {base!r}: {newest}")
    return newest


def _refuse_finished(name: str, exp_dir: str) -> None:
    if (done := finished(exp_dir)) is not None:
        raise Finished(
            f"--resume: experiment {name!r} at {exp_dir} has finished ({_all(done[0])}); "
            f"nothing to continue. Its results: {done[1]}"
        )


def _all(trials: int) -> str:
    return "its one trial" if trials == 1 else f"all {trials} trials"


def finished(exp_dir: str) -> tuple[int, str] | None:
    """``(trials, results.parquet's location)`` when every trial is TERMINATED in Tune's newest
    experiment state and results.parquet was written; no Ray, no RLlib."""
    try:
        fs, path = files.resolve(exp_dir)
        if (state_file := files.experiment_state_file(fs, path)) is None:
            return None
        state = json.loads(files.read_bytes(fs, state_file))
        statuses = [json.loads(entry[0]).get("status") for entry in state["trial_data"]]
        ended = set(statuses) == {"TERMINATED"}
        if not ended or not files.exists(fs, posixpath.join(path, RESULTS_FILE)):
            return None
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None
    return len(statuses), files.join(exp_dir, RESULTS_FILE)


def refuse_taken(storage: str, name: str) -> None:
    """Exit 2 when ``storage`` already holds an experiment ``name``."""
    check_unlocked(storage, name, "--name")
    exp_dir = files.join(storage, name)
    if (done := finished(exp_dir)) is not None:
        raise UsageError(
            f"--name: experiment {name!r} at {exp_dir} has already finished ({_all(done[0])}); "
            f"its results are in {done[1]}. Start a new run with another --name (or none: the "
            f"default name carries the start time)"
        )
    if taken(exp_dir):
        raise UsageError(
            f"--name: an experiment named {name!r} already exists at {exp_dir}; continue it "
            f"with --resume, or start a new one with another --name (or none: the default "
            f"name carries the start time)"
        )


def run_spec(exp: Experiment, num_samples: int | None) -> dict[str, object]:
    """The resolved experiment with --num-samples, less storage_path (--resume may move it)."""
    spec = exp.resolved()
    if num_samples is not None:
        spec["tune"] = {**exp.tune, "num_samples": num_samples}
    spec.pop("storage_path", None)
    return spec


def dump(spec: Mapping[str, object]) -> bytes:
    import yaml

    return yaml.safe_dump(dict(spec), sort_keys=False).encode()


def changed_keys(stored: Mapping[str, object], current: Mapping[str, object]) -> list[str]:
    """``key: old -> new`` for each dotted key whose value differs."""
    old, new = dotted(stored), dotted(current)

    def show(d: Mapping[str, object], k: str) -> str:
        return repr(d[k]) if k in d else "(not set)"

    return [
        f"{k}: {show(old, k)} -> {show(new, k)}"
        for k in dict.fromkeys([*old, *new])
        if old.get(k, ...) != new.get(k, ...)
    ]


def check_unchanged(exp_dir: str, spec: Mapping[str, object], accept: bool) -> None:
    """Exit 2 when the experiment differs from the one stored at the first start, unless
    ``accept``: then what differs is printed."""
    import yaml

    location = files.join(exp_dir, EXPERIMENT_FILE)
    fs, path = files.resolve(location)
    if not files.exists(fs, path):
        return  # started before experiments were stored: nothing to compare with
    try:
        stored = yaml.safe_load(files.read_bytes(fs, path))
    except (OSError, yaml.YAMLError) as e:
        raise UsageError(
            f"--resume: cannot read {location} ({root_error(e)}); restore it, or start anew "
            f"with another --name"
        ) from None
    diff = changed_keys(stored if isinstance(stored, dict) else {}, spec)
    if diff and not accept:
        raise UsageError(
            f"--resume: the experiment differs from the one stored at {location}: "
            f"{'; '.join(diff)}; resume with the same file and --set values, start a new run "
            f"with another --name, or pass --accept-changes to resume as first started (the "
            f"changes take no effect)"
        )
    if diff:
        print(
            f"--accept-changes: resuming as first started; these changes take no effect (Tune "
            f"restores the trials, the search and the stop rule as stored): {'; '.join(diff)}; "
            f"to run with them, start a new run with another --name"
        )


def resume_command(args: argparse.Namespace, exp: Experiment, name: str, storage: str) -> str:
    """The command that continues this run: the same file, --set values and sample count."""
    words = ["python", "-m", "rllib_amp.tune", "--config", exp.path, "--name", name]
    words += ["--storage-path", storage]
    for item in args.overrides:
        words += ["--set", item]
    if args.num_samples is not None:
        words += ["--num-samples", str(args.num_samples)]
    if args.address is not None:
        words += ["--address", args.address]
    return shlex.join([*words, "--resume"])


def taken(exp_dir: str) -> bool:
    """Whether anything but a lone lock is at ``exp_dir`` (unreachable: False, for
    check_writable to name)."""
    try:
        fs, path = files.resolve(exp_dir)
        if files.is_file(fs, path):
            return True
        entries = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
        return any(i.base_name != LOCK_FILE for i in entries)
    except (OSError, ValueError):
        return False


def can_restore(exp_dir: str) -> bool:
    from ray import tune

    try:
        return bool(tune.Tuner.can_restore(exp_dir))
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def warnings_on_stderr(logger_name: str) -> Iterator[None]:
    """Within it, the records of logger ``logger_name`` go to stderr only, as "WARNING ..."."""
    logger = logging.getLogger(logger_name)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    propagate, logger.propagate = logger.propagate, False
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def fall_back_to_intact_checkpoints(exp_dir: str, restart_damaged: bool = False) -> None:
    """Before Tuner.restore: a trial whose latest checkpoint is damaged resumes from its newest
    intact one; exit 2 for one with none left, unless ``restart_damaged``."""
    from rllib_amp.checkpoints import fallback as checkpoint_fallback

    try:
        with warnings_on_stderr(checkpoint_fallback.__name__):
            checkpoint_fallback.resume_from_intact_checkpoints(
                exp_dir, restart_damaged=restart_damaged
            )
    except checkpoint_fallback.NoIntactCheckpointError as e:
        raise UsageError(
            f"--resume: {e}; nothing was changed. Start anew with another --name, or pass "
            f"--restart-damaged to run that trial again from its first iteration (its damaged "
            f"checkpoints are kept as checkpoint_NNNNNN{checkpoint_fallback.DAMAGED_SUFFIX})"
        ) from None
    except (OSError, ValueError, KeyError, TypeError) as e:  # TypeError, KeyError: bad state
        raise UsageError(
            f"--resume: cannot read the checkpoints at {exp_dir} ({root_error(e)}); check the "
            f"storage, or start anew with another --name"
        ) from None
