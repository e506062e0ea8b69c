"""The Pong experiments on ALE's native vector env: uint8 from env to learner, AMP, BatchNorm.

Small on purpose (mini preset, tiny batches): what is checked is where observations are
uint8 and that training and checkpoints work on the native path, not learning.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from ray.rllib.algorithms.algorithm import Algorithm

from rllib_amp import experiment as E
from rllib_amp.envs import atari
from rllib_amp.envs.batched_runner import BatchedAleEnvRunner
from rllib_amp.envs.models import Uint8ImageInput
from tests.integration.common import all_finite, learner, same, weights

pytestmark = pytest.mark.usefixtures("ray_local")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
LOCAL = {
    "amp.dtype": "bfloat16",
    "resources.num_env_runners": 0,
    "resources.num_learners": 0,
    "resources.num_gpus_per_learner": 0,
    "model.preset": "mini",
}


def load(name: str, **overrides):
    return E.load(os.path.join(ROOT, "tune_configs", name), overrides={**LOCAL, **overrides})


def record_network_inputs(algo_obj) -> list[tuple[torch.dtype, tuple[int, ...]]]:
    """(dtype, shape) of every observation batch entering the learner's image networks."""
    seen: list[tuple[torch.dtype, tuple[int, ...]]] = []
    module = learner(algo_obj).module["default_policy"]
    nets = [m for m in module.modules() if isinstance(m, Uint8ImageInput)]
    assert nets, "the learner's module does not take uint8 images"
    for net in nets:
        net.register_forward_pre_hook(
            lambda m, args: seen.append((args[0].dtype, tuple(args[0].shape))) and None
        )
    return seen


@pytest.fixture(scope="module")
def ppo(ray_local):
    exp = load(
        "pong_ppo_amp.yaml",
        **{
            "resources.num_envs_per_env_runner": 2,
            "training.train_batch_size_per_learner": 64,
            "training.minibatch_size": 32,
            "training.num_epochs": 1,
        },
    )
    a = exp.algorithm_config().build_algo()
    yield a
    a.stop()


def test_ppo_on_the_native_env_trains_on_uint8_batches(ppo):
    assert ppo.config.env is atari.AleVectorEnv
    # The batched sampler is the native path's default, and it does not fall back here.
    assert isinstance(ppo.env_runner, BatchedAleEnvRunner)
    assert ppo.env_runner.batched_unsupported is None
    seen = record_network_inputs(ppo)
    before = weights(ppo)
    ppo.train()
    assert seen, "no batch reached the learner's network"
    # Value pass (GAE) and minibatch updates alike: uint8, channels last.
    assert {dtype for dtype, _ in seen} == {torch.uint8}
    assert {shape[1:] for _, shape in seen} == {(84, 84, 4)}
    after = weights(ppo)
    assert all_finite(after) and not same(before, after)
    episodes = ppo.env_runner.sample(num_timesteps=8)
    assert all(e.get_observations().dtype == np.uint8 for e in episodes)


def test_ppo_checkpoint_on_the_native_env_restores_and_trains_on(ppo, tmp_path):
    ppo.save_to_path(str(tmp_path))
    saved = weights(ppo)
    restored = Algorithm.from_checkpoint(str(tmp_path))
    try:
        assert restored.config.env is atari.AleVectorEnv
        assert same(weights(restored), saved)
        seen = record_network_inputs(restored)
        restored.train()
        assert seen and {dtype for dtype, _ in seen} == {torch.uint8}
        assert all_finite(weights(restored))
    finally:
        restored.stop()


def test_pong_dqn_batchnorm_on_the_native_env_keeps_uint8_in_the_replay_buffer():
    exp = load(
        "pong_dqn_amp.yaml",
        **{
            "model.batchnorm": True,
            "training.train_batch_size_per_learner": 16,
            "training.num_steps_sampled_before_learning_starts": 64,
        },
    )
    cfg = exp.algorithm_config().env_runners(rollout_fragment_length=32)
    # One sample + update per train() call (DQN's default is 1000 env steps per iteration).
    cfg.reporting(min_sample_timesteps_per_iteration=0, min_time_s_per_iteration=0)
    a = cfg.build_algo()
    try:
        assert isinstance(a.env_runner, BatchedAleEnvRunner)
        lrn = learner(a)
        module = lrn.module["default_policy"]
        norms = [m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)]
        assert len(norms) >= 3  # online encoder; target copies add more
        bn_dtypes = []
        for bn in norms:
            bn.register_forward_hook(
                lambda m, i, o: bn_dtypes.append((i[0].dtype, o.dtype)) and None
            )
        seen = record_network_inputs(a)
        before = weights(a)
        scaler = lrn.amp_scalers["default_policy"]
        for _ in range(8):  # 32 env steps each; updates start after 64
            a.train()
            if scaler.optimizer_steps_lifetime >= 2:
                break
        assert scaler.optimizer_steps_lifetime >= 2
        assert bn_dtypes, "no BatchNorm ran in the learner"
        assert set(bn_dtypes) == {(torch.float32, torch.float32)}
        assert seen and {dtype for dtype, _ in seen} == {torch.uint8}
        stored = list(a.local_replay_buffer.episodes)
        assert stored
        assert {np.asarray(e.get_observations()).dtype for e in stored} == {np.dtype(np.uint8)}
        after = weights(a)
        assert all_finite(after) and not same(before, after)
    finally:
        a.stop()


def test_ale_threads_follow_the_cpus_ray_gives_an_env_runner(ray_local):
    @ray_local.remote
    def threads(num_envs: int) -> int:
        return atari.default_num_threads(num_envs)

    assert ray_local.get(threads.options(num_cpus=1).remote(16)) == 1
    assert ray_local.get(threads.options(num_cpus=2).remote(16)) == 2
    assert ray_local.get(threads.options(num_cpus=2).remote(1)) == 1
