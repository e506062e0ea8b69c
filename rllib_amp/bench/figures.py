"""The four figures: learner throughput, peak memory, end-to-end speed, learning parity.

Each returns raw measurements per variant (``bench_parity``: {algorithm: {variant: returns}});
``report`` turns them into rows.
"""

from __future__ import annotations

import pickle
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from rllib_amp.bench.harness import in_child, peak_rss_bytes, reset_peak_rss, rss_bytes
from rllib_amp.bench.workloads import (
    PARITY,
    PARITY_ENV_ID,
    PARITY_MODEL,
    WORKLOADS,
    Batch,
    algo_config,
    build_learner,
    update_fn,
)

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

_T = TypeVar("_T")
# Untimed rounds of every variant before the timed ones: the first builds lazy state and
# picks kernels. With one round, the first timed AMP repetitions of PPO full come out
# markedly slower than the rest; steady state is what a long training run sees.
WARMUP_ROUNDS = 2
# End to end: the local EnvRunner steps this many Pong envs, so each action computation is
# one forward pass over all of them (RLlib's way of batching inference).
E2E_ENVS_PER_RUNNER = 16


def interleaved_reps(
    names: Sequence[str], reps: int, measure: Callable[[str], _T]
) -> dict[str, list[_T]]:
    """``measure(name)`` ``reps`` times per name, the order reversed every other round, so no
    name always runs right after the same other one."""
    out: dict[str, list[_T]] = {n: [] for n in names}
    for rep in range(reps):
        for n in names if rep % 2 == 0 else names[::-1]:
            out[n].append(measure(n))
    return out


# -- figure 1: throughput ---------------------------------------------------------------------
def throughput_cell(
    algo: str, model: str, variants: Sequence[str], device: str, data_path: str, reps: int
) -> dict[str, list[float]]:
    """Samples/s per variant on the batch pickled at ``data_path``: interleaved repetitions in
    one process (``in_child``'s), after warm-up rounds."""
    with open(data_path, "rb") as f:
        data: Batch = pickle.load(f)
    work = WORKLOADS[algo]
    learners = {v: build_learner(algo, model, v, device, data["spaces"]) for v in variants}
    runs = {
        v: update_fn(lrn, data["episodes"], work.minibatch, work.epochs)
        for v, lrn in learners.items()
    }
    n = sum(len(e) for e in data["episodes"]) * work.epochs  # samples one update trains on
    for _ in range(WARMUP_ROUNDS):
        for run in runs.values():
            run()  # warm-up: lazy state, allocator, oneDNN / cuDNN kernel choice
    times = interleaved_reps(variants, reps, lambda v: runs[v]())
    return {v: [n / t for t in ts] for v, ts in times.items()}


# -- figure 2: memory -------------------------------------------------------------------------
def memory_one(
    algo: str,
    model: str,
    variant: str,
    device: str,
    data_path: str,
    preprocessing: str | None = None,
) -> float:
    """Peak bytes of one update of one variant (run in its own fresh process) on the batch
    at ``data_path``, sampled on the Atari path ``preprocessing``. CUDA: max_memory_allocated;
    CPU: the peak resident memory above the resident memory before the update."""
    import torch

    with open(data_path, "rb") as f:
        data: Batch = pickle.load(f)
    # Every variant under glibc's allocator defaults: a heap that keeps freed blocks
    # (rllib_amp.learner.malloc) would make the update's peak look smaller than it is.
    learner = build_learner(
        algo, model, variant, device, data["spaces"], tune_malloc=False, preprocessing=preprocessing
    )
    work = WORKLOADS[algo]
    run = update_fn(learner, data["episodes"], work.minibatch, work.epochs)
    run()  # warm-up, so lazily built state is in the baseline
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
        run()
        return float(torch.cuda.max_memory_allocated() - base)
    before = rss_bytes()
    reset_peak_rss()
    run()
    return float(max(0, peak_rss_bytes() - before))


def bench_memory(
    algo: str, model: str, variants: Sequence[str], device: str, data_path: str
) -> dict[str, float]:
    """Peak bytes of one update per variant, each measured in a fresh child process."""
    return {v: in_child(memory_one, algo, model, v, device, data_path) for v in variants}


# -- figure 3: end to end ---------------------------------------------------------------------
def bench_end_to_end(
    variants: Sequence[str], device: str, iterations: int, model: str = "full"
) -> dict[str, list[float]]:
    """Env steps/s of whole PPO training iterations on Pong, interleaved across variants."""
    configs = {v: algo_config("PPO", model, v, device) for v in variants}
    for cfg in configs.values():
        cfg.env_runners(num_envs_per_env_runner=E2E_ENVS_PER_RUNNER)
    return train_interleaved(configs, iterations)[0]


def train_interleaved(
    configs: Mapping[str, AlgorithmConfig], iterations: int, warmup: int = WARMUP_ROUNDS
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Env steps/s of each config's training iterations after ``warmup`` untimed ones, the
    configs' algorithms built side by side in this process and trained in turns; and, of the
    same iterations, the seconds spent in ``learner_group.update`` per env step sampled."""
    from rllib_amp.learner.env_runner import forget_rllib_env_ids

    algos: dict[str, Algorithm] = {}
    spent: dict[str, list[float]] = {}

    def timed_updates(name: str) -> None:
        group: Any = algos[name].learner_group  # every algorithm here has one
        update, spent[name] = group.update, [0.0]

        def timed(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return update(*args, **kwargs)
            finally:
                spent[name][0] += time.perf_counter() - t

        group.update = timed  # instance attribute shadows the method

    def rate(name: str) -> tuple[float, float]:
        spent[name][0] = 0.0
        t = time.perf_counter()
        result = algos[name].train()
        steps = float(result["env_runners"]["num_env_steps_sampled"])
        return steps / (time.perf_counter() - t), spent[name][0] / steps

    try:
        for name, cfg in configs.items():
            forget_rllib_env_ids()  # the stock variants' runners re-register RLlib's env id
            algos[name] = cfg.build_algo()
            timed_updates(name)
        reps = interleaved_reps(list(configs), warmup + iterations, rate)
    finally:
        for a in algos.values():
            a.stop()
    # The first iterations build and warm everything.
    return (
        {name: [r for r, _ in x[warmup:]] for name, x in reps.items()},
        {name: [s for _, s in x[warmup:]] for name, x in reps.items()},
    )


# -- figure 4: learning parity ----------------------------------------------------------------
def bench_parity(
    variants: Sequence[str], seeds: Sequence[int]
) -> dict[str, dict[str, list[float]]]:
    """CartPole return after each ``PARITY`` run's budget, per algorithm, variant and seed."""
    import numpy as np

    def final_return(algo: str, variant: str, seed: int) -> float:
        training = PARITY[algo].training
        cfg = algo_config(
            algo, PARITY_MODEL, variant, "cpu", env=PARITY_ENV_ID, training=training, seed=seed
        )
        a = cfg.build_algo()
        buffer = getattr(a, "local_replay_buffer", None)
        if buffer is not None:
            # RLlib seeds DQN's replay sampling with None even under debugging(seed=...): pin
            # it, so a seed means one result.
            buffer.rng = np.random.default_rng(seed)
        try:
            result: dict[str, Any] = {}
            while result.get("num_env_steps_sampled_lifetime", 0) < PARITY[algo].env_steps:
                result = a.train()
            return float(result["env_runners"]["episode_return_mean"])
        finally:
            a.stop()

    return {
        algo: {v: [final_return(algo, v, s) for s in seeds] for v in variants} for algo in PARITY
    }
