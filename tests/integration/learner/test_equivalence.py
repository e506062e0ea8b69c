"""AMP off is stock RLlib, bit for bit; clipping sees true-scale gradients."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch

from rllib_amp import with_amp
from tests.integration.common import learner, same, tiny_config, train_until_learned, weights

pytestmark = pytest.mark.usefixtures("ray_local")


def _train_once(cfg):
    a = cfg.build_algo()
    buffer = getattr(a, "local_replay_buffer", None)
    if buffer is not None:
        # RLlib seeds the replay buffer's sampling RNG with None even under
        # debugging(seed=...); pin it so two stock DQN runs agree.
        buffer.rng = np.random.default_rng(cfg.seed)
    try:
        result = train_until_learned(a)
        return weights(a), result
    finally:
        a.stop()


@pytest.mark.parametrize("algo", ["PPO", "DQN"])
def test_amp_disabled_is_bit_identical_to_stock_rllib(algo):
    stock_a, _ = _train_once(tiny_config(algo, seed=3))
    stock_b, _ = _train_once(tiny_config(algo, seed=3))
    assert same(stock_a, stock_b), "stock RLlib itself is not deterministic here"
    off, _ = _train_once(with_amp(tiny_config(algo, seed=3), enabled=False))
    assert same(off, stock_a)
    # ...and the check has teeth: AMP on gives different weights.
    on, _ = _train_once(with_amp(tiny_config(algo, seed=3), dtype="bfloat16"))
    assert not same(on, stock_a)


def _clip_config(seed=5):
    return tiny_config("PPO", seed=seed).training(
        grad_clip=0.1,
        grad_clip_by="global_norm",
        train_batch_size_per_learner=256,
        minibatch_size=256,
        num_epochs=1,
    )


def test_clipping_sees_true_scale_gradients():
    key = "gradients_default_optimizer_global_norm"
    _, ref = _train_once(_clip_config())
    ref_norm = ref["learners"]["default_policy"][key]
    assert ref_norm > 0.1  # the clip is active

    cfg = with_amp(_clip_config(), dtype="float16", init_scale=2.0**14)
    _, amp = _train_once(cfg)
    amp_norm = amp["learners"]["default_policy"][key]
    assert amp_norm == pytest.approx(ref_norm, rel=2e-2)

    # RLlib's own scaler hook clips the still-scaled gradients (the defect we fix).
    stock = _clip_config().experimental(
        _torch_grad_scaler_class=functools.partial(torch.amp.GradScaler, "cpu", init_scale=2.0**14)
    )
    _, rllib = _train_once(stock)
    rllib_norm = rllib["learners"]["default_policy"][key]
    assert rllib_norm == pytest.approx(ref_norm * 2.0**14, rel=2e-2)


def test_with_amp_learner_instances_are_amp():
    a = with_amp(tiny_config("PPO"), enabled=False).build_algo()
    try:
        lrn = learner(a)
        assert type(lrn).__name__ == "AmpPPOTorchLearner"
        assert not lrn.amp_enabled and lrn.amp_scalers == {}
    finally:
        a.stop()


def test_amp_minibatches_are_rllibs(monkeypatch):
    """The gathered minibatches (learner.minibatch) train exactly like RLlib's iterator."""
    from rllib_amp.learner import minibatch

    used = []
    original = minibatch.GatherMiniBatchIterator.__iter__

    def counting_iter(self):
        used.append(self)
        return original(self)

    monkeypatch.setattr(minibatch.GatherMiniBatchIterator, "__iter__", counting_iter)
    ours, _ = _train_once(with_amp(tiny_config("PPO", seed=4), dtype="bfloat16"))
    assert used, "the AMP PPO learner did not use GatherMiniBatchIterator"

    monkeypatch.setattr(minibatch.GatherMiniBatchIterator, "supports", lambda batch: False)
    used.clear()
    rllibs, _ = _train_once(with_amp(tiny_config("PPO", seed=4), dtype="bfloat16"))
    assert not used
    assert same(ours, rllibs)
