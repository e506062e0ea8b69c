"""Files: the one place that turns a path or URI into a filesystem, and reads, writes, lists
and decodes checkpoint files.

A location is a local path (``~`` expanded, made absolute) or a URI pyarrow opens (``s3://``,
``gs://``, ``file://``, ``abfs://``...). A scheme of one letter is a Windows drive
(``C:/runs``), not a URI. Everything above this module reads and writes files through these
functions, so local folders and object stores behave alike.

Example:
    >>> is_uri("s3://bucket/exp"), is_uri("C:/runs"), is_uri("runs:2")
    (True, False, False)
    >>> fs, path = resolve("/tmp/run/checkpoint_000001")
    >>> fs.type_name, path
    ('local', '/tmp/run/checkpoint_000001')
"""

from __future__ import annotations

import json
import os
import pickle
import posixpath
import re
import urllib.parse
from typing import Any

import pyarrow.fs

# Tune's checkpoint folder names (StorageContext): ``checkpoint_000003``, nothing after the
# number, so a folder moved aside (``checkpoint_000003.damaged``) is never one.
CHECKPOINT_FOLDER = re.compile(r"^checkpoint_(\d+)$")
# The file endings ``decode`` reads: RLlib's state files (pickle, msgpack) and JSON.
STATE_FORMATS: tuple[str, ...] = (".pkl", ".msgpack", ".json")
# pyarrow's filesystem type names that differ from the URI scheme users write.
_SCHEMES = {"gcs": "gs"}


def is_uri(location: str) -> bool:
    """True for ``scheme://...`` with a scheme of two or more characters.

    Example:
        >>> is_uri("gs://b/x"), is_uri("~/ray_results"), is_uri("c://x")
        (True, False, False)
    """
    return "://" in location and len(urllib.parse.urlparse(location).scheme) > 1


def local_path(location: str) -> str:
    """A local path with ``~`` expanded, made absolute (Tune trials run in their own folder).

    Example:
        >>> local_path("/tmp/../tmp/x")
        '/tmp/x'
    """
    return os.path.abspath(os.path.expanduser(location))


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
    pyarrow's errors (an unknown scheme, a bad URI) propagate: callers say which key it was.

    Example:
        >>> resolve("file:///tmp/exp")[1]
        '/tmp/exp'
    """
    text = location if isinstance(location, str) else os.fspath(location)
    if filesystem is not None:
        return filesystem, text
    if is_uri(text):
        return pyarrow.fs.FileSystem.from_uri(text)
    return pyarrow.fs.LocalFileSystem(), local_path(text)


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
