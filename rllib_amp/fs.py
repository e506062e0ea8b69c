"""Files: the one place that turns a path or URI into a filesystem, and reads, writes, lists
and decodes checkpoint files.

A location is a local path (``~`` expanded, made absolute) or a URI pyarrow opens (``s3://``,
``gs://``, ``file://``, ``abfs://``...). A scheme of one letter is a Windows drive
(``C:/runs``), not a URI. Everything above this module reads and writes files through these
functions, so local folders and object stores behave alike.

Remote filesystems are built with pyarrow's own bounds (``RLLIB_AMP_REMOTE_TIMEOUT_S``, default
30 s): S3's connect and request timeouts with a bounded retry strategy, GCS's retry time
limit. An S3 endpoint that never answers, or GCS retrying a credentials lookup, ends in an
OSError within about that time instead of a hang of minutes; ``probe`` names it.

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

# Tune's checkpoint folder names (StorageContext): ``checkpoint_000003``, nothing after the
# number, so a folder moved aside (``checkpoint_000003.damaged``) is never one.
CHECKPOINT_FOLDER = re.compile(r"^checkpoint_(\d+)$")
# The file endings ``decode`` reads: RLlib's state files (pickle, msgpack) and JSON.
STATE_FORMATS: tuple[str, ...] = (".pkl", ".msgpack", ".json")
# pyarrow's filesystem type names that differ from the URI scheme users write.
_SCHEMES = {"gcs": "gs"}
# How long one remote call may stay unanswered before it fails: pyarrow's S3 connect and
# inactivity timeouts (a third of it each, as the S3 client tries REMOTE_ATTEMPTS times),
# GCS's retry limit. Without it an S3 endpoint that accepts and never answers holds a call
# for 100 s, and GCS retries a failing credentials lookup for 15 minutes.
REMOTE_TIMEOUT_ENV = "RLLIB_AMP_REMOTE_TIMEOUT_S"
DEFAULT_REMOTE_TIMEOUT_S = 30.0
REMOTE_ATTEMPTS = 3


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


def to_uri(location: str, fs_path: str) -> str:
    """A path on ``location``'s filesystem (as Tune reports checkpoints) as a full location
    with ``location``'s scheme and query, so it can be pasted back into the CLI.

    pyarrow's paths start with the bucket (``s3://``, ``gs://``) or the container
    (``abfs://container@account...``); filesystems addressed by host (``hdfs://``) and
    ``file://`` give absolute paths.

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
    """The same filesystem with pyarrow's own bounds on each call: S3's connect and request
    timeouts and a retry strategy of ``REMOTE_ATTEMPTS`` tries, GCS's retry time limit.
    pyarrow takes none of them in an S3 URI's query, so the filesystem is built again from
    its own arguments (what pickling uses)."""
    timeout = remote_timeout_s()
    kind = type(fs).__name__
    if kind not in ("S3FileSystem", "GcsFileSystem"):
        return fs
    reconstruct, (kwargs, *_) = fs.__reduce__()
    if kind == "S3FileSystem":
        for key in ("connect_timeout", "request_timeout"):
            if kwargs.get(key) is None or kwargs[key] < 0:
                kwargs[key] = timeout / REMOTE_ATTEMPTS
        retry = pyarrow.fs.AwsStandardS3RetryStrategy(max_attempts=REMOTE_ATTEMPTS)
        return pyarrow.fs.S3FileSystem(**kwargs, retry_strategy=retry)
    if kwargs.get("retry_time_limit") is None:  # GCS (?retry_limit_seconds= sets it)
        kwargs["retry_time_limit"] = datetime.timedelta(seconds=max(1, round(timeout)))
    return reconstruct(kwargs)


# What pyarrow's S3 client (curl) says when a call ran out of time rather than was refused.
_TIMED_OUT = re.compile(r"curlCode: 28|Timeout was reached|timed out|deadline", re.IGNORECASE)


def probe(location: str) -> None:
    """Opens a URI's filesystem and asks it about ``location``: the pyarrow OSError (a closed
    port, no credentials, no libjvm for hdfs://), or RemoteTimeout when the remote gave no
    answer within the remote timeout (``remote_timeout_s``). Local paths are not probed. A
    missing path is fine.

    The call is pyarrow's own, bounded by the filesystem's timeouts (``resolve``): Ctrl-C or
    SIGTERM during it takes effect when it returns, within one remote timeout.

    Example:
        >>> probe("/no/such/folder")  # local: nothing to reach
    """
    if not is_uri(location):
        return
    fs, path = resolve(location)
    try:
        fs.get_file_info(path)
    except OSError as e:
        if _TIMED_OUT.search(str(e)):
            raise RemoteTimeout(
                f"no answer from {location} within {remote_timeout_s():g} s"
            ) from None
        raise


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


def delete_file(fs: Any, fs_path: str) -> None:
    """Removes one file; a file already gone is fine."""
    with contextlib.suppress(FileNotFoundError):
        fs.delete_file(fs_path)


# The marker ``write_probe`` writes: never a name Tune or RLlib uses.
PROBE_PREFIX = ".rllib-amp-storage-check-"


@contextlib.contextmanager
def write_probe(location: str) -> Iterator[tuple[str, bytes]]:
    """The one write check: writes a marker of random content into ``location`` and yields
    ``(the marker's location, its content)`` for the caller to read back (on this machine,
    or from every node); removes it on the way out, with the folder the write made (a local
    ``location`` that did not exist: only while empty). Raises what pyarrow raises when the
    write fails (a missing bucket, no credentials, a read-only or full disk).

    Example:
        >>> import tempfile
        >>> with write_probe(tempfile.mkdtemp()) as (marker, token):
        ...     read_bytes(*resolve(marker)) == token
        True
    """
    fs, root = resolve(location)
    made = not is_uri(location) and not exists(fs, root)
    name = PROBE_PREFIX + secrets.token_hex(8)
    marker, token = join(location, name), secrets.token_bytes(16)
    try:
        write_bytes(fs, posixpath.join(root, name), token)
        yield marker, token
    finally:
        with contextlib.suppress(OSError):
            delete_file(fs, posixpath.join(root, name))
            if made and not fs.get_file_info(pyarrow.fs.FileSelector(root)):
                fs.delete_dir(root)  # only while empty: nothing of anyone else's goes


# Tune's experiment state files (TuneController.CKPT_FILE_TMPL): the newest by name (the name
# holds the start time) is the one Tune resumes from.
EXPERIMENT_STATE_GLOB = "experiment_state-*.json"


def experiment_state_file(fs: Any, root: str) -> str | None:
    """The path of the newest Tune experiment state file directly in ``root`` (an experiment
    folder), or None when there is none (a missing ``root`` included). The one reader of
    where Tune keeps its experiment state.

    Example:
        >>> experiment_state_file(pyarrow.fs.LocalFileSystem(), "/no/such/experiment")
    """
    selector = pyarrow.fs.FileSelector(root, allow_not_found=True, recursive=False)
    names = [
        info.base_name
        for info in fs.get_file_info(selector)
        if info.type == pyarrow.fs.FileType.File
        and fnmatch.fnmatch(info.base_name, EXPERIMENT_STATE_GLOB)
    ]
    return posixpath.join(root, max(names)) if names else None


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
