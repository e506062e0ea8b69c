"""``sweep.png``: the sweep per setting, in three panels against env steps.

1. the Tune metric: per setting, the mean over its seeds and a band from the lowest to the
   highest seed (a dashed line marks the stop's target);
2. log2 of the loss scale: where each setting's scaler settled, and whether it kept
   overflowing (a saw-tooth) or stayed put;
3. the share of optimizer steps skipped per iteration (inf/nan gradients).

Seeds of a setting report at their own env steps; each curve is interpolated onto the union
of them and averaged over the seeds still running there (a seed that stopped on reaching the
target leaves the mean). Drawn with matplotlib's object API (no pyplot, no global state),
written through ``pyarrow.fs`` like every other output, so ``s3://`` works too.

Example:
    >>> from rllib_amp.sweep.groups import group
    >>> rows = [{"trial_id": "t0", "x.k": 1, "seed": 0, "status": "DONE", "m": 1.0}]
    >>> curves = {"t0": {"num_env_steps_sampled_lifetime": [100.0, 200.0], "m": [0.5, 1.0]}}
    >>> fig = build(group(rows, keys=["x.k"], metric="m", mode="max"), curves, metric="m")
    >>> len(fig.axes)
    3
"""

from __future__ import annotations

import io
import math
from collections.abc import Mapping, Sequence
from typing import Any

from rllib_amp import fs as files
from rllib_amp.learner import metrics as amp_metrics
from rllib_amp.sweep.groups import Group
from rllib_amp.sweep.summary import STEPS_KEY, amp_metric_key, history, target

FILE = "sweep.png"
SCALE = amp_metric_key(amp_metrics.GRAD_SCALE)
SKIP = amp_metric_key(amp_metrics.SKIP_FRACTION)


def curves(grid: Any, keys: Sequence[str]) -> dict[Any, dict[str, list[float]]]:
    """trial_id -> {column: values} of each trial's result history, for ``keys`` and the env
    steps; trials without a history are left out."""
    out: dict[Any, dict[str, list[float]]] = {}
    for result in grid:
        frame = history(result)
        trial_id = (result.metrics or {}).get("trial_id")
        if frame is None or trial_id is None or STEPS_KEY not in frame.columns:
            continue
        out[trial_id] = {
            k: [float(v) for v in frame[k].tolist()]
            for k in (STEPS_KEY, *keys)
            if k in frame.columns
        }
    return out


def _band(
    series: Sequence[tuple[Sequence[float], Sequence[float]]], transform: Any = None
) -> tuple[list[float], list[float], list[float], list[float]]:
    """(x, mean, low, high) over seeds, each seed interpolated onto the union of their x and
    counted only up to its own last x."""
    import numpy as np

    clean = []
    for xs, ys in series:
        pts = [
            (x, transform(y) if transform else y)
            for x, y in zip(xs, ys)
            if math.isfinite(x) and math.isfinite(y) and (transform is None or y > 0)
        ]
        if pts:
            clean.append((np.array([p[0] for p in pts]), np.array([p[1] for p in pts])))
    if not clean:
        return [], [], [], []
    grid = np.unique(np.concatenate([x for x, _ in clean]))
    mean, low, high, keep = [], [], [], []
    for x in grid:
        here = [float(np.interp(x, xs, ys)) for xs, ys in clean if xs[0] <= x <= xs[-1]]
        if here:
            keep.append(float(x))
            mean.append(sum(here) / len(here))
            low.append(min(here))
            high.append(max(here))
    return keep, mean, low, high


def build(
    groups: Sequence[Group],
    curves: Mapping[Any, Mapping[str, Sequence[float]]],
    *,
    metric: str,
    threshold: float | None = None,
) -> Any:
    """The three-panel matplotlib Figure of ``groups`` from the trials' ``curves``."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.6), layout="constrained")
    ax_metric, ax_scale, ax_skip = fig.subplots(1, 3)
    panels = [
        (ax_metric, metric, None, metric.split("/")[-1]),
        (ax_scale, SCALE, math.log2, "log2 loss scale"),
        (ax_skip, SKIP, None, "skipped share of optimizer steps"),
    ]
    for g in groups:
        mark = " (best)" if g.rank == 1 else (" (tied)" if g.tied else "")
        label = f"#{g.rank} {g.label()}{mark}"
        color = None
        for ax, key, transform, _ in panels:
            series = [
                (curves[t.get("trial_id")][STEPS_KEY], curves[t.get("trial_id")][key])
                for t in g.trials
                if key in curves.get(t.get("trial_id"), {})
            ]
            x, mean, low, high = _band(series, transform)
            if not x:
                continue
            (line,) = ax.plot(x, mean, label=label, color=color, lw=1.6)
            color = line.get_color()
            ax.fill_between(x, low, high, color=color, alpha=0.15, lw=0)
    if threshold is not None:
        ax_metric.axhline(threshold, color="grey", ls="--", lw=1)
    for ax, _, _, title in panels:
        ax.set_xlabel("env steps")
        ax.set_title(title)
        ax.grid(alpha=0.3)
    seeds = max((len(g.trials) for g in groups), default=0)
    ax_metric.set_ylabel(f"mean over seeds (band: lowest to highest of up to {seeds})")
    if ax_metric.get_legend_handles_labels()[0]:
        ax_metric.legend(fontsize=7, loc="best")
    else:  # every trial ended before its first result
        ax_metric.text(0.5, 0.5, "no results to plot", ha="center", transform=ax_metric.transAxes)
    return fig


def write(fig: Any, location: str) -> None:
    """Writes ``fig`` as a PNG to ``location``: a local path or a storage URI."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    files.write_bytes(*files.resolve(location), buffer.getvalue())


def report(exp: Any, groups: Sequence[Group], grid: Any, exp_dir: str) -> str:
    """Draws and writes ``sweep.png`` into ``exp_dir``; returns the line saying where (or why
    there is no figure)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "No sweep.png: matplotlib is not installed (pip install 'rllib-amp[plot]')."
    metric = exp.tune["metric"]
    fig = build(groups, curves(grid, (metric, SCALE, SKIP)), metric=metric, threshold=target(exp))
    location = files.join(exp_dir, FILE)
    write(fig, location)
    return f"Figure: {location}"
