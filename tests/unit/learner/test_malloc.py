"""rllib_amp.learner.malloc: freed update buffers are reused instead of re-faulted from the OS."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from rllib_amp.learner import malloc

# Allocates and frees a 64 MiB tensor (above glibc's largest default mmap threshold) a few
# times, like the buffers of a CPU update, and counts the page faults that cost. The probe
# loads what a learner process has loaded (RLlib's PPO learner): in a process holding torch
# alone the heap cannot grow in place and the tuned thresholds save nothing (81,920 faults
# either way), so a bare probe would measure a process no learner runs in.
PROBE = textwrap.dedent(
    """
    import json, resource, sys
    import ray.rllib.algorithms.ppo.torch.ppo_torch_learner
    import torch
    from rllib_amp.learner import malloc
    tuned = malloc.tune_cpu_malloc() if sys.argv[1] == "tune" else False
    def faults():
        return resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    torch.ones(16 << 20)  # warm-up: first touch of the heap is paid either way
    before = faults()
    for _ in range(5):
        t = torch.ones(16 << 20)  # 64 MiB of float32, written in full
        del t
    print(json.dumps({"tuned": tuned, "faults": faults() - before}))
    """
)


def _probes(*modes: str) -> list[dict]:
    """The probe once per mode, the processes side by side (each loads RLlib: seconds)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop("LD_PRELOAD", None)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", PROBE, mode],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for mode in modes
    ]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err[-2000:]
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


@pytest.mark.skipif(malloc.why_not() is not None, reason=f"{malloc.why_not()}")
def test_tuned_process_reuses_freed_buffers():
    default, tuned = _probes("default", "tune")
    assert tuned["tuned"] is True and default["tuned"] is False
    pages = (5 * (64 << 20)) // os.sysconf("SC_PAGE_SIZE")
    # glibc's defaults: every 64 MiB buffer is a fresh mmap, faulted in page by page.
    assert default["faults"] > 0.8 * pages, default
    # Tuned: the freed block is reused; at most the first buffer's pages are new.
    assert tuned["faults"] <= 0.25 * pages, tuned


def test_user_choices_are_respected(monkeypatch):
    monkeypatch.setattr(malloc.platform, "system", lambda: "Linux")
    monkeypatch.setattr(malloc.platform, "libc_ver", lambda: ("glibc", "2.36"))
    for var in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_CONF", "LD_PRELOAD"):
        monkeypatch.delenv(var, raising=False)
    assert malloc.why_not() is None
    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "0")
    assert "MALLOC_TRIM_THRESHOLD_" in malloc.why_not()
    monkeypatch.delenv("MALLOC_TRIM_THRESHOLD_")
    monkeypatch.setenv("LD_PRELOAD", "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2")
    assert "jemalloc" in malloc.why_not()
    monkeypatch.delenv("LD_PRELOAD")
    monkeypatch.setattr(malloc.platform, "libc_ver", lambda: ("", ""))
    assert "not glibc" in malloc.why_not()


def test_applied_once_per_process(monkeypatch):
    calls = []
    monkeypatch.setattr(malloc, "_state", None)
    monkeypatch.setattr(malloc, "why_not", lambda: calls.append(1) or "test: left alone")
    assert malloc.tune_cpu_malloc() is False
    assert malloc.tune_cpu_malloc() is False
    assert len(calls) == 1


@pytest.mark.parametrize(
    "amp, expected",
    [
        ({"dtype": "bfloat16"}, 1),
        ({"dtype": "bfloat16", "tune_cpu_malloc": False}, 0),
        ({"enabled": False}, 0),
    ],
    ids=["bf16", "bf16, opted out", "AMP off"],
)
def test_cpu_learner_tunes_only_with_amp_on(monkeypatch, amp, expected):
    import gymnasium as gym
    from ray.rllib.algorithms.ppo import PPOConfig

    from rllib_amp import with_amp
    from rllib_amp.learner import mixin as learner_mod

    calls = []
    monkeypatch.setattr(learner_mod, "tune_cpu_malloc", lambda: calls.append(1) or True)
    env = gym.make("CartPole-v1")
    spaces = {"default_policy": (env.observation_space, env.action_space)}
    cfg = with_amp(PPOConfig().environment("CartPole-v1"), **amp)
    cfg.build_learner(spaces=spaces)
    assert len(calls) == expected
