"""num_learners=2 (torch DDP, gloo on CPU): every learner holds the same scaler state."""

from __future__ import annotations

import pytest
from ray.rllib.algorithms.algorithm import Algorithm

from tests.integration.common import amp_config

pytestmark = pytest.mark.usefixtures("ray_local")


def _scaler_states(algo_obj):
    results = algo_obj.learner_group.foreach_learner(
        lambda lrn: {
            mid: (
                s.get_scale(),
                s.growth_tracker,
                s.optimizer_steps_lifetime,
                s.skipped_steps_lifetime,
            )
            for mid, s in lrn.amp_scalers.items()
        }
    )
    return [r.get() for r in results]


@pytest.mark.slow  # two learner actors, training and a restore: 17 s on 2 idle cores
def test_two_learners_share_identical_scaler_state_through_training_and_restore(tmp_path):
    cfg = amp_config("PPO", dtype="float16", init_scale=2.0**20, growth_interval=2).learners(
        num_learners=2, num_cpus_per_learner=1
    )
    a = cfg.build_algo()
    try:
        a.train()
        a.train()
        states = _scaler_states(a)
        assert len(states) == 2
        assert states[0] == states[1]
        scale, _, steps, _ = states[0]["default_policy"]
        assert steps > 0 and scale != 2.0**20
        a.save_to_path(str(tmp_path))
    finally:
        a.stop()

    b = Algorithm.from_checkpoint(str(tmp_path))
    try:
        restored = _scaler_states(b)
        assert restored == [states[0], states[0]]
        b.train()
        after = _scaler_states(b)
        assert after[0] == after[1]
        assert after[0]["default_policy"][2] > steps
    finally:
        b.stop()
