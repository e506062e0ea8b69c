"""``python -m rllib_amp.bench``: what AMP buys over stock RLlib, side by side in one run.

Variants (all in the same invocation, interleaved, several repetitions, medians):
  fp32          stock RLlib, float32
  rllib-scaler  stock RLlib with its built-in config.experimental(_torch_grad_scaler_class=...)
  amp-auto      rllib-amp, precision auto
  amp-fp16      rllib-amp, float16 + GradScaler (GPU only)
  amp-bf16      rllib-amp, bfloat16 (GPU only)

Figures:
  1. learner update throughput (samples/s) on one fixed batch per algorithm: PPO (batch 1024
     on CPU, 4096 on GPU, minibatch 256, 2 epochs, including the learner connector's GAE
     pass) and DQN (batch 256),
     ALE/Pong-v5 observations, presets mini / full / high;
  2. peak memory of the update (CUDA: max_memory_allocated; CPU: peak resident memory of a
     child process per variant, above its resident memory before the update, with glibc's
     allocator defaults);
  3. end-to-end env steps/s of PPO on ALE/Pong-v5 over a few training iterations, 16 envs
     per EnvRunner (one batched forward pass per step for all of them);

Each throughput cell and the end-to-end figure run in a fresh process, and within it every
variant runs interleaved, so the variants share one process: rllib-amp's CPU allocator
setting (rllib_amp.malloc) applies to the stock variants as well. The speed figures run
unseeded: a seed makes RLlib switch on torch's deterministic mode on a CPU, which is not how
one trains for speed.
  4. (not with --quick) learning parity: CartPole-v1 PPO and DQN, 3 seeds, return after a
     fixed number of env steps.

Example:
    python -m rllib_amp.bench --quick --json bench.json
"""

from __future__ import annotations

import argparse
import copy
import datetime as _dt
import functools
import json
import math
import multiprocessing as mp
import os
import pickle
import platform
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from typing import Any

from rllib_amp.cli import Parser, UsageError, main_wrapper

VARIANTS_CPU = ("fp32", "rllib-scaler", "amp-auto")
VARIANTS_GPU = ("fp32", "rllib-scaler", "amp-auto", "amp-fp16", "amp-bf16")
# rllib-amp variant -> AmpSettings.dtype
AMP_DTYPES = {"amp-auto": "auto", "amp-fp16": "float16", "amp-bf16": "bfloat16"}
ALGOS = ("PPO", "DQN")
MODELS = ("mini", "full", "high")
PPO_MINIBATCH, PPO_EPOCHS = 256, 2
# PPO train batch: 1024 on CPU; 4096 on a GPU (the size the GPU memory target is set at).
PPO_BATCH = {"cpu": 1024, "cuda": 4096}
DQN_BATCH = 256
# Untimed rounds of every variant before the timed ones: the first builds lazy state and
# picks kernels. With one round, the first two of seven timed AMP repetitions of PPO full
# came out about 30% slower than the other five (2026-11-30); steady state is what a long
# training run sees.
WARMUP_ROUNDS = 2
# End to end: the local EnvRunner steps this many Pong envs, so each action computation is
# one forward pass over all of them (RLlib's way of batching inference).
E2E_ENVS_PER_RUNNER = 16
ENV_ID = "ALE/Pong-v5"


def _csv(allowed: Sequence[str], flag: str) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"empty list; allowed: {','.join(allowed)}")
        for item in items:
            if item not in allowed:
                raise argparse.ArgumentTypeError(f"{item!r} is not one of {','.join(allowed)}")
        return items

    parse.__name__ = flag
    return parse


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog="python -m rllib_amp.bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="full preset only, fewer reps, no parity")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if any")
    p.add_argument("--algos", type=_csv(ALGOS, "algos"), default=None, help="e.g. PPO,DQN")
    p.add_argument("--models", type=_csv(MODELS, "models"), default=None, help="mini,full,high")
    p.add_argument("--reps", type=int, default=None, help="timed repetitions per variant")
    p.add_argument("--json", default=None, help="also write the results as JSON here")
    p.add_argument("--out", default=None, help="folder for results.parquet and ratios.png")
    return p


# -- configs ----------------------------------------------------------------------------------
def algo_config(
    algo: str,
    model: str,
    variant: str,
    device: str,
    *,
    seed: int | None = None,
    tune_malloc: bool = True,
) -> Any:
    """The RLlib config of one benchmark cell.

    No seed by default: RLlib's ``debugging(seed=...)`` turns on
    ``torch.use_deterministic_algorithms`` on a CPU, process-wide, which also fills every new
    tensor (about 12% of a bf16 PPO update); the speed figures measure normal training.
    ``tune_malloc=False`` keeps glibc's allocator defaults in the AMP variants (the memory
    figure: a heap that keeps freed blocks would hide the update's peak).
    """
    import torch

    from rllib_amp import envs, models, with_amp
    from rllib_amp.algorithms import algorithm

    cfg = algorithm(algo).config_class()
    envs.configure_env(cfg, ENV_ID, {})
    cfg.env_runners(num_env_runners=0)
    cfg.rl_module(model_config=models.model_config(model, image=True))
    cfg.learners(num_gpus_per_learner=1 if device == "cuda" else 0)
    if algo == "PPO":
        cfg.training(
            train_batch_size_per_learner=PPO_BATCH[device],
            minibatch_size=PPO_MINIBATCH,
            num_epochs=PPO_EPOCHS,
            lr=1e-4,
        )
    else:
        cfg.training(train_batch_size_per_learner=DQN_BATCH, lr=1e-4)
    if seed is not None:
        cfg.debugging(seed=seed)
    if variant == "rllib-scaler":
        # RLlib calls the class with no arguments: a partial is how a device gets in.
        scaler_cls: Any = functools.partial(torch.amp.GradScaler, device)
        cfg.experimental(_torch_grad_scaler_class=scaler_cls)
    elif variant in AMP_DTYPES:
        with_amp(cfg, dtype=AMP_DTYPES[variant], tune_cpu_malloc=tune_malloc)
    return cfg


def collect_data(algo: str, device: str, path: str) -> None:
    """Samples one fixed training batch (as episodes) from Pong and pickles it to ``path``."""
    import torch
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    cfg = algo_config(algo, "mini", "fp32", device, seed=0)
    deterministic = torch.are_deterministic_algorithms_enabled()
    runner = SingleAgentEnvRunner(config=cfg)
    # The seeded runner switched torch's deterministic mode on for the whole process.
    torch.use_deterministic_algorithms(deterministic)
    assert runner.env is not None
    spaces = {
        "default_policy": (runner.env.single_observation_space, runner.env.single_action_space)
    }
    if algo == "PPO":
        episodes = runner.sample(num_timesteps=PPO_BATCH[device], random_actions=False)
    else:
        from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer

        buffer = EpisodeReplayBuffer(capacity=10 * DQN_BATCH)
        buffer.add(runner.sample(num_timesteps=2 * DQN_BATCH, random_actions=True))
        episodes = buffer.sample(  # type: ignore[assignment]
            num_items=DQN_BATCH, n_step=1, gamma=0.99, sample_episodes=True
        )
    runner.stop()
    with open(path, "wb") as f:
        pickle.dump({"episodes": episodes, "spaces": spaces}, f)


def _update_fn(algo: str, learner: Any, episodes: Any) -> Callable[[], float]:
    """One timed learner update on a fresh copy of the batch (the copy is not timed)."""
    kwargs: dict[str, Any] = {"timesteps": {"num_env_steps_sampled_lifetime": 10_000}}
    if algo == "PPO":
        kwargs.update(
            minibatch_size=PPO_MINIBATCH, num_epochs=PPO_EPOCHS, shuffle_batch_per_epoch=True
        )

    def run() -> float:
        eps = copy.deepcopy(episodes)
        _sync(learner)
        t = time.perf_counter()
        learner.update(episodes=eps, **kwargs)
        _sync(learner)
        return time.perf_counter() - t

    return run


def _sync(learner: Any) -> None:
    import torch

    if torch.cuda.is_available() and str(getattr(learner, "_device", "cpu")).startswith("cuda"):
        torch.cuda.synchronize()


def _build_learner(
    algo: str, model: str, variant: str, device: str, spaces: Any, *, tune_malloc: bool = True
) -> Any:
    import torch

    torch.manual_seed(0)
    cfg = algo_config(algo, model, variant, device, tune_malloc=tune_malloc)
    return cfg.build_learner(spaces=spaces)


def samples_in(episodes: Any) -> int:
    return sum(len(e) for e in episodes)


# -- fresh processes ---------------------------------------------------------------------
CHILD_TIMEOUT_S = 1800


def _child_entry(fn: Callable[..., Any], args: tuple, queue: Any) -> None:
    try:
        import torch

        torch.set_num_threads(max(1, os.cpu_count() or 1))
        queue.put(("ok", fn(*args)))
    except BaseException as e:  # reported, not swallowed: the parent raises it
        queue.put(("error", f"{type(e).__name__}: {e}"))


def in_child(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` in a fresh (spawned) process: no heap, caches or Ray state from the
    figures before it. In one long process the end-to-end AMP figure came out at 1.19x,
    in a fresh one 1.42x (2026-11-30)."""
    import queue as queue_mod

    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_child_entry, args=(fn, args, queue))
    proc.start()
    deadline = time.monotonic() + CHILD_TIMEOUT_S
    try:
        while True:
            try:
                status, value = queue.get(timeout=5)
                break
            except queue_mod.Empty:
                if not proc.is_alive():
                    raise RuntimeError(
                        f"{fn.__name__}{args}: the child process died (exit code "
                        f"{proc.exitcode}) without a result"
                    ) from None
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{fn.__name__}{args}: no result in {CHILD_TIMEOUT_S} s"
                    ) from None
    finally:
        proc.join(60)
        if proc.is_alive():
            proc.kill()
    if status != "ok":
        raise RuntimeError(f"{fn.__name__}{args}: {value}")
    return value


# -- figure 1: throughput ---------------------------------------------------------------------
def bench_throughput(
    algo: str, model: str, variants: Sequence[str], device: str, data: dict, reps: int
) -> dict[str, list[float]]:
    """Samples/s per variant: interleaved repetitions in one process, after warm-up rounds."""
    learners = {v: _build_learner(algo, model, v, device, data["spaces"]) for v in variants}
    runs = {v: _update_fn(algo, lrn, data["episodes"]) for v, lrn in learners.items()}
    n = samples_in(data["episodes"]) * (PPO_EPOCHS if algo == "PPO" else 1)
    for _ in range(WARMUP_ROUNDS):
        for run in runs.values():
            run()  # warm-up: lazy state, allocator, oneDNN / cuDNN kernel choice
    times: dict[str, list[float]] = {v: [] for v in variants}
    for rep in range(reps):
        order = list(variants) if rep % 2 == 0 else list(reversed(variants))
        for v in order:
            times[v].append(runs[v]())
    return {v: [n / t for t in ts] for v, ts in times.items()}


def throughput_cell(
    algo: str, model: str, variants: Sequence[str], device: str, data_path: str, reps: int
) -> dict[str, list[float]]:
    """``bench_throughput`` on the batch pickled at ``data_path`` (for ``in_child``)."""
    with open(data_path, "rb") as f:
        data = pickle.load(f)
    return bench_throughput(algo, model, variants, device, data, reps)


# -- figure 2: memory -------------------------------------------------------------------------
def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> bool:
    """Resets this process's peak resident memory (VmHWM) to its current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _memory_one(algo: str, model: str, variant: str, device: str, data_path: str) -> float:
    """Peak bytes of one update of one variant (run in its own fresh process)."""
    import torch

    with open(data_path, "rb") as f:
        data = pickle.load(f)
    # Every variant under glibc's allocator defaults: a heap that keeps freed blocks
    # (rllib_amp.malloc) would make the update's peak look smaller than it is.
    learner = _build_learner(algo, model, variant, device, data["spaces"], tune_malloc=False)
    run = _update_fn(algo, learner, data["episodes"])
    if device == "cuda":
        run()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run()
        return float(torch.cuda.max_memory_allocated() - base)
    run()  # warm-up, so lazily built state is in the baseline
    before = _rss_bytes()
    if not _reset_peak_rss():
        raise RuntimeError("cannot reset peak RSS (/proc/self/clear_refs)")
    run()
    return float(max(0, _peak_rss_bytes() - before))


def bench_memory(
    algo: str, model: str, variants: Sequence[str], device: str, data_path: str
) -> dict[str, float]:
    """Peak bytes of one update per variant, each measured in a fresh child process."""
    return {v: in_child(_memory_one, algo, model, v, device, data_path) for v in variants}


# -- figure 3: end to end ---------------------------------------------------------------------
def bench_end_to_end(
    variants: Sequence[str], device: str, iterations: int, model: str = "full"
) -> dict[str, list[float]]:
    """Env steps/s of whole PPO training iterations on Pong, interleaved across variants."""
    algos = {}
    for v in variants:
        cfg = algo_config("PPO", model, v, device)
        cfg.env_runners(num_envs_per_env_runner=E2E_ENVS_PER_RUNNER)
        algos[v] = cfg.build_algo()
    rates: dict[str, list[float]] = {v: [] for v in variants}
    try:
        for it in range(WARMUP_ROUNDS + iterations):
            order = list(variants) if it % 2 == 0 else list(reversed(variants))
            for v in order:
                t = time.perf_counter()
                result = algos[v].train()
                dt = time.perf_counter() - t
                steps = result["env_runners"]["num_env_steps_sampled"]
                if it >= WARMUP_ROUNDS:  # the first iterations build and warm everything
                    rates[v].append(steps / dt)
    finally:
        for a in algos.values():
            a.stop()
    return rates


# -- figure 4: learning parity ----------------------------------------------------------------
def bench_parity(
    variants: Sequence[str], seeds: Sequence[int], budgets: dict[str, int]
) -> dict[str, dict[str, list[float]]]:
    """CartPole return after a fixed env-step budget, per algorithm, variant and seed."""
    import numpy as np
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.algorithms.ppo import PPOConfig

    from rllib_amp import with_amp

    out: dict[str, dict[str, list[float]]] = {}
    for algo, budget in budgets.items():
        out[algo] = {}
        for v in variants:
            returns = []
            for seed in seeds:
                cfg: Any
                if algo == "PPO":
                    cfg = PPOConfig().training(
                        lr=3e-4, train_batch_size_per_learner=1000, minibatch_size=250
                    )
                else:
                    cfg = DQNConfig().training(
                        lr=5e-4,
                        train_batch_size_per_learner=32,
                        num_steps_sampled_before_learning_starts=1000,
                        target_network_update_freq=500,
                        n_step=3,
                    )
                cfg.environment("CartPole-v1").env_runners(num_env_runners=0)
                cfg.rl_module(model_config={"fcnet_hiddens": [64, 64]}).debugging(seed=seed)
                if v != "fp32":
                    with_amp(cfg)
                a = cfg.build_algo()
                buffer = getattr(a, "local_replay_buffer", None)
                if buffer is not None:
                    # RLlib seeds DQN's replay sampling with None even under
                    # debugging(seed=...): pin it, so a seed means one result.
                    buffer.rng = np.random.default_rng(seed)
                try:
                    result: dict[str, Any] = {}
                    while result.get("num_env_steps_sampled_lifetime", 0) < budget:
                        result = a.train()
                    returns.append(float(result["env_runners"]["episode_return_mean"]))
                finally:
                    a.stop()
            out[algo][v] = returns
    return out


# -- report -----------------------------------------------------------------------------------
def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


def machine_description(device: str) -> str:
    import torch

    from rllib_amp.precision import cpu_has_native_bf16

    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        return f"{name}, torch {torch.__version__}"
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    bf16 = "AVX512-BF16/AMX" if cpu_has_native_bf16() else "no native bf16"
    return f"{cpu}, {os.cpu_count()} cores ({bf16}), torch {torch.__version__}"


def rows_from(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Flat rows: one per (figure, workload, variant), with the ratio to fp32."""
    rows: list[dict[str, Any]] = []

    def add(figure: str, workload: str, unit: str, per_variant: dict[str, float], higher: bool):
        ref = per_variant.get("fp32")
        for v, value in per_variant.items():
            ratio = value / ref if ref else math.nan
            rows.append(
                {
                    "figure": figure,
                    "workload": workload,
                    "variant": v,
                    "value": value,
                    "unit": unit,
                    "ratio_to_fp32": ratio,
                    "better_is": "higher" if higher else "lower",
                }
            )

    for key, per in results.get("throughput", {}).items():
        add("learner update", key, "samples/s", {v: _median(x) for v, x in per.items()}, True)
    for key, per in results.get("memory", {}).items():
        add("peak memory of update", key, "MiB", {v: x / 2**20 for v, x in per.items()}, False)
    if results.get("end_to_end"):
        add(
            "end to end",
            "PPO ALE/Pong-v5 full",
            "env steps/s",
            {v: _median(x) for v, x in results["end_to_end"].items()},
            True,
        )
    for algo, per in results.get("parity", {}).items():
        add(
            "learning parity",
            f"{algo} CartPole-v1 return (mean of {len(next(iter(per.values())))} seeds)",
            "return",
            {v: statistics.fmean(x) for v, x in per.items()},
            True,
        )
    return rows


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    lines = [
        header,
        "",
        "| figure | workload | variant | value | x fp32 |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        value = r["value"]
        shown = f"{value:,.1f} {r['unit']}" if math.isfinite(value) else "-"
        ratio = f"{r['ratio_to_fp32']:.2f}x" if math.isfinite(r["ratio_to_fp32"]) else "-"
        lines.append(f"| {r['figure']} | {r['workload']} | {r['variant']} | {shown} | {ratio} |")
    return "\n".join(lines)


def write_outputs(rows: list[dict[str, Any]], results: dict, args: argparse.Namespace) -> None:
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"rows": rows, "raw": results}, f, indent=1, default=float)
    if args.out:
        import pyarrow as pa
        import pyarrow.parquet as pq

        os.makedirs(args.out, exist_ok=True)
        pq.write_table(pa.Table.from_pylist(rows), os.path.join(args.out, "results.parquet"))
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError:
            return
        shown = [r for r in rows if r["variant"] != "fp32" and math.isfinite(r["ratio_to_fp32"])]
        fig, ax = plt.subplots(figsize=(10, 0.35 * len(shown) + 1.5))
        labels = [f"{r['figure']}: {r['workload']} [{r['variant']}]" for r in shown]
        ax.barh(labels, [r["ratio_to_fp32"] for r in shown])
        ax.axvline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("ratio to stock RLlib float32")
        fig.tight_layout()
        fig.savefig(os.path.join(args.out, "ratios.png"), dpi=120)


def run(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.reps is not None and args.reps < 1:
        raise UsageError(f"--reps: got {args.reps}; must be >= 1")
    import torch

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible; use --device cpu")
    for path in (args.json, args.out):
        parent = os.path.dirname(os.path.abspath(path)) if path else None
        if parent and not os.path.isdir(parent):
            raise UsageError(f"{path}: folder {parent} does not exist; create it first")
    algos = args.algos or list(ALGOS)
    models = args.models or (["full"] if args.quick else list(MODELS))
    reps = args.reps or (3 if args.quick else 7)
    variants = VARIANTS_GPU if device == "cuda" else VARIANTS_CPU
    started = time.time()
    results: dict[str, Any] = {"throughput": {}, "memory": {}}
    with tempfile.TemporaryDirectory() as tmp:
        for algo in algos:
            data_path = os.path.join(tmp, f"{algo}.pkl")
            collect_data(algo, device, data_path)
            for model in models:
                key = f"{algo} {model}"
                print(f"[bench] {key}: learner update x{reps} per variant", file=sys.stderr)
                results["throughput"][key] = in_child(
                    throughput_cell, algo, model, variants, device, data_path, reps
                )
                if not args.quick or algo == "PPO":
                    print(f"[bench] {key}: peak memory", file=sys.stderr)
                    results["memory"][key] = bench_memory(algo, model, variants, device, data_path)
    print("[bench] PPO Pong end to end", file=sys.stderr)
    results["end_to_end"] = in_child(bench_end_to_end, variants, device, 4 if args.quick else 8)
    if not args.quick:
        print("[bench] CartPole learning parity (3 seeds)", file=sys.stderr)
        results["parity"] = bench_parity(
            ("fp32", "amp-auto"), (0, 1, 2), {"PPO": 40_000, "DQN": 10_000}
        )
    rows = rows_from(results)
    date = _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d")
    header = (
        f"rllib-amp benchmark, {date}, {machine_description(device)}; medians of {reps} "
        f"interleaved repetitions; {time.time() - started:.0f} s"
    )
    print(markdown(rows, header))
    write_outputs(rows, results, args)
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return main_wrapper("python -m rllib_amp.bench", run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
