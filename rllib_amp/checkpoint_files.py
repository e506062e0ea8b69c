"""Checkpoint files: a manifest of checksums at save time, every file read before a restore.

In the base layer: restores (``checkpoints/``) and warm starts (``scaling/``) share the checks.
RLlib restores an Algorithm component by component, so a damaged file found half-way leaves
half a state behind. Here the whole checkpoint is read first, and a restore goes ahead only
when every file:

- is listed in the manifest with the same size and sha256, when the checkpoint has one
  (``rllib_amp_manifest.json``, written last by ``write_manifest``);
- parses (pickle, msgpack, json), so truncated or overwritten files are caught without one;
- holds finite module weights and optimizer state (``rl_module`` and ``optimizer`` parts,
  ``module_state`` files) and a finite, positive loss scale: a run that diverged saved garbage.

Before any file is read, a symbolic link that leads out of the folder is refused, and so is a
missing state file that RLlib's restore reads (each component folder's own, and ``required``).
A file the manifest does not list is refused when RLlib reads it (put there after the save),
else named in one WARNING. Checkpoints without a manifest (stock RLlib, older rllib-amp) are
still read and checked, with one INFO line. Paths: local folders or pyarrow URIs.

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

import contextlib
import logging
import math
import os
import posixpath
import sys
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pyarrow.fs

from rllib_amp.checkpoint_manifest import (
    MANIFEST_FILE_NAME,
    CheckpointError,
    Location,
    check_checksum,
    fail,
    find_manifest,
    write_manifest,
)
from rllib_amp.fs import (
    STATE_FORMATS,
    decode,
    display_path,
    exists,
    is_dir,
    is_file,
    list_files,
    read_bytes,
    resolve,
)
from rllib_amp.log_events import event
from rllib_amp.settings import scaler_state_defects

if TYPE_CHECKING:
    from ray.rllib.utils.checkpoints import Checkpointable

# The manifest's names are read from here too: one module for a checkpoint's checks.
__all__ = [
    "MANIFEST_FILE_NAME",
    "CheckpointError",
    "Location",
    "VerifiedCheckpoint",
    "rllib_restore_files",
    "verify_checkpoint",
    "write_manifest",
]

logger = logging.getLogger(__name__)

# The parts of a state that must be finite: RLlib's COMPONENT_RL_MODULE and
# COMPONENT_OPTIMIZER keys, and RLModule's own state files. Metrics may hold nan legitimately.
_FINITE_KEYS = ("rl_module", "optimizer")
_MODULE_STATE_STEM = "module_state"
# The state files RLlib's restore_from_path loads (Checkpointable.STATE_FILE_NAME, Algorithm's
# and RLModule's); other pickles (class_and_ctor_args) are read by from_checkpoint at most.
_RESTORED_STEMS = ("state", "algorithm_state", _MODULE_STATE_STEM)
# The endings RLlib's state files have (Checkpointable.restore_from_path: msgpack if present).
_STATE_ENDINGS = (".msgpack", ".pkl")
# Files RLlib writes into every component folder next to its state file
# (Checkpointable.METADATA_FILE_NAME, CLASS_AND_CTOR_ARGS_FILE_NAME): they mark the folder as
# one RLlib's restore descends into.
_COMPONENT_MARKERS = ("metadata.json", "class_and_ctor_args.pkl")
# Other files RLlib reads: Algorithm.from_checkpoint's class file and checkpoint info.
_READ_BY_RLLIB = ("class_and_ctor_args.pkl", "rllib_checkpoint.json")
# The scalers' state inside a learner state (rllib_amp.scaling.state.AMP_STATE_KEY, a layer
# above this one): its loss scale must be finite and positive.
_AMP_STATE_KEY = "amp_scalers"


@dataclass(frozen=True)
class VerifiedCheckpoint:
    """What ``verify_checkpoint`` read: the folder, its file count and the manifest used."""

    path: str
    files: int
    manifest: str | None


def verify_checkpoint(
    path: Location,
    *,
    filesystem: pyarrow.fs.FileSystem | None = None,
    announce_missing_manifest: bool = True,
    for_rllib: bool = True,
    required: Iterable[str] = (),
) -> VerifiedCheckpoint | None:
    """Reads every file of a checkpoint folder; CheckpointError names the first damaged one.

    The checks are the module's (above); the manifest is the folder's own, or that of the
    algorithm checkpoint it is part of. ``for_rllib=False`` (a warm start, which reads only
    plain numbers and checks the scaler state itself) accepts msgpack files without
    msgpack_numpy, component folders without their state file, and leaves the loss scales
    to the caller.

    Args:
        path: The checkpoint folder: a local path, a URI (``s3://...``) or, with
            ``filesystem``, a path on that filesystem.
        filesystem: The pyarrow filesystem ``path`` lies on; None resolves it from ``path``.
        announce_missing_manifest: Log one INFO line when the folder has no manifest.
        for_rllib: False for a warm start (see above): fewer files are required.
        required: Further files that must exist, relative to ``path``.

    Returns:
        What was checked (the folder, how many files, which manifest), or None, doing
        nothing, when ``path`` is no folder: RLlib then reports the missing checkpoint itself.

    Raises:
        CheckpointError: naming the first missing, damaged or unlisted file.

    Example:
        >>> verify_checkpoint("/tmp/run/checkpoint_000001")  # doctest: +SKIP
        VerifiedCheckpoint(path='/tmp/run/checkpoint_000001', files=25, manifest='...')
    """
    fs, root = resolve(path, filesystem)
    if not is_dir(fs, root):
        return None
    required = tuple(required)
    _refuse_links_out_of(fs, root)
    files = list_files(fs, root)
    present = set(files)
    manifest_path, expected = find_manifest(fs, root, files)
    for rel in expected:
        if rel not in present:
            fail(
                fs,
                posixpath.join(root, rel),
                f"is listed in the manifest {display_path(fs, manifest_path or '')} but "
                f"missing (an interrupted save or copy)",
            )
    for rel in (*required, *(_component_state_files(fs, root, files) if for_rllib else ())):
        if rel not in present:
            fail(
                fs,
                posixpath.join(root, rel),
                "is missing, and RLlib's restore reads it (an interrupted save or copy, or "
                "a file removed since)",
            )
    if manifest_path is not None:
        unlisted = [r for r in files if r not in expected and r != MANIFEST_FILE_NAME]
        for rel in unlisted:
            if rel in required or _is_state_file(rel) or posixpath.basename(rel) in _READ_BY_RLLIB:
                fail(
                    fs,
                    posixpath.join(root, rel),
                    f"is not listed in the manifest {display_path(fs, manifest_path)}, and "
                    f"RLlib would load it: it was put there after the save",
                )
        if unlisted:
            shown = [display_path(fs, posixpath.join(root, rel)) for rel in unlisted]
            logger.warning(
                "rllib_amp: checkpoint %s holds %d file(s) its manifest does not list, which "
                "RLlib does not read: %s (added after the save; they are ignored)",
                display_path(fs, root),
                len(shown),
                ", ".join(shown),
                extra=event("unlisted_files", path=display_path(fs, root), files=shown),
            )
    # Every listed file against the manifest before any file is parsed: parsing a pickle runs
    # code. With a manifest, an unlisted file (named in the WARNING) is never parsed.
    contents, checked = {}, 0
    for rel in files:
        full = posixpath.join(root, rel)
        if full == manifest_path:
            continue
        data = read_bytes(fs, full)
        checked += 1
        if rel in expected:
            check_checksum(fs, full, data, expected[rel], manifest_path or "")
        if manifest_path is None or rel in expected:
            contents[full] = data
    for full, data in contents.items():
        _check_content(fs, full, data, for_rllib=for_rllib)
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


def rllib_restore_files(
    checkpointable: Checkpointable | None,
    path: Location,
    *,
    filesystem: pyarrow.fs.FileSystem | None = None,
) -> list[str]:
    """The state files ``checkpointable.restore_from_path(path)`` reads, relative to ``path``
    (maybe missing: the caller checks), as RLlib 2.60 does: each component whose folder
    exists, then the object's own state file (``.msgpack`` if there is one, else ``.pkl``);
    in a remote component's folder (a learner group's), every component folder's state file.

    Args:
        checkpointable: The RLlib object to be restored (an Algorithm, a Learner, ...); None
            lists nothing.
        path: Its checkpoint folder (local path or URI; with ``filesystem``, a path there).
        filesystem: The pyarrow filesystem ``path`` lies on; None resolves it from ``path``.

    Example:
        >>> rllib_restore_files(None, "/no/such/checkpoint")
        []
    """
    fs, root = resolve(path, filesystem)
    if checkpointable is None or not is_dir(fs, root):
        return []
    return _restore_files(checkpointable, fs, root, "")


def _restore_files(
    obj: Checkpointable, fs: pyarrow.fs.FileSystem, root: str, prefix: str
) -> list[str]:
    from ray.rllib.utils.actor_manager import FaultTolerantActorManager

    out: list[str] = []
    for name, component in obj.get_checkpointable_components():
        rel = posixpath.join(prefix, name) if prefix else name
        folder = posixpath.join(root, rel)
        if not exists(fs, folder):
            continue
        if isinstance(component, FaultTolerantActorManager):
            inside = _component_state_files(fs, folder, list_files(fs, folder))
            out += [posixpath.join(rel, f) for f in inside]
        else:
            out += _restore_files(component, fs, root, rel)
    stem = posixpath.join(prefix, obj.STATE_FILE_NAME)
    msgpack = f"{stem}.msgpack"
    out.append(msgpack if is_file(fs, posixpath.join(root, msgpack)) else f"{stem}.pkl")
    return out


def _component_state_files(fs: pyarrow.fs.FileSystem, root: str, files: list[str]) -> list[str]:
    """For each folder among ``files`` (relative to ``root``) that holds RLlib's component
    files, its state file: the one present, else the one its metadata.json names."""
    by_folder: dict[str, set[str]] = {}
    for rel in files:
        folder, name = posixpath.split(rel)
        by_folder.setdefault(folder, set()).add(name)
    out = []
    for folder, names in sorted(by_folder.items()):
        if not any(marker in names for marker in _COMPONENT_MARKERS):
            continue
        states = [n for n in sorted(names) if _is_state_file(n)]
        stem = "state"
        if not states and _COMPONENT_MARKERS[0] in names:
            path = posixpath.join(root, folder, _COMPONENT_MARKERS[0])
            with contextlib.suppress(Exception):  # a damaged metadata.json: named when read
                named = decode(path, read_bytes(fs, path)).get("state_file")
                stem = named if named in _RESTORED_STEMS else stem
        out.append(posixpath.join(folder, states[0] if states else f"{stem}.pkl"))
    return out


def _is_state_file(name: str) -> bool:
    stem, ext = posixpath.splitext(posixpath.basename(name))
    return stem in _RESTORED_STEMS and ext in _STATE_ENDINGS


def _refuse_links_out_of(fs: pyarrow.fs.FileSystem, root: str) -> None:
    """CheckpointError for the first symbolic link below ``root`` (a local folder) that
    leads out of it or nowhere; nothing beyond it is listed or read."""
    if not isinstance(fs, pyarrow.fs.LocalFileSystem):
        return  # object stores have no links
    top = os.path.realpath(root)
    for folder, dirs, names in os.walk(root, followlinks=False):
        for name in sorted(dirs + names):
            link = os.path.join(folder, name)
            if not os.path.islink(link):
                continue
            target = os.path.realpath(link)
            if not os.path.exists(target):
                problem = f"is a symbolic link to {os.readlink(link)}, which does not exist"
            elif target != top and not target.startswith(top.rstrip(os.sep) + os.sep):
                problem = (
                    f"is a symbolic link to {target}, outside the checkpoint folder "
                    f"{display_path(fs, root)}; it was not followed"
                )
            else:
                continue
            fail(
                fs,
                link,
                problem,
                advice="Put the files themselves in the checkpoint folder, or restore from "
                "another checkpoint.",
            )


def _check_content(
    fs: pyarrow.fs.FileSystem, full: str, data: bytes, *, for_rllib: bool = True
) -> None:
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
            fail(
                fs,
                full,
                f"cannot be loaded here ({type(e).__name__}: {e}); install or import what it "
                f"refers to",
                advice="",
            )
        return
    except Exception as e:  # any other parse failure means a damaged file
        fail(fs, full, f"is truncated or corrupted ({type(e).__name__}: {e})")
    if stem == _MODULE_STATE_STEM:
        parts = [("", obj)]
    else:
        parts = [(k, obj[k]) for k in _FINITE_KEYS if isinstance(obj, dict) and k in obj]
    # A warm start (not for RLlib) checks the scaler state it reads itself, value by value.
    if for_rllib and isinstance(obj, dict) and isinstance(obj.get(_AMP_STATE_KEY), dict):
        parts.append((_AMP_STATE_KEY, obj[_AMP_STATE_KEY]))
        # A loss scale of 0 or below is as unusable as an inf one (which _nonfinite names).
        for module_id, state in obj[_AMP_STATE_KEY].items():
            for field, scale in scaler_state_defects(state):
                try:
                    value = float(scale) if field == "scale" else math.nan
                except (TypeError, ValueError):
                    continue
                if math.isfinite(value) and value <= 0:
                    fail(
                        fs,
                        full,
                        f"holds a loss scale of {value:g} for module {module_id!r} at "
                        f"{_AMP_STATE_KEY}/{module_id}/torch/scale: a loss scale must be > 0",
                        advice="Restore from an earlier checkpoint.",
                    )
    for key, part in parts:
        if (bad := next(_nonfinite(part, key), None)) is not None:
            fail(
                fs,
                full,
                f"holds non-finite values at {bad[0] or '(the whole state)'} ({bad[1]} nan, "
                f"{bad[2]} inf): the run that saved it had diverged",
                advice="Restore from an earlier checkpoint.",
            )


def _nonfinite(obj: object, where: str) -> Iterator[tuple[str, int, int]]:
    """(key path, nan count, inf count) of each non-finite float array or number in ``obj``."""
    if isinstance(obj, (dict, list, tuple)):
        for k, v in obj.items() if isinstance(obj, dict) else enumerate(obj):
            yield from _nonfinite(v, f"{where}/{k}" if where else str(k))
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
