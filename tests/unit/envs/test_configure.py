"""RLlib's Atari wrappers (the ``wrappers`` path) and env id checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from rllib_amp.envs import configure as envs


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


def test_wrappers_and_native_paths_give_the_network_the_same_numbers():
    # The wrappers normalise to x / 128 - 1; the native path keeps uint8 and the module
    # converts with the same formula, so a network sees the same range on either path.
    from rllib_amp.envs.models import uint8_to_input

    env = envs.AtariEnv({"id": "ALE/Pong-v5"})
    obs, _ = env.reset(seed=0)
    pixels = np.rint((obs + 1.0) * 128.0)
    assert pixels.min() >= 0 and pixels.max() <= 255
    np.testing.assert_array_equal((pixels / 128.0 - 1.0).astype(np.float32), obs)
    converted = uint8_to_input(torch.from_numpy(pixels.astype(np.uint8))).numpy()
    np.testing.assert_array_equal(converted, obs)
    env.close()


def test_unknown_env_id_suggests_nearest():
    with pytest.raises(ValueError, match="did you mean 'ALE/Pong-v5'"):
        envs.check_env_id("ALE/Pongg-v5")
