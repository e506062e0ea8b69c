"""torch.compile (inductor) of the Nature CNN's inference forward pass on this CPU, against
eager, in float32 and under bfloat16 autocast: batch 16 (one EnvRunner's envs), no_grad as
the sampler runs it, 1 and 2 torch threads, medians of 5 interleaved runs of 200 passes
(range). The last candidate issue 33 left for the sampler's forward pass; docs/benchmark.md
keeps what it printed. Run from the repository root: python docs/bench/compile_forward.py
"""

import statistics
import time

import torch
from bf16_vs_fp32_cpu import nature_cnn

from rllib_amp.bench.report import machine_description


def forward_ms(fn, x: torch.Tensor, bf16: bool, n: int = 200) -> float:
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for _ in range(10):
            fn(x)
        start = time.perf_counter()
        for _ in range(n):
            fn(x)
    return (time.perf_counter() - start) / n * 1e3


if __name__ == "__main__":
    print(machine_description("cpu"))
    heads = ("eager float32", "compiled float32", "eager bfloat16", "compiled bfloat16")
    print("| torch threads | " + " | ".join(heads) + " |")
    print("|---|---|---|---|---|")
    x = torch.randint(0, 255, (16, 4, 84, 84), dtype=torch.uint8)
    for threads in (1, 2):
        torch.set_num_threads(threads)
        net = nature_cnn().eval()

        def eager(x: torch.Tensor, net: torch.nn.Module = net) -> torch.Tensor:
            return net(x.float() / 255)

        compiled = {bf16: torch.compile(eager) for bf16 in (False, True)}
        for bf16, fn in compiled.items():
            forward_ms(fn, x, bf16, 5)  # compiles outside the timed runs
        runs: dict[str, list[float]] = {}
        for _ in range(5):
            for bf16 in (False, True):
                runs.setdefault(f"eager {bf16}", []).append(forward_ms(eager, x, bf16))
                runs.setdefault(f"compiled {bf16}", []).append(forward_ms(compiled[bf16], x, bf16))
        cells = [
            f"{statistics.median(v):.2f} ms ({min(v):.2f}-{max(v):.2f})"
            for k in ("eager False", "compiled False", "eager True", "compiled True")
            for v in [runs[k]]
        ]
        print(f"| {threads} | " + " | ".join(cells) + " |")
