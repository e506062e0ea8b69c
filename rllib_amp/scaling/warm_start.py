"""Warm starts: a run's loss scales start from another run's checkpoint, not from init_scale.

``AmpSettings.warm_start = {"from": CHECKPOINT, "modules": {new_id: old_id}}`` (YAML
``amp.warm_start``, ``with_amp(cfg, warm_start=...)``). When the learner builds its modules,
each module's scale and growth tracker are set from ``old_id``'s saved scaler state; weights
and optimizer state are untouched. For the next stage of a curriculum, a new task's module, a
rerun that should not spend its first updates backing off from 65536.

Only the learner's state file is read (``learner_group/learner/state.pkl``, or ``state.pkl``
of a learner folder; ``.msgpack`` too), on the learner's machine, from a local path or URI.
As with RLlib's ``RLModuleSpec.load_state_path``, the checkpoint must stay readable while the
run may be rebuilt (restores, PBT); after a restore, the restored scaler state wins.

Example:
    >>> from rllib_amp import with_amp
    >>> from ray.rllib.algorithms.ppo import PPOConfig
    >>> cfg = with_amp(PPOConfig(), dtype="float16",  # doctest: +SKIP
    ...                warm_start={"from": "/runs/stage1/checkpoint_000009"})
"""

from __future__ import annotations

import logging
import posixpath
from collections.abc import Iterable, Mapping

from rllib_amp.checkpoint_files import CheckpointError, verify_checkpoint
from rllib_amp.fs import (
    checkpoint_folders,
    decode,
    error_line,
    exists,
    is_dir,
    is_file,
    is_uri,
    join,
    probe,
    read_bytes,
    resolve,
)
from rllib_amp.log_events import event
from rllib_amp.scaling.scaler import PolicyScaler, ScalerState, saved_scale, seed_scalers
from rllib_amp.scaling.state import AMP_STATE_KEY
from rllib_amp.settings import (
    FLOAT32_MAX,
    FLOAT32_TINY,
    MISSING_CHECKPOINT,
    STATE_VERSION,
    AmpSettings,
    WarmStart,
    scaler_state_defects,
)

logger = logging.getLogger(__name__)

WHERE = "amp.warm_start"
# Where a learner's own state file sits, relative to the folder given, first match wins:
# an Algorithm checkpoint, a LearnerGroup folder, a learner folder.
LEARNER_FOLDERS: tuple[str, ...] = ("learner_group/learner", "learner", "")
STATE_FILES: tuple[str, ...] = ("state.pkl", "state.msgpack")


def learner_state_file(path: str) -> str | None:
    """The learner state file inside a checkpoint folder (or ``path`` if it is one); None.

    Example:
        >>> learner_state_file("/no/such/checkpoint") is None
        True
    """
    fs, base = resolve(path)
    if is_file(fs, base):
        return path
    if not is_dir(fs, base):
        return None
    for folder in LEARNER_FOLDERS:
        for name in STATE_FILES:
            rel = f"{folder}/{name}" if folder else name
            if is_file(fs, posixpath.join(base, rel)):
                return join(path, rel)  # a URI's query stays last
    return None


def read_scaler_states(path: str) -> dict[str, ScalerState]:
    """ModuleID -> saved PolicyScaler state of the checkpoint at ``path``; ValueError naming
    ``amp.warm_start.from`` and the fix when there is none to read.

    Example:
        >>> read_scaler_states("/no/such/checkpoint")
        Traceback (most recent call last):
        ...
        ValueError: amp.warm_start.from: '/no/such/checkpoint' does not exist; ...
    """
    where = f"{WHERE}.from"
    try:
        return _read_scaler_states(path, where)
    except OSError as e:  # the remote is down, slow or refuses us: before any trial, or in one
        remote = "reachable from this machine, " if is_uri(path) else ""
        raise ValueError(
            f"{where}: cannot read {path!r} ({error_line(e)}); check that it is {remote}"
            f"readable with these credentials, or drop warm_start to start from init_scale"
        ) from None


def _read_scaler_states(path: str, where: str) -> dict[str, ScalerState]:
    # A dead endpoint: one timeout, named as such, instead of one per file below.
    probe(path)
    fs, base = resolve(path)
    if not exists(fs, base):
        raise ValueError(f"{where}: {path!r} {MISSING_CHECKPOINT}")
    file = learner_state_file(path)
    if file is None:
        inside = [posixpath.basename(f) for f in reversed(checkpoint_folders(fs, base))]
        hint = f" (this folder holds {', '.join(inside)}: pick one)" if inside else ""
        raise ValueError(
            f"{where}: {path!r} holds no learner state file ({' or '.join(STATE_FILES)} in "
            f"learner_group/learner/, learner/ or the folder itself){hint}; give an Algorithm "
            f"checkpoint folder (checkpoint_NNNNNN) or its learner_group/learner folder"
        )
    try:
        # The checks a restore applies to the whole checkpoint, then the learner state.
        folder = base if is_dir(fs, base) else posixpath.dirname(base)
        verify_checkpoint(folder, filesystem=fs, announce_missing_manifest=False, for_rllib=False)
        file_fs, fs_file = resolve(file)
        state = decode(fs_file, read_bytes(file_fs, fs_file))
    except CheckpointError as e:
        raise ValueError(
            f"{where}: {e.path}: checkpoint file {e.problem}; warm-start from another "
            f"checkpoint, or drop warm_start to start from init_scale"
        ) from None
    except Exception as e:  # any parse failure: a damaged or foreign file
        raise ValueError(
            f"{where}: {file}: cannot read the learner state ({type(e).__name__}: {e}); "
            f"warm-start from another checkpoint"
        ) from None
    saved = state.get(AMP_STATE_KEY) if isinstance(state, Mapping) else None
    if not saved:
        raise ValueError(
            f"{where}: {path!r} holds no AMP scaler state (saved by stock RLlib, or with AMP "
            f"off); warm-start from a checkpoint of a float16 rllib-amp run, or drop warm_start "
            f"to start from init_scale"
        )
    _check_saved_scales(file, saved)
    return dict(saved)


# What a saved scaler state's field must be, by the field ``scaler_state_defects`` names.
_DEFECTS = {
    "": "scaler state {!r}, not a mapping",
    "version": f"scaler state version {{!r}}; this rllib-amp reads version {STATE_VERSION} "
    f"(saved by another rllib-amp, or edited)",
    "scaling": "saved scaling flag {!r}; it is true or false",
    "torch": "saved GradScaler state {!r}, not a mapping",
    "scale": f"saved scale {{!r}}; a loss scale is a positive normal float32, in "
    f"[{FLOAT32_TINY:g}, {FLOAT32_MAX:g}]",
    "_growth_tracker": "saved growth tracker {!r}; it is a count of clean steps, an integer >= 0",
}


def _check_saved_scales(file: str, saved: object) -> None:
    """ValueError naming the file, the module and the value of a scaler state no scaler
    could load: such a run never saved it; the file was edited or written by another version."""
    if not isinstance(saved, Mapping):
        raise ValueError(
            f"{WHERE}.from: {file}: the AMP scaler state is a {type(saved).__name__}, not a "
            f"mapping of ModuleID -> scaler state; warm-start from another checkpoint"
        )
    for module_id, state in saved.items():
        for field, value in scaler_state_defects(state):
            raise ValueError(
                f"{WHERE}.from: {file}: module {str(module_id)!r} has the "
                f"{_DEFECTS[field].format(value)}; warm-start from another checkpoint, or "
                f"drop warm_start to start from init_scale"
            )


def warm_start_seeds(
    warm: WarmStart, module_ids: Iterable[str] | None = None
) -> dict[str, tuple[float, int]]:
    """new ModuleID -> (scale, growth tracker) to seed it with, read from the checkpoint.

    ``module_ids``: this run's modules (None: not known yet; only the checkpoint side is
    checked). ValueError, naming the key and the fix, for a checkpoint without a loss scale
    or a map naming a module missing there or in this run.

    Example:
        >>> from rllib_amp.settings import WarmStart
        >>> warm_start_seeds(WarmStart(path="/no/such/checkpoint"))
        Traceback (most recent call last):
        ...
        ValueError: amp.warm_start.from: '/no/such/checkpoint' does not exist; ...
    """
    saved = read_scaler_states(warm.path)
    # Checked states: saved_scale raises on none of them; None for a bfloat16 module.
    scales = {str(m): seed for m, st in saved.items() if (seed := saved_scale(st)) is not None}
    if not scales:
        raise ValueError(
            f"{WHERE}.from: {warm.path!r} holds no loss scale: its modules "
            f"({', '.join(sorted(map(str, saved)))}) trained without loss scaling (bfloat16); "
            f"warm-start from a float16 run's checkpoint, or drop warm_start"
        )
    known = ", ".join(sorted(scales))
    # Sorted: an error names the same first module on every run.
    ids = None if module_ids is None else sorted(map(str, module_ids))
    if warm.modules is None:
        if ids is None:
            return dict(scales)
        for mid in ids:
            if mid not in scales:
                raise ValueError(
                    f"{WHERE}: this run's module {mid!r} has no loss scale in {warm.path!r} "
                    f"(modules there with one: {known}); add {WHERE}.modules: "
                    f"{{{mid}: OLD_ID}} to say which module seeds it"
                )
        return {mid: scales[mid] for mid in ids}
    seeds = {}
    for new_id, old_id in warm.modules:
        if old_id not in scales:
            why = "trained without loss scaling" if old_id in saved else "is not in it"
            raise ValueError(
                f"{WHERE}.modules.{new_id}: {old_id!r} {why} (checkpoint {warm.path!r}; "
                f"modules there with a loss scale: {known}); map {new_id!r} to one of those"
            )
        if ids is not None and new_id not in ids:
            raise ValueError(
                f"{WHERE}.modules: {new_id!r} is not a module of this run (modules: "
                f"{', '.join(sorted(ids))}); the keys are this run's ModuleIDs, the values "
                f"the checkpoint's"
            )
        seeds[new_id] = scales[old_id]
    return seeds


def check_warm_start(settings: AmpSettings, module_ids: Iterable[str] | None = None) -> None:
    """Reads ``settings.warm_start``'s checkpoint now (if any): ValueError as the learner
    would raise, for command lines that refuse bad input before anything starts.

    Example:
        >>> check_warm_start(AmpSettings())  # no warm start: nothing to check
    """
    if settings.warm_start is not None:
        warm_start_seeds(settings.warm_start, module_ids)


def apply_warm_start(scalers: Mapping[str, PolicyScaler], warm: WarmStart | None) -> None:
    """Seeds the scalers of a learner that just built its modules (one INFO line each);
    without loss scaling (float32, bfloat16) one WARNING, nothing read."""
    if warm is None:
        return
    if not any(s.scaling for s in scalers.values()):
        logger.warning(
            "rllib_amp: amp.warm_start is ignored: this run trains without loss scaling "
            "(float32 or bfloat16), so there is no scale to seed",
            extra=event("warm_start_ignored", path=warm.path),
        )
        return
    seeds = warm_start_seeds(warm, scalers)
    seed_scalers(scalers, seeds)
    sources = warm.module_map(scalers)
    for module_id in seeds:
        scaler = scalers[module_id]
        logger.info(
            "rllib_amp: module %r starts at scale %g (growth tracker %d) from module %r of %s",
            module_id,
            scaler.get_scale(),
            scaler.growth_tracker,
            sources[module_id],
            warm.path,
            extra=event(
                "warm_start",
                module_id=module_id,
                from_module=sources[module_id],
                scale=scaler.get_scale(),
                growth_tracker=scaler.growth_tracker,
                path=warm.path,
            ),
        )
