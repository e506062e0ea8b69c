"""Files: the one place that turns a path or URI into a filesystem, and reads, writes, lists
and decodes checkpoint files.

A location is a local path (``~`` expanded, made absolute) or a URI pyarrow opens (``s3://``,
``gs://``, ``file://``, ``abfs://``...). A scheme of one letter is a Windows drive
(``C:/runs``), not a URI. Everything above this module reads and writes files through these
functions, so local folders and object stores behave alike.

Remote filesystems are opened with timeouts (``RLLIB_AMP_REMOTE_TIMEOUT_S``, default 30 s): an
S3 endpoint that never answers, or GCS retrying a credentials lookup, ends in an OSError
instead of a hang of minutes; ``probe`` checks a location within that time, on a helper
thread, so Ctrl-C still works while it waits.

Example:
    >>> is_uri("s3://bucket/exp"), is_uri("C:/runs"), is_uri("runs:2")
    (True, False, False)
    >>> fs, path = resolve("/tmp/run/checkpoint_000001")
    >>> fs.type_name, path
    ('local', '/tmp/run/checkpoint_000001')
    >>> join("s3://b/run?endpoint_override=127.0.0.1:9000&scheme=http", "checkpoint_000001")
    's3://b/run/checkpoint_000001?endpoint_override=127.0.0.1:9000&scheme=http'
"""

from __future__ import annotations

import datetime
import json
import os
import pickle
import posixpath
import re
import signal
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

import pyarrow.fs

T = TypeVar("T")

# Tune's checkpoint folder names (StorageContext): ``checkpoint_000003``, nothing after the
# number, so a folder moved aside (``checkpoint_000003.damaged``) is never one.
CHECKPOINT_FOLDER = re.compile(r"^checkpoint_(\d+)$")
# The file endings ``decode`` reads: RLlib's state files (pickle, msgpack) and JSON.
STATE_FORMATS: tuple[str, ...] = (".pkl", ".msgpack", ".json")
# pyarrow's filesystem type names that differ from the URI scheme users write.
_SCHEMES = {"gcs": "gs"}
# How long one remote access may stay unanswered before it fails: pyarrow's S3 connect and
# inactivity timeouts (a third of it each, as the S3 client tries 3 times), GCS's retry
# limit, and ``probe``'s wait. Without it an S3 endpoint that accepts and never answers
# holds a call for 100 s, and GCS retries a failing credentials lookup for 15 minutes.
REMOTE_TIMEOUT_ENV = "RLLIB_AMP_REMOTE_TIMEOUT_S"
DEFAULT_REMOTE_TIMEOUT_S = 30.0


class RemoteTimeout(TimeoutError):
    """A remote location gave no answer within the remote timeout (an OSError)."""


def remote_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """Seconds a remote access may stay unanswered: ``$RLLIB_AMP_REMOTE_TIMEOUT_S`` or 30.

    Example:
        >>> remote_timeout_s({"RLLIB_AMP_REMOTE_TIMEOUT_S": "5"}), remote_timeout_s({})
        (5.0, 30.0)
    """
    raw = (os.environ if env is None else env).get(REMOTE_TIMEOUT_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_REMOTE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise ValueError(
            f"{REMOTE_TIMEOUT_ENV}: got {raw!r}; must be a number of seconds > 0, e.g. "
            f"{REMOTE_TIMEOUT_ENV}=30 (or unset it for {DEFAULT_REMOTE_TIMEOUT_S:g})"
        )
    return value


def is_uri(location: str) -> bool:
    """True for ``scheme://...`` with a scheme of two or more characters.

    Example:
        >>> is_uri("gs://b/x"), is_uri("~/ray_results"), is_uri("c://x")
        (True, False, False)
    """
    return "://" in location and len(urllib.parse.urlparse(location).scheme) > 1


def join(location: str, *parts: str) -> str:
    """``location/part/...``: a local path, or a URI whose query (``?endpoint_override=...``)
    stays at the end, after the joined path.

    Example:
        >>> join("/runs", "a", "b"), join("gs://bucket/exp", "trial_0")
        ('/runs/a/b', 'gs://bucket/exp/trial_0')
    """
    if not is_uri(location):
        return os.path.join(location, *parts)
    u = urllib.parse.urlparse(location)
    return urllib.parse.urlunparse(u._replace(path=posixpath.join(u.path or "/", *parts)))


_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})")


def local_path(location: str) -> str:
    """A local path made absolute (Tune trials run in their own folder), with ``~`` and
    environment variables (``$HOME``, ``${RUNS}``) expanded: the one rule for every path flag
    and key, quoted or not. A variable that is not set raises ValueError naming it.

    Example:
        >>> local_path("/tmp/../tmp/x")
        '/tmp/x'
    """
    expanded = os.path.expandvars(os.path.expanduser(location))
    unset = _VARIABLE.search(expanded)
    if unset is not None:
        raise ValueError(
            f"{location!r} names ${unset.group(1).strip('{}')}, which is not set; set it, or "
            f"write the path out"
        )
    return os.path.abspath(expanded)


def existing_location(location: str) -> str:
    """A URI untouched (checked where it is read), or a local path made absolute; a local
    path that does not exist raises FileNotFoundError naming it.

    Example:
        >>> existing_location("s3://bucket/run/checkpoint_000009")
        's3://bucket/run/checkpoint_000009'
    """
    if is_uri(location):
        return location
    path = local_path(location)
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    return path


def resolve(location: Any, filesystem: pyarrow.fs.FileSystem | None = None) -> tuple[Any, str]:
    """(pyarrow filesystem, path on it) for a local path, a ``pathlib.Path`` or a URI.

    With ``filesystem`` given, ``location`` is already a path on it and is returned as is.
    S3 and GCS filesystems get the remote timeout (``remote_timeout_s``) where the URI sets
    none. pyarrow's errors (an unknown scheme, a bad URI) propagate: callers say which key
    it was.

    Example:
        >>> resolve("file:///tmp/exp")[1]
        '/tmp/exp'
    """
    text = location if isinstance(location, str) else os.fspath(location)
    if filesystem is not None:
        return filesystem, text
    if is_uri(text):
        fs, path = pyarrow.fs.FileSystem.from_uri(text)
        return _with_timeouts(fs), path
    return pyarrow.fs.LocalFileSystem(), local_path(text)


def _with_timeouts(fs: Any) -> Any:
    """The same filesystem with bounded waits. pyarrow takes no timeouts in an S3 URI's
    query, so the filesystem is built again from its own arguments (what pickling uses)."""
    timeout = remote_timeout_s()
    kind = type(fs).__name__
    if kind not in ("S3FileSystem", "GcsFileSystem"):
        return fs
    reconstruct, (kwargs, *_) = fs.__reduce__()
    if kind == "S3FileSystem":
        for key in ("connect_timeout", "request_timeout"):
            if kwargs.get(key) is None or kwargs[key] < 0:
                kwargs[key] = timeout / 3
    elif kwargs.get("retry_time_limit") is None:  # GCS (?retry_limit_seconds= sets it)
        kwargs["retry_time_limit"] = datetime.timedelta(seconds=max(1, round(timeout)))
    return reconstruct(kwargs)


def bounded(call: Callable[[], T], where: str, timeout_s: float | None = None) -> T:
    """``call()``, or RemoteTimeout naming ``where`` when it has not returned within
    ``timeout_s`` (default ``remote_timeout_s()``).

    The call runs on a helper thread and this one waits: Ctrl-C (or SIGTERM, raised as
    ``rllib_amp.cli.Interrupted``) ends the wait at once, which a thread inside a blocking
    pyarrow call would not notice. A call that times out is left to end on its own (its
    filesystem's own timeouts end it); a command ends its process without waiting for it
    (``rllib_amp.cli.exit_command``, ``calls_left_running``). Interrupted in a command's process
    (``rllib_amp.cli.may_end_process``), the KeyboardInterrupt propagates and the process
    ends at exit with 128 + the signal without waiting for the call; in a library call,
    RemoteCallInterrupted is raised and nothing ends the caller's process.

    Example:
        >>> bounded(lambda: 42, "nowhere", timeout_s=5)
        42
    """
    timeout = remote_timeout_s() if timeout_s is None else timeout_s
    box: dict[str, Any] = {}
    # An Event, not Thread.join: a join interrupted by Ctrl-C marks a running thread as
    # stopped (Python 3.11), and whether the call still runs is what matters at exit.
    done = threading.Event()

    def run() -> None:
        try:
            box["value"] = call()
        except BaseException as e:  # noqa: BLE001 - raised again on the caller's thread
            box["error"] = e
        finally:
            done.set()

    thread = threading.Thread(target=run, name=f"rllib-amp access to {where}", daemon=True)
    thread.start()
    try:
        finished = done.wait(timeout)
    except KeyboardInterrupt as e:
        from rllib_amp import cli

        if not cli.may_end_process():  # a library call: the caller's process is its own
            raise RemoteCallInterrupted(where, e) from e
        signum = int(getattr(e, "signum", signal.SIGINT))  # cli.Interrupted: SIGTERM too
        _exit_without_waiting_for(done, cli.signal_exit_status(signum))
        raise
    if not finished:
        # A command ends without waiting (cli.exit_command); calls that ended are dropped.
        _left_running[:] = [*(d for d in _left_running if not d.is_set()), done]
        raise RemoteTimeout(f"no answer from {where} within {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


# ``done`` of each call ``bounded`` stopped waiting for: the call may still run on its thread.
_left_running: list[threading.Event] = []


def calls_left_running() -> int:
    """How many remote calls ``bounded`` stopped waiting for still run on their threads.

    Example:
        >>> calls_left_running()
        0
    """
    return sum(not done.is_set() for done in _left_running)


class RemoteCallInterrupted(KeyboardInterrupt):
    """A signal ended the wait for a remote call in a library call (``bounded``): the call
    still runs on its daemon thread until its filesystem's own timeouts end it, and pyarrow's
    exit handler may wait for it when the interpreter exits. ``signum`` is the signal's."""

    def __init__(self, where: str, interrupt: BaseException) -> None:
        super().__init__(
            f"interrupted while waiting for {where}; the call still runs on a daemon thread "
            f"until its filesystem gives up (at most {REMOTE_TIMEOUT_ENV} a try)"
        )
        self.where = where
        self.signum = int(getattr(interrupt, "signum", signal.SIGINT))


def _exit_without_waiting_for(done: threading.Event, status: int) -> None:
    """At interpreter exit, ends the process at once with ``status`` if a remote call is
    still running (``done`` not set): pyarrow's exit handler would otherwise wait for that
    call to give up (minutes, with a long remote timeout) after the user pressed Ctrl-C.
    Registered last, so it runs before pyarrow's own handler (and skips the handlers
    registered before it: only a command's own process, ``rllib_amp.cli.may_end_process``,
    asks for it); output is flushed first."""
    import atexit

    def end_now() -> None:
        if not done.is_set():
            from rllib_amp import cli

            cli.end_process_now(status)

    atexit.register(end_now)


def probe(location: str, timeout_s: float | None = None) -> None:
    """Opens a URI's filesystem and asks it about ``location``, within ``timeout_s``: the
    pyarrow OSError (a closed port, no credentials, no libjvm for hdfs://) or RemoteTimeout
    when the remote cannot be used. Local paths are not probed. A missing path is fine.

    Example:
        >>> probe("/no/such/folder")  # local: nothing to reach
    """
    if not is_uri(location):
        return

    def ask() -> None:
        fs, path = resolve(location)
        fs.get_file_info(path)

    bounded(ask, location, timeout_s)


def error_line(e: BaseException) -> str:
    """The first line of an error, as a cause in parentheses: pyarrow's OSErrors run to 40
    lines (hdfs's libjvm search) where the first says what failed.

    Example:
        >>> error_line(OSError("Unable to load libjvm\\ndlopen(...) failed"))
        'Unable to load libjvm'
    """
    text = str(e).strip() or type(e).__name__
    return text.splitlines()[0].strip()


def display_path(fs: Any, fs_path: str) -> str:
    """The path as a user would type it: local paths as they are, others as ``scheme://...``.

    Example:
        >>> display_path(pyarrow.fs.LocalFileSystem(), "/tmp/x")
        '/tmp/x'
    """
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        return fs_path
    return f"{_SCHEMES.get(fs.type_name, fs.type_name)}://{fs_path}"


def is_dir(fs: Any, fs_path: str) -> bool:
    return bool(fs.get_file_info(fs_path).type == pyarrow.fs.FileType.Directory)


def is_file(fs: Any, fs_path: str) -> bool:
    return bool(fs.get_file_info(fs_path).type == pyarrow.fs.FileType.File)


def exists(fs: Any, fs_path: str) -> bool:
    return bool(fs.get_file_info(fs_path).type != pyarrow.fs.FileType.NotFound)


def list_files(fs: Any, root: str) -> list[str]:
    """Every file below ``root``, as sorted posix paths relative to it."""
    infos = fs.get_file_info(pyarrow.fs.FileSelector(root, recursive=True))
    return sorted(
        posixpath.relpath(info.path, root)
        for info in infos
        if info.type == pyarrow.fs.FileType.File
    )


def checkpoint_folders(fs: Any, root: str) -> list[str]:
    """The ``checkpoint_NNNNNN`` folders directly under ``root`` (a Tune trial), newest first.

    Folders moved aside (``checkpoint_000003.damaged``) and files are never listed; a
    missing ``root`` lists nothing.

    Example:
        >>> checkpoint_folders(pyarrow.fs.LocalFileSystem(), "/no/such/trial")
        []
    """
    selector = pyarrow.fs.FileSelector(root, allow_not_found=True, recursive=False)
    found = []
    for info in fs.get_file_info(selector):
        match = CHECKPOINT_FOLDER.match(info.base_name)
        if match and info.type == pyarrow.fs.FileType.Directory:
            found.append((int(match.group(1)), info.path))
    return [path for _, path in sorted(found, reverse=True)]


def read_bytes(fs: Any, fs_path: str) -> bytes:
    """The content of one file."""
    with fs.open_input_stream(fs_path) as f:
        return bytes(f.readall())


def write_bytes(fs: Any, fs_path: str, data: bytes) -> None:
    """Writes ``data`` to one file, making its folder first if needed."""
    parent = posixpath.dirname(fs_path)
    if parent:
        fs.create_dir(parent, recursive=True)
    with fs.open_output_stream(fs_path) as out:
        out.write(data)


def create_exclusive(fs: Any, fs_path: str, data: bytes) -> bool:
    """Writes ``data`` to a new file at ``fs_path``; False, and nothing written, when a file
    is already there. Its folder is made first if needed.

    On a local disk the create is atomic (``O_EXCL``): of two callers at the same instant,
    exactly one gets True. pyarrow's object-store filesystems offer no conditional put, so
    there it is a check, then a write: two callers within the same moment can both get True.

    Example:
        >>> import tempfile
        >>> path = tempfile.mkdtemp() + "/owner"
        >>> local = pyarrow.fs.LocalFileSystem()
        >>> create_exclusive(local, path, b"a"), create_exclusive(local, path, b"b")
        (True, False)
    """
    parent = posixpath.dirname(fs_path)
    if parent:
        fs.create_dir(parent, recursive=True)
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        try:
            fd = os.open(fs_path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            return False
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        return True
    if exists(fs, fs_path):
        return False
    write_bytes(fs, fs_path, data)
    return True


def decode(fs_path: str, data: bytes) -> Any:
    """The object a state file holds, by its ending (``STATE_FORMATS``).

    Raises ValueError for another ending; parse errors propagate (the caller names the file).

    Example:
        >>> decode("x/state.json", b'{"a": 1}')
        {'a': 1}
    """
    ext = posixpath.splitext(fs_path)[1]
    if ext == ".pkl":
        return pickle.loads(data)  # noqa: S301 - the user's own checkpoint, as RLlib loads it
    if ext == ".msgpack":
        try:
            import msgpack_numpy as msgpack
        except ImportError:
            # Plain msgpack parses the same bytes; numpy arrays come back as ExtType, which
            # is enough for readers of plain numbers (warm starts).
            import msgpack
        return msgpack.unpackb(data, strict_map_key=False)
    if ext == ".json":
        return json.loads(data.decode("utf-8"))
    raise ValueError(
        f"{fs_path}: no state file (allowed endings: {', '.join(STATE_FORMATS)}); pass a "
        f"state.pkl or state.msgpack file or the checkpoint folder that holds it"
    )
