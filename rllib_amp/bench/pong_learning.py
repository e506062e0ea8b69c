"""Pong learning evidence: PPO on ALE/Pong-v5, resumable runs whose curves are kept as data.

Three paths, each with ``tune_configs/pong_ppo_amp.yaml``'s PPO settings (CleanRL's
``ppo_atari`` recipe), the Nature CNN ("full") and one local EnvRunner of 16 envs:

- ``stock``: RLlib as it ships: float32, RLlib's Python Atari wrappers, float32 observations;
- ``fp32-native``: ALE's native vector env and uint8 observations, float32 training;
- ``amp-native``: all of rllib-amp: the native env, uint8, AMP at precision auto.

Each run (path, seed) trains in a fresh process, one after another (never side by side: the
wall-clock axis is the point), appends a row to ``OUT/curves.parquet`` after every iteration
(a killed run keeps everything up to its last iteration) and checkpoints every
``--checkpoint-every`` iterations under ``OUT/checkpoints/``::

    python -m rllib_amp.bench.pong_learning --paths amp-native --seeds 0 --steps 3000000 \\
        --out pong_run
    python -m rllib_amp.bench.pong_learning --resume pong_run     # after a kill, same day
    python -m rllib_amp.bench.pong_learning --plot-only docs/pong # figure + table from parquet

``--plot-only DIR`` reads every ``*.parquet`` under DIR (runs of several days add up) and
writes ``learning.png`` and ``table.md`` there.

Example:
    >>> rows = [{"run": "r", "path": "amp-native", "seed": 0, "env_steps": s,
    ...          "seconds": s / 100, "return": r, "episodes": 20}
    ...         for s, r in [(5e5, -21.0), (1e6, -5.0), (1.5e6, 1.0), (2e6, 19.0)]]
    >>> m = run_milestones(rows)
    >>> m["return_at_1M"], m["steps_to_0"], m["steps_to_18"]
    (-5.0, 1500000.0, 2000000.0)
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import os
import shutil
import statistics
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from rllib_amp.cli import Parser, UsageError, main_wrapper

PROG = "python -m rllib_amp.bench.pong_learning"
STOCK = "stock"
FP32_NATIVE = "fp32-native"
AMP = "amp-native"
# Path name -> the Atari-path variant of rllib_amp.bench (workloads.PATH_VARIANTS).
PATHS = {STOCK: "fp32 wrappers", FP32_NATIVE: "fp32 native", AMP: "amp native"}
# tune_configs/pong_ppo_amp.yaml's training section without its lr schedule (a test keeps the
# two equal); the schedule anneals LR_START linearly to 0 over the run's step budget.
TRAINING: dict[str, Any] = {
    "gamma": 0.99,
    "lambda_": 0.95,
    "clip_param": 0.1,
    "vf_clip_param": 10.0,
    "vf_loss_coeff": 0.5,
    "entropy_coeff": 0.01,
    "use_kl_loss": False,
    "kl_coeff": 0.0,
    "train_batch_size_per_learner": 1024,
    "minibatch_size": 256,
    "num_epochs": 4,
    "grad_clip": 0.5,
    "grad_clip_by": "global_norm",
}
LR_START = 2.5e-4
NUM_ENVS = 16
# Episodes in the mean return the milestones and the figure use. RLlib's "return" of an
# iteration is the mean over the episodes that ended in it (none, one or a few for 16 Pong
# envs and 1,024 steps), so the window is computed here from each iteration's mean and count.
RETURN_WINDOW = 20
# One run may take this long (3M steps on 2 CPU cores: a few hours).
RUN_TIMEOUT_S = 24 * 3600.0
RETURN_KEY = "episode_return_mean"
CURVES = "curves.parquet"
RUN_FILE = "run.json"
MILESTONE_STEPS = (1_000_000, 2_000_000, 3_000_000)
MILESTONE_RETURNS = (0.0, 18.0)
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
}


def lr_schedule(steps: int) -> list[list[float]]:
    """RLlib's schedule form: LR_START at step 0, linearly down to 0 at ``steps``.

    Example:
        >>> lr_schedule(1000)
        [[0, 0.00025], [1000, 0.0]]
    """
    return [[0, LR_START], [int(steps), 0.0]]


def _run_name(path: str, seed: int) -> str:
    return f"{path}-seed{seed}"


# -- curves.parquet ---------------------------------------------------------------------------
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
    rows: list[dict[str, Any]] = []
    for f in files:
        rows.extend(pq.read_table(f).to_pylist())
    return rows


def write_rows(rows: Sequence[Mapping[str, Any]], path: str) -> None:
    """Writes ``rows`` to ``path`` atomically (a kill leaves the old file or the new one)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    tmp = f"{path}.tmp-{os.getpid()}"
    table = pa.Table.from_pylist([{k: r.get(k) for k in COLUMNS} for r in rows], _schema())
    pq.write_table(table, tmp)
    os.replace(tmp, path)


# -- one run, in its own process --------------------------------------------------------------
def _checkpoint_dir(out: str, path: str, seed: int) -> str:
    return os.path.join(out, "checkpoints", _run_name(path, seed))


def last_checkpoint(out: str, path: str, seed: int) -> dict[str, Any] | None:
    """The newest complete checkpoint of a run: its folder, iteration, env steps, seconds."""
    marker = os.path.join(_checkpoint_dir(out, path, seed), "latest.json")
    if not os.path.exists(marker):
        return None
    with open(marker, encoding="utf-8") as f:
        return json.load(f)


def _save_checkpoint(algo: Any, out: str, path: str, seed: int, point: dict[str, Any]) -> None:
    """Saves into a new folder, then points ``latest.json`` at it (atomically), then drops the
    older folders: a kill at any moment leaves ``latest.json`` naming a complete checkpoint."""
    root = _checkpoint_dir(out, path, seed)
    folder = os.path.join(root, f"iter_{point['iteration']:06d}")
    algo.save_to_path(folder)
    marker = {**point, "folder": folder}
    tmp = os.path.join(root, f"latest.json.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(marker, f)
    os.replace(tmp, os.path.join(root, "latest.json"))
    for old in glob.glob(os.path.join(root, "iter_*")):
        if old != folder:
            shutil.rmtree(old, ignore_errors=True)


def build_config(path: str, seed: int, steps: int, device: str, batch: int | None) -> Any:
    """The PPO config of one run."""
    from rllib_amp.bench.atari_figures import path_configs

    training = {**TRAINING, "lr": lr_schedule(steps)}
    if batch is not None:
        training["train_batch_size_per_learner"] = batch
        training["minibatch_size"] = min(training["minibatch_size"], batch)
    cfg = path_configs("PPO", [PATHS[path]], device, training=training)[PATHS[path]]
    cfg.env_runners(num_envs_per_env_runner=NUM_ENVS)
    cfg.debugging(seed=seed)
    return cfg


def train_one(
    out: str,
    path: str,
    seed: int,
    steps: int,
    device: str,
    batch: int | None,
    checkpoint_every: int,
    machine: str,
) -> int:
    """Trains one run up to ``steps`` env steps, from its last checkpoint when there is one;
    appends each iteration's point to ``OUT/curves.parquet``. Returns the iterations run."""
    run = _run_name(path, seed)
    algo = build_config(path, seed, steps, device, batch).build_algo()
    ckpt = last_checkpoint(out, path, seed)
    offset_s, iteration = 0.0, 0
    if ckpt is not None:
        algo.restore_from_path(ckpt["folder"])
        offset_s, iteration = ckpt["seconds"], ckpt["iteration"]
    curves = os.path.join(out, CURVES)
    # Points past the checkpoint are trained again: drop them, so the curve has no duplicate.
    rows = [
        r
        for r in read_rows(curves)
        if r["run"] != run or (ckpt is not None and r["iteration"] <= iteration)
    ]
    write_rows(rows, curves)
    start = time.perf_counter()
    ran = 0
    try:
        done = max([0.0] + [r["env_steps"] for r in rows if r["run"] == run])
        while done < steps:
            result = algo.train()
            iteration += 1
            ran += 1
            done = float(result["num_env_steps_sampled_lifetime"])
            ret = float(result["env_runners"].get(RETURN_KEY, math.nan))
            episodes = int(result["env_runners"].get("num_episodes", 0) or 0)
            point = {
                "run": run,
                "path": path,
                "seed": seed,
                "iteration": iteration,
                "env_steps": done,
                "seconds": offset_s + time.perf_counter() - start,
                "return": ret,
                "episodes": episodes,
                "date": datetime.date.today().isoformat(),
                "machine": machine,
            }
            rows.append(point)
            write_rows(rows, curves)
            if iteration % checkpoint_every == 0 or done >= steps:
                _save_checkpoint(algo, out, path, seed, point)
            print(
                f"[pong] {run}: {done:,.0f} steps, {point['seconds']:.0f} s, return {ret:.2f}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        algo.stop()
    return ran


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


def run_milestones(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One run's figures: the mean return of the last RETURN_WINDOW episodes at the first
    iteration at or past 1M, 2M and 3M env steps; env steps and seconds to first reach 0 and
    +18 with that mean; its final value. None where the run never got there (or the window
    never filled)."""
    rows = sorted(rows, key=lambda r: r["env_steps"])
    points = [p for p in smoothed(rows) if p["full"]]
    out: dict[str, Any] = {
        "env_steps": rows[-1]["env_steps"] if rows else 0.0,
        "seconds": rows[-1]["seconds"] if rows else 0.0,
        "final": points[-1]["return"] if points else None,
    }
    for m in MILESTONE_STEPS:
        at = next((p for p in points if p["env_steps"] >= m), None)
        out[f"return_at_{m // 1_000_000}M"] = at["return"] if at else None
    for target in MILESTONE_RETURNS:
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


def compare_at(
    runs: Mapping[tuple[str, str, int], Sequence[Mapping[str, Any]]],
    steps: int,
    path: str = AMP,
    reference: str = FP32_NATIVE,
) -> dict[str, Any] | None:
    """``path`` against ``reference`` at ``steps`` env steps, over the seeds of each that got
    there: no worse when the mean is at least the reference's minus the larger half-range.

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
        for (_, q, _), rows in runs.items():
            at = next((p for p in smoothed(rows) if p["full"] and p["env_steps"] >= steps),
                      None)  # fmt: skip
            if q == p and at is not None:
                vals.append(float(at["return"]))
        return vals

    a, b = values(path), values(reference)
    if len(a) < 2 or len(b) < 2:
        return None
    half = max((max(a) - min(a)) / 2, (max(b) - min(b)) / 2)
    ma, mb = statistics.fmean(a), statistics.fmean(b)
    return {
        "values": a,
        "reference_values": b,
        "mean": ma,
        "reference_mean": mb,
        "no_worse": ma >= mb - half,
    }


def table(rows: Sequence[Mapping[str, Any]]) -> str:
    """The markdown table of every run in ``rows``: one line per run."""

    def num(v: Any, fmt: str = "{:.1f}") -> str:
        return "-" if v is None else fmt.format(v)

    def steps_time(s: Any, t: Any) -> str:
        return "-" if s is None else f"{s / 1e6:.2f}M / {t / 60:.0f} min"

    lines = [
        "| date | path | seed | env steps | hours | return at 1M | 2M | 3M | final "
        "| to 0 (steps / time) | to +18 | machine |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for (date, path, seed), run_rows in group_runs(rows).items():
        m = run_milestones(run_rows)
        lines.append(
            f"| {date} | {path} | {seed} | {m['env_steps'] / 1e6:.2f}M | "
            f"{m['seconds'] / 3600:.2f} | {num(m['return_at_1M'])} | {num(m['return_at_2M'])} | "
            f"{num(m['return_at_3M'])} | {num(m['final'])} | "
            f"{steps_time(m['steps_to_0'], m['seconds_to_0'])} | "
            f"{steps_time(m['steps_to_18'], m['seconds_to_18'])} | {run_rows[0]['machine']} |"
        )
    return "\n".join(lines)


def plot(rows: Sequence[Mapping[str, Any]], png: str) -> bool:
    """learning.png from the rows alone: return against env steps and against hours. False
    (and nothing written) without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    colors = {STOCK: "tab:gray", FP32_NATIVE: "tab:blue", AMP: "tab:red"}
    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for (date, path, seed), run_rows in group_runs(rows).items():
        raw = _finite(run_rows)
        pts = smoothed(run_rows)
        color = colors.get(path, "black")
        label = f"{path}, seed {seed} ({date})"
        axes[0].scatter(
            [r["env_steps"] for r in raw], [r["return"] for r in raw], s=2, color=color, alpha=0.2
        )
        axes[0].plot(
            [p["env_steps"] for p in pts], [p["return"] for p in pts], label=label, color=color
        )
        axes[1].plot([p["seconds"] / 3600 for p in pts], [p["return"] for p in pts], color=color)
    axes[0].set_xlabel("env steps")
    axes[1].set_xlabel("wall-clock hours")
    axes[0].set_ylabel(f"return (dots: per iteration; line: last {RETURN_WINDOW} episodes)")
    for ax in axes:
        ax.axhline(0, color="black", linewidth=0.5)
        ax.set_ylim(-21.5, 21.5)
    axes[0].legend(fontsize=7)
    fig.suptitle("PPO on ALE/Pong-v5 (CleanRL's ppo_atari settings)")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return True


def report_text(rows: Sequence[Mapping[str, Any]]) -> str:
    """table.md's text: the table of every run, and AMP against float32 at 1M env steps when
    both have two seeds or more there."""
    lines = [table(rows)]
    c = compare_at(group_runs(rows), 1_000_000)
    if c is not None:
        lines.append(
            f"\nAt 1M env steps, amp-native {c['mean']:.1f} ({', '.join(f'{v:.1f}' for v in c['values'])}) "  # noqa: E501
            f"vs fp32-native {c['reference_mean']:.1f} "
            f"({', '.join(f'{v:.1f}' for v in c['reference_values'])}): "
            f"{'no worse' if c['no_worse'] else 'WORSE'} beyond the seed spread."
        )
    return "\n".join(lines) + "\n"


def write_report(folder: str) -> list[str]:
    """learning.png and table.md in ``folder``, from every parquet under it."""
    rows = read_rows(folder)
    if not rows:
        raise UsageError(f"--plot-only: no curve rows in any *.parquet under {folder!r}")
    md = os.path.join(folder, "table.md")
    with open(md, "w", encoding="utf-8") as f:
        f.write(report_text(rows))
    written = [md]
    png = os.path.join(folder, "learning.png")
    if plot(rows, png):
        written.append(png)
    return written


# -- the command ------------------------------------------------------------------------------
def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--seeds: got {text!r}; give integers, e.g. --seeds 0,1") from None
    if not seeds:
        raise UsageError("--seeds: got no seed; give e.g. --seeds 0,1")
    return seeds


def _paths(text: str) -> list[str]:
    paths = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in paths if p not in PATHS]
    if bad or not paths:
        raise UsageError(
            f"--paths: got {text!r}; give one or more of {', '.join(PATHS)}, "
            "e.g. --paths amp-native,fp32-native"
        )
    return paths


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--paths", default=AMP, help=f"comma-separated of: {', '.join(PATHS)}")
    p.add_argument("--steps", type=int, default=3_000_000, help="env steps per run")
    p.add_argument("--seeds", default="0", help="comma-separated, e.g. 0,1")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if any")
    p.add_argument("--out", default="pong_learning", help="folder for the runs")
    p.add_argument("--batch", type=int, default=None, help="train batch size (default 1024)")
    p.add_argument(
        "--checkpoint-every", type=int, default=10, help="iterations between checkpoints"
    )
    p.add_argument("--resume", metavar="OUT", help="continue the unfinished runs in OUT")
    p.add_argument("--plot-only", metavar="DIR", help="redraw learning.png and table.md")
    return p


def _new_run(args: argparse.Namespace) -> dict[str, Any]:
    if args.steps < 1:
        raise UsageError(f"--steps: got {args.steps}; must be >= 1")
    if args.batch is not None and args.batch < 2:
        raise UsageError(f"--batch: got {args.batch}; must be >= 2")
    if args.checkpoint_every < 1:
        raise UsageError(f"--checkpoint-every: got {args.checkpoint_every}; must be >= 1")
    spec = {
        "paths": _paths(args.paths),
        "seeds": _seeds(args.seeds),
        "steps": args.steps,
        "batch": args.batch,
        "device": args.device,
        "checkpoint_every": args.checkpoint_every,
        "command": " ".join([PROG, *sys.argv[1:]]) if sys.argv[1:] else PROG,
    }
    if os.path.exists(os.path.join(args.out, RUN_FILE)):
        raise UsageError(
            f"--out: {args.out!r} already holds a run; continue it with --resume {args.out} "
            "or pick another --out"
        )
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, RUN_FILE), "w", encoding="utf-8") as f:
        json.dump(spec, f, indent=1)
    return spec


def _resumed_run(out: str) -> dict[str, Any]:
    try:
        with open(os.path.join(out, RUN_FILE), encoding="utf-8") as f:
            return json.load(f)
    except OSError:
        raise UsageError(
            f"--resume: {out!r} holds no {RUN_FILE}; give the --out folder of an earlier run"
        ) from None


def run(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.plot_only:
        for f in write_report(args.plot_only):
            print(f"wrote {f}")
        return 0
    out = args.resume or args.out
    spec = _resumed_run(out) if args.resume else _new_run(args)
    import torch

    from rllib_amp.bench.harness import in_child
    from rllib_amp.bench.report import machine_description

    device = spec["device"] or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible; use --device cpu")
    machine = machine_description(device)
    print(f"rllib-amp Pong learning, {machine}", flush=True)
    for seed in spec["seeds"]:
        for path in spec["paths"]:
            rows = [r for r in read_rows(os.path.join(out, CURVES))
                    if r["run"] == _run_name(path, seed)]  # fmt: skip
            if rows and max(r["env_steps"] for r in rows) >= spec["steps"]:
                continue
            in_child(
                train_one, out, path, seed, spec["steps"], device, spec["batch"],
                spec["checkpoint_every"], machine, timeout_s=RUN_TIMEOUT_S,
            )  # fmt: skip
    rows = read_rows(os.path.join(out, CURVES))
    print(table(rows))
    for f in write_report(out):
        print(f"wrote {f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return main_wrapper(PROG, run, argv)


if __name__ == "__main__":
    sys.exit(main())
