"""The checkpoint manifest: size and sha256 of every file, written last at save time, and the
error every check of a checkpoint file raises (``CheckpointError``). Read by
``rllib_amp.checkpoint_files.verify_checkpoint``.

Example:
    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> open(os.path.join(folder, "state.pkl"), "wb").close()
    >>> path = write_manifest(folder)
    >>> sorted(find_manifest(*resolve(folder), ["state.pkl", MANIFEST_FILE_NAME])[1])
    ['state.pkl']
"""

from __future__ import annotations

import hashlib
import json
import os
import posixpath
from typing import NoReturn, TypedDict

import pyarrow.fs

from rllib_amp.fs import display_path, list_files, read_bytes, resolve

# A checkpoint folder: a local path, a URI (``s3://...``) or a path on a given filesystem.
Location = str | os.PathLike[str]

MANIFEST_FILE_NAME = "rllib_amp_manifest.json"
_MANIFEST_FORMAT = "rllib-amp checkpoint manifest"
_MANIFEST_VERSION = 1
# A component restored on its own (e.g. ``learner_group/learner/rl_module/default_policy``)
# sits at most this deep below the algorithm folder that holds the manifest.
_MANIFEST_SEARCH_DEPTH = 4


class ManifestEntry(TypedDict):
    bytes: int
    sha256: str


class CheckpointError(ValueError):
    """A checkpoint file (``path``) is damaged; nothing was restored. ``problem``: what is
    wrong with it, without the advice (for readers other than a restore: warm starts)."""

    def __init__(self, message: str, path: str = "", problem: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.problem = problem

    def __reduce__(self) -> tuple[type, tuple[object, ...]]:
        # Keeps ``path`` when Ray sends the error from a remote learner to the driver.
        return (type(self), (str(self), self.path, self.problem))


def write_manifest(path: Location, *, filesystem: pyarrow.fs.FileSystem | None = None) -> str:
    """Writes ``rllib_amp_manifest.json`` (size and sha256 of every file) into a checkpoint.

    Call it after every other file of the checkpoint is written. Returns the manifest's path.

    Example:
        >>> write_manifest("/tmp/run/checkpoint_000001")  # doctest: +SKIP
        '/tmp/run/checkpoint_000001/rllib_amp_manifest.json'
    """
    fs, root = resolve(path, filesystem)
    files = {}
    for rel in (r for r in list_files(fs, root) if r != MANIFEST_FILE_NAME):
        data = read_bytes(fs, posixpath.join(root, rel))
        files[rel] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {"format": _MANIFEST_FORMAT, "version": _MANIFEST_VERSION, "files": files}
    target = posixpath.join(root, MANIFEST_FILE_NAME)
    with fs.open_output_stream(target) as f:
        f.write(json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8"))
    return display_path(fs, target)


def find_manifest(
    fs: pyarrow.fs.FileSystem, root: str, files: list[str]
) -> tuple[str | None, dict[str, ManifestEntry]]:
    """(manifest path, {path relative to root: entry}) of the manifest covering ``root``."""
    if MANIFEST_FILE_NAME in files:
        manifest_path = posixpath.join(root, MANIFEST_FILE_NAME)
        return manifest_path, _load_manifest(fs, manifest_path)
    # A component restored on its own: the algorithm folder above it holds the manifest.
    folder, prefix = root.rstrip("/"), ""
    for _ in range(_MANIFEST_SEARCH_DEPTH):
        parent = posixpath.dirname(folder)
        if not parent or parent == folder:
            break
        prefix = posixpath.join(posixpath.basename(folder), prefix)
        folder = parent
        candidate = posixpath.join(folder, MANIFEST_FILE_NAME)
        if fs.get_file_info(candidate).type != pyarrow.fs.FileType.File:
            continue
        entries = _load_manifest(fs, candidate)
        covered = {rel[len(prefix) :]: e for rel, e in entries.items() if rel.startswith(prefix)}
        if covered:
            return candidate, covered
    return None, {}


def _load_manifest(fs: pyarrow.fs.FileSystem, manifest_path: str) -> dict[str, ManifestEntry]:
    try:
        manifest = json.loads(read_bytes(fs, manifest_path).decode("utf-8"))
        if manifest.get("format") != _MANIFEST_FORMAT or not isinstance(
            manifest.get("files"), dict
        ):
            raise ValueError(f"not an {_MANIFEST_FORMAT}")
        if manifest.get("version") != _MANIFEST_VERSION:
            raise ValueError(
                f"manifest version {manifest.get('version')!r}; this rllib-amp reads version "
                f"{_MANIFEST_VERSION}: upgrade rllib-amp"
            )
        return {
            str(rel): {"bytes": int(e["bytes"]), "sha256": str(e["sha256"])}
            for rel, e in manifest["files"].items()
        }
    except Exception as e:  # any defect of the manifest itself
        fail(fs, manifest_path, f"is unreadable ({type(e).__name__}: {e})")


def check_checksum(
    fs: pyarrow.fs.FileSystem, full: str, data: bytes, entry: ManifestEntry, manifest_path: str
) -> None:
    shown = display_path(fs, manifest_path)
    if len(data) != entry["bytes"]:
        fail(
            fs,
            full,
            f"has {len(data)} bytes where the manifest {shown} records {entry['bytes']} "
            f"(truncated or overwritten after the save)",
        )
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        fail(
            fs,
            full,
            f"does not match its sha256 in the manifest {shown} (its bytes changed after the save)",
        )


def fail(
    fs: pyarrow.fs.FileSystem,
    full: str,
    problem: str,
    *,
    advice: str = "Restore from another checkpoint.",
) -> NoReturn:
    shown = display_path(fs, full)
    raise CheckpointError(
        f"{shown}: checkpoint file {problem}; nothing was restored. {advice}".rstrip(),
        path=shown,
        problem=problem,
    )
