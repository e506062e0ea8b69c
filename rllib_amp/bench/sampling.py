"""Sampling throughput of one EnvRunner (env steps/s, inference included) on an Atari path.

The benchmark's sampling row: RLlib's wrappers vs ALE's native vector env, same module, same
number of envs; on the native path, RLlib's per-env loop vs the batched sampler
(``env_config.sampler``, ``rllib_amp.envs.batched_runner``). ``compare_samplers`` repeats
each in a fresh process, interleaved, and reports median and spread;
``python -m rllib_amp.bench.sampling`` prints them.

Example:
    >>> cfg = sampling_config(WRAPPERS, num_envs=2)
    >>> cfg.num_envs_per_env_runner
    2
"""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rllib_amp.algorithms import algorithm as algorithm_record
from rllib_amp.envs import configure as envs
from rllib_amp.envs import models
from rllib_amp.envs.atari import (
    BATCHED,
    NATIVE,
    PREPROCESSING_KEY,
    RLLIB,
    SAMPLER_KEY,
    SAMPLERS,
    WRAPPERS,
)

__all__ = [
    "BATCHED",
    "NATIVE",
    "RLLIB",
    "WRAPPERS",
    "SamplingThroughput",
    "compare_samplers",
    "measure_sampling",
    "sampling_config",
]


def sampling_config(
    preprocessing: str = NATIVE,
    *,
    env_id: str = "ALE/Pong-v5",
    num_envs: int = 16,
    model: str = "mini",
    algorithm: str = "PPO",
    num_cpus: int = 2,
    env_config: Mapping[str, Any] | None = None,
    sampler: str | None = None,
) -> Any:
    """A config for one local EnvRunner with ``num_cpus`` CPUs sampling ``env_id``.

    ``preprocessing``: the Atari path (``native`` or ``wrappers``). The native env gets one
    ALE thread per CPU, as in a Ray EnvRunner. ``sampler`` (native only): ``batched`` (the
    default) or ``rllib``. Add ``with_amp`` for autocast inference.

    Example:
        >>> cfg = sampling_config(WRAPPERS, num_envs=2)
        >>> cfg.num_envs_per_env_runner, cfg.gym_env_vectorize_mode
        (2, 'sync')
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


@dataclass(frozen=True)
class SamplingThroughput:
    """One timed EnvRunner.sample() call (after a warm-up call)."""

    env_steps: int
    seconds: float

    @property
    def steps_per_s(self) -> float:
        return self.env_steps / self.seconds


def measure_sampling(
    config: Any, *, env_steps: int = 4096, warmup_steps: int = 512
) -> SamplingThroughput:
    """Env steps per second of one EnvRunner built from ``config``, inference included.

    The runner lives in this process (the config's ``env_runner_cls``, RLlib's
    SingleAgentEnvRunner by default); actions come from its RLModule, as in training. Torch
    runs ``num_cpus_per_env_runner`` threads meanwhile, as Ray sets for an EnvRunner actor
    (OMP_NUM_THREADS); more threads than cores stall every small op on a busy machine.

    Example:
        >>> r = measure_sampling(sampling_config(num_envs=2), env_steps=64)  # doctest: +SKIP
        >>> r.steps_per_s > 0  # doctest: +SKIP
        True
    """
    import torch
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    runner_cls = config.env_runner_cls or SingleAgentEnvRunner
    torch_threads = torch.get_num_threads()
    torch.set_num_threads(max(1, int(config.num_cpus_per_env_runner)))
    runner = runner_cls(config=config)
    try:
        runner.sample(num_timesteps=warmup_steps, random_actions=False)
        start = time.perf_counter()
        episodes = runner.sample(num_timesteps=env_steps, random_actions=False)
        seconds = time.perf_counter() - start
        steps = sum(len(e) for e in episodes)
    finally:
        runner.stop()
        torch.set_num_threads(torch_threads)
    return SamplingThroughput(env_steps=steps, seconds=seconds)


# -- batched vs RLlib's loop ------------------------------------------------------------------
def sampler_one(sampler: str, num_envs: int, env_steps: int, model: str, num_cpus: int) -> float:
    """Env steps/s of one native EnvRunner on ``sampler`` (a picklable job for ``in_child``)."""
    cfg = sampling_config(
        NATIVE, num_envs=num_envs, model=model, num_cpus=num_cpus, sampler=sampler
    )
    return measure_sampling(cfg, env_steps=env_steps, warmup_steps=min(512, env_steps)).steps_per_s


def summary(values: Sequence[float]) -> dict[str, float]:
    """Median and spread of repeated figures.

    Example:
        >>> summary([3.0, 1.0, 2.0])
        {'median': 2.0, 'min': 1.0, 'max': 3.0, 'n': 3}
    """
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "n": len(values),
    }


def compare_samplers(
    reps: int,
    *,
    samplers: Sequence[str] = (RLLIB, BATCHED),
    num_envs: int = 16,
    env_steps: int = 4096,
    model: str = "full",
    num_cpus: int = 2,
    fresh: bool = True,
) -> dict[str, list[float]]:
    """Env steps/s per sampler, ``reps`` each, interleaved; each in a fresh process by default.

    Example:
        >>> runs = compare_samplers(1, num_envs=2, env_steps=8, fresh=False)  # doctest: +SKIP
        >>> sorted(runs)  # doctest: +SKIP
        ['batched', 'rllib']
    """
    from rllib_amp.bench.figures import interleaved
    from rllib_amp.bench.harness import in_child

    out: dict[str, list[float]] = {s: [] for s in samplers}
    for rep in range(reps):
        for sampler in interleaved(samplers, rep):
            args = (sampler, num_envs, env_steps, model, num_cpus)
            value = in_child(sampler_one, *args) if fresh else sampler_one(*args)
            out[sampler].append(float(value))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    from rllib_amp.cli import Parser, main_wrapper

    def run(argv: Sequence[str] | None) -> int:
        parser = Parser(
            prog="python -m rllib_amp.bench.sampling",
            description="Env steps/s of one native EnvRunner: RLlib's loop vs the batched sampler.",
        )
        parser.add_argument("--reps", type=int, default=5)
        parser.add_argument("--envs", type=int, default=16)
        parser.add_argument("--steps", type=int, default=4096)
        parser.add_argument("--model", default="full")
        parser.add_argument("--cpus", type=int, default=2)
        parser.add_argument("--samplers", default=",".join((RLLIB, BATCHED)))
        args = parser.parse_args(argv)
        samplers = [s for s in args.samplers.split(",") if s]
        for s in samplers:
            if s not in SAMPLERS:
                parser.error(f"--samplers: {s!r} is not one of {', '.join(SAMPLERS)}")
        runs = compare_samplers(
            args.reps,
            samplers=samplers,
            num_envs=args.envs,
            env_steps=args.steps,
            model=args.model,
            num_cpus=args.cpus,
        )
        print(json.dumps({s: {"runs": v, **summary(v)} for s, v in runs.items()}, indent=1))
        return 0

    return main_wrapper("python -m rllib_amp.bench.sampling", run, argv)


if __name__ == "__main__":
    raise SystemExit(main())


# -- overlap: envs stepping while the network works -------------------------------------------
OVERLAP_MODES = ("sync", "halves")


def overlap_one(
    mode: str,
    num_envs: int = 16,
    env_steps: int = 4096,
    model: str = "full",
    ale_threads: int = 2,
    torch_threads: int = 2,
) -> float:
    """Env steps/s of the bare batched loop (module forward, action sampling, ALE step).

    ``sync``: one ALE vector env of ``num_envs``; the network and the envs take turns.
    ``halves``: two vector envs of half the envs each, stepped with ALE's asynchronous
    ``send``/``recv``: while the network computes one half's actions, the other half steps.
    No episodes, no RLlib runner: what overlap can buy at most.
    """
    import gymnasium as gym
    import numpy as np
    import torch
    from ale_py.vector_env import AtariVectorEnv

    torch.set_num_threads(torch_threads)
    cfg = sampling_config(NATIVE, num_envs=num_envs, model=model)
    spaces: dict[str, Any] = {"default_policy": (models.ATARI_OBS_SPACE, gym.spaces.Discrete(6))}
    module = cfg.get_rl_module_spec(spaces=spaces).build()
    dist_cls = module.get_exploration_action_dist_cls()

    def act(obs: np.ndarray) -> np.ndarray:
        images = torch.from_numpy(obs).permute(0, 2, 3, 1).contiguous()
        logits = module.forward_exploration({"obs": images}, t=0)["action_dist_inputs"]
        return dist_cls.from_logits(logits).sample().numpy()

    groups = 1 if mode == "sync" else 2
    size = num_envs // groups
    threads = max(1, ale_threads // groups)
    envs = [AtariVectorEnv("pong", size, num_threads=threads) for _ in range(groups)]
    obs: list[Any] = [env.reset(seed=i * size)[0] for i, env in enumerate(envs)]
    rounds = max(1, env_steps // num_envs)
    warmup = max(1, rounds // 8)
    start = 0.0
    for r in range(rounds + warmup):
        if r == warmup:
            start = time.perf_counter()
        if groups == 1:
            obs[0] = envs[0].step(act(obs[0]))[0]
            continue
        # Half 0 was sent last round: compute half 1's actions while half 0 steps.
        if r == 0:
            envs[0].send(act(obs[0]))
        envs[1].send(act(obs[1]))
        obs[0] = envs[0].recv()[0]
        envs[0].send(act(obs[0]))
        obs[1] = envs[1].recv()[0]
    seconds = time.perf_counter() - start
    for env in envs:
        env.close()
    return rounds * num_envs / seconds


def compare_overlap(
    reps: int, *, variants: Sequence[tuple[str, int, int]] | None = None, **kwargs: Any
) -> dict[str, list[float]]:
    """Env steps/s per (mode, ALE threads, torch threads), ``reps`` each, interleaved, each in
    a fresh process."""
    from rllib_amp.bench.figures import interleaved
    from rllib_amp.bench.harness import in_child

    variants = variants or [("sync", 2, 2), ("halves", 2, 2), ("halves", 2, 1)]
    names = {f"{m} ale{a} torch{t}": (m, a, t) for m, a, t in variants}
    out: dict[str, list[float]] = {n: [] for n in names}
    for rep in range(reps):
        for name in interleaved(list(names), rep):
            mode, ale, tt = names[name]
            out[name].append(
                float(
                    in_child(
                        overlap_one,
                        mode,
                        kwargs.get("num_envs", 16),
                        kwargs.get("env_steps", 4096),
                        kwargs.get("model", "full"),
                        ale,
                        tt,
                    )
                )
            )
    return out
