"""The sweep's answer per setting (a combination of searched values; its trials are its seeds):
the Tune metric's mean and 95% Student-t interval over the seeds and, with a target in ``stop``,
the env steps to it, a seed that never got there counted as the steps it was allowed (a lower
bound: a setting cannot look fast by counting only its lucky seeds). Ranked by the steps when
there is a target, else by the metric; a group whose interval overlaps the best's is **tied**
(docs/cli.md), and one line says which searched key separates the settings.

Example:
    >>> rows = [{"amp.growth_interval": g, "seed": s, "status": "DONE", "m": m,
    ...          "skipped_steps": 0, "optimizer_steps": 8, "settled_scale": 1024.0}
    ...         for g, s, m in [(10, 0, 1.0), (10, 1, 1.2), (2000, 0, 9.0), (2000, 1, 9.4)]]
    >>> found = group(rows, keys=["amp.growth_interval"], metric="m", mode="max")
    >>> [(g.values["amp.growth_interval"], g.rank, g.tied) for g in found]
    [(2000, 1, True), (10, 2, False)]
    >>> finding(found)
    'growth_interval decides (10: -0.171 to 2.37 vs 2000: 6.66-11.7)'
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rllib_amp import fs as files
from rllib_amp.sweep.summary import STEPS_KEY, Row, finite, target, target_columns, write_parquet
from rllib_amp.text_table import compact, format_value, table

if TYPE_CHECKING:
    from rllib_amp.experiment import Experiment

FILE = "groups.parquet"
SINGLE_RUN = (
    "one seed per setting: every number rests on a single run, with no interval; "
    "raise tune.num_samples (or --num-samples) to 3 or more"
)


@dataclass(frozen=True)
class Interval:
    """A mean over ``n`` seeds and its 95% Student-t interval (``lo``/``hi`` None when n < 2).

    Example:
        >>> i = interval([1.0, 3.0])
        >>> (i.mean, round(i.lo, 2), round(i.hi, 2), i.n)
        (2.0, -10.71, 14.71, 2)
    """

    mean: float | None
    lo: float | None
    hi: float | None
    n: int

    def bounds(self) -> tuple[float, float] | None:
        """(lo, hi); a single value's point."""
        if self.mean is None:
            return None
        return (self.mean, self.mean) if self.lo is None or self.hi is None else (self.lo, self.hi)

    def overlaps(self, other: Interval) -> bool:
        a, b = self.bounds(), other.bounds()
        return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]

    def columns(self, prefix: str) -> dict[str, float | None]:
        return {f"{prefix}_mean": self.mean, f"{prefix}_ci_lo": self.lo, f"{prefix}_ci_hi": self.hi}


def interval(values: Sequence[object]) -> Interval:
    """The mean of the finite ``values`` and its 95% Student-t interval."""
    xs = [x for x in map(finite, values) if x is not None]
    if len(xs) < 2:
        return Interval(xs[0] if xs else None, None, None, len(xs))
    from scipy import stats

    mean = statistics.fmean(xs)
    half = float(stats.t.ppf(0.975, len(xs) - 1) * stats.sem(xs))
    return Interval(mean, mean - half, mean + half, len(xs))


@dataclass
class Group:
    """One setting's trials and their statistics; ``rank`` 1 is the best, ``tied``: its
    interval overlaps the best group's (the best group is tied with itself)."""

    values: dict[str, object]
    trials: list[Row]
    metric: Interval
    steps: Interval | None  # env steps to the target (None: no target in stop)
    reached: int  # seeds that got to the target
    skip_fraction: float | None
    skipped_steps: float | None
    settled_scale: float | None
    scale_swing: float | None
    rank: int = 0
    tied: bool = False

    @property
    def seeds(self) -> list[object]:
        return [t.get("seed") for t in self.trials]

    @property
    def ranked(self) -> Interval:
        """The interval the rank and the tie rule use: the steps to the target, if any."""
        return self.metric if self.steps is None else self.steps

    @property
    def skip_percent(self) -> str:
        return "-" if self.skip_fraction is None else f"{100 * self.skip_fraction:.1f}%"

    def label(self) -> str:
        """``init_scale=1024, growth_interval=10``."""
        return ", ".join(f"{_leaf(k)}={_typed(v)}" for k, v in self.values.items()) or "all"

    def as_row(self, metric_name: str) -> dict[str, object]:
        """One row of ``groups.parquet``."""
        steps: dict[str, object] = {}
        if self.steps is not None:
            steps = {
                **self.steps.columns("env_steps_to_target"),
                "seeds_reached_target": self.reached,
            }
        return {
            **self.values,
            "rank": self.rank,
            "tied": self.tied,
            "n_seeds": len(self.trials),
            "seeds": [s for s in self.seeds if s is not None],
            "trial_ids": [t.get("trial_id") for t in self.trials],
            **self.metric.columns(metric_name),
            **steps,
            "skip_fraction": self.skip_fraction,
            "skipped_steps_mean": self.skipped_steps,
            "settled_scale": self.settled_scale,
            "scale_swing_log2": self.scale_swing,
        }


def _key(v: object) -> object:
    return tuple(v) if isinstance(v, list) else v


def _steps_to_target(
    trials: Sequence[Row], steps_key: str, budget: float | None
) -> tuple[Interval, int]:
    """The env steps to the target (a seed that never got there counted as the steps it was
    allowed) and how many got there."""
    hits = [finite(t.get(steps_key)) for t in trials]
    allowed = [[v for v in (budget, finite(t.get("env_steps"))) if v is not None] for t in trials]
    counted = [hit if hit is not None else max(a, default=None) for hit, a in zip(hits, allowed)]
    return interval(counted), sum(hit is not None for hit in hits)


def group(
    rows: Sequence[Row],
    *,
    keys: Sequence[str],
    metric: str,
    mode: str,
    steps_key: str | None = None,
    budget: float | None = None,
) -> list[Group]:
    """The summary's ``rows`` grouped by their values at ``keys`` (never ``seed``), ranked,
    ``tied`` set. ``steps_key``: the row key of the env steps to the stop's target (None: the
    rank is by the metric, in ``mode``); ``budget``: the stop's env-step budget."""
    keys = [k for k in keys if k != "seed"]
    by_setting: dict[tuple[object, ...], list[Row]] = {}
    for r in rows:
        by_setting.setdefault(tuple(_key(r.get(k)) for k in keys), []).append(r)
    groups = []
    for trials in by_setting.values():
        finished = [t for t in trials if t.get("status") != "ERROR"]
        steps, reached = None, 0
        if steps_key is not None:
            steps, reached = _steps_to_target(finished, steps_key, budget)
        fractions = [
            skipped / optimizer
            for t in finished
            if (skipped := finite(t.get("skipped_steps"))) is not None
            and (optimizer := finite(t.get("optimizer_steps")))
        ]
        groups.append(
            Group(
                values={k: trials[0].get(k) for k in keys},
                trials=trials,
                metric=interval([t.get(metric) for t in finished]),
                steps=steps,
                reached=reached,
                skip_fraction=statistics.fmean(fractions) if fractions else None,
                skipped_steps=_over(finished, "skipped_steps", statistics.fmean),
                settled_scale=_over(finished, "settled_scale", statistics.median),
                scale_swing=_over(finished, "scale_swing", statistics.median),
            )
        )
    # Best first by the ranked interval's mean (groups without one last); tied: overlapping
    # the best's interval.
    sign = 1.0 if steps_key is not None or mode == "min" else -1.0
    groups.sort(key=lambda g: (g.ranked.mean is None, sign * (g.ranked.mean or 0.0)))
    for i, g in enumerate(groups, 1):
        g.rank = i
        g.tied = g.ranked.overlaps(groups[0].ranked)
    return groups


def _over(trials: Sequence[Row], key: str, stat: Callable[[list[float]], float]) -> float | None:
    xs = [v for v in (finite(t.get(key)) for t in trials) if v is not None]
    return stat(xs) if xs else None


def single_seed(groups: Sequence[Group]) -> bool:
    return all(g.ranked.n < 2 for g in groups)


def finding(groups: Sequence[Group]) -> str:
    """One line on what the sweep found. A searched key decides when the envelopes of the
    intervals of the groups with each of its values are disjoint."""
    ranked = [g for g in groups if g.ranked.bounds() is not None]
    if not ranked:
        return "Nothing to compare: no setting reported the metric."
    best = ranked[0]
    unit = "" if best.steps is None else " steps"
    best_text = interval_text(best.ranked) + unit
    if single_seed(ranked):  # one value per setting: no key can be said to decide anything
        return (
            f"nothing can be told apart ({SINGLE_RUN}); the highest single run: "
            f"{best.label()}: {best_text}."
        )
    keys = list(best.values) if all(g.ranked.n >= 2 for g in ranked) else []
    deciding, rest = [], []
    for key in keys:
        envelopes: dict[object, list[float]] = {}
        for g in ranked:
            lo, hi = g.ranked.bounds() or (0.0, 0.0)
            env = envelopes.setdefault(_key(g.values[key]), [lo, hi])
            env[:] = [min(env[0], lo), max(env[1], hi)]
        spans = sorted(envelopes.items(), key=lambda kv: kv[1][0])
        if len(spans) > 1 and all(a[1][1] < b[1][0] for a, b in zip(spans, spans[1:])):
            parts = " vs ".join(f"{_typed(v)}: {_span(lo, hi)}{unit}" for v, (lo, hi) in spans)
            deciding.append(f"{_leaf(key)} decides ({parts})")
        else:
            rest.append(_leaf(key))
    if deciding:
        verb = "does" if len(rest) == 1 else "do"
        tail = [f"{', '.join(rest)} {verb} not separate the groups."] if rest else []
        return "; ".join(deciding + tail)
    tied = sum(g.tied for g in ranked)
    if tied == len(ranked):
        return (
            f"nothing separates the groups: all {tied} intervals overlap the best's ({best_text})"
        )
    return (
        f"no single searched key separates the groups; {tied} of {len(ranked)} are "
        f"tied with the best ({best.label()}: {best_text})"
    )


def _span(lo: float, hi: float) -> str:
    return compact(lo) if lo == hi else f"{compact(lo)}{' to ' if lo < 0 else '-'}{compact(hi)}"


def interval_text(i: Interval) -> str:
    """``19.8k [18.9k, 20.6k]``; a single run's value with ``(1 run)``."""
    if i.mean is None:
        return "-"
    if i.lo is None or i.hi is None:
        return f"{compact(i.mean)} (1 run)"
    return f"{compact(i.mean)} [{compact(i.lo)}, {compact(i.hi)}]"


def _leaf(key: str) -> str:
    return key.split(".")[-1]


def _typed(v: object) -> str:
    return format_value(v, as_typed=True)


def format_table(groups: Sequence[Group], metric: str) -> str:
    if not groups:
        return "(no trials)"
    keys = list(groups[0].values)
    with_steps = groups[0].steps is not None
    header = ["rank", *map(_leaf, keys), "seeds", f"{metric.split('/')[-1]} mean [95% CI]"]
    if with_steps:
        header += ["steps to target [95% CI]", "reached"]
    rows = [header + ["skip frac", "skipped", "settled scale", "tie"]]
    for g in groups:
        cells = [str(g.rank), *(_typed(g.values[k]) for k in keys), str(len(g.trials))]
        cells.append(interval_text(g.metric))
        if with_steps and g.steps is not None:
            cells += [interval_text(g.steps), f"{g.reached}/{len(g.trials)}"]
        mark = "best" if g.rank == 1 else ("tied" if g.tied else "")
        rows.append(
            [*cells, g.skip_percent, compact(g.skipped_steps), _typed(g.settled_scale), mark]
        )
    return table(rows)


def of_experiment(exp: Experiment, rows: Sequence[Row]) -> list[Group]:
    """``group`` with the experiment's searched keys, metric, mode, target and budget."""
    threshold = target(exp)
    return group(
        rows,
        keys=list(exp.search),
        metric=exp.tune["metric"],
        mode=exp.tune["mode"],
        steps_key=None if threshold is None else target_columns(threshold)[0],
        budget=finite(exp.stop.get(STEPS_KEY)),
    )


def report(exp: Experiment, rows: Sequence[Row], exp_dir: str) -> list[Group]:
    """Prints the groups and the finding, writes ``groups.parquet`` into ``exp_dir`` (a path or
    URI) and says where; returns the groups (``figure.report`` draws them)."""
    groups = of_experiment(exp, rows)
    metric = exp.tune["metric"]
    by = "env steps to the target" if groups and groups[0].steps is not None else metric
    print()
    print(f"Settings, best first by the mean {by} over seeds (tie: 95% intervals overlap):")
    print(format_table(groups, metric))
    print(f"Found: {finding(groups)}")
    location = files.join(exp_dir, FILE)
    write_parquet([g.as_row(metric) for g in groups], location)
    print(f"Groups: {location}")
    return groups
