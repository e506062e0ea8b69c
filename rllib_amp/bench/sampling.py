"""Sampling throughput of one EnvRunner (env steps/s, inference included) on an Atari path.

The benchmark's sampling row: RLlib's wrappers vs ALE's native vector env, same module, same
number of envs.

Example:
    >>> cfg = sampling_config(WRAPPERS, num_envs=2)
    >>> cfg.num_envs_per_env_runner
    2
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rllib_amp.algorithms import algorithm as algorithm_record
from rllib_amp.envs import configure as envs
from rllib_amp.envs import models
from rllib_amp.envs.atari import NATIVE, PREPROCESSING_KEY, WRAPPERS

__all__ = ["NATIVE", "WRAPPERS", "SamplingThroughput", "measure_sampling", "sampling_config"]


def sampling_config(
    preprocessing: str = NATIVE,
    *,
    env_id: str = "ALE/Pong-v5",
    num_envs: int = 16,
    model: str = "mini",
    algorithm: str = "PPO",
    num_cpus: int = 2,
    env_config: Mapping[str, Any] | None = None,
) -> Any:
    """A config for one local EnvRunner with ``num_cpus`` CPUs sampling ``env_id``.

    ``preprocessing``: the Atari path (``native`` or ``wrappers``). The native env gets one
    ALE thread per CPU, as in a Ray EnvRunner. Add ``with_amp`` for autocast inference.

    Example:
        >>> cfg = sampling_config(WRAPPERS, num_envs=2)
        >>> cfg.num_envs_per_env_runner, cfg.gym_env_vectorize_mode
        (2, 'sync')
    """
    cfg = algorithm_record(algorithm).config_class()
    env_config = {**(env_config or {}), PREPROCESSING_KEY: preprocessing}
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
