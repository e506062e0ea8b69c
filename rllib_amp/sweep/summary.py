"""The summary of a finished sweep: one row per trial, the printed table, results.parquet.

A row holds the trial's searched values (read from its config with ``config_path``), its final
metric, the AMP scaler's final state (grad scale, skipped steps), and, when the experiment's
``stop`` sets a threshold on the Tune metric (``stop: {env_runners/episode_return_mean:
450}``), the env steps and seconds the trial took to first reach it. With such a target the
rows are ranked by how soon they reached it: once every trial gets there, the final returns
differ only by noise, and the steps to the target are what the settings changed.

Example:
    >>> from rllib_amp.experiment import load
    >>> exp = load("tune_configs/cartpole_ppo_amp.yaml")
    >>> target(exp)
    450.0
"""

from __future__ import annotations

import contextlib
import math
import os
import posixpath
import re
import statistics
from collections.abc import Sequence
from typing import Any

from rllib_amp import fs as files
from rllib_amp.checks import is_number
from rllib_amp.cli import root_error
from rllib_amp.learner import metrics as amp_metrics
from rllib_amp.settings import AMP_CONFIG_KEY

MODULE_ID = "default_policy"
STEPS_KEY = "num_env_steps_sampled_lifetime"
_TRIAL_ID = re.compile(r"_([0-9a-f]{5}_\d{5})(?:_|$)")


def config_path(dotted: str, config: dict[str, Any]) -> tuple[str, ...]:
    """Where a dotted experiment key lives in a trial's config (``AlgorithmConfig.to_dict()``).

    ``config`` is such a dict: it decides between RLlib's public and underscored names
    (``train_batch_size_per_learner`` is stored as ``_train_batch_size_per_learner``).
    """
    top, _, rest = dotted.partition(".")
    parts = rest.split(".") if rest else []
    if top == "amp":
        return ("learner_config_dict", AMP_CONFIG_KEY, *parts)
    if top == "env_config":
        return ("env_config", *parts)
    if top == "model":
        return ("_model_config", *parts)
    if top == "seed":
        return ("seed",)
    head = parts[0] if parts else top
    for candidate in (head, f"_{head}", head.rstrip("_")):
        if candidate in config:
            return (candidate, *parts[1:])
    return (head, *parts[1:])


def _lookup(d: dict[str, Any], path: Sequence[str]) -> Any:
    """``d[path[0]][path[1]]...``, or None where a key is missing."""
    from ray.tune.utils import unflattened_lookup

    try:
        return unflattened_lookup("/".join(path), d, default=None)
    except (TypeError, ValueError, IndexError):  # a leaf met before the path ended
        return None


def _metric(result: dict[str, Any] | None, key: str) -> Any:
    if not result:
        return None
    value = _lookup(result, key.split("/"))
    # RLlib reduces metrics with numpy: a numpy scalar is no int or float to is_number.
    return value.item() if hasattr(value, "item") and not isinstance(value, Sequence) else value


def amp_metric_key(name: str, module_id: str = MODULE_ID) -> str:
    return f"learners/{module_id}/{name}"


# -- the stop's target ---------------------------------------------------------------------
def target(exp: Any) -> float | None:
    """The Tune metric's threshold in ``stop`` (mode max: the trial stops on reaching it), or
    None when the stop has none."""
    value = exp.stop.get(exp.tune["metric"])
    if exp.tune["mode"] != "max" or not is_number(value):
        return None
    return float(value)


def history(result: Any) -> Any:
    """The trial's result history (a pandas DataFrame, one row per iteration, nested keys
    joined by "/"), along the line of training that led to its final result (``lineage``),
    or None when Tune kept none."""
    try:
        frame = result.metrics_dataframe
    except Exception:  # noqa: BLE001 - a trial whose progress file is missing or unreadable
        return None
    return lineage(frame)


def lineage(frame: Any) -> Any:
    """The rows of a trial's history that led to its final result: one per iteration.

    Tune appends every result of a trial to its ``result.json`` and ``progress.csv`` and never
    removes one. When a trial is restored from a checkpoint (``--resume`` after a crash, a
    failed trial retried, a PBT exploit of another trial's checkpoint), the iterations after
    that checkpoint are trained again and logged again, so the file holds the same
    ``training_iteration`` twice, with different results: the abandoned run's and the one
    that carried on. Walking back from the last row, a row belongs to the final line when its
    iteration is below every iteration kept after it.

    Example:
        >>> import pandas as pd
        >>> frame = pd.DataFrame({"training_iteration": [1, 2, 3, 4, 3, 4, 5], "x": range(7)})
        >>> lineage(frame)["x"].tolist()
        [0, 1, 4, 5, 6]
    """
    if frame is None or "training_iteration" not in frame.columns or frame.empty:
        return frame
    keep: list[int] = []
    below = math.inf
    for pos, it in enumerate(reversed(frame["training_iteration"].tolist())):
        if is_number(it) and it < below:
            keep.append(len(frame) - 1 - pos)
            below = it
    if len(keep) == len(frame):
        return frame
    return frame.iloc[sorted(keep)].reset_index(drop=True)


def _late_scales(frame: Any) -> list[float]:
    """The finite grad scales of the last quarter of a history (at least its last result)."""
    key = amp_metric_key(amp_metrics.GRAD_SCALE)
    if frame is None or key not in frame.columns:
        return []
    values = [float(v) for v in frame[key].tolist() if is_number(v) and math.isfinite(v)]
    return values[-max(1, math.ceil(len(values) / 4)) :] if values else []


def settled_scale(frame: Any, final: Any = None) -> float | None:
    """The scale a trial settled at: the median of its grad scale over the last quarter of its
    results (one result's scale is wherever the last overflow left it). Without a history,
    ``final`` (the last reported scale).

    Example:
        >>> import pandas as pd
        >>> frame = pd.DataFrame({"learners/default_policy/amp_grad_scale": [8.0] * 6 + [2.0, 4.0]})
        >>> settled_scale(frame)
        3.0
    """
    late = _late_scales(frame)
    if late:
        return float(statistics.median(late))
    return float(final) if is_number(final) and math.isfinite(final) else None


def scale_swing(frame: Any) -> float | None:
    """How far the scale still moved over the last quarter of the results: max - min of its
    log2 (0: it stayed put; 1: it still halved or doubled). None without a history.

    Example:
        >>> import pandas as pd
        >>> scale_swing(pd.DataFrame({"learners/default_policy/amp_grad_scale": [1.0, 2.0, 8.0]}))
        0.0
    """
    late = [v for v in _late_scales(frame) if v > 0]
    if not late:
        return None
    return math.log2(max(late)) - math.log2(min(late))


def first_reached(result: Any, metric: str, threshold: float) -> tuple[Any, Any]:
    """(env steps, seconds) of the trial's first result with ``metric >= threshold``, from
    its result history; (None, None) when it never got there (or kept no history)."""
    frame = history(result)
    if frame is None or metric not in frame.columns:
        return None, None
    hit = frame[frame[metric] >= threshold]
    if hit.empty:
        return None, None
    first = hit.iloc[0]

    def plain(key: str) -> Any:
        v = first.get(key)
        return v.item() if hasattr(v, "item") else v

    return plain(STEPS_KEY), plain("time_total_s")


def target_columns(threshold: float) -> tuple[str, str]:
    """The row keys of the steps and seconds to reach ``threshold``."""
    return f"env_steps_to_{threshold:g}", f"time_s_to_{threshold:g}"


def summarize(exp: Any, grid: Any, storage: str | None = None) -> list[dict[str, Any]]:
    """One row per trial: searched parameters, final metrics, checkpoint, error.

    With ``storage`` (a URI), checkpoints are given as URIs on it, as the user passed it.
    """
    rows = []
    threshold = target(exp)
    for result in grid:
        cfg = result.config or {}
        final = result.metrics or {}
        # A trial that never reported has Tune's placeholder metrics (trial_id "default").
        row: dict[str, Any] = {"trial_id": _trial_id(result.path) or final.get("trial_id")}
        for key in exp.search:
            row[key] = _lookup(cfg, config_path(key, cfg))
        seed = cfg.get("seed")
        row["seed"] = seed if seed is not None else exp.data.get("seed")
        row["base_seed"] = exp.data.get("seed")
        steps = _metric(final, STEPS_KEY)
        total = _metric(final, "time_total_s")
        frame = history(result)
        status = "ERROR" if result.error else ("DONE" if final.get("done") else "UNFINISHED")
        row.update(
            {
                "status": status,
                "training_iteration": final.get("training_iteration"),
                "env_steps": steps,
                exp.tune["metric"]: _metric(final, exp.tune["metric"]),
                "grad_scale": _metric(final, amp_metric_key(amp_metrics.GRAD_SCALE)),
                "skip_fraction": _metric(final, amp_metric_key(amp_metrics.SKIP_FRACTION)),
                "skipped_steps": _metric(final, amp_metric_key(amp_metrics.SKIPPED_STEPS_LIFETIME)),
                "optimizer_steps": _metric(
                    final, amp_metric_key(amp_metrics.OPTIMIZER_STEPS_LIFETIME)
                ),
                "settled_scale": settled_scale(
                    frame, _metric(final, amp_metric_key(amp_metrics.GRAD_SCALE))
                ),
                "scale_swing": scale_swing(frame),
                "env_steps_per_s": (steps / total) if steps and total else None,
                "checkpoint": _checkpoint_location(result.checkpoint, storage),
                "error": root_error(result.error) if result.error else None,
                "error_file": _error_file(result, storage) if result.error else None,
            }
        )
        row.update(skip_warnings(frame, final, cfg))
        if threshold is not None:
            steps_key, time_key = target_columns(threshold)
            row[steps_key], row[time_key] = first_reached(result, exp.tune["metric"], threshold)
        rows.append(row)
    reverse = exp.tune["mode"] == "max"

    def sort_key(r: dict[str, Any]) -> float:
        v = r[exp.tune["metric"]]
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return -math.inf if reverse else math.inf
        return float(v)

    rows.sort(key=sort_key, reverse=reverse)
    if threshold is not None:
        # Those that reached the target first, soonest first; the rest keep the metric order.
        steps_key = target_columns(threshold)[0]
        rows.sort(key=lambda r: (r[steps_key] is None, r[steps_key] or 0))
    return rows


# -- warnings the learners logged ------------------------------------------------------------
def skip_warnings(frame: Any, final: dict[str, Any], cfg: dict[str, Any]) -> dict[str, Any]:
    """The "keeps skipping optimizer steps" WARNINGs a trial's learner logged (in its worker's
    log, which the CLI does not show): ``skip_warnings``, in how many iterations;
    ``skip_warning_iteration``, the first; ``skip_advice``, what to change (the learner's own
    advice, from the trial's AMP settings and its final metrics), None without a warning."""
    key = amp_metric_key(amp_metrics.SKIP_WARNING)
    none = {"skip_warnings": 0, "skip_warning_iteration": None, "skip_advice": None}
    if frame is None or key not in frame.columns:
        return none
    warned = frame[frame[key].fillna(0) >= 1]
    if warned.empty:
        return none
    from rllib_amp.learner import report

    settings = _amp_settings(cfg)
    scale = _metric(final, amp_metric_key(amp_metrics.GRAD_SCALE))
    dtype = getattr(settings, "dtype", None)
    scaling = dtype == "float16" or (is_number(scale) and scale != 1.0 and dtype != "bfloat16")
    nonfinite = _metric(final, amp_metric_key(amp_metrics.NONFINITE_LOSS_STEPS_LIFETIME))
    cause = report.skip_cause(nonfinite_loss_steps=nonfinite or 0, scaling=scaling)
    first: Any = None
    if "training_iteration" in warned.columns:
        first = warned["training_iteration"].iloc[0]
        first = first.item() if hasattr(first, "item") else first
    return {
        "skip_warnings": len(warned),
        "skip_warning_iteration": first,
        "skip_advice": report.skip_advice(cause, settings),
    }


def _amp_settings(cfg: dict[str, Any]) -> Any:
    """The trial's AmpSettings, from its config; None where they cannot be read."""
    from rllib_amp.settings import AmpSettings

    try:
        return AmpSettings.from_dict(_lookup(cfg, ("learner_config_dict", AMP_CONFIG_KEY)))
    except Exception:  # noqa: BLE001 - the advice then names no values
        return None


def warning_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per trial whose learner warned that its module keeps skipping optimizer
    steps: the learner's WARNING, repeated where the user sees it.

    Example:
        >>> (line,) = warning_lines([{"trial_id": "a_00000", "skip_warnings": 2,
        ...     "skip_fraction": 0.5, "skip_warning_iteration": 3, "grad_scale": 1.0,
        ...     "skip_advice": "lower x"}])
        >>> line.split(": ")[0], line.split("; ")[1]
        ('WARNING trial a_00000', 'final skip frac 0.5, grad scale 1. Advice: lower x.')
    """
    lines = []
    for r in rows:
        if not r.get("skip_warnings"):
            continue
        lines.append(
            f"WARNING trial {r['trial_id']}: module {MODULE_ID} kept skipping optimizer steps "
            f"(inf/nan gradients) in {r['skip_warnings']} iteration(s) from iteration "
            f"{format_value(r.get('skip_warning_iteration'))}; final skip frac "
            f"{format_value(r.get('skip_fraction'))}, grad scale "
            f"{format_value(r.get('grad_scale'))}. Advice: {r['skip_advice']}."
        )
    return lines


def _trial_id(trial_dir: str | None) -> str | None:
    """A trial's id from its folder name, for a trial that never reported a result: Tune
    names the folder ``{trainable}_{trial id}_{index}_{params}_{time}``, ids ``abcde_00000``."""
    found = _TRIAL_ID.search(os.path.basename(trial_dir or ""))
    return found.group(1) if found else None


def _error_file(result: Any, storage: str | None) -> str | None:
    """Where Tune wrote the trial's tracebacks (``error.txt`` in its folder)."""
    if not result.path:
        return None
    path = f"{result.path.rstrip('/')}/error.txt"
    return files.to_uri(storage, path) if storage else path


def _checkpoint_location(checkpoint: Any, storage: str | None) -> str | None:
    if checkpoint is None:
        return None
    return files.to_uri(storage, checkpoint.path) if storage else checkpoint.path


def format_value(v: Any) -> str:
    """A table cell or a number in a sentence: whole numbers with thousands separators.

    Example:
        >>> [format_value(v) for v in (None, float("nan"), 19500.0, 1234.56, 0.06931, 28, "x")]
        ['-', 'nan', '19,500', '1,234.6', '0.06931', '28', 'x']
    """
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if v.is_integer() and abs(v) < 1e15:
            return f"{v:,.0f}"
        return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.4g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


def format_table(exp: Any, rows: list[dict[str, Any]]) -> str:
    short = {k: k.split(".")[-1] for k in exp.search}
    threshold = target(exp)
    reached: list[tuple[str, str]] = []
    if threshold is not None:
        steps_key, time_key = target_columns(threshold)
        reached = [(steps_key, f"steps to {threshold:g}"), (time_key, f"s to {threshold:g}")]
    cols = [
        ("trial_id", "trial"),
        *short.items(),
        ("grad_scale", "final grad scale"),
        ("skipped_steps", "skipped steps"),
        ("skip_fraction", "skip frac"),
        *reached,
        (exp.tune["metric"], exp.tune["metric"].split("/")[-1]),
        ("env_steps_per_s", "env steps/s"),
        ("status", "status"),
    ]
    table = [[title for _, title in cols]]
    table += [[format_value(r.get(key)) for key, _ in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def target_line(exp: Any, rows: Sequence[dict[str, Any]], threshold: float) -> str:
    """One line under the table: how many trials reached the target, and how soon."""
    steps_key = target_columns(threshold)[0]
    steps = sorted(r[steps_key] for r in rows if r.get(steps_key) is not None)
    metric = exp.tune["metric"].split("/")[-1]
    if not steps:
        return f"No trial reached {metric} >= {threshold:g} within the stop's budget."
    return (
        f"{len(steps)} of {len(rows)} trials reached {metric} >= {threshold:g}: in "
        f"{format_value(steps[0])} to {format_value(steps[-1])} env steps "
        f"(median {format_value(statistics.median(steps))})."
    )


def try_write_parquet(rows: list[dict[str, Any]], path: str) -> bool:
    """``write_parquet`` on a storage that failed: True once written; False, and no part
    of the file left behind, when the write fails too."""
    try:
        write_parquet(rows, path)
    except (OSError, ValueError):
        with contextlib.suppress(OSError, ValueError):
            files.delete_file(*files.resolve(path))
        return False
    return True


def write_parquet(rows: list[dict[str, Any]], path: str) -> None:
    """Writes the rows as one parquet table to ``path``: a local path or a storage URI."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, list[Any]] = {}
    for key in dict.fromkeys(k for r in rows for k in r):
        values = [r.get(key) for r in rows]
        # Mixed ints/floats (e.g. a searched init_scale) become floats, for one column type.
        if any(isinstance(v, float) for v in values) and all(
            v is None or isinstance(v, (int, float)) for v in values
        ):
            values = [None if v is None else float(v) for v in values]
        columns[key] = values
    fs, fs_path = files.resolve(path)
    fs.create_dir(posixpath.dirname(fs_path), recursive=True)
    pq.write_table(pa.table(columns), fs_path, filesystem=fs)
