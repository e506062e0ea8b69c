"""Overflow storms, nan data, persistent-skip warnings and damaged checkpoints."""

from __future__ import annotations

import copy
import glob
import logging
import os

import numpy as np
import pytest
import torch
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner

from rllib_amp import with_amp
from rllib_amp.checkpoint_state import CheckpointError
from tests.integration.common import (
    amp_config,
    learner,
    ppo_episodes,
    same,
    train_until_learned,
    weights,
)


class _OverflowInBackward(torch.autograd.Function):
    """Identity forward; the backward pass overflows to inf, as a float16 backward does."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        return grad * torch.tensor(float("inf"), dtype=grad.dtype)


class StormLearner(PPOTorchLearner):
    """While ``storm`` is on, every gradient overflows; the loss itself stays finite."""

    storm = False

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        loss = super().compute_loss_for_module(
            module_id=module_id, config=config, batch=batch, fwd_out=fwd_out
        )
        return _OverflowInBackward.apply(loss) if self.storm else loss


@pytest.fixture(scope="module")
def ppo_setup():
    return ppo_episodes(64)


def _learner(ppo_setup, **amp):
    cfg, _, spaces = ppo_setup
    cfg = with_amp(cfg.copy(copy_frozen=False).learners(learner_class=StormLearner), **amp)
    torch.manual_seed(0)
    return cfg.build_learner(spaces=spaces)


def _update(lrn, episodes):
    # One optimizer step per update: the whole batch is one minibatch, one epoch.
    lrn.update(
        episodes=copy.deepcopy(episodes),
        num_epochs=1,
        timesteps={"num_env_steps_sampled_lifetime": 1},
    )


def _snapshot(lrn):
    module = lrn.module["default_policy"]
    w = {k: v.detach().clone() for k, v in module.state_dict().items()}
    opt = [
        copy.deepcopy(o.state_dict()) for _, o in lrn.get_optimizers_for_module("default_policy")
    ]
    return w, opt


def _same_snapshot(a, b):
    (wa, oa), (wb, ob) = a, b
    if wa.keys() != wb.keys() or not all(torch.equal(wa[k], wb[k]) for k in wa):
        return False
    for sa, sb in zip(oa, ob):
        for pid, st in sa["state"].items():
            for k, v in st.items():
                other = sb["state"][pid][k]
                if torch.is_tensor(v) and not torch.equal(v, other):
                    return False
    return True


def test_overflow_storm_leaves_no_trace_and_training_recovers(ppo_setup):
    _, episodes, _ = ppo_setup
    lrn = _learner(ppo_setup, dtype="float16", init_scale=1024.0, growth_interval=3)
    scaler = lrn.amp_scalers["default_policy"]
    _update(lrn, episodes)  # a clean step: Adam has state now
    assert scaler.skipped_steps_lifetime == 0 and scaler.get_scale() == 1024.0
    before = _snapshot(lrn)

    K = 5
    StormLearner.storm = True
    try:
        for _ in range(K):
            _update(lrn, episodes)
    finally:
        StormLearner.storm = False
    assert _same_snapshot(before, _snapshot(lrn)), "the storm reached weights or Adam state"
    assert scaler.get_scale() == 1024.0 * 0.5**K
    assert scaler.skipped_steps_lifetime == K
    assert scaler.nonfinite_loss_steps_lifetime == 0  # an overflow, not bad data

    for _ in range(3):  # growth_interval clean steps
        _update(lrn, episodes)
    assert scaler.get_scale() == 1024.0 * 0.5**K * 2
    assert scaler.skipped_steps_lifetime == K
    assert not _same_snapshot(before, _snapshot(lrn)), "training did not resume"


@pytest.mark.parametrize("column", ["obs", "rewards"])
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_nan_in_the_batch_never_reaches_the_weights(ppo_setup, caplog, column, dtype):
    _, episodes, _ = ppo_setup
    lrn = _learner(ppo_setup, dtype=dtype)
    _update(lrn, episodes)
    before = _snapshot(lrn)
    bad = copy.deepcopy(episodes)
    ep = bad[0]
    data = ep.observations if column == "obs" else ep.rewards
    arr = data.data if hasattr(data, "data") else data
    arr[1] = np.nan  # one poisoned value in the whole batch
    caplog.set_level(logging.WARNING, logger="rllib_amp")
    _update(lrn, bad)
    assert _same_snapshot(before, _snapshot(lrn))
    scaler = lrn.amp_scalers["default_policy"]
    assert scaler.skipped_steps_lifetime == 1 and scaler.nonfinite_loss_steps_lifetime == 1
    events = [
        (r.levelname, r.amp_event, r.amp_fields)
        for r in caplog.records
        if getattr(r, "amp_event", None) == "nonfinite_loss"
    ]
    assert events == [
        ("WARNING", "nonfinite_loss", {"module_id": "default_policy", "value": "nan", "count": 1})
    ]


def test_persistent_skips_log_one_warning_with_advice(ppo_setup, caplog):
    _, episodes, _ = ppo_setup
    lrn = _learner(
        ppo_setup,
        dtype="float16",
        init_scale=4096.0,
        skip_warning_updates=2,
        skip_warning_fraction=0.5,
    )
    caplog.set_level(logging.WARNING, logger="rllib_amp")
    StormLearner.storm = True
    try:
        for _ in range(5):
            _update(lrn, episodes)
    finally:
        StormLearner.storm = False
    warnings = [r for r in caplog.records if getattr(r, "amp_event", None) == "persistent_skips"]
    assert [r.levelname for r in warnings] == ["WARNING"]
    assert warnings[0].amp_fields == {
        "module_id": "default_policy",
        "skip_fraction": 1.0,
        "updates": 2,
        "grad_scale": 1024.0,  # 4096 * 0.5 ** 2 when the warning fired
        "cause": "overflow",  # advice: the scaler's settings, not the data
    }


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("damage", ["truncate", "garbage"])
def test_damaged_checkpoint_names_the_file_and_loads_nothing(tmp_path, damage):
    a = amp_config("PPO", dtype="float16", init_scale=2.0**12).build_algo()
    try:
        train_until_learned(a)
        a.save_to_path(str(tmp_path))
    finally:
        a.stop()
    states = glob.glob(str(tmp_path / "**" / "learner" / "state.pkl"), recursive=True)
    assert states, os.listdir(tmp_path)
    target = states[0]
    size = os.path.getsize(target)
    with open(target, "r+b") as f:
        if damage == "truncate":
            f.truncate(size // 2)
        else:
            f.write(b"\x00garbage" * 8)

    b = amp_config("PPO", dtype="float16", init_scale=2.0**12).build_algo()
    try:
        w = weights(b)
        scale = learner(b).amp_scalers["default_policy"].get_scale()
        with pytest.raises(CheckpointError) as e:
            b.restore_from_path(str(tmp_path))
        assert e.value.path == target
        assert same(weights(b), w)  # not half a state
        assert learner(b).amp_scalers["default_policy"].get_scale() == scale
    finally:
        b.stop()
