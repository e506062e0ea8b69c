"""Sampling throughput of one EnvRunner (env steps/s, inference included) on an Atari path.

The benchmark's sampling row: RLlib's wrappers vs ALE's native vector env, same module, same
number of envs; on the native path, RLlib's per-env loop vs the batched sampler
(``env_config.sampler``, ``rllib_amp.envs.batched_runner``). ``python -m
rllib_amp.bench.sampling`` repeats each of the latter in a fresh process, interleaved, and
prints median and spread.

Example:
    >>> cfg = sampling_config("wrappers", num_envs=2)
    >>> cfg.num_envs_per_env_runner, cfg.gym_env_vectorize_mode
    (2, 'sync')
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rllib_amp.algorithms import algorithm as algorithm_record
from rllib_amp.cli import Parser, main_wrapper
from rllib_amp.envs import configure as envs
from rllib_amp.envs import models
from rllib_amp.envs.atari import (
    BATCHED,
    NATIVE,
    PREPROCESSING_KEY,
    RLLIB,
    SAMPLER_KEY,
    SAMPLERS,
    ale_game,
    native_kwargs,
)

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

PROG = "python -m rllib_amp.bench.sampling"


def sampling_config(
    preprocessing: str = NATIVE,
    *,
    env_id: str = "ALE/Pong-v5",
    num_envs: int = 16,
    model: str = "mini",
    algorithm: str = "PPO",
    num_cpus: int = 2,
    env_config: Mapping[str, object] | None = None,
    sampler: str | None = None,
) -> AlgorithmConfig:
    """A config for one local EnvRunner with ``num_cpus`` CPUs sampling ``env_id``.

    ``preprocessing``: the Atari path (``native`` or ``wrappers``). The native env gets one
    ALE thread per CPU, as in a Ray EnvRunner. ``sampler`` (native only): ``batched`` (the
    default) or ``rllib``. Add ``with_amp`` for autocast inference.
    """
    cfg = algorithm_record(algorithm).config_class()
    env_config = {**(env_config or {}), PREPROCESSING_KEY: preprocessing}
    if sampler is not None:
        env_config[SAMPLER_KEY] = sampler
    if preprocessing == NATIVE:
        # A local runner has no Ray CPU assignment to follow: give it the same count.
        env_config.setdefault("num_threads", max(1, min(num_cpus, num_envs)))
    envs.configure_env(cfg, env_id, env_config)
    cfg.env_runners(
        num_env_runners=0, num_envs_per_env_runner=num_envs, num_cpus_per_env_runner=num_cpus
    )
    cfg.rl_module(model_config=models.model_config(model, image=True))
    return cfg


# -- batched vs RLlib's loop ------------------------------------------------------------------
def sampling_one(
    preprocessing: str,
    num_envs: int,
    env_steps: int,
    model: str,
    sampler: str | None = None,
    num_cpus: int = 2,
    torch_threads: int | None = None,
    inference_dtype: str | None = None,
) -> tuple[float, float]:
    """(env steps/s, env steps per CPU-second of the whole process: steadier on shared cores)
    of one timed ``EnvRunner.sample()`` after a warm-up call, on the Atari path
    ``preprocessing`` (``sampler``: native only), actions from the RLModule. A job for
    ``in_child``. Torch runs ``num_cpus`` threads (unless ``torch_threads``), as Ray sets for an
    EnvRunner actor: more threads than cores stall every small op on a busy machine.
    ``inference_dtype``: the runner's autocast inference as ``with_amp`` sets it ("auto"
    times the module on this CPU); None: float32, as stock RLlib."""
    import torch

    from rllib_amp import with_amp
    from rllib_amp.bench.workloads import stock_env_runner

    cfg = sampling_config(
        preprocessing, num_envs=num_envs, model=model, num_cpus=num_cpus, sampler=sampler
    )
    if inference_dtype is not None:
        cfg = with_amp(cfg, inference_dtype=inference_dtype)
    threads_before = torch.get_num_threads()
    torch.set_num_threads(torch_threads or max(1, num_cpus))
    try:
        with stock_env_runner(cfg, cfg.env_runner_cls) as runner:
            runner.sample(num_timesteps=min(512, env_steps), random_actions=False)
            start, cpu_start = time.perf_counter(), time.process_time()
            episodes = runner.sample(num_timesteps=env_steps, random_actions=False)
            seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
            steps = sum(len(e) for e in episodes)
    finally:
        torch.set_num_threads(threads_before)
    return steps / seconds, steps / cpu_seconds if cpu_seconds else math.nan


def sampling_amp_inference(num_envs: int, env_steps: int, model: str) -> tuple[float, float]:
    """``sampling_one`` on the native path with ``with_amp``'s "auto" inference dtype: the
    sampling AMP users get. A named job for ``in_child``, which names it in its errors."""
    return sampling_one(NATIVE, num_envs, env_steps, model, inference_dtype="auto")


def raw_ale_one(
    num_envs: int, env_steps: int, env_id: str = "ALE/Pong-v5", num_cpus: int = 2
) -> tuple[float, float]:
    """(env steps/s, env steps per CPU-second) of ALE's native vector env alone: the native
    path's preprocessing (``native_kwargs``), ``num_cpus`` ALE threads, random actions, no
    network and no RLlib. The limit the EnvRunner rows are fractions of."""
    import numpy as np
    from ale_py.vector_env import AtariVectorEnv

    kwargs = native_kwargs({"num_threads": max(1, min(num_cpus, num_envs))}, num_envs)
    env = AtariVectorEnv(ale_game(env_id), num_envs, **kwargs)
    n_actions = int(env.single_action_space.n)  # type: ignore[attr-defined]
    actions = np.random.default_rng(0).integers(0, n_actions, (64, num_envs))
    rounds = max(1, env_steps // num_envs)
    try:
        env.reset(seed=0)
        for r in range(min(512, env_steps) // num_envs):  # the same warm-up as the EnvRunners'
            env.step(actions[r % 64])
        start, cpu_start = time.perf_counter(), time.process_time()
        for r in range(rounds):
            env.step(actions[r % 64])
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    finally:
        env.close()
    return rounds * num_envs / seconds, rounds * num_envs / cpu_seconds


def _run(argv: Sequence[str] | None) -> int:
    from rllib_amp.bench.figures import interleaved_reps
    from rllib_amp.bench.harness import in_child

    parser = Parser(
        prog=PROG,
        description="Env steps/s of one native EnvRunner: RLlib's loop vs the batched sampler.",
    )
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4096)
    parser.add_argument("--model", default="full")
    parser.add_argument("--cpus", type=int, default=2)
    parser.add_argument("--torch-threads", type=int)
    parser.add_argument("--samplers", default=",".join((RLLIB, BATCHED)))
    parser.add_argument(
        "--omp-wait-policy",
        choices=("passive", "active"),
        help="OMP_WAIT_POLICY of the measuring processes (default: as inherited). passive: "
        "idle torch threads sleep instead of spinning (see docs/performance.md)",
    )
    args = parser.parse_args(argv)
    if args.omp_wait_policy:  # read by OpenMP when a fresh child loads torch
        os.environ["OMP_WAIT_POLICY"] = args.omp_wait_policy.upper()
    samplers = [s for s in args.samplers.split(",") if s]
    for s in samplers:
        if s not in SAMPLERS:
            parser.error(f"--samplers: {s!r} is not one of {', '.join(SAMPLERS)}")
    load_before = os.getloadavg()

    def run(sampler: str) -> tuple[float, float]:
        # A fresh process per run; --torch-threads None is --cpus, as Ray sets for an EnvRunner.
        job = (NATIVE, args.envs, args.steps, args.model, sampler, args.cpus, args.torch_threads)
        return in_child(sampling_one, *job)

    runs = interleaved_reps(samplers, args.reps, run)
    report: dict[str, object] = {
        "load_average_before_after": [load_before[0], os.getloadavg()[0]],
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
    }
    for s, r in runs.items():
        figures = {"steps_per_s": [w for w, _ in r], "steps_per_cpu_s": [c for _, c in r]}
        report[s] = {
            k: dict(runs=v, median=statistics.median(v), min=min(v), max=max(v), n=len(v))
            for k, v in figures.items()
        }
    print(json.dumps(report, indent=1))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Per sampler, ``--reps`` runs of env steps/s and of env steps per CPU-second, the samplers
    interleaved, as JSON on stdout; bad input is one line on stderr and exit status 2."""
    return main_wrapper(PROG, _run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
