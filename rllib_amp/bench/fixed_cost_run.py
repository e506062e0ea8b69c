"""``python -m rllib_amp.bench.fixed_cost_run``: the fixed-cost row alone, its raw figures in a
JSON file, and the table docs/benchmark.md shows, built from that file.

Each run is a fresh process (``harness.in_child``) that interleaves the variants over
``--reps`` repetitions (``fixed_cost.bench_fixed_cost``); the file keeps every repetition's
``FixedCostRecord``, the machine line, each run's load average before and after, and the
command. ``--table FILE`` prints the markdown table of a file written before, without measuring.

Example:
    >>> data = {"runs": [{"fixed_cost": {"fp32": [0.002, 0.0024], "amp-auto": [0.0021]}}]}
    >>> print(table(data))
    | variant | run 1 |
    |---|---|
    | fp32 (stock RLlib) | 2.20 ms (2.00-2.40) |
    | amp-auto | 2.10 ms (2.10-2.10), 0.95x |
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from typing import TypedDict

from rllib_amp.bench import fixed_cost
from rllib_amp.bench.fixed_cost import FixedCostRecord
from rllib_amp.bench.harness import in_child
from rllib_amp.bench.report import check_outputs, machine_description, markdown_table, write_json
from rllib_amp.bench.workloads import VARIANTS_CPU, VARIANTS_GPU
from rllib_amp.cli import UsageError, main_wrapper

PROG = "python -m rllib_amp.bench.fixed_cost_run"
NAMES = {"fp32": "fp32 (stock RLlib)", "rllib-scaler": "RLlib scaler hook"}


class Run(TypedDict):
    fixed_cost: Mapping[str, Sequence[FixedCostRecord | float]]
    load_average_1min: list[float]
    wall_s: float


class RunsFile(TypedDict, total=False):
    """What ``--json`` receives (docs/bench/fixed_cost.json)."""

    date: str
    machine: str
    command: str
    workload: str
    clock: str
    runs: list[Run]


def _ms(records: Sequence[FixedCostRecord | float]) -> list[float]:
    return [1000 * t for t in fixed_cost.per_step_seconds(records)]


def _cell(ms: list[float], ref: list[float] | None) -> str:
    cell = f"{statistics.median(ms):.2f} ms ({min(ms):.2f}-{max(ms):.2f})"
    if ref is not None:
        cell += f", {statistics.median(ms) / statistics.median(ref):.2f}x"
    return cell


def table(data: RunsFile) -> str:
    """Markdown: one column per run and, with more than one run, one for all repetitions
    pooled; per variant the median ms per step (min-max), and the ratio of medians to stock
    float32."""
    runs = [r["fixed_cost"] for r in data["runs"]]
    heads = ["variant", *(f"run {i + 1}" for i in range(len(runs)))]
    if len(runs) > 1:
        heads.append(f"all {len(runs)} runs")
        runs.append({v: [r for run in runs for r in run[v]] for v in runs[0]})
    rows = []
    for v in runs[0]:
        cells = (_cell(_ms(run[v]), None if v == "fp32" else _ms(run["fp32"])) for run in runs)
        rows.append([NAMES.get(v, v), *cells])
    return markdown_table(heads, rows)


def _run(argv: Sequence[str] | None) -> int:
    ap = argparse.ArgumentParser(prog=PROG, description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3, help="fresh processes (default 3)")
    ap.add_argument("--reps", type=int, default=9, help="repetitions per run (default 9)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--json", help="where to write the raw figures")
    ap.add_argument("--table", metavar="FILE", help="print the table of FILE and exit")
    args = ap.parse_args(argv)
    if args.table:
        try:
            with open(args.table, encoding="utf-8") as f:
                print(table(json.load(f)))
        except (OSError, ValueError, KeyError) as e:
            raise UsageError(
                f"--table: cannot read {args.table} ({e}); pass a file --json wrote"
            ) from None
        return 0
    for flag, n in (("--runs", args.runs), ("--reps", args.reps)):
        if n < 1:
            raise UsageError(f"{flag}: got {n}; must be >= 1")
    check_outputs(args.json, None)
    variants = VARIANTS_GPU if args.device == "cuda" else VARIANTS_CPU
    data: RunsFile = {
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine_description(args.device),
        "command": " ".join([PROG, *(argv if argv is not None else sys.argv[1:])]),
        "workload": f"{fixed_cost.FIXED_COST.label()}, epochs {fixed_cost.FIXED_COST.epochs}",
        "clock": "thread CPU time" if args.device == "cpu" else "wall time",
        "runs": [],
    }
    for i in range(args.runs):
        print(f"[fixed cost] run {i + 1}/{args.runs}, {args.reps} reps", file=sys.stderr)
        load, started = os.getloadavg()[0], time.time()
        out = in_child(fixed_cost.fixed_cost_cell, variants, args.device, args.reps)
        data["runs"].append(
            {
                "fixed_cost": out,
                "load_average_1min": [load, os.getloadavg()[0]],
                "wall_s": time.time() - started,
            }
        )
        if args.json:
            write_json(args.json, data)
    print(table(data))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """``_run`` with bad input as one line on stderr and exit status 2."""
    return main_wrapper(PROG, _run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
