"""PPO, APPO and DQN train on the batched sampler, and checkpoints move between the samplers.

Tiny on purpose (mini preset, 2 envs, tiny batches): what is checked is that each algorithm
trains on the batched runner's episodes, that results keep RLlib's keys, and that a checkpoint
saved on one sampler restores on the other, not learning.
"""

from __future__ import annotations

import os

import pytest

from rllib_amp import experiment as E
from rllib_amp.envs import atari
from rllib_amp.envs.batched_runner import BatchedAleEnvRunner
from rllib_amp.learner.env_runner import AmpSingleAgentEnvRunner
from tests.integration.common import all_finite, same, train_until_learned, weights

pytestmark = pytest.mark.usefixtures("ray_local")
ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
LOCAL = {
    "amp.dtype": "bfloat16",
    "resources.num_env_runners": 0,
    "resources.num_learners": 0,
    "resources.num_gpus_per_learner": 0,
    "resources.num_envs_per_env_runner": 2,
    "model.preset": "mini",
}
RUNNER = {atari.BATCHED: BatchedAleEnvRunner, atari.RLLIB: AmpSingleAgentEnvRunner}


def build(name: str, sampler: str, **overrides):
    exp = E.load(
        os.path.join(ROOT, "tune_configs", name),
        overrides={**LOCAL, "env_config.sampler": sampler, **overrides},
    )
    cfg = exp.algorithm_config()
    assert cfg.env_runner_cls is RUNNER[sampler]
    return cfg


def ppo(sampler: str):
    return build(
        "pong_ppo_amp.yaml",
        sampler,
        **{
            "training.train_batch_size_per_learner": 64,
            "training.minibatch_size": 32,
            "training.num_epochs": 1,
        },
    ).build_algo()


@pytest.mark.slow
def test_ppo_checkpoints_restore_across_the_two_samplers(tmp_path):
    batched, rllib = ppo(atari.BATCHED), ppo(atari.RLLIB)
    try:
        assert isinstance(batched.env_runner, BatchedAleEnvRunner)
        assert batched.env_runner.batched_unsupported is None
        result = batched.train()
        batched.save_to_path(str(tmp_path / "batched"))
        # batched -> rllib: the weights arrive, and training goes on on RLlib's loop.
        rllib.restore_from_path(str(tmp_path / "batched"))
        assert same(weights(rllib), weights(batched))
        other = rllib.train()
        assert all_finite(weights(rllib)) and not same(weights(rllib), weights(batched))
        # Results keep RLlib's keys: stop keys and Tune metrics read the same names.
        assert set(result["env_runners"]) == set(other["env_runners"])
        steps = "num_env_steps_sampled_lifetime"
        assert result["env_runners"][steps] >= 64 and other["env_runners"][steps] >= 128
        # rllib -> batched.
        rllib.save_to_path(str(tmp_path / "rllib"))
        batched.restore_from_path(str(tmp_path / "rllib"))
        assert same(weights(batched), weights(rllib))
        batched.train()
        assert all_finite(weights(batched))
    finally:
        batched.stop()
        rllib.stop()


@pytest.mark.slow
def test_appo_trains_on_the_batched_sampler_in_a_remote_env_runner():
    cfg = build(
        "pong_appo_amp.yaml",
        atari.BATCHED,
        **{"resources.num_env_runners": 1, "training.train_batch_size_per_learner": 64},
    )
    cfg.env_runners(rollout_fragment_length=32, num_cpus_per_env_runner=1)
    cfg.reporting(min_time_s_per_iteration=0.5)
    algo = cfg.build_algo()
    try:
        before = weights(algo)
        result = train_until_learned(algo, max_tries=40)
        assert result["env_runners"]["num_env_steps_sampled_lifetime"] > 0
        after = weights(algo)
        assert all_finite(after) and not same(before, after)
    finally:
        algo.stop()


@pytest.mark.slow
def test_dqn_replay_buffer_takes_the_batched_episodes():
    cfg = build(
        "pong_dqn_amp.yaml",
        atari.BATCHED,
        **{
            "training.train_batch_size_per_learner": 16,
            "training.num_steps_sampled_before_learning_starts": 64,
        },
    )
    cfg.env_runners(rollout_fragment_length=32)
    cfg.reporting(min_sample_timesteps_per_iteration=0, min_time_s_per_iteration=0)
    algo = cfg.build_algo()
    try:
        before = weights(algo)
        for _ in range(4):  # 64 env steps each (2 envs x 32); updates start after 64
            algo.train()
        # Each env's chunks continue one Pong game (same id, matching ends), so the buffer
        # concatenates them: two episodes, every sampled step in them.
        stored = list(algo.local_replay_buffer.episodes)
        assert len(stored) == 2
        assert sum(len(e) for e in stored) == algo.local_replay_buffer.get_num_timesteps() >= 256
        after = weights(algo)
        assert all_finite(after) and not same(before, after)
    finally:
        algo.stop()
