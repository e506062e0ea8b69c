"""fuse_adam / set_adam_fusing on real torch optimizers, and on the Adam of an RLlib learner."""

from __future__ import annotations

import copy
import importlib

import gymnasium as gym
import numpy as np
import pytest
import torch

from rllib_amp.learner.fused_adam import fuse_adam, set_adam_fusing


def _cpu_fused_adam_supported() -> bool:
    try:
        torch.optim.Adam(torch.nn.Linear(1, 1).parameters(), fused=True)
    except (RuntimeError, ValueError):
        return False
    return True


needs_cpu_fused = pytest.mark.skipif(
    not _cpu_fused_adam_supported(), reason="this torch has no fused Adam for CPU tensors"
)


def _net(seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)).to(
        dtype
    )


def _fused_flags(opt: torch.optim.Optimizer) -> list:
    return [g.get("fused") for g in opt.param_groups] + [opt.defaults.get("fused")]


@needs_cpu_fused
def test_plain_float32_adam_becomes_fused():
    net = _net()
    # Two groups: every group must be switched, not only the first.
    opt = torch.optim.Adam(
        [{"params": net[0].parameters()}, {"params": net[2].parameters(), "lr": 1e-4}]
    )
    assert _fused_flags(opt) == [None, None, None]
    assert fuse_adam(opt) is True
    assert _fused_flags(opt) == [True, True, True]


@pytest.mark.parametrize(
    "make",
    [
        pytest.param(lambda p: torch.optim.Adam(p, foreach=True), id="foreach-chosen-by-user"),
        pytest.param(lambda p: torch.optim.Adam(p, foreach=False), id="for-loop-chosen-by-user"),
        pytest.param(lambda p: torch.optim.AdamW(p), id="AdamW"),
        pytest.param(lambda p: torch.optim.SGD(p, lr=0.1), id="SGD"),
    ],
)
def test_optimizers_the_user_configured_or_other_kinds_are_left_alone(make):
    opt = make(_net().parameters())
    before = copy.deepcopy(
        [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
    )
    assert fuse_adam(opt) is False
    assert [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups] == before


def test_adam_over_non_float32_parameters_is_left_alone():
    # Fused Adam on float64 (or any non-float32 dtype) is not what RLlib's default would run.
    opt = torch.optim.Adam(_net(dtype=torch.float64).parameters())
    assert fuse_adam(opt) is False
    assert _fused_flags(opt) == [None, None]  # one group, and the defaults


@needs_cpu_fused
def test_fused_steps_match_unfused_steps(monkeypatch: pytest.MonkeyPatch):
    # Counts calls of torch's fused implementation: the flag alone proves no kernel ran.
    fused_calls = []
    # The module, not torch.optim.adam: that name is the functional adam() in torch.optim.
    adam_module = importlib.import_module("torch.optim.adam")
    real = adam_module._fused_adam

    def counting(*args, **kwargs):
        fused_calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(adam_module, "_fused_adam", counting)
    plain_net, fused_net = _net(seed=3), _net(seed=3)
    plain = torch.optim.Adam(plain_net.parameters(), lr=1e-2)
    fused = torch.optim.Adam(fused_net.parameters(), lr=1e-2)
    assert fuse_adam(fused)
    gen = torch.Generator().manual_seed(0)
    for _ in range(5):
        x = torch.randn(16, 4, generator=gen)
        for net, opt in ((plain_net, plain), (fused_net, fused)):
            opt.zero_grad()
            net(x).pow(2).mean().backward()
            calls_before = len(fused_calls)
            opt.step()
            assert len(fused_calls) - calls_before == (1 if opt is fused else 0)
    moved = [
        (a - b).abs().max().item()
        for a, b in zip(plain_net.parameters(), _net(seed=3).parameters())
    ]
    assert min(moved) > 1e-4  # the steps did something, so the comparison below means something
    for a, b in zip(plain_net.parameters(), fused_net.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@needs_cpu_fused
def test_set_adam_fusing_follows_the_run_not_the_loaded_state():
    saved = torch.optim.Adam(_net().parameters())
    fuse_adam(saved)
    state = saved.state_dict()

    # An AMP-off run restoring an AMP run's state: back to RLlib's default implementation.
    off = torch.optim.Adam(_net().parameters())
    off.load_state_dict(state)
    assert _fused_flags(off)[0] is True  # the loaded state carried the saving run's flag
    set_adam_fusing([off], fused=False)
    assert _fused_flags(off) == [None, None]

    # An AMP run restoring an AMP-off run's state: fused again.
    on = torch.optim.Adam(_net().parameters())
    on.load_state_dict(off.state_dict())
    set_adam_fusing([on], fused=True)
    assert _fused_flags(on) == [True, True]


def test_unfusing_leaves_other_optimizers_alone():
    sgd = torch.optim.SGD(_net().parameters(), lr=0.1, foreach=True)
    set_adam_fusing([sgd], fused=False)
    assert sgd.param_groups[0]["foreach"] is True


def _learner_adams(**amp) -> list[torch.optim.Optimizer]:
    from ray.rllib.algorithms.ppo import PPOConfig

    from rllib_amp import with_amp

    config = with_amp(
        PPOConfig()
        .environment("CartPole-v1")
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .env_runners(num_env_runners=0),
        **amp,
    )
    spaces = {
        "default_policy": (
            gym.spaces.Box(-1.0, 1.0, (4,), np.float32),
            gym.spaces.Discrete(2),
        )
    }
    learner = config.build_learner(spaces=spaces)
    return [opt for _, opt in learner.get_optimizers_for_module("default_policy")]


@needs_cpu_fused
def test_an_amp_learner_fuses_rllibs_adam_and_a_disabled_one_does_not():
    amp = _learner_adams(dtype="bfloat16")
    stock = _learner_adams(enabled=False)
    assert amp and stock
    assert all(type(o) is torch.optim.Adam for o in amp + stock)
    assert all(_fused_flags(o)[0] is True for o in amp)
    assert all(_fused_flags(o)[0] is None for o in stock)
