"""The scaler across runs: PBT's exploit (a restore into mutated settings) and warm starts.

Learners are driven directly (tiny PPO nets, CartPole batches sampled once, float16 on CPU);
``LossFactorLearner`` multiplies the loss by 1000 so that a fresh scale of 65536 overflows
and has to back off, as it does for a task with large gradients.
"""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pytest
import torch

from studies.scaler_study import (
    Batches,
    build_learner,
    sample_batches,
    train,
)

MID = "default_policy"
BIG = {MID: 1000.0}  # gradients 1000x a plain PPO loss's: 65536 overflows


@pytest.fixture(scope="module")
def single() -> Batches:
    return sample_batches(multi_agent=False, batches=2, batch_size=64)


def _two_modules() -> Batches:
    """A two-policy PPO learner's config and spaces; no episodes (built, not trained)."""
    from ray.rllib.algorithms.ppo import PPOConfig

    from studies.scaler_study import LossFactorLearner

    obs = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    cfg = (
        PPOConfig()
        .rl_module(model_config={"fcnet_hiddens": [8]})
        .learners(learner_class=LossFactorLearner)
        .multi_agent(policies={"p0", "p1"}, policy_mapping_fn=lambda aid, *a, **k: "p0")
        .debugging(seed=0)
    )
    spaces = {mid: (obs, gym.spaces.Discrete(2)) for mid in ("p0", "p1")}
    return Batches(cfg, [], spaces)


def _view(scaler) -> tuple:
    return (
        scaler.get_scale(),
        scaler.growth_tracker,
        scaler.optimizer_steps_lifetime,
        scaler.skipped_steps_lifetime,
    )


def _weights(lrn, mid=MID):
    return {k: v.detach().clone() for k, v in lrn.module[mid].state_dict().items()}


def _same(a, b) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def donor_checkpoint(single, tmp_path_factory):
    """A run whose scale backed off from 65536 and settled; its learner folder and scaler."""
    donor = build_learner(single, BIG, init_scale=65536.0)
    train(donor, single, 14)
    path = tmp_path_factory.mktemp("donor") / "learner"
    donor.save_to_path(str(path))
    return path, _view(donor.amp_scalers[MID]), _weights(donor)


# -- 1. PBT: a restore into a recipient with mutated settings ---------------------------------
def test_exploit_continues_the_donors_scale_under_the_recipients_settings(single, donor_checkpoint):
    path, donor_view, donor_weights = donor_checkpoint
    scale, tracker, steps, skipped = donor_view
    assert scale < 65536.0 and skipped > 0  # the donor's scale moved
    # PBT mutated the recipient's growth_interval and backoff; its init_scale differs too.
    recipient = build_learner(
        single, BIG, init_scale=1024.0, growth_interval=7, backoff_factor=0.25
    )
    recipient.restore_from_path(str(path))
    r = recipient.amp_scalers[MID]
    assert _view(r) == donor_view  # the donor's live scale, tracker and counters
    assert _same(_weights(recipient), donor_weights)
    own = r.state_dict()["torch"]
    assert (own["growth_interval"], own["backoff_factor"]) == (7, 0.25)  # the recipient's

    # No burst of skipped steps after the exploit; a fresh 65536 backs off every step.
    after = train(recipient, single, 6)
    fresh = train(build_learner(single, BIG, init_scale=65536.0), single, 6)
    assert fresh.skipped[MID] == 6
    assert after.skipped[MID] <= 1  # at most the one growth within interval 7 overflows


# -- 2. warm starts ----------------------------------------------------------------------------
def test_warm_start_seeds_scale_and_tracker_only(single, donor_checkpoint):
    path, (scale, tracker, _, _), donor_weights = donor_checkpoint
    warm = build_learner(single, BIG, warm_start={"from": str(path)})
    fresh = build_learner(single, BIG)  # same seed: the initial weights a new run has
    w = warm.amp_scalers[MID]
    assert _view(w) == (scale, tracker, 0, 0)  # this run's counters start at zero
    assert _same(_weights(warm), _weights(fresh))
    assert not _same(_weights(warm), donor_weights)  # not the weights
    assert all(not opt.state for _, opt in warm.get_optimizers_for_module(MID))  # nor Adam
    assert train(warm, single, 6).skipped[MID] == 0


def test_a_restore_wins_over_the_warm_start(single, donor_checkpoint, tmp_path):
    other = build_learner(single, BIG, init_scale=2.0**3)
    train(other, single, 2)
    other.save_to_path(str(tmp_path / "other"))
    lrn = build_learner(single, BIG, warm_start={"from": str(donor_checkpoint[0])})
    lrn.restore_from_path(str(tmp_path / "other"))
    assert _view(lrn.amp_scalers[MID]) == _view(other.amp_scalers[MID])


def test_module_map_seeds_named_modules_and_shared_scaler_shares_the_seed(donor_checkpoint):
    path, (scale, tracker, _, _), _ = donor_checkpoint
    two = _two_modules()
    lrn = build_learner(two, {}, warm_start={"from": str(path), "modules": {"p1": MID}})
    p0, p1 = lrn.amp_scalers["p0"], lrn.amp_scalers["p1"]
    assert (p1.get_scale(), p1.growth_tracker) == (scale, tracker)
    assert p0.get_scale() == 65536.0  # not in the map: a fresh scaler

    shared = build_learner(
        two, {}, shared_scaler=True, warm_start={"from": str(path), "modules": {"p0": MID}}
    )
    p0, p1 = shared.amp_scalers["p0"], shared.amp_scalers["p1"]
    assert p0 is not p1 and p0.shares_scale_with(p1)
    assert p0.get_scale() == p1.get_scale() == scale


@pytest.mark.parametrize(
    "warm_start, fragment",
    [
        ({"modules": {"p7": MID}}, "amp.warm_start.modules: 'p7' is not a module of this run"),
        ({"modules": {"p0": "p0"}}, "amp.warm_start.modules.p0: 'p0' is not in it"),
        ({}, "amp.warm_start: this run's module 'p0' has no loss scale"),
    ],
)
def test_a_module_map_that_does_not_fit_fails_the_build(donor_checkpoint, warm_start, fragment):
    with pytest.raises(ValueError, match=fragment):
        build_learner(
            _two_modules(), {}, warm_start={"from": str(donor_checkpoint[0]), **warm_start}
        )


@pytest.mark.parametrize(
    "amp, fragment",
    [
        ({"dtype": "bfloat16"}, "trained without loss scaling (bfloat16)"),
        ({"enabled": False}, "holds no AMP scaler state"),
    ],
)
def test_a_checkpoint_without_a_loss_scale_fails_the_build(single, tmp_path, amp, fragment):
    from rllib_amp import with_amp

    cfg = with_amp(single.config.copy(copy_frozen=False), tune_cpu_malloc=False, **amp)
    source = cfg.build_learner(spaces=single.spaces)
    source.save_to_path(str(tmp_path / "source"))
    with pytest.raises(ValueError, match=r"^amp\.warm_start\.from: ") as e:
        build_learner(single, BIG, warm_start={"from": str(tmp_path / "source")})
    assert fragment in str(e.value)


@pytest.mark.usefixtures("ray_local")
def test_warm_start_from_an_algorithm_checkpoint_folder(single, tmp_path):
    from tests.integration.common import amp_config, learner, train_until_learned

    algo = amp_config("PPO", dtype="float16", init_scale=2.0**20, growth_interval=3).build_algo()
    try:
        train_until_learned(algo)
        algo.save_to_path(str(tmp_path / "algo"))
        source = learner(algo).amp_scalers[MID]
        expected = (source.get_scale(), source.growth_tracker)
    finally:
        algo.stop()
    assert expected[0] != 2.0**20
    lrn = build_learner(single, BIG, warm_start={"from": str(tmp_path / "algo")})
    assert (lrn.amp_scalers[MID].get_scale(), lrn.amp_scalers[MID].growth_tracker) == expected
