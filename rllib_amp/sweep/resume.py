"""Experiment names, reruns and the resume rules.

A run without ``--name`` gets the file's name and its start time
(``cartpole_ppo_amp_2026-12-01_16-20-03``), so running the same command again starts a new
run beside the old one. ``--resume`` without ``--name`` continues the newest run of that file
in the storage. An explicit ``--name`` that already exists is refused: a new Tune experiment
in that folder would replace results.parquet and orphan the old trials' checkpoints. A run
that finished (every trial TERMINATED in Tune's experiment state, results.parquet written) is
not to be continued: a rerun of its ``--name`` is refused naming its results, and its
``--resume`` says where they are and ends with exit 0 (``Finished``).

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
import os
import posixpath
import re
import shlex
from typing import Any

import pyarrow.fs

from rllib_amp import fs as files
from rllib_amp.checks import dotted
from rllib_amp.cli import UsageError, root_error
from rllib_amp.sweep.lock import LOCK_FILE, check_unlocked, lock, unlock

# The resolved experiment of the first start, beside results.parquet: --resume compares to it.
EXPERIMENT_FILE = "experiment.yaml"
# Keys of the resolved experiment that may change between a run and its --resume.
UNCOMPARED_KEYS = ("storage_path",)
# Sorts as text in time order, and is a valid folder name everywhere (no ':').
STAMP_FORMAT = "%Y-%m-%d_%H-%M-%S"
_STAMP = r"\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d"
_NAME = re.compile(r"[\w][\w.+=-]{0,199}")
# Tries at a fresh name before giving up: each failed try means another run took that name.
_MAX_NAME_TRIES = 1000
# Beside the experiment's trials once its summary is written (written by sweep.main).
RESULTS_FILE = "results.parquet"


def check_name(name: str, where: str = "--name") -> None:
    """An experiment name is one folder name under the storage path, never a path: UsageError
    for ``''``, ``.``, ``..``, ``a/b``, ``../../x`` or characters a URI would misread.

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
    """``base_<when>`` (default: now); the ``n``-th run that starts within the same second
    gets ``_n``. Looks at no storage: ``new_run_name`` makes sure no run has the name."""
    when = when or datetime.datetime.now()
    name = f"{base}_{when.strftime(STAMP_FORMAT)}"
    return name if n == 1 else f"{name}_{n}"


def runs_of(base: str, storage: str) -> list[str]:
    """The names of the runs of file ``base`` in ``storage``, oldest first: the timestamped
    ones, after a plain ``base`` (the name every run had before names carried a time)."""
    pattern = re.compile(rf"{re.escape(base)}(?:_({_STAMP})(?:_(\d+))?)?")
    fs, path = files.resolve(storage)
    try:
        entries = fs.get_file_info(pyarrow.fs.FileSelector(path, allow_not_found=True))
    except OSError:
        return []
    keyed = []
    for entry in entries:
        match = pattern.fullmatch(entry.base_name)
        if match and entry.type == pyarrow.fs.FileType.Directory:
            stamp, n = match.groups()
            keyed.append(((stamp or "", int(n or 1)), entry.base_name))
    return [name for _, name in sorted(keyed)]


def newest_run(base: str, storage: str) -> str | None:
    """The newest run of file ``base`` in ``storage`` that holds anything, or None.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     for run in ("tiny_2026-12-01_16-20-03", "tiny_2026-12-01_16-20-03_2"):
        ...         os.makedirs(os.path.join(d, run, "trial"))
        ...     newest_run("tiny", d)
        'tiny_2026-12-01_16-20-03_2'
    """
    for name in reversed(runs_of(base, storage)):
        if taken(files.join(storage, name)):
            return name
    return None


def new_run_name(base: str, storage: str) -> str:
    """A name no run in ``storage`` has: ``base`` and the time now, ``_2``, ``_3``... for
    further starts within the same second. On a local path the run's folder is created here,
    atomically, so two commands started at once never share a folder (an object store has no
    folders to create: there, the check is all there is)."""
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
    """Removes the folder ``new_run_name`` made if the run left nothing in it (it failed
    before Tune wrote), so an empty folder is never taken for a run."""
    unlock(files.join(storage, name, LOCK_FILE))
    if files.is_uri(storage):
        return
    # It holds the run's files, or is gone: either way it stays as it is.
    with contextlib.suppress(OSError):
        os.rmdir(files.join(storage, name))


class Finished(Exception):
    """A ``--resume`` of a run that finished: nothing to continue. Its message is the one line
    to print (it names the run and its results.parquet); the command then ends with exit 0."""


def choose_name(base: str, storage: str, *, name: str | None, resume: bool) -> str | None:
    """The experiment name of this start, or None for a new run of file ``base`` (see
    ``new_run_name``). Exit 2 for a name that is not a folder name, a ``--resume`` with
    nothing to resume, or an explicit ``--name`` already used. ``Finished`` for a
    ``--resume`` of a run that finished."""
    if name is not None:
        check_name(name)
        exp_dir = files.join(storage, name)
        if resume:
            check_unlocked(storage, name, "--resume")
        if resume and not can_restore(exp_dir):
            raise UsageError(
                f"--resume: no experiment at {exp_dir}; pass the --name and --storage-path of "
                f"the interrupted run"
            )
        if resume:
            _refuse_finished(name, exp_dir)
        if not resume:
            refuse_taken(storage, name)
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
    done = finished(exp_dir)
    if done is not None:
        trials, results = done
        raise Finished(
            f"--resume: experiment {name!r} at {exp_dir} has finished ({_all(trials)}); "
            f"nothing to continue. Its results: {results}"
        )


def _all(trials: int) -> str:
    return "its one trial" if trials == 1 else f"all {trials} trials"


def finished(exp_dir: str) -> tuple[int, str] | None:
    """``(trials, results.parquet's location)`` when the run at ``exp_dir`` finished: every
    trial TERMINATED in Tune's newest ``experiment_state-*.json`` and its results.parquet
    written. Else None: no run, trials to continue (pending, running, paused, errored), a
    run stopped before its summary (``--resume`` writes it), or storage that cannot be read.
    Reads JSON only: no Ray, no RLlib.

    Example:
        >>> import tempfile
        >>> with tempfile.TemporaryDirectory() as d:
        ...     trial = json.dumps({"status": "TERMINATED"})
        ...     with open(os.path.join(d, "experiment_state-2026.json"), "w") as f:
        ...         _ = f.write(json.dumps({"trial_data": [[trial, "{}"]]}))
        ...     before = finished(d)
        ...     open(os.path.join(d, RESULTS_FILE), "wb").close()
        ...     before, finished(d)[0]
        (None, 1)
    """
    try:
        fs, path = files.resolve(exp_dir)
        state_file = files.experiment_state_file(fs, path)
        if state_file is None:
            return None
        state = json.loads(files.read_bytes(fs, state_file))
        statuses = [json.loads(entry[0]).get("status") for entry in state["trial_data"]]
        results = files.join(exp_dir, RESULTS_FILE)
        if not statuses or any(s != "TERMINATED" for s in statuses):
            return None
        if not files.exists(fs, posixpath.join(path, RESULTS_FILE)):
            return None
    except (OSError, ValueError, KeyError, TypeError, IndexError, AttributeError):
        return None
    return len(statuses), results


def refuse_taken(storage: str, name: str) -> None:
    """Exit 2 when an experiment named ``name`` (given with --name) is already in
    ``storage``: Tune would start a new one in its folder and orphan the old trials."""
    check_unlocked(storage, name, "--name")
    exp_dir = files.join(storage, name)
    done = finished(exp_dir)
    if done is not None:
        trials, results = done
        raise UsageError(
            f"--name: experiment {name!r} at {exp_dir} has already finished ({_all(trials)}); "
            f"its results are in {results}. Start a new run with another --name (or none: the "
            f"default name carries the start time)"
        )
    if taken(exp_dir):
        raise UsageError(
            f"--name: an experiment named {name!r} already exists at {exp_dir}; continue it "
            f"with --resume, or start a new one with another --name (or none: the default "
            f"name carries the start time)"
        )


def run_spec(exp: Any, num_samples: int | None) -> dict[str, Any]:
    """What a run is: the resolved experiment, with --num-samples in it."""
    spec = exp.resolved()
    if num_samples is not None:
        spec["tune"] = {**spec["tune"], "num_samples": num_samples}
    for key in UNCOMPARED_KEYS:
        spec.pop(key, None)
    return spec


def dump(spec: dict[str, Any]) -> bytes:
    import yaml

    return yaml.safe_dump(spec, sort_keys=False).encode()


def changed_keys(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for each dotted key whose value differs."""
    old, new = dotted(stored), dotted(current)

    def show(d: dict[str, Any], k: str) -> str:
        return repr(d[k]) if k in d else "(not set)"

    return [
        f"{k}: {show(old, k)} -> {show(new, k)}"
        for k in dict.fromkeys([*old, *new])
        if old.get(k, ...) != new.get(k, ...)
    ]


def check_unchanged(exp_dir: str, spec: dict[str, Any], accept: bool) -> None:
    """Exit 2 when the experiment differs from the one stored at the first start, unless
    ``accept`` (--accept-changes), which prints what differs and goes on."""
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
            f"with another --name, or pass --accept-changes (trials already created keep "
            f"their settings)"
        )
    if diff:
        print(f"--accept-changes: resuming despite {'; '.join(diff)}")


def resume_command(args: argparse.Namespace, exp: Any, name: str, storage: str) -> str:
    """The command that continues this run: the same file, --set values and sample count."""
    words = ["python", "-m", "rllib_amp.tune", "--config", exp.path, "--name", name]
    words += ["--storage-path", storage]
    for item in args.overrides:
        words += ["--set", item]
    if args.num_samples is not None:
        words += ["--num-samples", str(args.num_samples)]
    if args.address is not None:
        words += ["--address", args.address]
    return " ".join(shlex.quote(w) for w in [*words, "--resume"])


def taken(exp_dir: str) -> bool:
    """Whether an experiment (anything) is at ``exp_dir``. Storage that cannot be reached is
    not judged here: --dry-run touches no storage, and a real run's check_writable names it."""
    try:
        fs, path = files.resolve(exp_dir)
        if files.is_file(fs, path):
            return True
        selector = pyarrow.fs.FileSelector(path, allow_not_found=True, recursive=False)
        # A lone lock is a run that ended before writing anything (its stale lock is taken
        # over): nothing to resume or to lose.
        return any(i.base_name != LOCK_FILE for i in fs.get_file_info(selector))
    except (OSError, ValueError):
        return False


def can_restore(exp_dir: str) -> bool:
    from ray import tune

    try:
        return bool(tune.Tuner.can_restore(exp_dir))
    except (OSError, ValueError):
        return False


@contextlib.contextmanager
def warnings_on_stderr(logger_name: str) -> Any:
    """Within it, the WARNINGs of logger ``logger_name`` are shown as "WARNING ..." on stderr
    whatever logging this process has set up (none: the CLI is the program), and only once."""
    import logging

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
    """Before Tuner.restore: trials whose latest checkpoint is damaged resume from their newest
    intact one (checkpoint_fallback logs a WARNING naming both). Exit 2 for a trial to resume
    with no intact checkpoint left, unless ``restart_damaged`` (--restart-damaged): then it
    runs again from its first iteration."""
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
