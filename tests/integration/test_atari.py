"""The Pong DQN experiment (dueling, double Q, target network, BatchNorm) trains under AMP."""

from __future__ import annotations

import os

import pytest
import torch

from rllib_amp import experiment as E
from tests.integration.common import all_finite, learner, same, weights

pytestmark = pytest.mark.usefixtures("ray_local")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_pong_dqn_batchnorm_preset_trains_with_float32_norm_layers():
    exp = E.load(
        os.path.join(ROOT, "tune_configs", "pong_dqn_amp.yaml"),
        overrides={
            "amp.dtype": "bfloat16",
            "resources.num_env_runners": 0,
            "resources.num_learners": 0,
            "resources.num_gpus_per_learner": 0,
            "training.train_batch_size_per_learner": 16,
            "training.num_steps_sampled_before_learning_starts": 64,
        },
    )
    cfg = exp.algorithm_config().env_runners(rollout_fragment_length=32)
    a = cfg.build_algo()
    try:
        lrn = learner(a)
        module = lrn.module["default_policy"]
        norms = [m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)]
        assert len(norms) >= 3  # online encoder; target copies add more
        seen = []
        for bn in norms:
            bn.register_forward_hook(lambda m, i, o: seen.append((i[0].dtype, o.dtype)) and None)
        before = weights(a)
        for _ in range(3):
            a.train()
        assert seen, "no BatchNorm ran in the learner"
        assert set(seen) == {(torch.float32, torch.float32)}
        after = weights(a)
        assert all_finite(after) and not same(before, after)
        assert lrn.amp_scalers["default_policy"].optimizer_steps_lifetime > 0
    finally:
        a.stop()
