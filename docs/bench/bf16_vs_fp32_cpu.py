"""bfloat16 autocast against float32 on this CPU: the Nature CNN forward (inference mode) at
batch 1, 16, 64 and 256, and one training step (forward, backward, Adam) at batch 256, one
torch thread, medians of 3 interleaved runs with their range. docs/benchmark.md keeps what it
printed per machine. Run from the repository root: python docs/bench/bf16_vs_fp32_cpu.py
"""

import statistics
import time

import torch


def nature_cnn() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Conv2d(4, 32, 8, 4), torch.nn.ReLU(),
        torch.nn.Conv2d(32, 64, 4, 2), torch.nn.ReLU(),
        torch.nn.Conv2d(64, 64, 3, 1), torch.nn.ReLU(),
        torch.nn.Flatten(), torch.nn.Linear(3136, 512), torch.nn.ReLU(), torch.nn.Linear(512, 7),
    )  # fmt: skip


def forward_ms(net: torch.nn.Module, x: torch.Tensor, bf16: bool, n: int) -> float:
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
        for _ in range(5):
            net(x.float() / 255)
        start = time.perf_counter()
        for _ in range(n):
            net(x.float() / 255)
    return (time.perf_counter() - start) / n * 1e3


def train_ms(net: torch.nn.Module, x: torch.Tensor, bf16: bool, n: int = 6) -> float:
    opt = torch.optim.Adam(net.parameters(), 1e-4)
    for i in range(n + 2):
        if i == 2:
            start = time.perf_counter()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
            loss = net(x.float() / 255).float().pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return (time.perf_counter() - start) / n * 1e3


def row(label: str, measure) -> None:
    runs: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(3):
        for bf16 in (False, True):
            runs[bf16].append(measure(bf16))
    f, b = (statistics.median(runs[k]) for k in (False, True))
    cells = [f"{statistics.median(runs[k]):.2f} ms ({min(runs[k]):.2f}-{max(runs[k]):.2f})"
             for k in (False, True)]  # fmt: skip
    print(f"| {label} | {cells[0]} | {cells[1]} | {b / f:.2f} |")


if __name__ == "__main__":
    torch.set_num_threads(1)
    net = nature_cnn()
    print("| what | float32 | bfloat16 autocast | bfloat16 / float32 time |")
    print("|---|---|---|---|")
    for batch in (1, 16, 64, 256):
        x = torch.randint(0, 255, (batch, 4, 84, 84), dtype=torch.uint8)
        n = max(5, 1600 // batch)
        row(f"forward, batch {batch}", lambda bf16, x=x, n=n: forward_ms(net, x, bf16, n))
    x = torch.randint(0, 255, (256, 4, 84, 84), dtype=torch.uint8)
    row("train step, batch 256", lambda bf16: train_ms(nature_cnn(), x, bf16))
