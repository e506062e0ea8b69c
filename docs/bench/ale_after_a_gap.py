"""How long one step of ALE's vector env (Pong, 16 envs, 2 threads, random actions) takes when
the calling thread did something else for a few ms before it: nothing, slept, spun in Python,
or ran the Nature CNN forward pass (one torch thread, float32 or bfloat16 autocast), the
sampler's order. Medians over 230 steps per gap, two rounds. Run from the repository root:
python docs/bench/ale_after_a_gap.py
"""

import os
import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
import torch

sys.path.insert(0, os.getcwd())
from docs.bench.bf16_vs_fp32_cpu import nature_cnn  # noqa: E402
from docs.bench.pipelined_ale import make  # noqa: E402


def spin(ms: float) -> None:
    end = time.perf_counter() + ms / 1e3
    while time.perf_counter() < end:
        pass


if __name__ == "__main__":
    torch.set_num_threads(1)
    net = nature_cnn()
    net[-1] = torch.nn.Linear(512, 6)
    x = torch.randint(0, 255, (16, 4, 84, 84), dtype=torch.uint8)

    def bf16_forward() -> None:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            net(x.to(torch.bfloat16))

    gaps: dict[str, Callable[[], object]] = {
        "none": lambda: None,
        "sleep 3 ms": lambda: time.sleep(0.003),
        "spin 3 ms in Python": lambda: spin(3),
        "float32 forward": lambda: net(x.float()),
        "bfloat16 forward": bf16_forward,
    }
    env, _ = make(16, 2, 0)
    rng = np.random.default_rng(0)
    print("| before each step | round | gap ms | ALE step ms |")
    print("|---|---|---|---|")
    with torch.inference_mode():
        for round_ in (1, 2):
            for name, gap in gaps.items():
                gap_ms, step_ms = [], []
                for i in range(250):
                    t0 = time.perf_counter()
                    gap()
                    t1 = time.perf_counter()
                    env.step(rng.integers(0, 6, 16))
                    if i >= 20:
                        gap_ms.append((t1 - t0) * 1e3)
                        step_ms.append((time.perf_counter() - t1) * 1e3)
                gap_m, step_m = statistics.median(gap_ms), statistics.median(step_ms)
                print(f"| {name} | {round_} | {gap_m:.2f} | {step_m:.2f} |")
    env.close()
