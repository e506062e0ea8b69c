"""``sweep.png``: per setting against env steps, the Tune metric (mean over seeds, a band from
the lowest to the highest seed, a dashed line at the stop's target), log2 of the loss scale
(where each scaler settled, or its saw-tooth of overflows) and the share of steps skipped.

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
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from rllib_amp import fs as files
from rllib_amp.learner import metrics as amp_metrics
from rllib_amp.sweep.groups import Group
from rllib_amp.sweep.summary import SCALE_KEY as SCALE
from rllib_amp.sweep.summary import STEPS_KEY, amp_metric_key, history, target

if TYPE_CHECKING:
    import numpy as np
    from matplotlib.figure import Figure
    from ray.tune import Result

    from rllib_amp.experiment import Experiment

FILE = "sweep.png"
SKIP = amp_metric_key(amp_metrics.SKIP_FRACTION)


def curves(grid: Iterable[Result], keys: Sequence[str]) -> dict[str, dict[str, list[float]]]:
    """trial_id -> {column: values} of each trial's history, for ``keys`` and the env steps."""
    out = {}
    for result in grid:
        frame = history(result)
        trial_id = (result.metrics or {}).get("trial_id")
        if frame is not None and trial_id is not None and STEPS_KEY in frame.columns:
            columns = [k for k in (STEPS_KEY, *keys) if k in frame.columns]
            out[trial_id] = {k: frame[k].astype(float).tolist() for k in columns}
    return out


def _band(
    series: Sequence[tuple[Sequence[float], Sequence[float]]], log2: bool
) -> list[np.ndarray]:
    """[x, mean, low, high] over seeds (of y, or of its log2): seeds report at their own env
    steps, so each is interpolated onto the union of them, counted from its first x to its last."""
    import numpy as np

    clean = []
    for xs, ys in series:
        x, y = np.asarray(xs, dtype=float), np.asarray(ys, dtype=float)
        ok = np.isfinite(x) & np.isfinite(y) & (y > 0 if log2 else True)
        if ok.any():
            clean.append((x[ok], np.log2(y[ok]) if log2 else y[ok]))
    if not clean:
        return [np.array([])] * 4
    grid = np.unique(np.concatenate([x for x, _ in clean]))
    seeds = np.array([np.interp(grid, x, y, left=np.nan, right=np.nan) for x, y in clean])
    return [grid, np.nanmean(seeds, 0), np.nanmin(seeds, 0), np.nanmax(seeds, 0)]


def build(
    groups: Sequence[Group],
    curves: Mapping[str, Mapping[str, Sequence[float]]],
    *,
    metric: str,
    threshold: float | None = None,
) -> Figure:
    """The three panels of ``groups`` from the trials' ``curves``."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(15, 4.6), layout="constrained")
    axes = fig.subplots(1, 3)
    titles = (metric.split("/")[-1], "log2 loss scale", "skipped share of optimizer steps")
    for ax, title in zip(axes, titles):
        ax.set(xlabel="env steps", title=title)
        ax.grid(alpha=0.3)
    ax_metric = axes[0]
    for g in groups:
        mark = " (best)" if g.rank == 1 else (" (tied)" if g.tied else "")
        trials = [curves.get(str(t.get("trial_id")), {}) for t in g.trials]
        color = None
        for ax, key, log2 in zip(axes, (metric, SCALE, SKIP), (False, True, False)):
            x, mean, low, high = _band([(c[STEPS_KEY], c[key]) for c in trials if key in c], log2)
            if not len(x):
                continue
            (line,) = ax.plot(x, mean, label=f"#{g.rank} {g.label()}{mark}", color=color, lw=1.6)
            color = line.get_color()
            ax.fill_between(x, low, high, color=color, alpha=0.15, lw=0)
    if threshold is not None:
        ax_metric.axhline(threshold, color="grey", ls="--", lw=1)
    seeds = max((len(g.trials) for g in groups), default=0)
    ax_metric.set_ylabel(f"mean over seeds (band: lowest to highest of up to {seeds})")
    if ax_metric.get_legend_handles_labels()[0]:
        ax_metric.legend(fontsize=7, loc="best")
    else:  # every trial ended before its first result
        ax_metric.text(0.5, 0.5, "no results to plot", ha="center", transform=ax_metric.transAxes)
    return fig


def write(fig: Figure, location: str) -> None:
    """To a local path or a storage URI."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110)
    files.write_bytes(*files.resolve(location), buffer.getvalue())


def report(exp: Experiment, groups: Sequence[Group], grid: Iterable[Result], exp_dir: str) -> str:
    """Writes ``sweep.png`` into ``exp_dir``; returns the line saying where (or why not)."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "No sweep.png: matplotlib is not installed (pip install 'rllib-amp[plot]')."
    metric = exp.tune["metric"]
    fig = build(groups, curves(grid, (metric, SCALE, SKIP)), metric=metric, threshold=target(exp))
    location = files.join(exp_dir, FILE)
    write(fig, location)
    return f"Figure: {location}"
