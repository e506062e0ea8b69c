"""Would overlapping ALE's stepping with the forward pass help on this machine? Pong, 16 envs,
the Nature CNN (6 actions) in bfloat16 autocast, one torch thread, actions sampled from its
logits; three loops, interleaved, fresh envs per run:

- raw: ALE's vector env alone, 2 threads, random actions (the bench's raw-ALE row);
- sync: one vector env of 16 (2 ALE threads), forward on all 16, then step all 16 (what the
  batched sampler does);
- piped: two vector envs of 8 (1 ALE thread each); the forward pass of one half runs while
  the other half steps (ALE's send/recv).

Prints env steps/s, median (min-max) over --reps runs, as a markdown table. Run from the
repository root: python docs/bench/pipelined_ale.py
"""

import argparse
import os
import statistics
import sys
import time

import numpy as np
import torch
from ale_py.vector_env import AtariVectorEnv

sys.path.insert(0, os.getcwd())
from docs.bench.bf16_vs_fp32_cpu import nature_cnn  # noqa: E402
from rllib_amp.envs.atari import ale_game, native_kwargs  # noqa: E402
from rllib_amp.learner.precision import bf16_cpu_flags, read_cpuinfo  # noqa: E402


def make(num_envs: int, threads: int, seed: int) -> tuple[AtariVectorEnv, np.ndarray]:
    env = AtariVectorEnv(
        ale_game("ALE/Pong-v5"), num_envs, **native_kwargs({"num_threads": threads}, num_envs)
    )
    return env, env.reset(seed=seed)[0]


def actions(net: torch.nn.Module, obs: np.ndarray) -> np.ndarray:
    x = torch.from_numpy(obs).to(torch.bfloat16).mul_(1 / 128).sub_(1)
    return torch.distributions.Categorical(logits=net(x).float()).sample().numpy()


def raw(net: torch.nn.Module, steps: int) -> float:
    env, _ = make(16, 2, 0)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for _ in range(steps // 16):
        env.step(rng.integers(0, 6, 16))
    rate = steps / (time.perf_counter() - start)
    env.close()
    return rate


def sync(net: torch.nn.Module, steps: int) -> float:
    env, obs = make(16, 2, 0)
    start = time.perf_counter()
    for _ in range(steps // 16):
        obs = env.step(actions(net, obs))[0]
    rate = steps / (time.perf_counter() - start)
    env.close()
    return rate


def piped(net: torch.nn.Module, steps: int) -> float:
    (a, obs_a), (b, obs_b) = make(8, 1, 0), make(8, 1, 8)
    a.send(actions(net, obs_a))
    start = time.perf_counter()
    for _ in range(steps // 16):
        b.send(actions(net, obs_b))  # B's forward pass ran while A stepped
        obs_a = a.recv()[0]
        a.send(actions(net, obs_a))  # A's while B steps
        obs_b = b.recv()[0]
    rate = steps / (time.perf_counter() - start)
    a.recv()
    a.close()
    b.close()
    return rate


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6000)
    args = parser.parse_args()
    torch.set_num_threads(1)
    net = nature_cnn()
    net[-1] = torch.nn.Linear(512, 6)  # Pong's actions: an action out of range hangs ALE
    loops = {"raw ALE (2 threads, random actions)": raw, "sync (the batched sampler's order)": sync,
             "piped (two halves, send/recv)": piped}  # fmt: skip
    runs: dict[str, list[float]] = {name: [] for name in loops}
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        for fn in loops.values():
            fn(net, 512)  # warm-up
        for rep in range(args.reps):
            for name in loops if rep % 2 == 0 else reversed(loops):
                runs[name].append(loops[name](net, args.steps))
    cpuinfo = read_cpuinfo()
    model = next(
        line.split(":", 1)[1].strip() for line in cpuinfo.splitlines() if "model name" in line
    )
    shown = bf16_cpu_flags(cpuinfo)
    print(f"{model}: {os.cpu_count()} cores, {', '.join(shown) or 'no native bfloat16 flags'}")
    print("| loop | env steps/s, median (min-max) | of raw ALE |")
    print("|---|---|---|")
    base = statistics.median(runs[next(iter(loops))])
    for name, r in runs.items():
        m = statistics.median(r)
        print(f"| {name} | {m:,.0f} ({min(r):,.0f}-{max(r):,.0f}) | {m / base:.2f} |")
