"""Overflow storms, nan data, persistent-skip warnings and damaged checkpoints."""

from __future__ import annotations

import copy
import logging
import os
import pickle
import shutil

import numpy as np
import pytest
import torch
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner

from rllib_amp import with_amp
from rllib_amp.checkpoint_files import MANIFEST_FILE_NAME, CheckpointError, write_manifest
from tests.integration.common import (
    amp_config,
    learner,
    optimizer_state,
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


# -- damaged checkpoints: a restore loads everything or nothing ------------------------------

ENV_RUNNER_STATE = "env_runner/state.pkl"
LEARNER_STATE = "learner_group/learner/state.pkl"
MODULE_STATE = "learner_group/learner/rl_module/default_policy/module_state.pkl"


@pytest.fixture(scope="module")
def saved_checkpoint(ray_local, tmp_path_factory):
    """An AMP PPO checkpoint after some training (saved once; tests damage copies of it)."""
    path = tmp_path_factory.mktemp("saved")
    a = amp_config("PPO", dtype="float16", init_scale=2.0**12).build_algo()
    try:
        train_until_learned(a)
        a.save_to_path(str(path))
    finally:
        a.stop()
    return path


@pytest.fixture
def checkpoint(saved_checkpoint, tmp_path):
    copy_ = tmp_path / "checkpoint"
    shutil.copytree(saved_checkpoint, copy_)
    return copy_


@pytest.fixture(scope="module")
def running(ray_local):
    """A fresh algorithm whose state must survive every failed restore."""
    b = amp_config("PPO", dtype="float16", init_scale=2.0**12).build_algo()
    yield b
    b.stop()


def _algo_state(algo_obj):
    """Weights, Adam state, scaler state and iteration of a running algorithm."""
    scaler = learner(algo_obj).amp_scalers["default_policy"]
    return (
        weights(algo_obj),
        optimizer_state(algo_obj),
        (scaler.get_scale(), scaler.growth_tracker, scaler.optimizer_steps_lifetime),
        algo_obj.iteration,
    )


def _same_algo_state(a, b):
    (wa, oa, sa, ia), (wb, ob, sb, ib) = a, b
    return same(wa, wb) and _same_optimizer_state(oa, ob) and sa == sb and ia == ib


def _same_optimizer_state(a, b):
    if [sorted(s) for s in a] != [sorted(s) for s in b]:
        return False
    return all(
        torch.equal(v, sb[pid][k]) if torch.is_tensor(v) else v == sb[pid][k]
        for sa, sb in zip(a, b)
        for pid, st in sa.items()
        for k, v in st.items()
    )


def _saved_weights(checkpoint):
    with open(checkpoint / MODULE_STATE, "rb") as f:
        return pickle.load(f)


def _truncate(path):
    size = os.path.getsize(path)
    with open(path, "r+b") as f:
        f.truncate(size // 2)


def _truncate_without_manifest(path):
    """As a stock RLlib or older checkpoint: files are still read whole before any load."""
    os.remove(os.path.join(os.path.dirname(path), "..", MANIFEST_FILE_NAME))
    _truncate(path)


def _garbage(path):
    with open(path, "r+b") as f:
        f.write(b"\x00garbage" * 8)


def _flip_weight_byte(path):
    """One bit inside a weight tensor's bytes: the file still parses, into finite weights."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    state = pickle.loads(bytes(data))
    key = next(k for k, v in state.items() if v.ndim == 2)
    at = bytes(data).index(state[key].tobytes())
    data[at + 1] ^= 0x01
    with open(path, "wb") as f:
        f.write(bytes(data))
    changed = pickle.loads(bytes(data))[key]
    assert np.isfinite(changed).all() and not np.array_equal(changed, state[key])


@pytest.mark.parametrize(
    "name, damage",
    [
        (ENV_RUNNER_STATE, _truncate),  # RLlib loads it after the learner's weights
        (ENV_RUNNER_STATE, _truncate_without_manifest),
        (LEARNER_STATE, _truncate),
        (LEARNER_STATE, _garbage),
        ("algorithm_state.pkl", _truncate),  # loaded last of all
        ("rllib_checkpoint.json", _truncate),
        (MODULE_STATE, _flip_weight_byte),  # parses fine: only the manifest can tell
    ],
    ids=[
        "env_runner-truncate",
        "env_runner-truncate-no-manifest",
        "learner-truncate",
        "learner-garbage",
        "algorithm-truncate",
        "json-truncate",
        "weights-bitflip",
    ],
)
def test_damaged_checkpoint_names_the_file_and_loads_nothing(checkpoint, running, name, damage):
    assert not same(_saved_weights(checkpoint), weights(running))  # a restore would show
    target = str(checkpoint / name)
    damage(target)
    before = _algo_state(running)
    with pytest.raises(CheckpointError) as e:
        running.restore_from_path(str(checkpoint))
    assert e.value.path == target
    assert _same_algo_state(_algo_state(running), before)  # not half a state


def test_from_checkpoint_refuses_a_damaged_env_runner_state(checkpoint):
    target = str(checkpoint / ENV_RUNNER_STATE)
    _truncate(target)
    with pytest.raises(CheckpointError) as e:
        Algorithm.from_checkpoint(str(checkpoint))
    assert e.value.path == target


def test_nan_weight_written_by_a_diverged_run_is_refused_before_load(checkpoint, running):
    """The manifest agrees with the file (the run wrote it so); the values are the problem."""
    state = _saved_weights(checkpoint)
    key = next(k for k, v in state.items() if v.ndim == 2)
    state[key][0, 0] = np.nan
    with open(checkpoint / MODULE_STATE, "wb") as f:
        pickle.dump(state, f)
    write_manifest(checkpoint)
    before = _algo_state(running)
    with pytest.raises(CheckpointError, match="non-finite") as e:
        running.restore_from_path(str(checkpoint))
    assert e.value.path == str(checkpoint / MODULE_STATE)
    assert key in str(e.value)
    assert _same_algo_state(_algo_state(running), before)
