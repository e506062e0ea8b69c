"""The experiment lock: while a command runs an experiment, its folder holds
``rllib_amp.lock`` naming the host and pid, and a second command on it is refused (exit 2).
On a local path or a mount it is a ``filelock.FileLock``, which the OS releases with its
process; an object store has no lock: there the file is created if absent, judged by its pid.

Example:
    >>> import tempfile
    >>> storage = tempfile.mkdtemp()
    >>> with locks_released():
    ...     lock(storage, "exp")
    ...     lock(storage, "exp", "--resume")
    Traceback (most recent call last):
    rllib_amp.cli.UsageError: --resume: experiment 'exp' at ... is in use by pid ...
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
from collections.abc import Iterator

import filelock
import pyarrow.fs

from rllib_amp import fs as files
from rllib_amp.cli import UsageError

LOCK_FILE = "rllib_amp.lock"
# What a lock file holds: {"host": ..., "pid": ...}; {} when being written or unreadable.
Owner = dict[str, object]
# This process's locks: the FileLock (None on an object store), and whether the lock made its
# folder (removed with it while empty: a start refused later leaves nothing).
_held: dict[str, tuple[filelock.BaseFileLock | None, bool]] = {}


@contextlib.contextmanager
def locks_released() -> Iterator[None]:
    """Releases every lock taken in it on the way out, Ctrl-C and SIGTERM included."""
    start = len(_held)
    try:
        yield
    finally:
        while len(_held) > start:
            unlock(next(reversed(_held)))


def lock(storage: str, name: str, where: str = "--name") -> None:
    """Takes experiment ``name``'s lock, or UsageError naming the run that holds it; one left by
    a killed command is taken over with a line saying so."""
    location = files.join(storage, name, LOCK_FILE)
    fs, path = files.resolve(location)
    new_folder = not files.is_uri(location) and not os.path.exists(os.path.dirname(path))
    for _ in range(3):
        if (owner := _holder(fs, path)) is not None:
            break
        if _take(name, location, fs, path, new_folder):
            return
    else:
        owner = _holder(fs, path)
    raise UsageError(_locked_message(storage, name, where, owner or {}))


def check_unlocked(storage: str, name: str, where: str) -> None:
    """Exit 2 when a live run holds experiment ``name``'s lock."""
    try:
        owner = _holder(*files.resolve(files.join(storage, name, LOCK_FILE)))
    except (OSError, ValueError):
        return  # unreachable storage: the run's check_writable names it
    if owner is not None:
        raise UsageError(_locked_message(storage, name, where, owner))


def unlock(location: str) -> None:
    """Removes the lock at ``location`` if this process holds it."""
    held, made_folder = _held.pop(location, (None, False))
    with contextlib.suppress(OSError, ValueError):
        fs, path = files.resolve(location)
        if held is not None or _holder(fs, path) == _me():
            files.delete_file(fs, path)  # before the release: nobody else has it open yet
    if held is not None:
        held.release()
    if made_folder:
        with contextlib.suppress(OSError):
            os.rmdir(os.path.dirname(location))  # only if empty: a run's files keep it


def _take(name: str, location: str, fs: pyarrow.fs.FileSystem, path: str, new_folder: bool) -> bool:
    """Makes this process the lock's owner; False when another took it in between."""
    held = None
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        held = filelock.FileLock(path)
        try:
            held.acquire(timeout=0)
        except filelock.Timeout:
            return False
        # Its holder removed it as we took it: look again. (filelock opens the path with its
        # folder resolved, as realpath does, which differs for /proc/PID/root/... paths.)
        if not os.path.exists(os.path.realpath(path)):
            held.release()
            return False
    elif _holder(fs, path) is not None:  # an object store has no conditional put
        return False
    with contextlib.suppress(OSError):  # a file left by a command that ended
        left = _decoded(files.read_bytes(fs, path))
        if left.get("pid") is not None and left != _me():
            shown = location if held is not None else files.display_path(fs, path)
            print(
                f"{name}: taking over the lock of pid {left['pid']}, which is no longer "
                f"running ({shown})"
            )
    files.write_bytes(fs, path, json.dumps(_me()).encode())  # the owner a refusal names
    _held[location] = (held, new_folder)
    return True


def _holder(fs: pyarrow.fs.FileSystem, path: str) -> Owner | None:
    """The live run holding the lock at ``path`` (``{}``: being written or unreadable), or None
    (no file, a local file no process holds, a stale one)."""
    local = isinstance(fs, pyarrow.fs.LocalFileSystem)
    if local:
        if not os.path.exists(path):
            return None
        # Held (or another user's: PermissionError): the file names the holder.
        with (
            contextlib.suppress(filelock.Timeout, PermissionError),
            filelock.FileLock(path, timeout=0),
        ):
            return None  # no process holds it
    try:
        owner = _decoded(files.read_bytes(fs, path))
    except OSError:
        if not files.exists(fs, path):  # object stores' "no such key" is not always typed
            return None
        raise
    return None if not local and owner and _is_stale(owner) else owner


def _decoded(data: bytes) -> Owner:
    with contextlib.suppress(ValueError):  # UnicodeDecodeError and JSONDecodeError too
        if isinstance(owner := json.loads(data.decode("utf-8")), dict):
            return owner
    return {}


def _me() -> Owner:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _is_stale(owner: Owner) -> bool:
    pid = owner.get("pid")
    if owner.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        pass  # alive, another user's
    return False


def _locked_message(storage: str, name: str, where: str, owner: Owner) -> str:
    who = (
        f"pid {owner['pid']} on {owner['host']}"
        if {"pid", "host"} <= owner.keys()
        else "another command (its lock is being written or unreadable)"
    )
    return (
        f"{where}: experiment {name!r} at {files.join(storage, name)} is in use by {who}; "
        f"wait for it to end, or stop it (SIGINT or SIGTERM; --resume continues it later). If "
        f"that run is gone, delete {files.join(storage, name, LOCK_FILE)}"
    )
