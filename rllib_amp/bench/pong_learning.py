"""Pong learning evidence: PPO on ALE/Pong-v5, stock RLlib against the full rllib-amp path.

Stock is RLlib as it ships: float32, RLlib's Python Atari wrappers, float32 observations.
rllib-amp is ALE's native vector env, uint8 observations end to end and AMP at precision
auto. Both train with ``tune_configs/pong_ppo_amp.yaml``'s PPO settings, the Nature CNN
("full") and one local EnvRunner of 16 envs, for the same env-step budget and seeds; each run
in a fresh process, one after another (never side by side: the wall-clock axis is the point).

    python -m rllib_amp.bench.pong_learning --steps 1000000 --seeds 0,1 --out pong_learning

writes ``curves.parquet`` (one row per training iteration: path, seed, env steps, seconds,
return) and ``learning.png`` (return against env steps and against wall-clock time), and
prints a table and two verdicts: rllib-amp learns no worse than stock beyond the seed spread,
and reaches stock's final return sooner in wall-clock time.

Example:
    >>> curves = {("stock", 0): [(1000, 10.0, -21.0), (2000, 20.0, -19.0)],
    ...           ("rllib-amp", 0): [(1000, 4.0, -21.0), (2000, 8.0, -18.0)]}
    >>> s = summarize(curves)
    >>> s["rllib-amp"]["final"], s["rllib-amp"]["time_to_stock_final"]
    (-18.0, [8.0])
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rllib_amp.cli import Parser, UsageError, main_wrapper

PROG = "python -m rllib_amp.bench.pong_learning"
STOCK = "stock"
AMP = "rllib-amp"
# Path label -> the Atari-path variant of rllib_amp.bench (workloads.PATH_VARIANTS).
PATHS = {STOCK: "fp32 wrappers", AMP: "amp native"}
# tune_configs/pong_ppo_amp.yaml's training section (a test keeps the two equal).
TRAINING: dict[str, Any] = {
    "lr": 0.0001,
    "gamma": 0.99,
    "lambda_": 0.95,
    "clip_param": 0.1,
    "vf_clip_param": 10.0,
    "entropy_coeff": 0.01,
    "train_batch_size_per_learner": 4096,
    "minibatch_size": 256,
    "num_epochs": 4,
    "grad_clip": 100.0,
}
NUM_ENVS = 16
# One run may take this long (1M steps of stock RLlib on 2 CPU cores: about 45 minutes).
RUN_TIMEOUT_S = 24 * 3600.0
RETURN_KEY = "episode_return_mean"
# (env steps, seconds since the run started, mean return of the last episodes or NaN)
Point = tuple[float, float, float]


def train_one(
    path: str, seed: int, steps: int, device: str, training: Mapping[str, Any]
) -> list[Point]:
    """One run: trains until ``steps`` env steps; the curve, one point per iteration."""
    from rllib_amp.bench.atari_figures import path_configs

    cfg = path_configs("PPO", [PATHS[path]], device, training=dict(training))[PATHS[path]]
    cfg.env_runners(num_envs_per_env_runner=NUM_ENVS)
    cfg.debugging(seed=seed)
    algo = cfg.build_algo()
    curve: list[Point] = []
    start = time.perf_counter()
    try:
        done = 0.0
        while done < steps:
            result = algo.train()
            done = float(result["num_env_steps_sampled_lifetime"])
            ret = result["env_runners"].get(RETURN_KEY, math.nan)
            curve.append((done, time.perf_counter() - start, float(ret)))
            print(
                f"[pong] {path} seed {seed}: {done:,.0f} steps, {curve[-1][1]:.0f} s, "
                f"return {ret:.2f}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        algo.stop()
    return curve


def _final(curve: Sequence[Point]) -> float:
    finite = [r for _, _, r in curve if not math.isnan(r)]
    return finite[-1] if finite else math.nan


def _first_time(curve: Sequence[Point], target: float) -> float | None:
    return next((t for _, t, r in curve if not math.isnan(r) and r >= target), None)


def summarize(curves: Mapping[tuple[str, int], Sequence[Point]]) -> dict[str, dict[str, Any]]:
    """Per path: the final return (mean over seeds, the seeds' values, their spread), env
    steps/s, and per seed the seconds to first reach stock's mean final return."""
    paths = sorted({p for p, _ in curves}, key=lambda p: (p != STOCK, p))
    runs_of = {p: [c for (q, _), c in sorted(curves.items()) if q == p] for p in paths}
    out: dict[str, dict[str, Any]] = {}
    for p, runs in runs_of.items():
        finals = [_final(c) for c in runs]
        out[p] = {
            "finals": finals,
            "final": statistics.fmean(finals),
            "spread": (max(finals) - min(finals)) / 2,
            "env_steps_per_s": statistics.fmean(c[-1][0] / c[-1][1] for c in runs),
            "seconds": [c[-1][1] for c in runs],
        }
    if STOCK in out:
        target = out[STOCK]["final"]
        for p, runs in runs_of.items():
            out[p]["time_to_stock_final"] = [_first_time(c, target) for c in runs]
    return out


def verdicts(summary: Mapping[str, Mapping[str, Any]]) -> dict[str, bool]:
    """The issue's two checks: no worse than stock beyond the seed spread (AMP's mean final
    return at least stock's minus the larger of the two spreads), and sooner in wall-clock
    time (every AMP seed reaches stock's mean final return before stock's slowest seed)."""
    s, a = summary[STOCK], summary[AMP]
    no_worse = a["final"] >= s["final"] - max(s["spread"], a["spread"])
    amp_times = a["time_to_stock_final"]
    stock_times = [t for t in s["time_to_stock_final"] if t is not None]
    sooner = (
        bool(stock_times)
        and all(t is not None for t in amp_times)
        and max(amp_times) < max(stock_times)
    )
    return {"no worse than stock": no_worse, "sooner in wall-clock time": sooner}


def table(summary: Mapping[str, Mapping[str, Any]], steps: int) -> str:
    """The markdown table of the summary."""

    def times(ts: Sequence[float | None]) -> str:
        return ", ".join("-" if t is None else f"{t:,.0f}" for t in ts)

    lines = [
        f"| PPO Pong, {steps:,} env steps | final return (seeds) | env steps/s | wall s "
        "| s to stock's final return |",
        "|---|---|---|---|---|",
    ]
    for p, v in summary.items():
        seeds = ", ".join(f"{f:.1f}" for f in v["finals"])
        lines.append(
            f"| {p} ({PATHS[p]}) | {v['final']:.1f} +- {v['spread']:.1f} ({seeds}) | "
            f"{v['env_steps_per_s']:,.0f} | {times(v['seconds'])} | "
            f"{times(v.get('time_to_stock_final', []))} |"
        )
    return "\n".join(lines)


def write_outputs(curves: Mapping[tuple[str, int], Sequence[Point]], out_dir: str) -> list[str]:
    """curves.parquet and learning.png (the PNG only with matplotlib); returns the paths."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(out_dir, exist_ok=True)
    rows = [
        {"path": p, "seed": seed, "env_steps": s, "seconds": t, "return": r}
        for (p, seed), curve in sorted(curves.items())
        for s, t, r in curve
    ]
    written = [os.path.join(out_dir, "curves.parquet")]
    pq.write_table(pa.Table.from_pylist(rows), written[0])
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return written
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for (p, seed), curve in sorted(curves.items()):
        style = {"color": "tab:gray" if p == STOCK else "tab:red", "alpha": 0.9}
        label = f"{p}, seed {seed}"
        axes[0].plot([s for s, _, _ in curve], [r for _, _, r in curve], label=label, **style)
        axes[1].plot([t / 60 for _, t, _ in curve], [r for _, _, r in curve], **style)
    axes[0].set_xlabel("env steps")
    axes[1].set_xlabel("wall-clock minutes")
    axes[0].set_ylabel("mean episode return")
    axes[0].legend(fontsize=8)
    fig.suptitle("PPO on ALE/Pong-v5: stock RLlib float32 vs rllib-amp")
    fig.tight_layout()
    written.append(os.path.join(out_dir, "learning.png"))
    fig.savefig(written[-1], dpi=100)
    plt.close(fig)
    return written


def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--seeds: got {text!r}; give integers, e.g. --seeds 0,1") from None
    if not seeds:
        raise UsageError("--seeds: got no seed; give e.g. --seeds 0,1")
    return seeds


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=1_000_000, help="env steps per run")
    p.add_argument("--seeds", default="0,1", help="comma-separated, e.g. 0,1")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if any")
    p.add_argument("--out", default="pong_learning", help="folder for the parquet and PNG")
    p.add_argument(
        "--batch", type=int, default=None, help="train batch size per learner (default 4096)"
    )
    return p


def run(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.steps < 1:
        raise UsageError(f"--steps: got {args.steps}; must be >= 1")
    seeds = _seeds(args.seeds)
    training = dict(TRAINING)
    if args.batch is not None:
        if args.batch < 2:
            raise UsageError(f"--batch: got {args.batch}; must be >= 2")
        training["train_batch_size_per_learner"] = args.batch
        training["minibatch_size"] = min(training["minibatch_size"], args.batch)
    import torch

    from rllib_amp.bench.harness import in_child
    from rllib_amp.bench.report import machine_description

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible; use --device cpu")
    curves: dict[tuple[str, int], list[Point]] = {}
    for seed in seeds:
        for path in (STOCK, AMP):
            curves[(path, seed)] = in_child(
                train_one, path, seed, args.steps, device, training, timeout_s=RUN_TIMEOUT_S
            )
    summary = summarize(curves)
    print(f"rllib-amp Pong learning, {machine_description(device)}")
    print(table(summary, args.steps))
    for name, ok in verdicts(summary).items():
        print(f"{name}: {'yes' if ok else 'NO'}")
    for f in write_outputs(curves, args.out):
        print(f"wrote {f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return main_wrapper(PROG, run, argv)


if __name__ == "__main__":
    sys.exit(main())
