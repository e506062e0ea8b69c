"""Atari preprocessing and model presets."""

from __future__ import annotations

import numpy as np
import pytest
import torch

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


@pytest.mark.parametrize("algo", ["PPO", "DQN"])
@pytest.mark.parametrize(
    "preset, lo, hi",
    [("mini", 0.3e6, 0.7e6), ("full", 2e6, 6e6), ("high", 8e6, 12e6)],
)
def test_image_preset_sizes_are_in_their_ranges(algo, preset, lo, hi):
    n = envs.count_parameters(algo, preset, image=True)
    assert lo <= n <= hi, f"{algo} {preset}: {n:,}"


def test_vector_presets_grow_with_size():
    sizes = [envs.count_parameters("PPO", p, image=False) for p in envs.PRESETS]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]


def test_batchnorm_inserted_after_every_conv():
    module_cls = envs.batchnorm_module_class("DQN")
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    cfg = DQNConfig().rl_module(
        model_config=envs.model_config("mini", image=True),
        rl_module_spec=RLModuleSpec(module_class=module_cls),
    )
    import gymnasium as gym

    module = cfg.get_rl_module_spec(
        spaces={"default_policy": (envs.ATARI_OBS_SPACE, gym.spaces.Discrete(6))}
    ).build()
    layers = [m for m in module.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.BatchNorm2d))]
    kinds = [type(m).__name__ for m in layers]
    assert kinds == ["Conv2d", "BatchNorm2d"] * 3
    assert envs.count_parameters("DQN", "mini", batchnorm=True) > envs.count_parameters(
        "DQN", "mini"
    )


def test_main_prints_every_preset(capsys):
    assert envs.main(["--algorithms", "PPO"]) == 0
    out = capsys.readouterr().out
    for preset in envs.PRESETS:
        assert preset in out
    assert "84x84x4" in out and "vector" in out
