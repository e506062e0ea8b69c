"""Two policies, two independent scalers; modules added later get their own."""

from __future__ import annotations

import pytest
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core.rl_module.rl_module import RLModuleSpec
from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole
from ray.tune.registry import register_env

from rllib_amp import amp_learner_class, with_amp
from tests.integration.common import TINY, learner, same, train_until_learned, weights

pytestmark = pytest.mark.usefixtures("ray_local")


class OverflowP1Learner(PPOTorchLearner):
    """A user's own learner: p1's loss is always inf, p0's is untouched."""

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):
        loss = super().compute_loss_for_module(
            module_id=module_id, config=config, batch=batch, fwd_out=fwd_out
        )
        return loss * float("inf") if module_id == "p1" else loss


def _two_policy_config(learner_class=None):
    register_env("ma_cartpole", lambda cfg: MultiAgentCartPole({"num_agents": 2}))
    cfg = (
        PPOConfig()
        .environment("ma_cartpole")
        .env_runners(num_env_runners=0)
        .multi_agent(
            policies={"p0", "p1"},
            policy_mapping_fn=lambda agent_id, episode, **kw: f"p{agent_id}",
        )
        .training(train_batch_size_per_learner=128, minibatch_size=64, num_epochs=1)
        .rl_module(model_config=dict(TINY))
        .debugging(seed=0)
    )
    if learner_class is not None:
        cfg.learners(learner_class=learner_class)
    return cfg


def test_overflow_in_one_policy_leaves_the_other_alone():
    cfg = with_amp(_two_policy_config(OverflowP1Learner), dtype="float16", init_scale=1024.0)
    assert cfg.learner_class is amp_learner_class(OverflowP1Learner)
    a = cfg.build_algo()
    try:
        lrn = learner(a)
        assert set(lrn.amp_scalers) == {"p0", "p1"}
        assert lrn.amp_scalers["p0"] is not lrn.amp_scalers["p1"]
        before = {mid: weights(a, mid) for mid in ("p0", "p1")}
        result = train_until_learned(a)
        p0, p1 = lrn.amp_scalers["p0"], lrn.amp_scalers["p1"]
        assert p1.optimizer_steps_lifetime > 0
        assert p1.skipped_steps_lifetime == p1.optimizer_steps_lifetime
        assert p1.get_scale() == 1024.0 * 0.5**p1.optimizer_steps_lifetime
        assert same(weights(a, "p1"), before["p1"])

        assert p0.skipped_steps_lifetime == 0
        assert p0.get_scale() == 1024.0
        assert not same(weights(a, "p0"), before["p0"])
        assert result["learners"]["p1"]["amp_skip_fraction"] == 1.0
        assert result["learners"]["p0"]["amp_skip_fraction"] == 0.0
    finally:
        a.stop()


def test_added_module_gets_fresh_scaler_and_removed_module_drops_it():
    a = with_amp(_two_policy_config(), dtype="float16", init_scale=4096.0).build_algo()
    try:
        lrn = learner(a)
        train_until_learned(a)
        lrn.amp_scalers["p0"].skipped_steps_lifetime = 7  # mark p0's scaler as used
        spec = RLModuleSpec.from_module(lrn.module["p0"].unwrapped())
        lrn.add_module(module_id="p2", module_spec=spec)
        assert set(lrn.amp_scalers) == {"p0", "p1", "p2"}
        fresh = lrn.amp_scalers["p2"]
        assert (fresh.get_scale(), fresh.optimizer_steps_lifetime) == (4096.0, 0)
        assert lrn.amp_scalers["p0"].skipped_steps_lifetime == 7
        assert set(lrn.get_state()["amp_scalers"]) == {"p0", "p1", "p2"}

        lrn.remove_module("p2")
        assert set(lrn.amp_scalers) == {"p0", "p1"}
        assert set(lrn.get_state()["amp_scalers"]) == {"p0", "p1"}
    finally:
        a.stop()


def test_shared_scaler_one_scale_for_all_modules_each_skipping_only_its_own_steps(tmp_path):
    """shared_scaler: p1 overflows every step; the one scale backs off once per step, p0 learns."""
    cfg = with_amp(
        _two_policy_config(OverflowP1Learner),
        dtype="float16",
        init_scale=1024.0,
        shared_scaler=True,
    )
    a = cfg.build_algo()
    try:
        lrn = learner(a)
        p0, p1 = lrn.amp_scalers["p0"], lrn.amp_scalers["p1"]
        assert p0 is not p1 and p0.shares_scale_with(p1)
        before = {mid: weights(a, mid) for mid in ("p0", "p1")}
        result = train_until_learned(a)
        steps = p1.optimizer_steps_lifetime
        assert steps > 0 and p1.skipped_steps_lifetime == steps
        # One backoff per learner step (not one per module), seen by both modules.
        assert p0.get_scale() == p1.get_scale() == 1024.0 * 0.5**steps
        # p0's gradients were finite: it stepped every time, at the shared scale.
        assert (p0.optimizer_steps_lifetime, p0.skipped_steps_lifetime) == (steps, 0)
        assert not same(weights(a, "p0"), before["p0"])
        assert same(weights(a, "p1"), before["p1"])
        assert result["learners"]["p0"]["amp_grad_scale"] == p0.get_scale()
        assert result["learners"]["p0"]["amp_skip_fraction"] == 0.0
        assert result["learners"]["p1"]["amp_skip_fraction"] == 1.0

        # A module added later joins the shared scale.
        spec = RLModuleSpec.from_module(lrn.module["p0"].unwrapped())
        lrn.add_module(module_id="p2", module_spec=spec)
        assert lrn.amp_scalers["p2"].shares_scale_with(p0)
        assert lrn.amp_scalers["p2"].get_scale() == p0.get_scale()

        # Checkpoints keep one entry per module (the same scale in each) and restore shared.
        lrn.remove_module("p2")
        a.save_to_path(str(tmp_path))
        saved = lrn.get_state()["amp_scalers"]
        assert {mid: s["torch"]["scale"] for mid, s in saved.items()} == {
            "p0": p0.get_scale(),
            "p1": p0.get_scale(),
        }
    finally:
        a.stop()
    b = cfg.build_algo()
    try:
        b.restore_from_path(str(tmp_path))
        q0, q1 = learner(b).amp_scalers["p0"], learner(b).amp_scalers["p1"]
        assert q0.shares_scale_with(q1) and q0.get_scale() == 1024.0 * 0.5**steps
        assert (q0.skipped_steps_lifetime, q1.skipped_steps_lifetime) == (0, steps)
    finally:
        b.stop()
