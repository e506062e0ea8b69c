"""The experiment lock: one command per experiment at a time.

While a command runs an experiment, its folder holds ``rllib_amp.lock``, naming the host and
pid, so that a second command on it (the same ``--name`` started twice, a ``--resume`` while
it runs) is refused with exit 2 and one line. On a local path or a shared mount the lock is
``filelock.FileLock`` (the OS releases it when its process dies, however it dies); an object
store has no lock, so there the file is created if absent and judged by its pid.

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
from typing import Any

import filelock
import pyarrow.fs

from rllib_amp import fs as files
from rllib_amp.cli import UsageError

LOCK_FILE = "rllib_amp.lock"
# The locks this process holds (their locations), taken under ``locks_released``.
_held: list[str] = []
# Of those, the local and mounted ones: their filelock.FileLock, held until ``unlock``.
_local_locks: dict[str, filelock.BaseFileLock] = {}
# Local folders that a lock created (removed with the lock when the run left nothing in them).
_made_folders: set[str] = set()


@contextlib.contextmanager
def locks_released() -> Iterator[None]:
    """Releases, on the way out (an error, Ctrl-C, SIGTERM included), every experiment lock
    ``lock`` took within it."""
    start = len(_held)
    try:
        yield
    finally:
        while len(_held) > start:
            unlock(_held.pop())


def lock(storage: str, name: str, where: str = "--name") -> None:
    """Takes experiment ``name``'s lock, or refuses (UsageError, exit 2) naming the run that
    holds it. Released by ``unlock`` or on leaving ``locks_released``.

    Local and mounted storage: ``filelock.FileLock(...).acquire(timeout=0)``; a lock file
    that no process holds (its command was killed) is taken over, with a line saying so. An
    object store has no lock: there the file is created if absent (a check, then a write:
    two commands started within the same moment are not told apart) and taken over once its
    pid is no longer alive on this host; a lock from another host is never judged stale."""
    location = files.join(storage, name, LOCK_FILE)
    fs, path = files.resolve(location)
    local = isinstance(fs, pyarrow.fs.LocalFileSystem)
    # A folder the lock itself brings into being goes with it: a start refused later (storage
    # unreachable from a node, say) leaves nothing behind.
    new_folder = not files.is_uri(location) and not os.path.exists(os.path.dirname(path))
    for _ in range(3):
        owner = _owner(fs, path)
        if _live(fs, owner):
            raise UsageError(_locked_message(storage, name, where, owner or {}))
        taken = _take_local(name, location, path) if local else _take_remote(name, fs, path, owner)
        if taken:
            _held.append(location)
            if new_folder:
                _made_folders.add(os.path.dirname(location))
            return
    raise UsageError(_locked_message(storage, name, where, _owner(fs, path) or {}))


def check_unlocked(storage: str, name: str, where: str) -> None:
    """Exit 2 when a live run holds experiment ``name``'s lock (before any other check, so
    the answer names the run that has it, not what it wrote)."""
    try:
        fs, path = files.resolve(files.join(storage, name, LOCK_FILE))
        owner = _owner(fs, path)
    except (OSError, ValueError):
        return  # unreachable storage: the run's check_writable names it
    if _live(fs, owner):
        raise UsageError(_locked_message(storage, name, where, owner or {}))


def unlock(location: str) -> None:
    """Removes the lock at ``location`` if this process holds it."""
    with contextlib.suppress(ValueError):
        _held.remove(location)
    held = _local_locks.pop(location, None)
    with contextlib.suppress(OSError, ValueError):
        fs, path = files.resolve(location)
        if held is not None or _owner(fs, path) == _me():
            files.delete_file(fs, path)  # before the release: nobody else has it open yet
    if held is not None:
        held.release()
    folder = os.path.dirname(location)
    if folder in _made_folders:
        _made_folders.discard(folder)
        with contextlib.suppress(OSError):
            os.rmdir(folder)  # only if empty: a run's files keep it


def _live(fs: Any, owner: dict[str, Any] | None) -> bool:
    """Whether ``owner`` (``_owner``'s answer) still runs: a local lock is held by a live
    process by definition; an object store's is judged by its pid (``_is_stale``)."""
    if owner is None:
        return False
    return isinstance(fs, pyarrow.fs.LocalFileSystem) or not (owner and _is_stale(owner))


def _say_taken_over(name: str, owner: dict[str, Any], location: str) -> None:
    if owner.get("pid") is not None and owner != _me():
        print(
            f"{name}: taking over the lock of pid {owner['pid']}, which is no longer running "
            f"({location})"
        )


def _take_local(name: str, location: str, path: str) -> bool:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    held = filelock.FileLock(path)
    try:
        held.acquire(timeout=0)
    except filelock.Timeout:
        return False  # taken in between: its owner is named at the next look
    # Its holder removed it as we took it: look again. (filelock opens the path with its
    # folder resolved, as realpath does, which differs for /proc/PID/root/... paths.)
    if not os.path.exists(os.path.realpath(path)):
        held.release()
        return False
    with contextlib.suppress(OSError):  # a file left by a command that was killed
        _say_taken_over(
            name, _decoded(files.read_bytes(pyarrow.fs.LocalFileSystem(), path)), location
        )
    with open(path, "w") as f:  # ours now: the owner a refusal names
        json.dump(_me(), f)
    _local_locks[location] = held
    return True


def _take_remote(name: str, fs: Any, path: str, stale: dict[str, Any] | None) -> bool:
    """Creates the lock file if absent. pyarrow's object stores offer no conditional put:
    a check, then a write, so two callers within the same moment can both get True."""
    if stale:
        _say_taken_over(name, stale, files.display_path(fs, path))
        files.delete_file(fs, path)
    elif files.exists(fs, path):
        return False
    files.write_bytes(fs, path, json.dumps(_me()).encode())
    return True


def _owner(fs: Any, path: str) -> dict[str, Any] | None:
    """Who holds the lock at ``path``: None when nobody does, ``{"host": ..., "pid": ...}``
    (``_is_stale`` judges it on an object store), or ``{}`` for a lock being written or
    unreadable (judged live: its owner may be writing it right now)."""
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        if not os.path.exists(path):
            return None
        probe = filelock.FileLock(path)
        try:
            probe.acquire(timeout=0)
        except (filelock.Timeout, PermissionError):  # held (or another user's): it names them
            pass
        else:
            probe.release()
            return None
    try:
        data = files.read_bytes(fs, path)
    except OSError:
        if not files.exists(fs, path):  # object stores' "no such key" is not always typed
            return None
        raise
    return _decoded(data)


def _decoded(data: bytes) -> dict[str, Any]:
    try:
        owner = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        return {}
    return owner if isinstance(owner, dict) else {}


def _me() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid()}


def _is_stale(owner: dict[str, Any]) -> bool:
    pid = owner.get("pid")
    if owner.get("host") != socket.gethostname() or not isinstance(pid, int) or pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:
        return False  # alive, another user's
    return False


def _locked_message(storage: str, name: str, where: str, owner: dict[str, Any]) -> str:
    location = files.join(storage, name, LOCK_FILE)
    who = (
        f"pid {owner['pid']} on {owner['host']}"
        if {"pid", "host"} <= owner.keys()
        else "another command (its lock is being written or unreadable)"
    )
    return (
        f"{where}: experiment {name!r} at {files.join(storage, name)} is in use by {who}; "
        f"wait for it to end, or stop it (SIGINT or SIGTERM; --resume continues it later). If "
        f"that run is gone, delete {location}"
    )
