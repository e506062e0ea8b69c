"""Atari preprocessing and model presets."""

from __future__ import annotations

import numpy as np
import pytest

from rllib_amp import envs


def test_atari_env_has_deepmind_preprocessing():
    env = envs.AtariEnv({"id": "ALE/Pong-v5"})
    obs, _ = env.reset(seed=0)
    assert obs.shape == (84, 84, 4) and obs.dtype == np.float32
    assert env.observation_space.shape == (84, 84, 4)
    names = []
    e = env
    while hasattr(e, "env"):
        names.append(type(e).__name__)
        e = e.env
    for wrapper in (
        "FrameStack",
        "NoopResetEnv",
        "MaxAndSkipEnv",
        "GrayScaleAndResize",
        "EpisodicLifeEnv",
        "TransformReward",
    ):
        assert wrapper in names, names
    # The ALE itself skips no frames: the max-pooling wrapper does (frame skip 4).
    assert env.unwrapped._frameskip == 1
    rewards = set()
    for _ in range(400):
        obs, r, term, trunc, _ = env.step(env.action_space.sample())
        rewards.add(r)
        if term or trunc:
            env.reset()
    assert rewards <= {-1.0, 0.0, 1.0}  # clipped to the sign
    env.close()


def test_env_for_rllib_routes_atari_through_the_wrapper():
    assert envs.env_for_rllib("CartPole-v1", None) == ("CartPole-v1", {})
    env, cfg = envs.env_for_rllib("ALE/Breakout-v5", {"repeat_action_probability": 0.25})
    assert env is envs.AtariEnv
    assert cfg == {"id": "ALE/Breakout-v5", "repeat_action_probability": 0.25}


def test_unknown_env_id_suggests_nearest():
    with pytest.raises(ValueError, match="did you mean 'ALE/Pong-v5'"):
        envs.check_env_id("ALE/Pongg-v5")
