"""Where one vector step of the batched sampler goes: one local EnvRunner of 16 Pong envs
(the bench's sampling config, "full" model), one timed ``sample()`` of --steps env steps after
a warm-up call, each phase's wall time per vector step (phases nest: ``forward_exploration``
and ``GetActions`` are inside ``_actions``). Run from the repository root:
python docs/bench/sampler_phases.py --inference-dtype auto --torch-threads 1
"""

import argparse
import collections
import os
import sys
import time
from collections.abc import Callable

import torch

sys.path.insert(0, os.getcwd())
import rllib_amp.envs.batched_runner as batched  # noqa: E402
from rllib_amp import with_amp  # noqa: E402
from rllib_amp.bench.sampling import sampling_config  # noqa: E402
from rllib_amp.bench.workloads import stock_env_runner  # noqa: E402

spent: collections.Counter[str] = collections.Counter()


def timed(name: str, fn: Callable[..., object]) -> Callable[..., object]:
    def call(*args: object, **kwargs: object) -> object:
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            spent[name] += time.perf_counter() - start

    return call


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--inference-dtype", default="auto")
    parser.add_argument("--torch-threads", type=int, default=1)
    parser.add_argument("--steps", type=int, default=8192)
    args = parser.parse_args()
    cfg = with_amp(sampling_config(num_envs=16, model="full"), inference_dtype=args.inference_dtype)
    torch.set_num_threads(args.torch_threads)
    with stock_env_runner(cfg, cfg.env_runner_cls) as runner:
        runner.sample(num_timesteps=512, random_actions=False)
        ale = runner.env.unwrapped
        ale.step = timed("ALE step (send + recv)", ale.step)
        runner._actions = timed("_actions (input, forward, actions)", runner._actions)
        runner._finish = timed("_finish (episodes, once per call)", runner._finish)
        runner.module.forward_exploration = timed(
            "  forward_exploration", runner.module.forward_exploration
        )
        batched._GET_ACTIONS = timed("  GetActions", batched._GET_ACTIONS)
        start = time.perf_counter()
        episodes = runner.sample(num_timesteps=args.steps, random_actions=False)
        seconds = time.perf_counter() - start
        vector_steps = sum(len(e) for e in episodes) / 16
        policy = os.environ.get("OMP_WAIT_POLICY")
        print(f"{runner.amp_inference_precision.describe()}; OMP_WAIT_POLICY {policy}")
        per_step = seconds / vector_steps * 1e3
        print(f"{16 * vector_steps / seconds:,.0f} env steps/s, {per_step:.2f} ms per vector step")
        for name, s in sorted(spent.items(), key=lambda kv: -kv[1]):
            print(f"{name}: {s / vector_steps * 1e3:.2f} ms")
