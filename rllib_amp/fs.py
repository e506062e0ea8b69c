"""Files: the one place that turns a location (a local path or a URI pyarrow opens: ``s3://``,
``gs://``, ``file://``, ``abfs://``...) into a pyarrow filesystem and a path on it, and reads,
writes, lists and decodes checkpoint files, so local folders and object stores behave alike.
S3 and GCS get pyarrow's own bounds on each call (``RLLIB_AMP_REMOTE_TIMEOUT_S``, default
30 s): an endpoint that never answers ends in an OSError, not a hang of minutes.
"""

from __future__ import annotations

import contextlib
import datetime
import fnmatch
import json
import os
import pickle
import posixpath
import re
import secrets
import urllib.parse
from collections.abc import Iterator, Mapping
from typing import Any

import pyarrow.fs
from pyarrow.fs import FileSelector, FileSystem, FileType

# Tune's checkpoint folder names; never one moved aside (``checkpoint_000003.damaged``).
CHECKPOINT_FOLDER = re.compile(r"^checkpoint_(\d+)$")
# The file endings ``decode`` reads: RLlib's state files (pickle, msgpack) and JSON.
STATE_FORMATS: tuple[str, ...] = (".pkl", ".msgpack", ".json")
# Without a bound, an S3 endpoint that accepts and never answers holds a call for 100 s, and
# GCS retries a failing credentials lookup for 15 minutes. S3 gets a third of it per try.
REMOTE_TIMEOUT_ENV = "RLLIB_AMP_REMOTE_TIMEOUT_S"
DEFAULT_REMOTE_TIMEOUT_S = 30.0
REMOTE_ATTEMPTS = 3
# Tune's experiment state files (TuneController.CKPT_FILE_TMPL): Tune resumes the newest.
EXPERIMENT_STATE_GLOB = "experiment_state-*.json"
# The marker ``write_probe`` writes: never a name Tune or RLlib uses.
PROBE_PREFIX = ".rllib-amp-storage-check-"
# What pyarrow's S3 client (curl) says when a call ran out of time rather than was refused.
_TIMED_OUT = re.compile(r"curlCode: 28|Timeout was reached|timed out|deadline", re.IGNORECASE)
_VARIABLE = re.compile(r"\$(\w+|\{[^}]*\})")


class RemoteTimeout(TimeoutError):
    """A remote location gave no answer within the remote timeout (an OSError)."""


def remote_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """Seconds a remote call may stay unanswered: ``$RLLIB_AMP_REMOTE_TIMEOUT_S`` or 30.

    Example:
        >>> remote_timeout_s({"RLLIB_AMP_REMOTE_TIMEOUT_S": "5"}), remote_timeout_s({})
        (5.0, 30.0)
    """
    raw = (os.environ if env is None else env).get(REMOTE_TIMEOUT_ENV)
    if raw is None or not raw.strip():
        return DEFAULT_REMOTE_TIMEOUT_S
    with contextlib.suppress(ValueError):
        if 0 < (value := float(raw)) < float("inf"):
            return value
    raise ValueError(
        f"{REMOTE_TIMEOUT_ENV}: got {raw!r}; must be a number of seconds > 0, e.g. "
        f"{REMOTE_TIMEOUT_ENV}=30 (or unset it for {DEFAULT_REMOTE_TIMEOUT_S:g})"
    )


def is_uri(location: str) -> bool:
    """True for ``scheme://...`` with a scheme of two or more characters.

    Example:
        >>> is_uri("gs://b/x"), is_uri("~/ray_results"), is_uri("c://x")
        (True, False, False)
    """
    return "://" in location and len(urllib.parse.urlparse(location).scheme) > 1


def join(location: str, *parts: str) -> str:
    """``location/part/...``; a URI's query (``?endpoint_override=...``) stays at the end.

    Example:
        >>> join("/runs", "a", "b"), join("gs://bucket/exp", "trial_0")
        ('/runs/a/b', 'gs://bucket/exp/trial_0')
    """
    if not is_uri(location):
        return os.path.join(location, *parts)
    u = urllib.parse.urlparse(location)
    return urllib.parse.urlunparse(u._replace(path=posixpath.join(u.path or "/", *parts)))


def to_uri(location: str, fs_path: str) -> str:
    """A path on ``location``'s filesystem (as Tune reports it) with its scheme and query.

    Example:
        >>> to_uri("s3://b/exp?endpoint_override=127.0.0.1:9000", "b/exp/t/checkpoint_000001")
        's3://b/exp/t/checkpoint_000001?endpoint_override=127.0.0.1:9000'
    """
    if not is_uri(location):
        return fs_path
    u = urllib.parse.urlparse(location)
    if fs_path.startswith("/"):
        return urllib.parse.urlunparse(u._replace(path=fs_path))
    first, _, rest = fs_path.partition("/")
    named = {u.netloc, u.netloc.split("@", 1)[0], u.netloc.rsplit("@", 1)[-1]}
    netloc = u.netloc if first in named else first
    return urllib.parse.urlunparse(u._replace(netloc=netloc, path="/" + rest if rest else ""))


def local_path(location: str) -> str:
    """A local path with ``~``, ``$HOME`` or ``${RUNS}`` expanded, made absolute (Tune trials
    run in their own folder); ValueError naming a variable that is not set.

    Example:
        >>> local_path("/tmp/../tmp/x")
        '/tmp/x'
    """
    expanded = os.path.expandvars(os.path.expanduser(location))
    if unset := _VARIABLE.search(expanded):
        raise ValueError(
            f"{location!r} names ${unset.group(1).strip('{}')}, which is not set; set it, or "
            f"write the path out"
        )
    return os.path.abspath(expanded)


def existing_location(location: str) -> str:
    """A URI untouched (checked where it is read), or an existing local path made absolute.

    Example:
        >>> existing_location("s3://bucket/run/checkpoint_000009")
        's3://bucket/run/checkpoint_000009'
    """
    if is_uri(location):
        return location
    if not os.path.exists(path := local_path(location)):
        raise FileNotFoundError(path)
    return path


def resolve(
    location: str | os.PathLike[str], filesystem: FileSystem | None = None
) -> tuple[FileSystem, str]:
    """(pyarrow filesystem, path on it); with ``filesystem`` given, ``location`` is a path on
    it already. pyarrow's errors (an unknown scheme) propagate: callers name the key.

    Example:
        >>> resolve("file:///tmp/exp")[1]
        '/tmp/exp'
    """
    text = os.fspath(location)
    if filesystem is not None:
        return filesystem, text
    if is_uri(text):
        fs, path = FileSystem.from_uri(text)
        return _with_timeouts(fs), path
    return pyarrow.fs.LocalFileSystem(), local_path(text)


def _with_timeouts(fs: FileSystem) -> FileSystem:
    """S3 with connect and request timeouts and bounded retries, GCS with a retry limit."""
    if fs.type_name not in ("s3", "gcs"):
        return fs
    timeout = remote_timeout_s()
    reconstruct, (kwargs, *_) = fs.__reduce__()  # its own arguments: a URI's query sets none
    if fs.type_name == "s3":
        for key in ("connect_timeout", "request_timeout"):
            if kwargs.get(key) is None or kwargs[key] < 0:
                kwargs[key] = timeout / REMOTE_ATTEMPTS
        retry = pyarrow.fs.AwsStandardS3RetryStrategy(max_attempts=REMOTE_ATTEMPTS)
        return pyarrow.fs.S3FileSystem(**kwargs, retry_strategy=retry)
    if kwargs.get("retry_time_limit") is None:
        kwargs["retry_time_limit"] = datetime.timedelta(seconds=max(1, round(timeout)))
    return reconstruct(kwargs)


def probe(location: str) -> None:
    """Asks a URI's filesystem about ``location`` (local paths are not asked): pyarrow's
    OSError (a closed port, no credentials), or RemoteTimeout after ``remote_timeout_s``.

    Example:
        >>> probe("/no/such/folder")  # local: nothing to reach
    """
    if not is_uri(location):
        return
    try:
        exists(*resolve(location))
    except OSError as e:
        if _TIMED_OUT.search(str(e)):
            raise RemoteTimeout(
                f"no answer from {location} within {remote_timeout_s():g} s"
            ) from None
        raise


def error_line(e: BaseException) -> str:
    """The first line of an error: pyarrow's OSErrors run to 40 lines (hdfs's libjvm search).

    Example:
        >>> error_line(OSError("Unable to load libjvm\\ndlopen(...) failed"))
        'Unable to load libjvm'
    """
    return (str(e).strip() or type(e).__name__).splitlines()[0].strip()


def display_path(fs: FileSystem, fs_path: str) -> str:
    """The path as a user would type it: ``scheme://...`` but for local paths.

    Example:
        >>> display_path(pyarrow.fs.LocalFileSystem(), "/tmp/x")
        '/tmp/x'
    """
    if isinstance(fs, pyarrow.fs.LocalFileSystem):
        return fs_path
    return f"{'gs' if fs.type_name == 'gcs' else fs.type_name}://{fs_path}"


def is_dir(fs: FileSystem, fs_path: str) -> bool:
    return bool(fs.get_file_info(fs_path).type == FileType.Directory)


def is_file(fs: FileSystem, fs_path: str) -> bool:
    return bool(fs.get_file_info(fs_path).type == FileType.File)


def exists(fs: FileSystem, fs_path: str) -> bool:
    return bool(fs.get_file_info(fs_path).type != FileType.NotFound)


def list_files(fs: FileSystem, root: str) -> list[str]:
    """Every file below ``root``, as sorted posix paths relative to it."""
    infos = fs.get_file_info(FileSelector(root, recursive=True))
    return sorted(posixpath.relpath(i.path, root) for i in infos if i.type == FileType.File)


def _entries(fs: FileSystem, root: str, kind: FileType) -> list[pyarrow.fs.FileInfo]:
    infos = fs.get_file_info(FileSelector(root, allow_not_found=True))
    return [i for i in infos if i.type == kind]


def checkpoint_folders(fs: FileSystem, root: str) -> list[str]:
    """The ``checkpoint_NNNNNN`` folders directly in ``root`` (a Tune trial), newest first.

    Example:
        >>> checkpoint_folders(pyarrow.fs.LocalFileSystem(), "/no/such/trial")
        []
    """
    numbered = [
        (int(match.group(1)), i.path)
        for i in _entries(fs, root, FileType.Directory)
        if (match := CHECKPOINT_FOLDER.match(i.base_name))
    ]
    return [path for _, path in sorted(numbered, reverse=True)]


def experiment_state_file(fs: FileSystem, root: str) -> str | None:
    """The newest Tune experiment state file directly in ``root``, or None.

    Example:
        >>> experiment_state_file(pyarrow.fs.LocalFileSystem(), "/no/such/experiment")
    """
    files = [i.base_name for i in _entries(fs, root, FileType.File)]
    names = fnmatch.filter(files, EXPERIMENT_STATE_GLOB)
    return posixpath.join(root, max(names)) if names else None


def read_bytes(fs: FileSystem, fs_path: str) -> bytes:
    with fs.open_input_stream(fs_path) as f:
        return bytes(f.readall())


def write_bytes(fs: FileSystem, fs_path: str, data: bytes) -> None:
    """Writes ``data`` to one file, making its folder first if needed."""
    if parent := posixpath.dirname(fs_path):
        fs.create_dir(parent, recursive=True)
    with fs.open_output_stream(fs_path) as out:
        out.write(data)


def delete_file(fs: FileSystem, fs_path: str) -> None:
    """Removes one file; a file already gone is fine."""
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(fs_path)


@contextlib.contextmanager
def write_probe(location: str) -> Iterator[tuple[str, bytes]]:
    """Yields (location, content) of a random marker written into ``location``, to read
    back here or on every node, then removes it (and a folder it made).

    Example:
        >>> import tempfile
        >>> with write_probe(tempfile.mkdtemp()) as (marker, token):
        ...     read_bytes(*resolve(marker)) == token
        True
    """
    fs, root = resolve(location)
    made = not is_uri(location) and not exists(fs, root)
    name = PROBE_PREFIX + secrets.token_hex(8)
    token = secrets.token_bytes(16)
    try:
        write_bytes(fs, posixpath.join(root, name), token)
        yield join(location, name), token
    finally:
        with contextlib.suppress(OSError):
            delete_file(fs, posixpath.join(root, name))
            if made:
                os.rmdir(root)  # only while empty: nothing of anyone else's goes


def decode(fs_path: str, data: bytes) -> Any:
    """The object a state file holds, by its ending (``STATE_FORMATS``; ValueError else).

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
        except ImportError:  # plain msgpack: numpy arrays come back as ExtType, enough for
            import msgpack  # readers of plain numbers (warm starts)
        return msgpack.unpackb(data, strict_map_key=False)
    if ext == ".json":
        return json.loads(data.decode("utf-8"))
    raise ValueError(
        f"{fs_path}: no state file (allowed endings: {', '.join(STATE_FORMATS)}); pass a "
        f"state.pkl or state.msgpack file or the checkpoint folder that holds it"
    )
