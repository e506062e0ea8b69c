"""Where experiments are written (a local path or shared mount, made absolute, or a URI
pyarrow opens, passed to Tune untouched) and the storage rules on top of ``rllib_amp.fs``:
whether it is reachable and writable, from every node too (since Ray 2.7 a trial whose node
cannot reach it fails at its first checkpoint), and whether an error is the storage failing.

Example:
    >>> resolve("file:///mnt/nfs/x", "/mnt/other", {})
    'file:///mnt/nfs/x'
"""

from __future__ import annotations

import contextlib
import errno
import os
import posixpath
import re
import shutil
from collections.abc import Iterator, Mapping, Sequence

import pyarrow.fs

from rllib_amp import fs as files
from rllib_amp.cli import root_error

DEFAULT_STORAGE = "~/ray_results"
# Set on every node of a cluster (cluster.yaml): shared storage by default (see resolve).
STORAGE_ENV = "RLLIB_AMP_STORAGE"
FIX = (
    "use storage every node can reach: an s3:// or gs:// URI (--storage-path "
    "s3://BUCKET/experiments) or a shared mount (NFS, EFS) at the same path on every node"
)
# How long a node may take to start the tiny task that reads the marker.
REACH_TIMEOUT_S = 120.0
# errno values of the storage itself refusing a write: full, read-only, a quota, no permission.
FAILED_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES})
# What a file being replaced is written to first, beside it (never a name Tune uses).
PARTIAL_SUFFIX = ".rllib-amp-partial"


class StorageError(ValueError):
    """Storage that cannot be used: the message names the location, the cause and the fix."""


class StorageFailed(Exception):
    """The storage failed under a running sweep so that Tune could not read it back."""

    def __init__(self, exp_dir: str, cause: BaseException) -> None:
        super().__init__(f"the storage at {exp_dir} failed: {files.error_line(cause)}")


def resolve(flag: str | None, from_file: str | None, env: Mapping[str, str] | None = None) -> str:
    """The storage to use: ``--storage-path``, else the file's ``storage_path``, else
    ``$RLLIB_AMP_STORAGE``, else ``~/ray_results``; local paths made absolute.

    Example:
        >>> resolve(None, "/mnt/nfs/exp", {})
        '/mnt/nfs/exp'
    """
    env = os.environ if env is None else env
    given = (
        ("--storage-path", flag),
        ("storage_path", from_file),
        (STORAGE_ENV, env.get(STORAGE_ENV)),
        ("default storage", DEFAULT_STORAGE),
    )
    where, location = next((w, v.strip()) for w, v in given if v is not None)
    if not location:
        raise StorageError(
            f"{where}: got an empty location; pass a local path, a shared mount or a "
            f"URI such as s3://BUCKET/experiments"
        )
    if not files.is_uri(location):
        try:
            return files.local_path(location)
        except ValueError as e:
            raise StorageError(f"{where}: {e}") from None
    try:
        files.resolve(location)  # an unknown scheme is an error now, not mid-run (offline)
    except (ValueError, OSError, TypeError) as e:
        raise StorageError(
            f"{where}: pyarrow cannot open {location!r} ({files.error_line(e)}); pass a local "
            f"path, a shared mount or a URI such as s3://BUCKET/experiments, "
            f"gs://BUCKET/experiments, abfs://CONTAINER@ACCOUNT.dfs.core.windows.net/experiments"
        ) from None
    return location


def check_reachable(location: str) -> None:
    """StorageError when the endpoint of ``location`` does not answer (``fs.probe``)."""
    try:
        files.probe(location)
    except (OSError, ValueError) as e:
        raise StorageError(
            f"--storage-path: cannot reach {location} ({files.error_line(e)}); check that its "
            f"endpoint is up and reachable from this machine and the credentials, or "
            f"pass another --storage-path"
        ) from None


def _write_failure(location: str) -> OSError | ValueError | None:
    """Why a marker cannot be written to ``location``, read back and removed."""
    try:
        with files.write_probe(location) as (marker, token):
            if _read_marker(marker) != token:
                raise OSError("the marker read back differs from what was written")
    except (OSError, ValueError) as e:
        return e
    return None


def _read_marker(location: str) -> bytes:
    # Runs on each node (a Ray task): pyarrow only, so it has no state to carry over.
    return files.read_bytes(*files.resolve(location))


def check_writable(location: str) -> None:
    """StorageError with the cause when ``location`` does not answer or cannot take a marker."""
    check_reachable(location)  # one timeout for a dead endpoint, named as such
    if (e := _write_failure(location)) is not None:
        raise StorageError(
            f"--storage-path: cannot write to {location} ({files.error_line(e)}); check the "
            f"location and its permissions or credentials, or pass another --storage-path"
        )


def failed(error: BaseException, exp_dir: str) -> bool:
    """Whether ``error`` (out of Tune's run) is the storage at ``exp_dir`` failing: a refused
    write's errno on a path in a local ``exp_dir``, or a fresh check failing now."""
    if getattr(error, "errno", None) in FAILED_ERRNOS and not files.is_uri(exp_dir):
        root = files.local_path(exp_dir)
        names = [getattr(error, key, None) for key in ("filename", "filename2")]
        paths = [files.local_path(name) for name in names if isinstance(name, str)]
        if any(os.path.commonpath((path, root)) == root for path in paths):
            return True
    try:
        check_reachable(exp_dir)
    except StorageError:
        return True
    return _write_failure(exp_dir) is not None


# A trial's root error line that is the storage refusing a write or not answering: an
# OSError (full, a quota, read-only, a dead endpoint), Tune's RuntimeError for a node that
# cannot set it up. An env's own "Could not connect to server" (no OSError) is the trial's.
_STORAGE_ERROR = re.compile(
    r"^(?:[\w.]+\.)?(?:OSError|IOError|ArrowIOError): .*(?:No space left on device"
    r"|Disk quota exceeded|Read-only file system|\[Errno (?:28|30|122)\]"
    r"|AWS Error NETWORK_CONNECTION|Could not connect to server)"
    r"|^(?:[\w.]+\.)?RuntimeError: Unable to set up cluster storage",
    re.IGNORECASE,
)
_NAMED = (
    ("is full (ENOSPC)", re.compile(r"No space left on device|\[Errno 28\]", re.IGNORECASE)),
    ("is read-only (EROFS)", re.compile(r"Read-only file system|\[Errno 30\]", re.IGNORECASE)),
)


def stopped_on_storage(error: str | None) -> bool:
    """Whether a trial's error (``root_error``'s line) is the storage failing under it.

    Example:
        >>> stopped_on_storage("OSError: [Errno 28] No space left on device")
        True
        >>> stopped_on_storage("RuntimeError: env: Could not connect to server 10.0.0.5")
        False
    """
    line = (error or "").strip().splitlines()
    return bool(line) and _STORAGE_ERROR.search(line[-1]) is not None


def storage_fault(exp_dir: str, rows: Sequence[Mapping[str, object]]) -> str | None:
    """One line for all trials naming the storage error (unwritable now, trials stopped on it)."""
    stopped = [r for r in rows if stopped_on_storage(str(r.get("error") or ""))]
    refused = _write_failure(exp_dir)
    if refused is None and not stopped:
        return None
    cause = root_error(refused) if refused is not None else str(stopped[0]["error"])
    what = next((name for name, pattern in _NAMED if pattern.search(cause)), "failed")
    ids = ", ".join(str(r["trial_id"]) for r in stopped)
    on_it = f"; trial(s) {ids} stopped on it" if stopped else ""
    return f"the storage at {exp_dir} {what}: {cause}{on_it}"


def check_reachable_from_nodes(location: str, *, timeout_s: float = REACH_TIMEOUT_S) -> int:
    """The number of nodes once each reads a marker the driver wrote (a 0-CPU task pinned to
    it; nothing is checked on one node), or StorageError naming those that cannot."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) < 2:
        return len(nodes)
    reader = ray.remote(num_cpus=0, max_retries=0)(_read_marker)
    try:
        with files.write_probe(location) as (marker, token):
            refs = {
                reader.options(
                    scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
                ).remote(marker): n
                for n in nodes
            }
            ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
            whys = {ref: f"no answer within {timeout_s:.0f} s" for ref in pending}
            for ref in pending:
                ray.cancel(ref, force=True)
            for ref in ready:
                try:
                    if ray.get(ref) != token:
                        whys[ref] = "read a different file at that path"
                except Exception as e:  # the task's error says why this node cannot read it
                    whys[ref] = files.error_line(getattr(e, "cause", None) or e)
    except (OSError, ValueError) as e:
        raise StorageError(
            f"--storage-path: cannot write to {location} ({files.error_line(e)}); {FIX}"
        ) from None
    failures = [
        f"node {refs[ref]['NodeID'][:8]} at {refs[ref].get('NodeManagerAddress', '?')}: {why}"
        for ref, why in whys.items()
    ]
    if failures:
        raise StorageError(
            f"--storage-path: {location} is not reachable from {len(failures)} of "
            f"{len(nodes)} nodes ({'; '.join(failures)}), so their trials could not save "
            f"checkpoints; {FIX}"
        )
    return len(nodes)


@contextlib.contextmanager
def keep_files_whole() -> Iterator[None]:
    """Within it, each file Tune uploads to local storage replaces the old one whole or not at
    all (a full disk cut Tune's experiment state mid-JSON): written to ``<name>.rllib-amp-
    partial``, then renamed, by replacing Tune's ``_pyarrow_fs_copy_files`` (pinned by
    tests/unit/sweep/test_storage.py); nested uses wrap once."""
    from ray.train._internal import storage as train_storage

    copy = train_storage._pyarrow_fs_copy_files
    if getattr(copy, "_rllib_amp_whole", False):
        yield
        return

    def copy_whole(
        source: str,
        destination: str,
        source_filesystem: pyarrow.fs.FileSystem | None = None,
        destination_filesystem: pyarrow.fs.FileSystem | None = None,
        **kwargs: object,
    ) -> None:
        if not isinstance(destination_filesystem, pyarrow.fs.LocalFileSystem):
            copy(source, destination, source_filesystem, destination_filesystem, **kwargs)
            return
        source_fs = source_filesystem or pyarrow.fs.LocalFileSystem()
        if files.is_file(source_fs, source):
            _replace_whole(source_fs, source, destination)
            return
        for name in files.list_files(source_fs, source):
            _replace_whole(source_fs, posixpath.join(source, name), os.path.join(destination, name))

    copy_whole._rllib_amp_whole = True  # type: ignore[attr-defined]
    train_storage._pyarrow_fs_copy_files = copy_whole  # type: ignore[assignment]
    try:
        yield
    finally:
        train_storage._pyarrow_fs_copy_files = copy  # type: ignore[assignment]


def _replace_whole(source_fs: pyarrow.fs.FileSystem, src: str, dst: str) -> None:
    os.makedirs(os.path.dirname(dst) or ".", exist_ok=True)
    partial = dst + PARTIAL_SUFFIX
    try:
        with source_fs.open_input_stream(src) as f, open(partial, "wb") as out:
            shutil.copyfileobj(f, out, 1 << 20)
        os.replace(partial, dst)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(partial)
        raise
