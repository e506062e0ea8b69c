"""PPO, DQN and APPO train under AMP on CartPole: metrics, weights, precision, logs."""

from __future__ import annotations

import logging

import pytest
import torch

from rllib_amp.learner import metrics as M
from tests.integration.common import (
    all_finite,
    amp_config,
    learner,
    same,
    train_until_learned,
    weights,
)

pytestmark = pytest.mark.usefixtures("ray_local")


# float16 APPO (about 10 s) is slow: float16 with its scaler trains PPO and DQN here, and APPO
# trains in bfloat16.
@pytest.mark.parametrize(
    "algo, dtype",
    [
        pytest.param(
            a, d, id=f"{d}-{a}", marks=[pytest.mark.slow] if (a, d) == ("APPO", "float16") else []
        )
        for d in ("bfloat16", "float16")
        for a in ("PPO", "DQN", "APPO")
    ],
)
def test_trains_under_amp(algo, dtype, caplog):
    caplog.set_level(logging.INFO, logger="rllib_amp")
    a = amp_config(algo, dtype=dtype).build_algo()
    try:
        lrn = learner(a)
        assert lrn.amp_precision.dtype == getattr(torch, dtype)
        assert lrn.amp_precision.use_scaler is (dtype == "float16")
        lines = [r.amp_fields for r in caplog.records if getattr(r, "amp_event", 0) == "precision"]
        assert [(f["module_id"], f["dtype"], f["scaler"]) for f in lines] == [
            ("default_policy", dtype, dtype == "float16")
        ]

        before = weights(a)
        result = train_until_learned(a, iterations=2)
        after = weights(a)
        assert all_finite(after)
        assert not same(before, after), "weights did not change"

        stats = result["learners"]["default_policy"]
        for key in M.ALL_KEYS:
            assert key in stats, key
        scaler = lrn.amp_scalers["default_policy"]
        assert stats[M.OPTIMIZER_STEPS_LIFETIME] > 0
        if algo == "APPO":
            # APPO's learner thread may have stepped on since the result was reported.
            assert stats[M.OPTIMIZER_STEPS_LIFETIME] <= scaler.optimizer_steps_lifetime
            assert stats[M.SKIPPED_STEPS_LIFETIME] <= scaler.skipped_steps_lifetime
        else:
            assert stats[M.GRAD_SCALE] == scaler.get_scale()
            assert stats[M.OPTIMIZER_STEPS_LIFETIME] == scaler.optimizer_steps_lifetime
            assert stats[M.SKIPPED_STEPS_LIFETIME] == scaler.skipped_steps_lifetime
        assert 0.0 <= stats[M.SKIP_FRACTION] <= 1.0
        if dtype == "bfloat16":
            assert stats[M.GRAD_SCALE] == 1.0
        else:
            assert stats[M.GRAD_SCALE] > 1.0
    finally:
        a.stop()


def test_forward_runs_in_low_precision_and_loss_in_float32():
    """The module's forward_train sees autocast; the loss inputs are float32."""
    a = amp_config("PPO", dtype="bfloat16").build_algo()
    try:
        lrn = learner(a)
        seen: dict[str, torch.dtype] = {}
        module = lrn.module["default_policy"]
        first_linear = next(m for m in module.modules() if isinstance(m, torch.nn.Linear))

        def record(m, i, o):
            seen.setdefault("linear_out", o.dtype)  # returns None: output unchanged

        first_linear.register_forward_hook(record)
        original = lrn.compute_loss_for_module

        def spy(*, module_id, config, batch, fwd_out):
            seen["loss_in"] = fwd_out["action_dist_inputs"].dtype
            loss = original(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
            seen["loss_out"] = loss.dtype
            return loss

        lrn.compute_loss_for_module = spy
        train_until_learned(a)
        assert seen == {
            "linear_out": torch.bfloat16,
            "loss_in": torch.float32,
            "loss_out": torch.float32,
        }
    finally:
        a.stop()


def test_large_init_scale_overflows_are_skipped_and_scale_backs_off():
    """float16 with a scale of 2**100: every step overflows, none reaches the weights."""
    a = amp_config("PPO", dtype="float16", init_scale=2.0**100).build_algo()
    try:
        before = weights(a)
        result = train_until_learned(a)
        stats = result["learners"]["default_policy"]
        n = stats[M.OPTIMIZER_STEPS_LIFETIME]
        assert n > 0
        assert stats[M.SKIPPED_STEPS_LIFETIME] == n
        assert stats[M.SKIP_FRACTION] == 1.0
        assert stats[M.GRAD_SCALE] == 2.0**100 * 0.5**n
        assert same(before, weights(a))
    finally:
        a.stop()
