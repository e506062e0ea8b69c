"""Pong learning curves as data: rows of curves.parquet, the 20-episode mean return, each
run's milestones, AMP against float32, and the table and figure built from the files alone.

One row per training iteration of a run (``COLUMNS``); a folder of such files, from several
days and machines, is read as one set of runs.

Example:
    >>> rows = [{"run": "r", "path": "amp-native", "seed": 0, "env_steps": s,
    ...          "seconds": s / 100, "return": r, "episodes": 20}
    ...         for s, r in [(5e5, -21.0), (1e6, -5.0), (1.5e6, 1.0), (2e6, 19.0)]]
    >>> m = run_milestones(rows)
    >>> m["return_at_1M"], m["steps_to_0"], m["steps_to_18"]
    (-5.0, 1500000.0, 2000000.0)
"""

from __future__ import annotations

import glob
import itertools
import math
import os
import statistics
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rllib_amp.cli import UsageError

# The paths a Pong run trains along (``learning.PATHS`` maps them to the benchmark's variants).
STOCK = "stock"
FP32_NATIVE = "fp32-native"
AMP = "amp-native"
# Episodes in the mean return the milestones and the figure use. RLlib's "return" of an
# iteration is the mean over the episodes that ended in it (none, one or a few for 16 Pong
# envs and 1,024 steps), so the window is computed here from each iteration's mean and count.
RETURN_WINDOW = 20


@dataclass(frozen=True)
class Task:
    """What a task's report reads off its curves.

    Args:
        name: the ``--task`` of ``studies.learning``.
        title: the figure's title.
        amp: the AMP path's name; ``reference``: the float32 path it is compared with.
        compare_steps: env steps at which the two are compared.
        replication_seeds: the seeds of each path whose comparison was fixed in the docs
            before any of their runs started; the report judges them on their own.
        doc: the page that fixed them.
        milestone_steps: env steps at which the table gives the return.
        milestone_returns: the returns whose first crossing the table gives.
        ylim: the figure's return axis.
    """

    name: str
    title: str
    amp: str
    reference: str
    compare_steps: int
    replication_seeds: tuple[int, ...]
    doc: str
    milestone_steps: tuple[int, ...]
    milestone_returns: tuple[float, ...]
    ylim: tuple[float, float]


# Pong's replication at 1M env steps (seeds 4 and 5, docs/pong.md): seeds 0-3 of each path
# were added after looking at earlier verdicts, so they cannot settle it.
PONG_PPO = Task(
    "pong-ppo", "PPO on ALE/Pong-v5 (CleanRL's ppo_atari settings)", AMP, FP32_NATIVE,
    1_000_000, (4, 5), "docs/pong.md", (1_000_000, 2_000_000, 3_000_000), (0.0, 18.0),
    (-21.5, 21.5),
)  # fmt: skip
# CartPole DQN: seeds 0-2 of each path at 500k env steps, fixed in docs/dqn.md before the runs.
CARTPOLE_DQN = Task(
    "cartpole-dqn", "DQN on CartPole-v1 (CleanRL's dqn.py settings)", "amp", "fp32",
    500_000, (0, 1, 2), "docs/dqn.md", (100_000, 250_000, 500_000), (195.0, 475.0),
    (0.0, 510.0),
)  # fmt: skip
# Pong DQN: seeds 0 and 1 of each path at 1M env steps, fixed in docs/dqn.md before the runs.
PONG_DQN = Task(
    "pong-dqn", "DQN on ALE/Pong-v5 (Tianshou's atari_dqn settings)", AMP, FP32_NATIVE,
    1_000_000, (0, 1), "docs/dqn.md", (1_000_000, 2_000_000), (0.0, 15.0), (-21.5, 21.5),
)  # fmt: skip
# Pong APPO: tune_configs/pong_appo_amp.yaml on one 2-core machine; one run to a return of 0
# (issue 32), no comparison fixed before runs.
PONG_APPO = Task(
    "pong-appo", "APPO on ALE/Pong-v5 (pong_appo_amp.yaml on 2 cores)", AMP, FP32_NATIVE,
    1_000_000, (), "docs/dqn.md", (1_000_000, 2_000_000, 3_000_000), (0.0, 18.0), (-21.5, 21.5),
)  # fmt: skip
TASKS = {t.name: t for t in (PONG_PPO, CARTPOLE_DQN, PONG_DQN, PONG_APPO)}
REPLICATION_SEEDS = PONG_PPO.replication_seeds
# Column -> pyarrow type name of curves.parquet (types fixed, so files of any day concatenate).
COLUMNS = {
    "run": "string",
    "path": "string",
    "seed": "int64",
    "iteration": "int64",
    "env_steps": "float64",
    "seconds": "float64",
    "return": "float64",
    "episodes": "int64",
    "date": "string",
    "machine": "string",
    # The training process's peak resident memory so far (its VmHWM), MiB; None in older files.
    "peak_rss_mib": "float64",
}


def _schema() -> Any:
    import pyarrow as pa

    return pa.schema([(k, getattr(pa, v)()) for k, v in COLUMNS.items()])


def read_rows(path: str) -> list[dict[str, Any]]:
    """The rows of one curves parquet file, or of every ``*.parquet`` under a folder."""
    import pyarrow.parquet as pq

    if os.path.isdir(path):
        files = sorted(glob.glob(os.path.join(path, "**", "*.parquet"), recursive=True))
    else:
        files = [path] if os.path.exists(path) else []
    return continued([pq.read_table(f).to_pylist() for f in files])


def _run_key(r: Mapping[str, Any]) -> tuple[Any, ...]:
    return (r["path"], r["seed"], r["run"], r["machine"])


def continued(files: Sequence[Sequence[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of several files as one line of training per run. A resumed run trains again
    from its checkpoint, so a file that continues a run from iteration k replaces the rows at
    k and after in the files before it (those of the killed process past its last checkpoint).

    Example:
        >>> row = lambda i, s: {"path": "p", "seed": 0, "run": "r", "machine": "m",
        ...                     "iteration": i, "env_steps": s}
        >>> killed = [row(1, 10), row(2, 20), row(3, 30)]     # checkpoint at iteration 2
        >>> resumed = [row(3, 31), row(4, 41)]
        >>> [r["env_steps"] for r in continued([killed, resumed])]
        [10, 20, 31, 41]
    """
    firsts_per_file = [_firsts(rows) for rows in files]
    starts: dict[tuple[Any, ...], list[int]] = {}
    for firsts in firsts_per_file:
        for key, first in firsts.items():
            starts.setdefault(key, []).append(first)
    out: list[dict[str, Any]] = []
    for rows, firsts in zip(files, firsts_per_file):
        for r in rows:
            key = _run_key(r)
            if not any(firsts[key] < k <= r["iteration"] for k in starts[key]):
                out.append(r)
    return out


def _firsts(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[Any, ...], int]:
    firsts: dict[tuple[Any, ...], int] = {}
    for r in rows:
        key = _run_key(r)
        firsts[key] = min(firsts.get(key, r["iteration"]), r["iteration"])
    return firsts


def write_rows(rows: Sequence[Mapping[str, Any]], path: str) -> None:
    """Writes ``rows`` to ``path`` atomically (a kill leaves the old file or the new one)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = f"{path}.tmp-{os.getpid()}"
    table = pa.Table.from_pylist([{k: r.get(k) for k in COLUMNS} for r in rows], _schema())
    pq.write_table(table, tmp)
    os.replace(tmp, path)


# -- what the curves say ----------------------------------------------------------------------
def _finite(rows: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in rows if r["return"] is not None and not math.isnan(r["return"])]


def smoothed(rows: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The mean return of the last RETURN_WINDOW episodes after each iteration in which one
    ended (``full``: the window holds that many). An iteration's mean stands for each of its
    ``episodes`` (one where the count was not recorded).

    Example:
        >>> rows = [{"env_steps": 1.0, "seconds": 1.0, "return": -21.0, "episodes": 15},
        ...         {"env_steps": 2.0, "seconds": 2.0, "return": -11.0, "episodes": 10}]
        >>> [(p["return"], p["full"]) for p in smoothed(rows)]
        [(-21.0, False), (-16.0, True)]
    """
    out: list[dict[str, Any]] = []
    window: list[tuple[float, int]] = []  # (mean return, episodes), oldest first
    for r in _finite(sorted(rows, key=lambda r: r["env_steps"])):
        window.append((float(r["return"]), int(r.get("episodes") or 1)))
        total, weighted = 0, 0.0
        for mean, n in reversed(window):
            take = min(n, RETURN_WINDOW - total)
            total += take
            weighted += take * mean
            if total == RETURN_WINDOW:
                break
        out.append(
            {
                "env_steps": r["env_steps"],
                "seconds": r["seconds"],
                "return": weighted / total,
                "full": total == RETURN_WINDOW,
            }
        )
    return out


def return_at(rows: Sequence[Mapping[str, Any]], steps: float) -> float | None:
    """The mean return of the last RETURN_WINDOW episodes as of ``steps`` env steps: at the
    first iteration at or past ``steps`` that ended an episode; for a run that reached
    ``steps`` with no episode ending after it (a run stopped at its budget), the window as the
    run left it. None when the run never got there or the window never filled.

    Example:
        >>> rows = [{"env_steps": s, "seconds": 1.0, "return": r, "episodes": 20}
        ...         for s, r in ((900.0, -5.0), (1000.0, float("nan")))]
        >>> return_at(rows, 1000), return_at(rows, 1001)
        (-5.0, None)
    """
    points = [p for p in smoothed(rows) if p["full"]]
    at = next((p for p in points if p["env_steps"] >= steps), None)
    if at is not None:
        return float(at["return"])
    reached = max((r["env_steps"] for r in rows), default=0.0) >= steps
    return float(points[-1]["return"]) if reached and points else None


def steps_label(steps: int) -> str:
    """Env steps as the table's headers and the milestone keys write them.

    Example:
        >>> steps_label(1_000_000), steps_label(250_000), steps_label(1_500_000)
        ('1M', '250k', '1.5M')
    """
    if steps >= 1_000_000:
        return f"{steps / 1e6:g}M"
    return f"{steps / 1e3:g}k"


def run_milestones(rows: Sequence[Mapping[str, Any]], task: Task = PONG_PPO) -> dict[str, Any]:
    """One run's figures: the mean return of the last RETURN_WINDOW episodes at the task's
    milestone steps (``return_at``; Pong: 1M, 2M, 3M); env steps and seconds to first reach
    each milestone return with that mean (Pong: 0 and +18); its final value. None where the
    run never got there (or the window never filled)."""
    rows = sorted(rows, key=lambda r: r["env_steps"])
    points = [p for p in smoothed(rows) if p["full"]]
    out: dict[str, Any] = {
        "env_steps": rows[-1]["env_steps"] if rows else 0.0,
        "seconds": rows[-1]["seconds"] if rows else 0.0,
        "final": points[-1]["return"] if points else None,
    }
    for m in task.milestone_steps:
        out[f"return_at_{steps_label(m)}"] = return_at(rows, m)
    for target in task.milestone_returns:
        hit = next((p for p in points if p["return"] >= target), None)
        out[f"steps_to_{target:g}"] = hit["env_steps"] if hit else None
        out[f"seconds_to_{target:g}"] = hit["seconds"] if hit else None
    return out


def group_runs(rows: Iterable[Mapping[str, Any]]) -> dict[tuple[str, str, int], list[Any]]:
    """Rows by (date the run started, path, seed): one entry per run, files of every day."""
    by_run: dict[tuple[str, str, int], list[Any]] = {}
    first_date: dict[tuple[str, str, int, str], str] = {}
    for r in rows:
        key = (r["path"], r["seed"], r["run"], r["machine"])
        first_date.setdefault(key, r["date"])
    for r in rows:
        key = (r["path"], r["seed"], r["run"], r["machine"])
        by_run.setdefault((first_date[key], r["path"], r["seed"]), []).append(r)
    return dict(sorted(by_run.items()))


def permutation_p(values: Sequence[float], reference: Sequence[float]) -> tuple[int, int]:
    """The exact one-sided permutation test of "``values`` lower than ``reference``": of all
    the ways to split the pooled returns into groups of their sizes, (how many give a mean
    difference at most the observed one, how many ways there are). Their ratio is the
    p-value; with 3 seeds a side there are 20 ways, so it cannot go below 0.05.

    Example:
        >>> permutation_p([1.0, 2.0, 3.0], [4.0, 5.0, 6.0])  # the lowest split of 20
        (1, 20)
        >>> permutation_p([4.0, 5.0, 6.0], [1.0, 2.0, 3.0])
        (20, 20)
    """
    pooled, n = [*values, *reference], len(values)
    observed = statistics.fmean(values) - statistics.fmean(reference)
    total = sum(pooled)
    at_most = 0
    for chosen in itertools.combinations(pooled, n):
        mean_a = sum(chosen) / n
        mean_b = (total - sum(chosen)) / (len(pooled) - n)
        at_most += mean_a - mean_b <= observed + 1e-9
    return at_most, math.comb(len(pooled), n)


def compare_at(
    runs: Mapping[tuple[str, str, int], Sequence[Mapping[str, Any]]],
    steps: int,
    path: str = AMP,
    reference: str = FP32_NATIVE,
    seeds: Collection[int] | None = None,
) -> dict[str, Any] | None:
    """``path`` against ``reference`` at ``steps`` env steps, over the seeds of each that got
    there (only ``seeds`` when given): no worse when the mean is at least the reference's
    minus the larger half-range. ``as_low`` and ``splits``: ``permutation_p`` of path's
    returns against the reference's.

    Example:
        >>> mk = lambda p, s, r: [
        ...     {"path": p, "seed": s, "env_steps": 1e6, "seconds": 1, "return": r, "episodes": 20}
        ... ]
        >>> runs = {("d", AMP, 0): mk(AMP, 0, -10.0), ("d", AMP, 1): mk(AMP, 1, -14.0),
        ...         ("d", FP32_NATIVE, 0): mk(FP32_NATIVE, 0, -11.0),
        ...         ("d", FP32_NATIVE, 1): mk(FP32_NATIVE, 1, -12.0)}
        >>> c = compare_at(runs, 1_000_000)
        >>> c["mean"], c["reference_mean"], c["no_worse"]
        (-12.0, -11.5, True)
    """

    def values(p: str) -> list[float]:
        vals = []
        for (_, q, seed), rows in runs.items():
            wanted = q == p and (seeds is None or seed in seeds)
            at = return_at(rows, steps) if wanted else None
            if at is not None:
                vals.append(at)
        return vals

    a, b = values(path), values(reference)
    if len(a) < 2 or len(b) < 2:
        return None
    half = max((max(a) - min(a)) / 2, (max(b) - min(b)) / 2)
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    as_low, splits = permutation_p(a, b)
    return {
        "values": a,
        "reference_values": b,
        "mean": ma,
        "reference_mean": mb,
        "no_worse": ma >= mb - half,
        "as_low": as_low,
        "splits": splits,
    }


def table(rows: Sequence[Mapping[str, Any]], task: Task = PONG_PPO) -> str:
    """The markdown table of every run in ``rows``: one line per run."""

    def num(v: Any, fmt: str = "{:.1f}") -> str:
        return "-" if v is None else fmt.format(v)

    def steps_time(s: Any, t: Any) -> str:
        return "-" if s is None else f"{s / 1e6:.2f}M / {t / 60:.0f} min"

    at = [f"return at {steps_label(task.milestone_steps[0])}"]
    at += [steps_label(m) for m in task.milestone_steps[1:]]
    to = [f"to {task.milestone_returns[0]:g} (steps / time)"]
    signed = min(task.milestone_returns) <= 0  # Pong's scores run from -21 to +21
    to += [f"to {r:+g}" if signed else f"to {r:g}" for r in task.milestone_returns[1:]]
    # Files written since peak memory was recorded get its column and the speed beside it.
    memory = any(r.get("peak_rss_mib") is not None for r in rows)
    extra = ["env steps/s", "peak memory"] if memory else []
    header = ["date", "path", "seed", "env steps", "hours", *at, "final", *to, *extra, "machine"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (date, path, seed), run_rows in group_runs(rows).items():
        m = run_milestones(run_rows, task)
        cells = [
            date,
            path,
            str(seed),
            f"{m['env_steps'] / 1e6:.2f}M",
            f"{m['seconds'] / 3600:.2f}",
        ]
        cells += [num(m[f"return_at_{steps_label(s)}"]) for s in task.milestone_steps]
        cells.append(num(m["final"]))
        cells += [
            steps_time(m[f"steps_to_{r:g}"], m[f"seconds_to_{r:g}"]) for r in task.milestone_returns
        ]
        if memory:
            peaks = [r["peak_rss_mib"] for r in run_rows if r.get("peak_rss_mib") is not None]
            cells.append(f"{m['env_steps'] / m['seconds']:.0f}" if m["seconds"] else "-")
            cells.append(f"{max(peaks) / 1024:.1f} GiB" if peaks else "-")
        cells.append(run_rows[0]["machine"])
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def time_to_score(rows: Sequence[Mapping[str, Any]], task: Task = PONG_PPO) -> str:
    """Wall-clock minutes to first reach each milestone return, one line per path and machine:
    the seeds that got there within their run's length (of all seeds), their median and range.

    Example:
        >>> rows = [{"run": f"r{i}", "path": "amp-native", "seed": i, "env_steps": s,
        ...          "seconds": s / 100 * (i + 1), "return": r, "episodes": 20, "machine": "m",
        ...          "date": "d"} for i in (0, 1) for s, r in [(1e6, -5.0), (2e6, 19.0)]]
        >>> print(time_to_score(rows).splitlines()[-1])
        | amp-native | 2 | 2.00M | 2 of 2 | 500 | 333-667 | 2 of 2 | 500 | 333-667 | m |
    """
    by: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for run_rows in group_runs(rows).values():
        key = (run_rows[0]["path"], run_rows[0]["machine"])
        by.setdefault(key, []).append(run_milestones(run_rows, task))
    signed = min(task.milestone_returns) <= 0
    header = ["path", "seeds", "run length"]
    for r in task.milestone_returns:
        name = f"{r:+g}" if signed and r else f"{r:g}"
        header += [f"reached {name}", "minutes, median", "range"]
    header.append("machine")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for (path, machine), runs in sorted(by.items()):
        spans = sorted({f"{m['env_steps'] / 1e6:.2f}M" for m in runs})
        cells = [path, str(len(runs)), "-".join([spans[0], spans[-1]][: len(spans)])]
        for r in task.milestone_returns:
            minutes = [m[f"seconds_to_{r:g}"] / 60 for m in runs if m[f"seconds_to_{r:g}"]]
            cells.append(f"{len(minutes)} of {len(runs)}")
            if minutes:
                cells += [
                    f"{statistics.median(minutes):.0f}",
                    f"{min(minutes):.0f}-{max(minutes):.0f}",
                ]
            else:
                cells += ["-", "-"]
        cells.append(machine)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: Sequence[Mapping[str, Any]], png: str, task: Task = PONG_PPO) -> bool:
    """learning.png from the rows alone: return against env steps and against hours. False
    (and nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    colors = {STOCK: "tab:gray", task.reference: "tab:blue", task.amp: "tab:red"}
    # Seeds of one path: one colour, a line style each (seed 0 solid, 1 dashed, ... 6 styles).
    styles = ("-", "--", ":", "-.", (0, (5, 1)), (0, (1, 1)))
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for (date, path, seed), run_rows in group_runs(rows).items():
        raw = _finite(run_rows)
        pts = smoothed(run_rows)
        color = colors.get(path, "black")
        style = styles[seed % len(styles)]
        label = f"{path}, seed {seed} ({date})"
        axes[0].scatter(
            [r["env_steps"] for r in raw], [r["return"] for r in raw], s=2, color=color, alpha=0.2
        )
        axes[0].plot(
            [p["env_steps"] for p in pts],
            [p["return"] for p in pts],
            label=label,
            color=color,
            linestyle=style,
        )
        axes[1].plot(
            [p["seconds"] / 3600 for p in pts],
            [p["return"] for p in pts],
            color=color,
            linestyle=style,
        )
    axes[0].set_xlabel("env steps")
    axes[1].set_xlabel("wall-clock hours")
    axes[0].set_ylabel(f"return (dots: per iteration; line: last {RETURN_WINDOW} episodes)")
    for ax in axes:
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_ylim(*task.ylim)
    axes[0].legend(fontsize=7)
    fig.suptitle(task.title)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return True


def _verdict(c: Mapping[str, Any], task: Task) -> str:
    """One ``compare_at`` result in words: both means, each seed, the rule, the test."""
    n = len(c["values"]) + len(c["reference_values"])
    return (
        f"{task.amp} {c['mean']:.1f} ({', '.join(f'{v:.1f}' for v in c['values'])}) "
        f"vs {task.reference} {c['reference_mean']:.1f} "
        f"({', '.join(f'{v:.1f}' for v in c['reference_values'])}): "
        f"{'no worse' if c['no_worse'] else 'WORSE'} beyond the seed spread. "
        f"Exact permutation test: {c['as_low']} of the {c['splits']} ways to split these "
        f"{n} returns into two such groups put {task.amp} this far behind or further "
        f"(one-sided p = {c['as_low'] / c['splits']:.2f})."
    )


def report_text(rows: Sequence[Mapping[str, Any]], task: Task = PONG_PPO) -> str:
    """table.md's text: the table of every run; AMP against float32 at the task's
    ``compare_steps`` when both have two seeds or more there; and the replication
    (``task.replication_seeds``) on its own once each of its seeds of both paths got there."""
    lines = [table(rows, task)]
    lines.append(
        "\nWall-clock minutes from each run's start to first reach each return (the 20-episode "
        "mean), per path and machine; the runs' own hours, so a shared machine's where the "
        "page says the runs shared the cores:\n"
    )
    lines.append(time_to_score(rows, task))
    runs = group_runs(rows)
    at = steps_label(task.compare_steps)
    c = compare_at(runs, task.compare_steps, task.amp, task.reference)
    if c is not None:
        lines.append(f"\nAt {at} env steps, every seed on record: {_verdict(c, task)}")
    seeds = task.replication_seeds
    r = compare_at(runs, task.compare_steps, task.amp, task.reference, seeds=seeds)
    if r is not None and len(r["values"]) == len(r["reference_values"]) == len(seeds):
        named = " and ".join([", ".join(map(str, seeds[:-1])), str(seeds[-1])][-len(seeds) :])
        lines.append(
            f"\nThe replication decided before its runs (seeds {named} of each path, "
            f"{task.doc}), at {at} env steps: {_verdict(r, task)}"
        )
    return "\n".join(lines) + "\n"


def write_report(folder: str, task: Task = PONG_PPO) -> list[str]:
    """learning.png and table.md in ``folder``, from every parquet under it."""
    rows = read_rows(folder)
    if not rows:
        raise UsageError(f"--plot-only: no curve rows in any *.parquet under {folder!r}")
    md = os.path.join(folder, "table.md")
    with open(md, "w", encoding="utf-8") as f:
        f.write(report_text(rows, task))
    written = [md]
    png = os.path.join(folder, "learning.png")
    if plot(rows, png, task):
        written.append(png)
    return written
