"""ALE's native vector env (rllib_amp.envs.atari): DeepMind preprocessing, options and errors."""

from __future__ import annotations

import numpy as np
import pytest
from ray.rllib.algorithms.dqn import DQNConfig
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

from rllib_amp.algorithms import algorithm
from rllib_amp.envs import atari
from rllib_amp.envs import configure as envs


def make(game: str = "Breakout", num_envs: int = 4, **options) -> atari.AleVectorEnv:
    return atari.AleVectorEnv({"id": f"ALE/{game}-v5", "num_envs": num_envs, **options})


def run(env, steps: int, *, seed: int = 0, action: int | None = None):
    """Steps ``env``; yields (obs, reward, terminated, truncated, info) per step."""
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        if action is None:
            actions = rng.integers(0, env.single_action_space.n, env.num_envs)
        else:
            actions = np.full(env.num_envs, action, np.int64)
        yield env.step(actions)


def test_observations_are_uint8_84x84_with_the_newest_frame_last():
    env = make("Pong", num_envs=2)
    obs, _ = env.reset(seed=0)
    assert obs.shape == (2, 84, 84, 4) and obs.dtype == np.uint8
    assert env.single_observation_space.shape == (84, 84, 4)
    assert env.single_observation_space.dtype == np.uint8
    prev = obs.copy()
    for obs, *_ in run(env, 40):
        assert env.observation_space.contains(obs)
        # The stack shifts by one frame per step: channel i now is channel i + 1 before.
        np.testing.assert_array_equal(obs[..., :-1], prev[..., 1:])
        prev = obs.copy()
    # A real screen, not a blank: gray levels span a range (Pong: background, bats, score).
    assert len(np.unique(obs[..., -1])) > 3


def test_rewards_are_float32_and_clipped_unless_turned_off():
    seen = {}
    for clip in (True, False):
        env = make("SpaceInvaders", num_envs=2, reward_clipping=clip)
        env.reset(seed=0)
        rewards = np.concatenate([r for _, r, *_ in run(env, 300)])
        assert rewards.dtype == np.float32
        seen[clip] = set(rewards.tolist())
    assert seen[True] <= {-1.0, 0.0, 1.0} and 1.0 in seen[True]
    assert max(seen[False]) > 1.0  # Space Invaders pays 5-30 points per alien


def test_without_episodic_life_an_episode_ends_at_game_over():
    env = make("Breakout", num_envs=2, episodic_life=False)
    env.reset(seed=0)
    ends = 0
    for _, _, terminated, truncated, info in run(env, 1500):
        assert not truncated.any()
        # A termination is a game over (no lives left); a life loss alone is no termination.
        assert (info["lives"][terminated] == 0).all()
        ends += int(terminated.sum())
        if ends >= 2:
            break
    assert ends >= 2


def test_with_episodic_life_each_life_is_an_episode_and_the_game_goes_on():
    env = make("Breakout", num_envs=1)  # episodic_life defaults to True, as in the wrappers
    _, info = env.reset(seed=0)
    lives = [int(info["lives"][0])]
    assert lives == [5]
    restart_lives = []
    just_ended = False
    for _, _, terminated, _, info in run(env, 2000):
        if just_ended:
            restart_lives.append(int(info["lives"][0]))
        just_ended = bool(terminated[0])
        if just_ended:
            lives.append(int(info["lives"][0]))
            if lives[-1] == 0:
                break
    # One termination per life: 4, 3, 2, 1 lives left, then game over.
    assert lives == [5, 4, 3, 2, 1, 0]
    # After a life loss the same game goes on (no reset to 5 lives); after game over it resets.
    assert restart_lives[:4] == [4, 3, 2, 1]


def test_noop_starts_vary_the_first_frame_and_respect_noop_max():
    starts = {}
    for noop_max, num_envs in ((0, 2), (30, 8)):
        env = make("Pong", num_envs=num_envs, noop_max=noop_max, use_fire_reset=False)
        _, info = env.reset(seed=0)
        starts[noop_max] = info["episode_frame_number"]
    assert set(starts[0].tolist()) == {0}
    # Up to 30 no-op agent steps of 4 frames each, different per env.
    assert len(set(starts[30].tolist())) > 3
    assert starts[30].max() <= 30 * 4


def test_fire_reset_launches_the_ball():
    # Breakout's ball only moves after FIRE: with FIRE on reset a do-nothing agent loses
    # lives; without it, it never does.
    for fire, loses in ((True, True), (False, False)):
        env = make("Breakout", num_envs=2, use_fire_reset=fire, noop_max=0)
        env.reset(seed=0)
        lost = np.zeros(2, bool)
        for _, _, terminated, _, _ in run(env, 150, action=0):
            lost |= terminated
        assert lost.all() == loses and lost.any() == loses


def test_options_reach_the_ale():
    env = make("Pong", num_envs=3, repeat_action_probability=0.25, num_threads=1, stack_num=2)
    kw = env.ale_kwargs
    assert kw["repeat_action_probability"] == 0.25 and kw["num_threads"] == 1
    assert env.single_observation_space.shape == (84, 84, 2)
    defaults = make("Pong", num_envs=3).ale_kwargs
    assert defaults["repeat_action_probability"] == 0.0 and defaults["life_loss_info"]
    assert 1 <= defaults["num_threads"] <= 3  # never more threads than envs


# -- configure_env: routing and errors ----------------------------------------------------------
def test_configure_env_defaults_ale_ids_to_the_native_path_with_a_uint8_module():
    cfg = PPOConfig()
    envs.configure_env(cfg, "ALE/Pong-v5", {"episodic_life": False})
    assert cfg.env is atari.AleVectorEnv
    assert cfg.env_config == {"id": "ALE/Pong-v5", "episodic_life": False}
    assert cfg.gym_env_vectorize_mode == "vector_entry_point"
    assert cfg._rl_module_spec.module_class is algorithm("PPO").uint8_module


class MyRunner(SingleAgentEnvRunner):
    """A user's own EnvRunner."""


def test_native_path_samples_batched_unless_the_sampler_says_rllib():
    from rllib_amp import with_amp
    from rllib_amp.envs.batched_runner import BatchedAleEnvRunner
    from rllib_amp.learner.env_runner import AmpSingleAgentEnvRunner

    cfg = PPOConfig()
    envs.configure_env(cfg, "ALE/Pong-v5", None)
    assert cfg.env_runner_cls is BatchedAleEnvRunner
    assert "sampler" not in cfg.env_config  # the env never sees it
    # with_amp after configure_env keeps the batched runner (it does AMP inference itself);
    # configure_env after with_amp replaces the AMP runner with it.
    assert with_amp(cfg).env_runner_cls is BatchedAleEnvRunner
    amp_first = with_amp(PPOConfig())
    envs.configure_env(amp_first, "ALE/Pong-v5", {"sampler": "batched"})
    assert amp_first.env_runner_cls is BatchedAleEnvRunner
    # sampler: rllib is RLlib's loop: the AMP runner with AMP, RLlib's own without.
    envs.configure_env(amp_first, "ALE/Pong-v5", {"sampler": "rllib"})
    assert amp_first.env_runner_cls is AmpSingleAgentEnvRunner
    stock = PPOConfig()
    envs.configure_env(stock, "ALE/Pong-v5", {"sampler": "rllib"})
    assert stock.env_runner_cls is None
    # The wrappers path and other envs never get it; a user's own EnvRunner stays.
    for env_id, env_config in (("ALE/Pong-v5", {"preprocessing": "wrappers"}), ("CartPole-v1", {})):
        other = PPOConfig()
        envs.configure_env(other, "ALE/Pong-v5", None)
        envs.configure_env(other, env_id, env_config)
        assert other.env_runner_cls is None
    mine = PPOConfig().env_runners(env_runner_cls=MyRunner)
    envs.configure_env(mine, "ALE/Pong-v5", None)
    assert mine.env_runner_cls is MyRunner


def test_configure_env_wrappers_path_is_todays_float32_path():
    cfg = DQNConfig()
    envs.configure_env(
        cfg, "ALE/Breakout-v5", {"preprocessing": "wrappers", "repeat_action_probability": 0.25}
    )
    assert cfg.env is envs.AtariEnv
    assert cfg.env_config == {"id": "ALE/Breakout-v5", "repeat_action_probability": 0.25}
    assert cfg.gym_env_vectorize_mode == "sync" and cfg._rl_module_spec is None
    cartpole = PPOConfig()
    envs.configure_env(cartpole, "CartPole-v1", {})
    assert cartpole.env == "CartPole-v1" and cartpole.gym_env_vectorize_mode == "sync"


@pytest.mark.parametrize(
    "env_config, names",
    [
        ({"mode": 2}, ["env_config.mode", "preprocessing: wrappers"]),
        ({"difficulty": 1}, ["env_config.difficulty", "preprocessing: wrappers"]),
        ({"noop_maxx": 10}, ["env_config.noop_maxx", "did you mean 'noop_max'"]),
        ({"episodic_life": "yes"}, ["env_config.episodic_life", "true or false"]),
        ({"repeat_action_probability": 2}, ["env_config.repeat_action_probability", "[0, 1]"]),
        ({"num_threads": 0}, ["env_config.num_threads", ">= 1"]),
        ({"preprocessing": "python"}, ["env_config.preprocessing", "native | wrappers"]),
        ({"sampler": "fast"}, ["env_config.sampler", "got 'fast'", "batched | rllib"]),
        ({"sampler": {"grid_search": ["batched", "rllib"]}}, ["env_config.sampler", "fixed"]),
        (
            {"preprocessing": "wrappers", "sampler": "batched"},
            ["env_config.sampler", "preprocessing: native"],
        ),
        ({"samplr": "rllib"}, ["env_config.samplr", "did you mean 'sampler'"]),
    ],
)
def test_options_the_native_env_cannot_honour_are_clear_errors(env_config, names):
    with pytest.raises(ValueError) as e:
        envs.configure_env(PPOConfig(), "ALE/Pong-v5", env_config)
    for name in names:
        assert name in str(e.value)


def test_native_options_the_wrappers_cannot_change_are_clear_errors():
    with pytest.raises(ValueError, match=r"env_config\.noop_max.*preprocessing: native"):
        envs.configure_env(PPOConfig(), "ALE/Pong-v5", {"preprocessing": "wrappers", "noop_max": 5})
    # What the wrappers do anyway is accepted.
    envs.configure_env(PPOConfig(), "ALE/Pong-v5", {"preprocessing": "wrappers", "noop_max": 30})


def test_the_env_itself_checks_options_it_is_given_directly():
    with pytest.raises(ValueError, match=r"env_config\.obs_type"):
        make("Pong", obs_type="rgb")


def test_sampling_one_times_one_env_runner_on_either_path():
    import torch

    from rllib_amp.bench import sampling
    from rllib_amp.envs.batched_runner import BatchedAleEnvRunner

    threads = torch.get_num_threads()
    paths = {
        (atari.NATIVE, None): (atari.AleVectorEnv, BatchedAleEnvRunner),
        (atari.NATIVE, atari.RLLIB): (atari.AleVectorEnv, None),
        (atari.WRAPPERS, None): (envs.AtariEnv, None),
    }
    for (path, sampler), (env_cls, runner_cls) in paths.items():
        cfg = sampling.sampling_config(path, num_envs=2, num_cpus=1, sampler=sampler)
        assert cfg.env is env_cls and cfg.env_runner_cls is runner_cls
        per_s, per_cpu_s = sampling.sampling_one(path, 2, 16, "mini", sampler, num_cpus=1)
        assert per_s > 0 and per_cpu_s > 0
    assert torch.get_num_threads() == threads
