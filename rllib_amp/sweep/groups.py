"""The sweep's answer per setting: trials grouped by their searched values, statistics over
their seeds, a rank, a tie rule and one line on what separates the settings.

A setting is one combination of searched values (``seed`` aside); its trials are its seeds.
Each group reports, over its seeds:

- the Tune metric's mean and 95% interval (Student t; none with a single seed);
- when ``stop`` sets a threshold on the metric: env steps to it (mean and interval) and how
  many seeds got there. A seed that never got there counts as the steps it was allowed (the
  stop's env-step budget, else the steps it ran): a lower bound, never left out, so a setting
  cannot look fast because only its lucky seeds are counted;
- the share of optimizer steps its scaler skipped (inf/nan gradients) and the skipped steps;
- the settled loss scale: the median over seeds of each trial's median scale over its last
  quarter of results, and how much that scale still swung (log2 range, median over seeds).

Groups are ranked by the mean of the ranking statistic: env steps to the target when there is
one (once settings all learn, their final returns differ by noise, the steps they took do not),
else the metric. A group whose interval overlaps the best group's is **tied** with it.

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

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rllib_amp.checks import is_number

FILE = "groups.parquet"
CONFIDENCE = 0.95
SEED_KEYS = ("seed",)


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
        """(lo, hi); a single value's point; None without values."""
        if self.mean is None:
            return None
        if self.lo is None or self.hi is None:
            return (self.mean, self.mean)
        return (self.lo, self.hi)

    def overlaps(self, other: Interval) -> bool:
        a, b = self.bounds(), other.bounds()
        return a is not None and b is not None and a[0] <= b[1] and b[0] <= a[1]


def interval(values: Sequence[Any], confidence: float = CONFIDENCE) -> Interval:
    """The mean of ``values`` and its Student-t interval (non-finite values left out)."""
    xs = [float(v) for v in values if is_number(v) and math.isfinite(v)]
    if not xs:
        return Interval(None, None, None, 0)
    mean = statistics.fmean(xs)
    if len(xs) < 2:
        return Interval(mean, None, None, 1)
    from scipy import stats

    half = float(stats.t.ppf((1 + confidence) / 2, len(xs) - 1)) * statistics.stdev(xs)
    half /= math.sqrt(len(xs))
    return Interval(mean, mean - half, mean + half, len(xs))


@dataclass
class Group:
    """One setting's trials and their statistics; ``rank`` 1 is the best, ``tied``: its
    interval overlaps the best group's (the best group is tied with itself)."""

    values: dict[str, Any]
    trials: list[Mapping[str, Any]]
    metric: Interval
    steps: Interval | None  # env steps to the target (None: no target in stop)
    reached: int  # seeds that got to the target
    skip_fraction: float | None
    skipped_steps: float | None
    settled_scale: float | None
    scale_swing: float | None
    stat: str  # "steps" or "metric": what the rank is by
    lower_is_better: bool
    rank: int = 0
    tied: bool = False
    seeds: list[Any] = field(default_factory=list)

    @property
    def ranked(self) -> Interval:
        """The interval the rank and the tie rule use."""
        return self.steps if self.stat == "steps" and self.steps is not None else self.metric

    @property
    def single_seed(self) -> bool:
        return self.ranked.n < 2

    def label(self) -> str:
        """``init_scale=1024, growth_interval=10``: the setting in words."""
        return ", ".join(f"{_leaf(k)}={_plain(v)}" for k, v in self.values.items()) or "all"

    def as_row(self, metric_name: str) -> dict[str, Any]:
        """The group as one row of ``groups.parquet``."""
        row: dict[str, Any] = dict(self.values)
        row.update(
            {
                "rank": self.rank,
                "tied": self.tied,
                "n_seeds": len(self.trials),
                "seeds": [s for s in self.seeds if s is not None],
                "trial_ids": [t.get("trial_id") for t in self.trials],
                f"{metric_name}_mean": self.metric.mean,
                f"{metric_name}_ci_lo": self.metric.lo,
                f"{metric_name}_ci_hi": self.metric.hi,
            }
        )
        if self.steps is not None:
            row.update(
                {
                    "env_steps_to_target_mean": self.steps.mean,
                    "env_steps_to_target_ci_lo": self.steps.lo,
                    "env_steps_to_target_ci_hi": self.steps.hi,
                    "seeds_reached_target": self.reached,
                }
            )
        row.update(
            {
                "skip_fraction": self.skip_fraction,
                "skipped_steps_mean": self.skipped_steps,
                "settled_scale": self.settled_scale,
                "scale_swing_log2": self.scale_swing,
            }
        )
        return row


def _finite(v: Any) -> float | None:
    v = v.item() if hasattr(v, "item") else v  # a numpy scalar
    return float(v) if is_number(v) and math.isfinite(v) else None


def _key(v: Any) -> Any:
    return tuple(v) if isinstance(v, list) else v


def group(
    rows: Sequence[Mapping[str, Any]],
    *,
    keys: Sequence[str],
    metric: str,
    mode: str,
    steps_key: str | None = None,
    budget: float | None = None,
) -> list[Group]:
    """Groups the summary's per-trial ``rows`` by their values at ``keys`` (``seed`` is
    never a group key), ranked best first, with ``tied`` set.

    ``steps_key``: the row key of the env steps to the stop's target (None: no target; the
    rank is by the metric, in ``mode``). ``budget``: the stop's env-step budget, which a seed
    that never reached the target counts as (else its own final env steps).
    """
    keys = [k for k in keys if k not in SEED_KEYS]
    by_setting: dict[tuple[Any, ...], list[Mapping[str, Any]]] = {}
    for r in rows:
        by_setting.setdefault(tuple(_key(r.get(k)) for k in keys), []).append(r)
    groups = []
    for trials in by_setting.values():
        finished = [t for t in trials if t.get("status") != "ERROR"]
        steps = None
        reached = 0
        if steps_key is not None:
            counted = []
            for t in finished:
                hit = _finite(t.get(steps_key))
                if hit is not None:
                    reached += 1
                    counted.append(hit)
                    continue
                ran = _finite(t.get("env_steps"))
                allowed = [v for v in (budget, ran) if v is not None]
                if allowed:
                    counted.append(max(allowed))
            steps = interval(counted)
        fractions = [
            float(t["skipped_steps"]) / float(t["optimizer_steps"])
            for t in finished
            if _finite(t.get("skipped_steps")) is not None and _finite(t.get("optimizer_steps"))
        ]
        skipped = [_finite(t.get("skipped_steps")) for t in finished]
        scales = [s for s in (_finite(t.get("settled_scale")) for t in finished) if s]
        swings = [s for s in (_finite(t.get("scale_swing")) for t in finished) if s is not None]
        groups.append(
            Group(
                values={k: trials[0].get(k) for k in keys},
                trials=trials,
                metric=interval([t.get(metric) for t in finished]),
                steps=steps,
                reached=reached,
                skip_fraction=statistics.fmean(fractions) if fractions else None,
                skipped_steps=_mean([s for s in skipped if s is not None]),
                settled_scale=statistics.median(scales) if scales else None,
                scale_swing=statistics.median(swings) if swings else None,
                stat="steps" if steps_key is not None else "metric",
                lower_is_better=steps_key is not None or mode == "min",
                seeds=[t.get("seed") for t in trials],
            )
        )
    return rank(groups)


def _mean(xs: Sequence[float]) -> float | None:
    return statistics.fmean(xs) if xs else None


def rank(groups: list[Group]) -> list[Group]:
    """Sorts best first by the ranked interval's mean (groups without one last), numbers
    them and marks those whose interval overlaps the best's as tied."""

    def order(g: Group) -> tuple[bool, float]:
        m = g.ranked.mean
        if m is None:
            return (True, 0.0)
        return (False, m if g.lower_is_better else -m)

    groups.sort(key=order)
    best = groups[0].ranked if groups else None
    for i, g in enumerate(groups, 1):
        g.rank = i
        g.tied = best is not None and g.ranked.overlaps(best)
    return groups


def single_seed(groups: Sequence[Group]) -> bool:
    """True when no group has two seeds: no interval, every answer rests on one run each."""
    return all(g.single_seed for g in groups)


SINGLE_RUN = (
    "one seed per setting: every number rests on a single run, with no interval; "
    "raise tune.num_samples (or --num-samples) to 3 or more"
)


def finding(groups: Sequence[Group]) -> str:
    """One line on what the sweep found: the searched key whose values split the groups'
    intervals apart, or that nothing separates the groups.

    A key decides when, for each of its values, the envelope of the intervals of the groups
    with that value is disjoint from every other value's envelope.
    """
    ranked = [g for g in groups if g.ranked.bounds() is not None]
    if not ranked:
        return "Nothing to compare: no setting reported the metric."
    unit = " steps" if ranked[0].stat == "steps" else ""
    keys = list(ranked[0].values)
    deciding: list[str] = []
    for key in keys:
        envelopes: dict[Any, tuple[float, float]] = {}
        for g in ranked:
            lo, hi = g.ranked.bounds() or (0.0, 0.0)
            v = _key(g.values[key])
            old = envelopes.get(v)
            envelopes[v] = (lo, hi) if old is None else (min(old[0], lo), max(old[1], hi))
        if len(envelopes) < 2:
            continue
        spans = sorted(envelopes.items(), key=lambda kv: kv[1][0])
        if all(a[1][1] < b[1][0] for a, b in zip(spans, spans[1:])):
            parts = " vs ".join(f"{_plain(v)}: {_span(lo, hi)}{unit}" for v, (lo, hi) in spans)
            deciding.append(f"{_leaf(key)} decides ({parts})")
    tied = [g for g in ranked if g.tied]
    if deciding:
        rest = [_leaf(k) for k in keys if not any(d.startswith(_leaf(k)) for d in deciding)]
        line = "; ".join(deciding)
        if rest:
            line += f"; {', '.join(rest)} {'does' if len(rest) == 1 else 'do'} not separate"
            line += " the groups"
    elif len(tied) == len(ranked):
        line = (
            f"nothing separates the groups: all {len(ranked)} intervals overlap the best's "
            f"({_interval_text(ranked[0].ranked)}{unit})"
        )
    else:
        line = (
            f"no single searched key separates the groups; {len(tied)} of {len(ranked)} are "
            f"tied with the best ({ranked[0].label()}: {_interval_text(ranked[0].ranked)}{unit})"
        )
    if single_seed(ranked):
        line += f" ({SINGLE_RUN})"
    return line if line.endswith(")") else line + "."


def _span(lo: float, hi: float) -> str:
    if lo == hi:
        return _compact(lo)
    return f"{_compact(lo)} to {_compact(hi)}" if lo < 0 else f"{_compact(lo)}-{_compact(hi)}"


def interval_text(i: Interval) -> str:
    """``19,750 [18,900, 20,600]``; a single run's value with ``(1 run)``."""
    return _interval_text(i)


def _interval_text(i: Interval) -> str:
    if i.mean is None:
        return "-"
    if i.lo is None or i.hi is None:
        return f"{_compact(i.mean)} (1 run)"
    return f"{_compact(i.mean)} [{_compact(i.lo)}, {_compact(i.hi)}]"


def _leaf(key: str) -> str:
    return key.split(".")[-1]


def _plain(v: Any) -> str:
    """A searched value as a user would type it: 65536, 0.0003, 500."""
    if v is None:
        return "-"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v))
    return str(v)


def _compact(v: Any) -> str:
    """Numbers as the group table shows them: 19.5k, 0.069, 28."""
    if v is None:
        return "-"
    if isinstance(v, bool) or not is_number(v):
        return str(v)
    x = float(v)
    if not math.isfinite(x):
        return str(x)
    if abs(x) >= 1000:
        return f"{x / 1000:,.1f}k".replace(".0k", "k")
    if x.is_integer():
        return f"{x:,.0f}"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"


def format_table(groups: Sequence[Group], metric: str) -> str:
    """The printed table: one line per setting, best first, tied groups marked."""
    if not groups:
        return "(no trials)"
    name = metric.split("/")[-1]
    keys = list(groups[0].values)
    cols = ["rank", *(_leaf(k) for k in keys), "seeds", f"{name} mean [95% CI]"]
    with_steps = groups[0].steps is not None
    if with_steps:
        cols += ["steps to target [95% CI]", "reached"]
    cols += ["skip frac", "skipped", "settled scale", "tie"]
    table = [cols]
    for g in groups:
        cells = [str(g.rank), *(_plain(g.values[k]) for k in keys), str(len(g.trials))]
        cells.append(_interval_text(g.metric))
        if with_steps and g.steps is not None:
            cells += [_interval_text(g.steps), f"{g.reached}/{len(g.trials)}"]
        frac = "-" if g.skip_fraction is None else f"{100 * g.skip_fraction:.1f}%"
        mark = "best" if g.rank == 1 else ("tied" if g.tied else "")
        cells += [frac, _compact(g.skipped_steps), _plain(g.settled_scale), mark]
        table.append(cells)
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths)) for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def of_experiment(exp: Any, rows: Sequence[Mapping[str, Any]]) -> list[Group]:
    """``group`` with what the experiment says: its searched keys, metric, mode, target and
    env-step budget."""
    from rllib_amp.sweep import summary

    threshold = summary.target(exp)
    budget = _finite(exp.stop.get(summary.STEPS_KEY))
    return group(
        rows,
        keys=list(exp.search),
        metric=exp.tune["metric"],
        mode=exp.tune["mode"],
        steps_key=None if threshold is None else summary.target_columns(threshold)[0],
        budget=budget,
    )


def report(exp: Any, rows: Sequence[Mapping[str, Any]], grid: Any, exp_dir: str) -> list[Group]:
    """Prints the per-setting summary and what the sweep found, writes ``groups.parquet``
    into ``exp_dir`` (a path or URI) and prints where; returns the groups (``figure.report``
    draws them).

    ``rows``: ``summary.summarize``'s per-trial rows; ``grid``: Tune's ResultGrid.
    """
    from rllib_amp import fs as files
    from rllib_amp.sweep import summary

    groups = of_experiment(exp, rows)
    metric = exp.tune["metric"]
    by = "env steps to the target" if groups and groups[0].stat == "steps" else metric
    print()
    print(f"Settings, best first by the mean {by} over seeds (tie: 95% intervals overlap):")
    print(format_table(groups, metric))
    print(f"Found: {finding(groups)}")
    location = files.join(exp_dir, FILE)
    summary.write_parquet([g.as_row(metric) for g in groups], location)
    print(f"Groups: {location}")
    return groups
