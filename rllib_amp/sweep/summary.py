"""The summary of a finished sweep: one row per trial, the printed table, results.parquet.

A row holds the trial's searched values, final metric, the AMP scaler's final and settled state
and, when ``stop`` sets a threshold on the Tune metric, the env steps and seconds to first reach
it; the rows are then ranked by how soon they reached it (docs/cli.md says why).

Example:
    >>> from rllib_amp.experiment import load
    >>> target(load("tune_configs/cartpole_ppo_amp.yaml"))
    450.0
"""

from __future__ import annotations

import contextlib
import math
import os
import posixpath
import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np

from rllib_amp import fs as files
from rllib_amp.checks import is_number
from rllib_amp.cli import root_error
from rllib_amp.learner import metrics as amp_metrics
from rllib_amp.settings import AMP_CONFIG_KEY, AmpSettings
from rllib_amp.text_table import format_value, table

if TYPE_CHECKING:
    import pandas as pd
    from ray.tune import Result

    from rllib_amp.experiment import Experiment

MODULE_ID = "default_policy"
STEPS_KEY = "num_env_steps_sampled_lifetime"
Row = Mapping[str, object]


def amp_metric_key(name: str) -> str:
    return f"learners/{MODULE_ID}/{name}"


SCALE_KEY = amp_metric_key(amp_metrics.GRAD_SCALE)
# The final AMP metrics of a row: row key -> the learner's metric name.
AMP_COLUMNS = {
    "grad_scale": amp_metrics.GRAD_SCALE,
    "skip_fraction": amp_metrics.SKIP_FRACTION,
    "skipped_steps": amp_metrics.SKIPPED_STEPS_LIFETIME,
    "optimizer_steps": amp_metrics.OPTIMIZER_STEPS_LIFETIME,
}


def config_path(dotted: str, config: Mapping[str, object]) -> tuple[str, ...]:
    """Where a dotted experiment key lives in a trial's config (``AlgorithmConfig.to_dict()``).

    ``config`` is such a dict: it decides between RLlib's public and underscored names
    (``train_batch_size_per_learner`` is stored as ``_train_batch_size_per_learner``).
    """
    top, _, rest = dotted.partition(".")
    parts = rest.split(".") if rest else []
    fixed = {"amp": ("learner_config_dict", AMP_CONFIG_KEY), "model": ("_model_config",)}
    if top in fixed or top == "env_config":
        return (*fixed.get(top, (top,)), *parts)
    head = parts[0] if parts else top
    found = next((c for c in (head, f"_{head}", head.rstrip("_")) if c in config), head)
    return (found, *parts[1:])


def lookup(d: Mapping[str, object] | None, path: str | Sequence[str]) -> object:
    """``d[path[0]][path[1]]...`` (``path`` a sequence or "/"-joined) as a plain Python value,
    or None where a key is missing."""
    from ray.tune.utils import unflattened_lookup

    key = path if isinstance(path, str) else "/".join(path)
    try:
        return plain(unflattened_lookup(key, d or {}, default=None))
    except (TypeError, ValueError, IndexError):  # a leaf met before the path ended
        return None


def plain(v: object) -> object:
    """A numpy scalar (RLlib reduces metrics with numpy) as the Python number it holds."""
    return v.item() if isinstance(v, np.generic) else v


def finite(v: object) -> float | None:
    """``v`` as a float when it is a finite number (a numpy one too), else None."""
    v = plain(v)
    return float(v) if is_number(v) and math.isfinite(v) else None


def target(exp: Experiment) -> float | None:
    """The Tune metric's threshold in ``stop`` (mode max: the trial stops on reaching it)."""
    value = exp.stop.get(exp.tune["metric"])
    return float(value) if exp.tune["mode"] == "max" and is_number(value) else None


def target_columns(threshold: float) -> tuple[str, str]:
    return f"env_steps_to_{threshold:g}", f"time_s_to_{threshold:g}"


def history(result: Result) -> pd.DataFrame | None:
    """The trial's result history (keys joined by "/") along its ``lineage``; None if Tune kept
    none."""
    try:
        frame = result.metrics_dataframe
    except Exception:  # noqa: BLE001 - a trial whose progress file is missing or unreadable
        return None
    return lineage(frame)


def lineage(frame: pd.DataFrame | None) -> pd.DataFrame | None:
    """The rows of a trial's history that led to its final result: one per iteration.

    A trial restored from a checkpoint (``--resume``, a retry, a PBT exploit) trains the
    iterations after it again, and Tune appends their results without removing the abandoned
    run's: the same ``training_iteration`` is logged twice. A row belongs to the final line
    when its iteration is below every iteration logged after it.

    Example:
        >>> import pandas as pd
        >>> frame = pd.DataFrame({"training_iteration": [1, 2, 3, 4, 3, 4, 5], "x": range(7)})
        >>> lineage(frame)["x"].tolist()
        [0, 1, 4, 5, 6]
    """
    if frame is None or "training_iteration" not in frame.columns or frame.empty:
        return frame
    iterations = frame["training_iteration"]
    logged_after = iterations[::-1].cummin()[::-1].shift(-1, fill_value=math.inf)
    keep = iterations < logged_after
    return frame if keep.all() else frame[keep].reset_index(drop=True)


def _late_scales(frame: pd.DataFrame | None) -> list[float]:
    """The finite grad scales of the last quarter of a history (at least its last result)."""
    if frame is None or SCALE_KEY not in frame.columns:
        return []
    values = [v for v in map(finite, frame[SCALE_KEY].tolist()) if v is not None]
    return values[-max(1, math.ceil(len(values) / 4)) :]


def settled_scale(frame: pd.DataFrame | None, final: object = None) -> float | None:
    """The scale a trial settled at: the median of its grad scale over the last quarter of its
    results (one result's scale is wherever the last overflow left it); without a history,
    ``final`` (the last reported scale).

    Example:
        >>> import pandas as pd
        >>> frame = pd.DataFrame({"learners/default_policy/amp_grad_scale": [8.0] * 6 + [2.0, 4.0]})
        >>> settled_scale(frame)
        3.0
    """
    late = _late_scales(frame)
    return float(statistics.median(late)) if late else finite(final)


def scale_swing(frame: pd.DataFrame | None) -> float | None:
    """How far the scale still moved over the last quarter of the results: max - min of its
    log2 (0: it stayed put; 1: it still halved or doubled). None without a history.

    Example:
        >>> import pandas as pd
        >>> scale_swing(pd.DataFrame({"learners/default_policy/amp_grad_scale": [1.0, 2.0, 8.0]}))
        0.0
    """
    late = [v for v in _late_scales(frame) if v > 0]
    return math.log2(max(late)) - math.log2(min(late)) if late else None


def first_reached(
    frame: pd.DataFrame | None, metric: str, threshold: float
) -> tuple[object, object]:
    """(env steps, seconds) of the first result of a history with ``metric >= threshold``;
    (None, None) when it never got there (or kept no history)."""
    hit = frame[frame[metric] >= threshold] if frame is not None and metric in frame else None
    if hit is None or hit.empty:
        return None, None
    return plain(hit.iloc[0].get(STEPS_KEY)), plain(hit.iloc[0].get("time_total_s"))


def summarize(
    exp: Experiment, grid: Iterable[Result], storage: str | None = None
) -> list[dict[str, object]]:
    """One row per trial, ranked; with ``storage`` (a URI), checkpoints are URIs on it."""
    rows = []
    metric = exp.tune["metric"]
    threshold = target(exp)
    reached_key, time_key = target_columns(threshold) if threshold is not None else ("", "")
    for result in grid:
        cfg = result.config or {}
        final = result.metrics or {}
        frame = history(result)
        steps, total = lookup(final, STEPS_KEY), finite(lookup(final, "time_total_s"))
        seed = cfg.get("seed")
        error_file = f"{result.path.rstrip('/')}/error.txt" if result.path else None
        # A trial that never reported has Tune's placeholder metrics (trial_id "default"): its id
        # (``abcde_00000``) is in its folder's name, ``{trainable}_{id}_{index}_{params}_{time}``.
        named = re.search(r"_([0-9a-f]{5}_\d{5})(?:_|$)", os.path.basename(result.path or ""))
        row: dict[str, object] = {
            "trial_id": named.group(1) if named else final.get("trial_id"),
            **{key: lookup(cfg, config_path(key, cfg)) for key in exp.search},
            "seed": seed if seed is not None else exp.data.get("seed"),
            "base_seed": exp.data.get("seed"),
            "status": "ERROR" if result.error else ("DONE" if final.get("done") else "UNFINISHED"),
            "training_iteration": final.get("training_iteration"),
            "env_steps": steps,
            metric: lookup(final, metric),
            **{k: lookup(final, amp_metric_key(name)) for k, name in AMP_COLUMNS.items()},
            "settled_scale": settled_scale(frame, lookup(final, SCALE_KEY)),
            "scale_swing": scale_swing(frame),
            "env_steps_per_s": steps / total if is_number(steps) and steps and total else None,
            "checkpoint": _on(storage, result.checkpoint.path if result.checkpoint else None),
            "error": root_error(result.error) if result.error else None,
            "error_file": _on(storage, error_file) if result.error else None,
        }
        row.update(skip_warnings(frame, final, cfg))
        if threshold is not None:
            row[reached_key], row[time_key] = first_reached(frame, metric, threshold)
        rows.append(row)
    sign = -1.0 if exp.tune["mode"] == "max" else 1.0

    def order(r: Row) -> tuple[bool, float, bool, float]:
        # Those that reached the target first, soonest first; then by the metric, best first.
        steps, value = r.get(reached_key), r[metric]
        by_steps = (False, float(steps)) if is_number(steps) else (True, 0.0)
        if is_number(value) and not math.isnan(value):
            return (*by_steps, False, sign * value)
        return (*by_steps, True, 0.0)

    return sorted(rows, key=order)


def _on(storage: str | None, path: str | None) -> str | None:
    return files.to_uri(storage, path) if storage and path else path


def skip_warnings(frame: pd.DataFrame | None, final: Row, cfg: Row) -> dict[str, object]:
    """The "keeps skipping optimizer steps" WARNINGs a trial's learner logged (in its worker's
    log, which the CLI does not show): in how many iterations, the first, and the learner's
    own advice from the trial's AMP settings and final metrics (None without a warning)."""
    key = amp_metric_key(amp_metrics.SKIP_WARNING)
    warned = frame[frame[key].fillna(0) >= 1] if frame is not None and key in frame else None
    if warned is None or warned.empty:
        return {"skip_warnings": 0, "skip_warning_iteration": None, "skip_advice": None}
    from rllib_amp.learner import report

    amp = lookup(cfg, ("learner_config_dict", AMP_CONFIG_KEY))
    try:
        settings = AmpSettings.from_dict(amp if isinstance(amp, Mapping) else None)
    except Exception:  # noqa: BLE001 - the advice then names no values
        settings = None
    scale = lookup(final, SCALE_KEY)
    dtype = getattr(settings, "dtype", None)
    scaling = dtype == "float16" or (is_number(scale) and scale != 1.0 and dtype != "bfloat16")
    nonfinite = finite(lookup(final, amp_metric_key(amp_metrics.NONFINITE_LOSS_STEPS_LIFETIME)))
    cause = report.skip_cause(nonfinite_loss_steps=nonfinite or 0, scaling=scaling)
    first = warned["training_iteration"].iloc[0] if "training_iteration" in warned else None
    return {
        "skip_warnings": len(warned),
        "skip_warning_iteration": plain(first),
        "skip_advice": report.skip_advice(cause, settings),
    }


def warning_lines(rows: Iterable[Row]) -> list[str]:
    """The learner's WARNING that its module keeps skipping optimizer steps, one line per trial
    that logged it, repeated where the user sees it.

    Example:
        >>> (line,) = warning_lines([{"trial_id": "a_00000", "skip_warnings": 2,
        ...     "skip_fraction": 0.5, "skip_warning_iteration": 3, "grad_scale": 1.0,
        ...     "skip_advice": "lower x"}])
        >>> line.split(": ")[0], line.split("; ")[1]
        ('WARNING trial a_00000', 'final skip frac 0.5, grad scale 1. Advice: lower x.')
    """
    return [
        f"WARNING trial {r['trial_id']}: module {MODULE_ID} kept skipping optimizer steps "
        f"(inf/nan gradients) in {r['skip_warnings']} iteration(s) from iteration "
        f"{format_value(r.get('skip_warning_iteration'))}; final skip frac "
        f"{format_value(r.get('skip_fraction'))}, grad scale "
        f"{format_value(r.get('grad_scale'))}. Advice: {r['skip_advice']}."
        for r in rows
        if r.get("skip_warnings")
    ]


def format_table(exp: Experiment, rows: Iterable[Row]) -> str:
    threshold = target(exp)
    reached: list[tuple[str, str]] = []
    if threshold is not None:
        steps_key, time_key = target_columns(threshold)
        reached = [(steps_key, f"steps to {threshold:g}"), (time_key, f"s to {threshold:g}")]
    cols = [
        ("trial_id", "trial"),
        *((k, k.split(".")[-1]) for k in exp.search),
        ("grad_scale", "final grad scale"),
        ("skipped_steps", "skipped steps"),
        ("skip_fraction", "skip frac"),
        *reached,
        (exp.tune["metric"], exp.tune["metric"].split("/")[-1]),
        ("env_steps_per_s", "env steps/s"),
        ("status", "status"),
    ]
    cells = [[format_value(r.get(key)) for key, _ in cols] for r in rows]
    return table([[title for _, title in cols], *cells])


def target_line(exp: Experiment, rows: Sequence[Row], threshold: float) -> str:
    """One line under the table: how many trials reached the target, and how soon."""
    steps_key = target_columns(threshold)[0]
    steps = sorted(v for v in (r.get(steps_key) for r in rows) if is_number(v))
    metric = exp.tune["metric"].split("/")[-1]
    if not steps:
        return f"No trial reached {metric} >= {threshold:g} within the stop's budget."
    return (
        f"{len(steps)} of {len(rows)} trials reached {metric} >= {threshold:g}: in "
        f"{format_value(steps[0])} to {format_value(steps[-1])} env steps "
        f"(median {format_value(statistics.median(steps))})."
    )


def try_write_parquet(rows: Sequence[Row], path: str) -> bool:
    """``write_parquet`` on a storage that failed: True once written, else False and no part of
    the file left behind."""
    try:
        write_parquet(rows, path)
    except (OSError, ValueError):
        with contextlib.suppress(OSError, ValueError):
            files.delete_file(*files.resolve(path))
        return False
    return True


def write_parquet(rows: Sequence[Row], path: str) -> None:
    """To a local path or a storage URI; a column of ints and floats (a searched
    ``init_scale``) is a column of floats."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    keys = dict.fromkeys(k for r in rows for k in r)
    fs, fs_path = files.resolve(path)
    fs.create_dir(posixpath.dirname(fs_path), recursive=True)
    pq.write_table(pa.table({k: [r.get(k) for r in rows] for k in keys}), fs_path, filesystem=fs)
