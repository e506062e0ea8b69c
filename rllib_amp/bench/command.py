"""The command line of ``python -m rllib_amp.bench``: flags, input checks, the order of figures.

Example:
    python -m rllib_amp.bench --quick --json bench.json
"""

from __future__ import annotations

import argparse
import datetime as _dt
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

import rllib_amp.bench.atari_figures as atari_figures
import rllib_amp.bench.figures as figures
import rllib_amp.bench.fixed_cost as fixed_cost
import rllib_amp.bench.report as report
from rllib_amp.algorithms import algorithm
from rllib_amp.bench.harness import in_child
from rllib_amp.bench.report import Results
from rllib_amp.bench.workloads import (
    DQN_BATCH_VARIANTS,
    DQN_BATCHES,
    MODELS,
    PATH_VARIANTS,
    STOCK,
    VARIANTS_CPU,
    VARIANTS_GPU,
    WORKLOADS,
    collect_data,
)
from rllib_amp.checks import suggest
from rllib_amp.cli import Parser, UsageError, main_wrapper
from rllib_amp.envs.atari import NATIVE, WRAPPERS
from rllib_amp.sweep.ray_address import local_ray_env

PROG = "python -m rllib_amp.bench"
PARITY_SEEDS = (0, 1, 2)


def _items(text: str, allowed: Sequence[str], known: bool = True) -> list[str]:
    items = [t.strip() for t in text.split(",") if t.strip()]
    if not items:
        raise argparse.ArgumentTypeError(f"empty list; allowed: {','.join(allowed)}")
    for item in items if known else ():
        if item not in allowed:
            raise argparse.ArgumentTypeError(f"{item!r} is not one of {','.join(allowed)}")
    return items


def _algos(text: str) -> list[str]:
    """``--algos``: algorithms of rllib_amp.algorithms that have a bench workload."""
    out = []
    allowed = ",".join(WORKLOADS)
    for name in _items(text, list(WORKLOADS), known=False):  # any spelling of the registry
        try:
            record = algorithm(name)
        except ValueError:
            hint = suggest(name, WORKLOADS)
            raise argparse.ArgumentTypeError(f"{name!r} is not one of {allowed}{hint}") from None
        if record.name not in WORKLOADS:
            raise argparse.ArgumentTypeError(
                f"{record.name!r} trains with rllib-amp but has no benchmark workload; "
                f"allowed: {allowed}"
            )
        out.append(record.name)
    return out


def build_parser() -> argparse.ArgumentParser:
    """The flags of ``python -m rllib_amp.bench``."""
    p = Parser(prog=PROG, description="What AMP buys over stock RLlib, side by side in one run.")
    p.add_argument("--quick", action="store_true", help="full preset only, fewer reps, no parity")
    p.add_argument("--device", choices=("cpu", "cuda"), help="default: cuda if any")
    p.add_argument("--algos", type=_algos, help=f"e.g. {','.join(WORKLOADS)}")
    p.add_argument("--models", type=lambda t: _items(t, MODELS), help="mini,full,high")
    p.add_argument("--reps", type=int, help="timed repetitions per variant")
    p.add_argument("--json", help="also write the results as JSON here")
    p.add_argument("--out", help=f"folder for {report.PARQUET_NAME} and {report.PLOT_NAME}")
    return p


def atari_paths(
    algos: Sequence[str],
    device: str,
    reps: int,
    quick: bool,
    save: Callable[[Results], None] = lambda part: None,
) -> Results:
    """The Atari-path figures (``atari_figures``): RLlib's wrappers vs the native env;
    ``save(part)`` after each figure, with what is measured so far."""
    out: Results = {}
    steps = 1024 if quick else 4096
    print(f"[bench] sampling, one EnvRunner: wrappers vs native x{reps}", file=sys.stderr)
    out["sampling"] = atari_figures.bench_sampling(reps, env_steps=steps)
    save(out)
    iterations = 2 if quick else 6
    e2e_labels = (STOCK, "fp32 native", "amp native")
    out["end_to_end_paths"], out["end_to_end_learner"] = {}, {}
    for algo in ("PPO", "APPO"):
        print(f"[bench] {algo} Pong end to end, Atari paths", file=sys.stderr)
        rates, learner = in_child(
            atari_figures.bench_end_to_end_paths, algo, e2e_labels, device, iterations
        )
        out["end_to_end_paths"][algo], out["end_to_end_learner"][algo] = rates, learner
        save(out)
    if "DQN" in algos:
        print("[bench] DQN replay bytes per transition", file=sys.stderr)
        out["replay_bytes"] = atari_figures.bench_replay_bytes(steps)
        save(out)
    out["memory_paths"] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for algo in algos:
            data = {pre: os.path.join(tmp, f"{algo}-{pre}.pkl") for pre in (WRAPPERS, NATIVE)}
            for pre, path in data.items():
                collect_data(algo, device, path, preprocessing=pre)
            print(f"[bench] {algo} full: peak memory, Atari paths", file=sys.stderr)
            out["memory_paths"][f"{algo} full"] = atari_figures.bench_memory_paths(
                algo, "full", list(PATH_VARIANTS), device, data
            )
            save(out)
    return out


def dqn_batches(
    device: str, reps: int, save: Callable[[Results], None] = lambda part: None
) -> dict[str, dict[str, dict[str, Any]]]:
    """Per ``DQN_BATCHES`` size: the DQN update's time (ms per update, ``reps`` each) and peak
    memory (bytes) with the Nature CNN, ``DQN_BATCH_VARIANTS`` side by side."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for size in DQN_BATCHES:
            data = os.path.join(tmp, f"dqn-{size}.pkl")
            collect_data("DQN", device, data, batch_size=size)
            print(f"[bench] DQN full, batch {size}: update time and peak memory", file=sys.stderr)
            per_s = in_child(
                figures.throughput_cell, "DQN", "full", DQN_BATCH_VARIANTS, device, data, reps
            )
            out[str(size)] = {
                "update_ms": {v: [1000 * size / x for x in xs] for v, xs in per_s.items()},
                "memory": figures.bench_memory("DQN", "full", DQN_BATCH_VARIANTS, device, data),
            }
            save({"dqn_batches": out})
    return out


def run(argv: Sequence[str] | None = None) -> int:
    """Parses ``argv``, checks every input and output, measures, prints and writes."""
    args = build_parser().parse_args(argv)
    if args.reps is not None and args.reps < 1:
        raise UsageError(f"--reps: got {args.reps}; must be >= 1")
    report.check_outputs(args.json, args.out)
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible; use --device cpu")
    algos = args.algos or list(WORKLOADS)
    models = args.models or (["full"] if args.quick else list(MODELS))
    reps = args.reps or (3 if args.quick else 7)
    variants = VARIANTS_GPU if device == "cuda" else VARIANTS_CPU
    started = time.time()
    results: Results = {"throughput": {}, "memory": {}}

    def save(part: Results | None = None) -> None:
        """What is measured so far, into --json: a run stopped early keeps its figures."""
        if args.json:
            report.write_partial({**results, **(part or {})}, args.json)

    # The measuring children get what `python -m rllib_amp.tune` gives its local Ray (idle
    # torch threads sleep, docs/performance.md) unless the environment sets it.
    with local_ray_env():
        policy = os.environ.get("OMP_WAIT_POLICY", "unset")
        _measure(args, algos, models, reps, device, variants, results, save)
    rows = report.rows_from(results)
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    header = (
        f"rllib-amp benchmark, {date}, {report.machine_description(device)}; medians of {reps} "
        f"interleaved repetitions; OMP_WAIT_POLICY {policy}; {time.time() - started:.0f} s"
    )
    print(report.markdown(rows, header), end="\n\n")
    print(report.markdown_targets(report.targets(results)), end="\n\n")
    print(report.markdown_bounds(report.end_to_end_bounds(results)))
    report.write_outputs(rows, results, args.json, args.out, header)
    return 0


def _measure(
    args: argparse.Namespace,
    algos: list[str],
    models: list[str],
    reps: int,
    device: str,
    variants: Any,
    results: Results,
    save: Callable[..., None],
) -> None:
    """Every figure the run asks for, into ``results``, saved (``save``) after each."""
    with tempfile.TemporaryDirectory() as tmp:
        for algo in algos:
            data_path = os.path.join(tmp, f"{algo}.pkl")
            collect_data(algo, device, data_path)
            for model in models:
                key = f"{algo} {model}"
                print(f"[bench] {key}: learner update x{reps} per variant", file=sys.stderr)
                results["throughput"][key] = in_child(
                    figures.throughput_cell, algo, model, variants, device, data_path, reps
                )
                save()
                if not args.quick or algo == "PPO":
                    print(f"[bench] {key}: peak memory", file=sys.stderr)
                    results["memory"][key] = figures.bench_memory(
                        algo, model, variants, device, data_path
                    )
                    save()
    if "DQN" in algos:
        results["dqn_batches"] = dqn_batches(device, reps, save)
    if "PPO" in algos:
        label = fixed_cost.FIXED_COST.label()
        print(f"[bench] fixed cost per minibatch, {label} x{reps}", file=sys.stderr)
        results["fixed_cost"] = in_child(fixed_cost.fixed_cost_cell, variants, device, reps)
        save()
    print("[bench] PPO Pong end to end", file=sys.stderr)
    results["end_to_end"] = in_child(
        figures.bench_end_to_end, variants, device, 4 if args.quick else 8
    )
    save()
    results.update(atari_paths(algos, device, reps, args.quick, save))
    if not args.quick:
        print(f"[bench] CartPole learning parity ({len(PARITY_SEEDS)} seeds)", file=sys.stderr)
        results["parity"] = figures.bench_parity(("fp32", "amp-auto"), PARITY_SEEDS)


def main(argv: Sequence[str] | None = None) -> int:
    """``run`` with bad input as one line on stderr and exit status 2."""
    return main_wrapper(PROG, run, argv)
