"""Where experiments are written: a local path, a shared mount, or any URI pyarrow opens.

A storage location is a string: ``/mnt/nfs/exp`` or ``~/ray_results`` (made absolute here), or a
URI such as ``s3://bucket/exp``, ``gs://bucket/exp`` or
``s3://bucket/exp?endpoint_override=127.0.0.1:9000&scheme=http``, which is passed to Tune
untouched. Files are read and written through ``rllib_amp.fs`` (a location resolved to a
pyarrow filesystem and a path on it), so the same code serves all of them; this module holds
the storage rules on top: which location, whether it is reachable and writable, whether an
error is the storage failing. On a multi-node cluster, ``check_reachable_from_nodes`` proves
before any trial starts that every node sees what the driver wrote: since Ray 2.7 a trial
whose node cannot reach the storage fails at its first checkpoint ("Unable to set up cluster
storage").

Example:
    >>> resolve("file:///mnt/nfs/x", "/mnt/other", {})
    'file:///mnt/nfs/x'
    >>> resolve(flag=None, from_file=None, env={})  # doctest: +SKIP
    '/home/me/ray_results'
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from rllib_amp import fs as files
from rllib_amp.cli import root_error
from rllib_amp.fs import is_uri

DEFAULT_STORAGE = "~/ray_results"
# Set on every node of a cluster (see cluster.yaml) so the CLI writes to shared storage by
# default; an experiment file's storage_path and --storage-path win over it.
STORAGE_ENV = "RLLIB_AMP_STORAGE"
FIX = (
    "use storage every node can reach: an s3:// or gs:// URI (--storage-path "
    "s3://BUCKET/experiments) or a shared mount (NFS, EFS) at the same path on every node"
)
# How long a node may take to start the tiny task that reads the marker.
REACH_TIMEOUT_S = 120.0


class StorageError(ValueError):
    """Storage that cannot be used: the message names the location, the cause and the fix."""


class StorageFailed(Exception):
    """The storage failed under a running sweep, so badly that Tune itself could not read its
    experiment back (an S3 endpoint gone): the message names the experiment folder and the
    cause, for one line with the --resume command."""

    def __init__(self, exp_dir: str, cause: BaseException) -> None:
        super().__init__(f"the storage at {exp_dir} failed: {files.error_line(cause)}")
        self.exp_dir = exp_dir


def resolve(
    flag: str | None,
    from_file: str | None,
    env: Mapping[str, str] | None = None,
) -> str:
    """The storage to use: ``--storage-path``, else the file's ``storage_path``, else
    ``$RLLIB_AMP_STORAGE``, else ``~/ray_results``. Local paths become absolute; URIs are
    returned untouched.

    Example:
        >>> resolve("file:///mnt/nfs/x", "/mnt/other", {})
        'file:///mnt/nfs/x'
    """
    env = os.environ if env is None else env
    for where, value in (
        ("--storage-path", flag),
        ("storage_path", from_file),
        (STORAGE_ENV, env.get(STORAGE_ENV)),
    ):
        if value is None:
            continue
        if not value.strip():
            raise StorageError(
                f"{where}: got an empty location; pass a local path, a shared mount or a "
                f"URI such as s3://BUCKET/experiments"
            )
        return _normalise(value.strip(), where)
    return _normalise(DEFAULT_STORAGE, "default storage")


def _normalise(location: str, where: str) -> str:
    if not is_uri(location):
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


def check_reachable(location: str, *, where: str = "--storage-path") -> None:
    """StorageError with one line naming ``location``, the cause and the fix when its
    endpoint does not answer within the remote timeout (``rllib_amp.fs.probe``): a closed
    port, a server that never answers, missing credentials. Local paths are not asked.

    Example:
        >>> check_reachable("/tmp")  # local: nothing to reach
    """
    try:
        files.probe(location)
    except (OSError, ValueError) as e:
        raise StorageError(
            f"{where}: cannot reach {location} ({files.error_line(e)}); check that its "
            f"endpoint is up and reachable from this machine and the credentials, or "
            f"pass another {where}"
        ) from None


# errno values that say the storage itself refused a write: a full disk, a read-only mount,
# a quota, no permission.
FAILED_ERRNOS = frozenset({errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES})


def failed(error: BaseException, exp_dir: str) -> bool:
    """Whether ``error`` (an OSError out of Tune's run) is the storage at ``exp_dir`` failing,
    rather than anything else that raised an OSError (a file of the trials' own, a socket).

    True when its errno says the storage refused a write (``FAILED_ERRNOS``) on a path under
    a local ``exp_dir``, or when the storage fails a fresh check now: its endpoint does not
    answer (``check_reachable``) or a marker cannot be written to ``exp_dir`` (``write_probe``).

    Example:
        >>> import tempfile
        >>> failed(OSError("unrelated"), tempfile.mkdtemp())
        False
    """
    code = getattr(error, "errno", None)
    if code in FAILED_ERRNOS and not is_uri(exp_dir):
        names = [getattr(error, "filename", None), getattr(error, "filename2", None)]
        root = files.local_path(exp_dir)
        for name in names:
            if isinstance(name, str) and _is_within(files.local_path(name), root):
                return True
    try:
        check_reachable(exp_dir)
    except StorageError:
        return True
    return write_refused(exp_dir) is not None


def write_refused(exp_dir: str) -> str | None:
    """Why a small file cannot be written to (and removed from) ``exp_dir`` now, or None."""
    try:
        with files.write_probe(exp_dir):
            return None
    except (OSError, ValueError) as e:
        return root_error(e)


# A trial's root error (its ``Type: message`` line, as ``root_error`` gives it) that is the
# storage refusing a write or not answering, not the trial's own fault: an OSError (pyarrow's
# and Python's file errors) for a full disk (ENOSPC), a quota (EDQUOT), a read-only mount
# (EROFS), a dead endpoint; Tune's RuntimeError for a node that cannot set up the storage.
# The phrases count only in that line and after such a type: an env's own "Could not connect
# to server" (a RuntimeError, a ConnectionError) is the trial's fault.
_STORAGE_ERROR = re.compile(
    r"^(?:[\w.]+\.)?(?:OSError|IOError|ArrowIOError): .*(?:No space left on device"
    r"|Disk quota exceeded|Read-only file system|\[Errno (?:28|30|122)\]"
    r"|AWS Error NETWORK_CONNECTION|Could not connect to server)"
    r"|^(?:[\w.]+\.)?RuntimeError: Unable to set up cluster storage",
    re.IGNORECASE,
)
_ENOSPC = re.compile(r"No space left on device|\[Errno 28\]", re.IGNORECASE)


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


def storage_fault(exp_dir: str, rows: Sequence[dict[str, Any]]) -> str | None:
    """One line naming the storage error of a run, or None when there was none: a small
    file cannot be written to ``exp_dir`` now, or trials stopped on a storage error
    (``stopped_on_storage``: their root error line only). Said once for all trials, so the
    CLI prints it instead of one failure line per trial; it still tries results.parquet
    (``summary.try_write_parquet``) but writes nothing else there.

    Example:
        >>> import tempfile
        >>> storage_fault(tempfile.mkdtemp(), [{"trial_id": "a", "error": None}]) is None
        True
    """
    stopped = [r for r in rows if stopped_on_storage(r.get("error"))]
    refused = write_refused(exp_dir)
    if refused is None and not stopped:
        return None
    cause = refused or str(stopped[0]["error"])
    what = "is full (ENOSPC)" if _ENOSPC.search(cause) else "failed"
    ids = ", ".join(str(r["trial_id"]) for r in stopped)
    on_it = f"; trial(s) {ids} stopped on it" if stopped else ""
    return f"the storage at {exp_dir} {what}: {cause}{on_it}"


def _is_within(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _read_marker(location: str) -> bytes:
    # Runs on each node (a Ray task): pyarrow only, so it has no state to carry over.
    return files.read_bytes(*files.resolve(location))


def check_writable(location: str) -> None:
    """Writes, reads back and removes a marker file (``rllib_amp.fs.write_probe``):
    StorageError with the cause if any step fails (a missing bucket, no credentials, a
    read-only folder), or if a URI's endpoint does not answer (``check_reachable``).

    Example:
        >>> check_writable("/tmp")  # returns None when the driver can use it
    """
    check_reachable(location)  # one timeout for a dead endpoint, named as such
    try:
        with files.write_probe(location) as (marker, token):
            if _read_marker(marker) != token:
                raise OSError("the marker read back differs from what was written")
    except (OSError, ValueError) as e:
        raise StorageError(
            f"--storage-path: cannot write to {location} ({files.error_line(e)}); check the "
            f"location and its permissions or credentials, or pass another --storage-path"
        ) from None


def check_reachable_from_nodes(location: str, *, timeout_s: float = REACH_TIMEOUT_S) -> int:
    """Proves every alive node of the connected Ray cluster reads what the driver wrote.

    Writes a marker with random content, reads it from a tiny task pinned to each node
    (``NodeAffinitySchedulingStrategy``, 0 CPUs, so busy or CPU-less nodes answer too), and
    removes it. Returns the number of nodes checked (nothing is checked on a single node);
    raises StorageError naming the nodes that could not read it, and the fix.

    Example:
        >>> ray.init(address="auto")  # doctest: +SKIP
        >>> check_reachable_from_nodes("s3://bucket/experiments")  # doctest: +SKIP
        3
    """
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    nodes = [n for n in ray.nodes() if n.get("Alive")]
    if len(nodes) < 2:
        return len(nodes)
    reader = ray.remote(_read_marker)
    failures = []
    try:
        with files.write_probe(location) as (marker, token):
            refs = {
                reader.options(
                    num_cpus=0,
                    max_retries=0,
                    scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False),
                ).remote(marker): n
                for n in nodes
            }
            ready, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
            for r in pending:
                failures.append(f"{_node_name(refs[r])}: no answer within {timeout_s:.0f} s")
                ray.cancel(r, force=True)
            for r in ready:
                try:
                    got = ray.get(r)
                except Exception as e:  # the task's error says why this node cannot read it
                    cause = getattr(e, "cause", None) or e
                    failures.append(f"{_node_name(refs[r])}: {files.error_line(cause)}")
                    continue
                if got != token:
                    failures.append(f"{_node_name(refs[r])}: read a different file at that path")
    except (OSError, ValueError) as e:
        raise StorageError(
            f"--storage-path: cannot write to {location} ({files.error_line(e)}); {FIX}"
        ) from None
    if failures:
        raise StorageError(
            f"--storage-path: {location} is not reachable from {len(failures)} of "
            f"{len(nodes)} nodes ({'; '.join(failures)}), so their trials could not save "
            f"checkpoints; {FIX}"
        )
    return len(nodes)


# What a file being replaced is written to first, beside it (never a name Tune uses).
PARTIAL_SUFFIX = ".rllib-amp-partial"


@contextlib.contextmanager
def keep_files_whole() -> Iterator[None]:
    """Within it, Tune replaces each file it uploads to a local or mounted storage whole or
    not at all: a full disk mid-run keeps the last complete copy. Tune's copy function comes
    back when it ends (also on an exception), so nothing else in the process is changed.

    Tune copies its experiment state, every trial's ``result.json`` and its error files
    from the driver's staging folder to the storage again and again, writing over the file
    in place: the copy that meets a full disk truncates it (seen: an experiment state cut
    mid-JSON, so ``--resume`` could not read it, and result rows lost). Here each file goes
    to ``<name>.rllib-amp-partial`` first and is renamed over the old one once complete.
    Object stores (S3, GCS) replace an object only on a complete upload already and are
    left as they are; so are the trials' own checkpoint uploads (new folders, which the
    checkpoint manifest covers). Nested uses wrap once.

    It replaces ``ray.train._internal.storage._pyarrow_fs_copy_files``, which that module's
    ``_upload_to_fs_path`` calls and which Tune's controller and experiment state use
    (tests/unit/sweep/test_storage.py pins both, and that Tune imports that module).

    Example:
        >>> with keep_files_whole():  # doctest: +SKIP
        ...     tuner.fit()
    """
    from ray.train._internal import storage as train_storage

    copy = train_storage._pyarrow_fs_copy_files
    if getattr(copy, "_rllib_amp_whole", False):
        yield
        return

    def copy_whole(source: Any, destination: Any, **kwargs: Any) -> Any:
        import pyarrow.fs as pafs

        target_fs = kwargs.get("destination_filesystem")
        if not isinstance(target_fs, pafs.LocalFileSystem):
            return copy(source, destination, **kwargs)
        source_fs = kwargs.get("source_filesystem") or pafs.LocalFileSystem()
        for src, dst in _file_pairs(source_fs, str(source), str(destination)):
            _replace_whole(source_fs, src, dst)
        return None

    copy_whole._rllib_amp_whole = True  # type: ignore[attr-defined]
    train_storage._pyarrow_fs_copy_files = copy_whole  # type: ignore[assignment]
    try:
        yield
    finally:
        train_storage._pyarrow_fs_copy_files = copy  # type: ignore[assignment]


def _file_pairs(source_fs: Any, source: str, destination: str) -> list[tuple[str, str]]:
    import pyarrow.fs as pafs

    if source_fs.get_file_info(source).type == pafs.FileType.File:
        return [(source, destination)]
    infos = source_fs.get_file_info(pafs.FileSelector(source, recursive=True))
    root = source.rstrip("/")
    return [
        (i.path, os.path.join(destination, os.path.relpath(i.path, root)))
        for i in infos
        if i.type == pafs.FileType.File
    ]


def _replace_whole(source_fs: Any, src: str, dst: str) -> None:
    import shutil

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


def _node_name(node: Mapping[str, Any]) -> str:
    return f"node {node['NodeID'][:8]} at {node.get('NodeManagerAddress', '?')}"
