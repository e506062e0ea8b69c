"""Checkpoint files: a manifest of checksums at save time, every file read before a restore.

In the base layer: restores (``checkpoints/``) and warm starts (``scaling/``) read a
checkpoint through the same checks.

RLlib restores an Algorithm component by component (learner group, then env runner, then the
algorithm's own state), so a damaged file found half-way leaves half a state behind. Here the
whole checkpoint is read first, and a restore goes ahead only when every file:

- is listed in the manifest with the same size and sha256, when the checkpoint has one
  (``rllib_amp_manifest.json``, written last by ``write_manifest``);
- parses (pickle, msgpack, json), so truncated or overwritten files are caught without one;
- holds finite module weights and optimizer state (the ``rl_module`` and ``optimizer``
  parts of a state, and ``module_state`` files): a run that diverged saved garbage.

Checkpoints without a manifest (stock RLlib, older rllib-amp) are still read and checked, with
one INFO line. Paths are local folders or pyarrow URIs (``s3://``, ``gs://``, ``file://``).

Example:
    >>> import os, pickle, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with open(os.path.join(folder, "state.pkl"), "wb") as f:
    ...     pickle.dump({"optimizer": {"lr": 1e-3}}, f)
    >>> os.path.basename(write_manifest(folder))
    'rllib_amp_manifest.json'
    >>> verify_checkpoint(folder).manifest is not None
    True
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import posixpath
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, NoReturn

import numpy as np
import pyarrow.fs

from rllib_amp.fs import (
    STATE_FORMATS,
    decode,
    display_path,
    is_dir,
    list_files,
    read_bytes,
    resolve,
)
from rllib_amp.log_events import event

logger = logging.getLogger(__name__)

MANIFEST_FILE_NAME = "rllib_amp_manifest.json"
_MANIFEST_FORMAT = "rllib-amp checkpoint manifest"
_MANIFEST_VERSION = 1
# A component restored on its own (e.g. ``learner_group/learner/rl_module/default_policy``)
# sits at most this deep below the algorithm folder that holds the manifest.
_MANIFEST_SEARCH_DEPTH = 4
# The parts of a state that must be finite: RLlib's COMPONENT_RL_MODULE and
# COMPONENT_OPTIMIZER keys, and RLModule's own state files. Metrics may hold nan legitimately.
_FINITE_KEYS = ("rl_module", "optimizer")
_MODULE_STATE_STEM = "module_state"
# The state files RLlib's restore_from_path loads (Checkpointable.STATE_FILE_NAME, Algorithm's
# and RLModule's); other pickles (class_and_ctor_args) are read by from_checkpoint at most.
_RESTORED_STEMS = ("state", "algorithm_state", _MODULE_STATE_STEM)


class CheckpointError(ValueError):
    """A checkpoint file is damaged; nothing of the checkpoint was restored. ``path``: that
    file; ``problem``: what is wrong with it, without the advice (for readers other than a
    restore, such as warm starts)."""

    def __init__(self, message: str, path: str = "", problem: str = "") -> None:
        super().__init__(message)
        self.path = path
        self.problem = problem

    def __reduce__(self) -> tuple[Any, ...]:
        # Keeps ``path`` when Ray sends the error from a remote learner to the driver.
        return (type(self), (str(self), self.path, self.problem))


@dataclass(frozen=True)
class VerifiedCheckpoint:
    """What ``verify_checkpoint`` read: the folder, its file count and the manifest used."""

    path: str
    files: int
    manifest: str | None


def write_manifest(path: Any, *, filesystem: pyarrow.fs.FileSystem | None = None) -> str:
    """Writes ``rllib_amp_manifest.json`` (size and sha256 of every file) into a checkpoint.

    Call it after every other file of the checkpoint is written. Returns the manifest's path.

    Example:
        >>> write_manifest("/tmp/run/checkpoint_000001")  # doctest: +SKIP
        '/tmp/run/checkpoint_000001/rllib_amp_manifest.json'
    """
    fs, root = resolve(path, filesystem)
    files = {}
    for rel in list_files(fs, root):
        if rel == MANIFEST_FILE_NAME:
            continue
        data = read_bytes(fs, posixpath.join(root, rel))
        files[rel] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {"format": _MANIFEST_FORMAT, "version": _MANIFEST_VERSION, "files": files}
    target = posixpath.join(root, MANIFEST_FILE_NAME)
    with fs.open_output_stream(target) as f:
        f.write(json.dumps(manifest, indent=1, sort_keys=True).encode("utf-8"))
    return display_path(fs, target)


def verify_checkpoint(
    path: Any,
    *,
    filesystem: pyarrow.fs.FileSystem | None = None,
    announce_missing_manifest: bool = True,
    for_rllib: bool = True,
) -> VerifiedCheckpoint | None:
    """Reads every file of a checkpoint folder; CheckpointError names the first damaged one.

    Checks sizes and checksums against the checkpoint's manifest (its own, or the one of the
    algorithm checkpoint it is part of), parses every state file, and rejects non-finite
    module weights or optimizer state. Without a manifest, logs one INFO line unless
    ``announce_missing_manifest`` is False. ``for_rllib=False`` (a warm start, which reads
    only plain numbers) accepts msgpack files where msgpack_numpy, which RLlib's own restore
    needs, is not installed. Returns None, doing nothing, when ``path`` is no
    folder: RLlib then reports the missing checkpoint itself.

    Example:
        >>> verify_checkpoint("/tmp/run/checkpoint_000001")  # doctest: +SKIP
        VerifiedCheckpoint(path='/tmp/run/checkpoint_000001', files=25, manifest='...')
    """
    fs, root = resolve(path, filesystem)
    if not is_dir(fs, root):
        return None
    files = list_files(fs, root)
    manifest_path, expected = _find_manifest(fs, root, files)
    present = set(files)
    for rel in expected:
        if rel not in present:
            _fail(
                fs,
                posixpath.join(root, rel),
                f"is listed in the manifest {display_path(fs, manifest_path or '')} but "
                f"missing (an interrupted save or copy)",
            )
    checked = 0
    for rel in files:
        full = posixpath.join(root, rel)
        if full == manifest_path:
            continue
        data = read_bytes(fs, full)
        if rel in expected:
            _check_checksum(fs, full, data, expected[rel], manifest_path or "")
        _check_content(fs, full, data, for_rllib=for_rllib)
        checked += 1
    if manifest_path is None and announce_missing_manifest:
        logger.info(
            "rllib_amp: checkpoint %s has no %s (saved by stock RLlib or an older rllib-amp): "
            "its %d files were read and parse, but changed bytes inside them cannot be detected",
            display_path(fs, root),
            MANIFEST_FILE_NAME,
            checked,
            extra=event("no_manifest", path=display_path(fs, root), files=checked),
        )
    return VerifiedCheckpoint(
        display_path(fs, root),
        checked,
        display_path(fs, manifest_path) if manifest_path else None,
    )


def _find_manifest(fs: Any, root: str, files: list[str]) -> tuple[str | None, dict[str, Any]]:
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


def _load_manifest(fs: Any, manifest_path: str) -> dict[str, Any]:
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
        _fail(fs, manifest_path, f"is unreadable ({type(e).__name__}: {e})")


def _check_checksum(
    fs: Any, full: str, data: bytes, entry: dict[str, Any], manifest_path: str
) -> None:
    if len(data) != entry["bytes"]:
        _fail(
            fs,
            full,
            f"has {len(data)} bytes where the manifest {display_path(fs, manifest_path)} "
            f"records {entry['bytes']} (truncated or overwritten after the save)",
        )
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        _fail(
            fs,
            full,
            f"does not match its sha256 in the manifest {display_path(fs, manifest_path)} "
            f"(its bytes changed after the save)",
        )


def _check_content(fs: Any, full: str, data: bytes, *, for_rllib: bool = True) -> None:
    stem, ext = posixpath.splitext(posixpath.basename(full))
    if ext not in STATE_FORMATS:
        return
    if ext == ".msgpack" and for_rllib:
        from ray.rllib.utils.checkpoints import try_import_msgpack

        # Outside the parse errors below: without msgpack_numpy no msgpack checkpoint loads.
        try_import_msgpack(error=True)
    try:
        obj = decode(full, data)
    except (ImportError, AttributeError) as e:
        # A class the pickle names is missing here: the file may be fine. RLlib's restore
        # never reads the other files (from_checkpoint falls back past such a class file).
        if stem in _RESTORED_STEMS:
            _fail(
                fs,
                full,
                f"cannot be loaded here ({type(e).__name__}: {e}); install or import what it "
                f"refers to",
                advice="",
            )
        return
    except Exception as e:  # any other parse failure means a damaged file
        _fail(fs, full, f"is truncated or corrupted ({type(e).__name__}: {e})")
    parts = [("", obj)] if stem == _MODULE_STATE_STEM else _finite_parts(obj)
    for key, part in parts:
        bad = next(_nonfinite(part, key), None)
        if bad is not None:
            where, nans, infs = bad
            _fail(
                fs,
                full,
                f"holds non-finite values at {where or '(the whole state)'} ({nans} nan, "
                f"{infs} inf): the run that saved it had diverged",
                advice="Restore from an earlier checkpoint.",
            )


def _finite_parts(obj: Any) -> list[tuple[str, Any]]:
    if not isinstance(obj, dict):
        return []
    return [(key, obj[key]) for key in _FINITE_KEYS if key in obj]


def _nonfinite(obj: Any, where: str) -> Iterator[tuple[str, int, int]]:
    """(key path, nan count, inf count) of each non-finite float array or number in ``obj``."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            yield from _nonfinite(v, f"{where}/{k}" if where else str(k))
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            yield from _nonfinite(v, f"{where}/{i}" if where else str(i))
    elif isinstance(obj, np.ndarray):
        if obj.dtype.kind in "fc" and not np.isfinite(obj).all():
            yield where, int(np.isnan(obj).sum()), int(np.isinf(obj).sum())
    elif isinstance(obj, (float, np.floating)):
        if not math.isfinite(float(obj)):
            yield where, int(math.isnan(float(obj))), int(math.isinf(float(obj)))
    else:
        # Unpickling a tensor imports torch: if torch is not loaded, there is no tensor here.
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor) and obj.is_floating_point():
            t = obj.detach()
            if not torch.isfinite(t).all():
                yield where, int(torch.isnan(t).sum()), int(torch.isinf(t).sum())


def _fail(
    fs: Any, full: str, problem: str, *, advice: str = "Restore from another checkpoint."
) -> NoReturn:
    shown = display_path(fs, full)
    raise CheckpointError(
        f"{shown}: checkpoint file {problem}; nothing was restored. {advice}".rstrip(),
        path=shown,
        problem=problem,
    )
