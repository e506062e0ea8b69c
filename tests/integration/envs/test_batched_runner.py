"""The batched sampler (rllib_amp.envs.batched_runner) gives the learner RLlib's episodes.

Both runners sample the same seeded native env with the same module weights and the same
random draws (torch is seeded at EnvRunner construction), so RLlib's runner and the batched
one take the same actions; their episodes must then agree element for element, across
several ``sample()`` calls (ongoing episodes continue), with terminations, truncations and
autoresets inside the calls. PPO, APPO and DQN train on the batched sampler, and checkpoints
move between the two samplers.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import numpy as np
import pytest
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

from rllib_amp import AmpSettings, with_amp
from rllib_amp import experiment as E
from rllib_amp.bench import sampling
from rllib_amp.envs import atari
from rllib_amp.envs.batched_runner import BatchedAleEnvRunner
from rllib_amp.learner.env_runner import AmpSingleAgentEnvRunner, forget_rllib_env_ids
from tests.integration.common import all_finite, same, train_until_learned, weights

# Breakout with a life per episode ends episodes within ~50 steps; 200 frames (50 agent
# steps) truncate the games that last longer, so one test sees both kinds of cut.
ENV_CONFIG = {"max_num_frames_per_episode": 200, "noop_max": 5}
CALLS = (25, 3, 40, 30)  # sample(num_timesteps=...) per call: cuts at odd places


def runner(
    sampler: str, *, algorithm: str = "PPO", num_envs: int = 2, seed: int = 7, amp: bool = False
):
    cfg = sampling.sampling_config(
        atari.NATIVE,
        env_id="ALE/Breakout-v5",
        num_envs=num_envs,
        num_cpus=1,
        algorithm=algorithm,
        env_config={**ENV_CONFIG, atari.SAMPLER_KEY: sampler},
    )
    cfg.debugging(seed=seed)
    if algorithm == "DQN":  # epsilon-greedy with an epsilon that matters
        cfg.training(epsilon=[(0, 0.5), (10_000, 0.05)])
    if amp:  # bfloat16 autocast inference
        cfg = with_amp(cfg, AmpSettings(dtype="bfloat16", inference_dtype="bfloat16"))
    forget_rllib_env_ids()  # RLlib's runner re-registers its env id: no gymnasium warning
    out = (cfg.env_runner_cls or SingleAgentEnvRunner)(config=cfg)
    rllibs = AmpSingleAgentEnvRunner if amp else SingleAgentEnvRunner
    assert type(out) is (BatchedAleEnvRunner if sampler == atari.BATCHED else rllibs)
    return out


def same_buffer(a, b, what: str) -> None:
    assert a.lookback == b.lookback, what
    if isinstance(a.data, list):
        assert isinstance(b.data, list) and len(a.data) == len(b.data), what
        for x, y in zip(a.data, b.data, strict=True):
            assert x.keys() == y.keys(), what
            for key in x:
                assert type(x[key]) is type(y[key]) and x[key] == y[key], (what, key)
        return
    a_data, b_data = np.asarray(a.data), np.asarray(b.data)
    assert a_data.dtype == b_data.dtype and a_data.shape == b_data.shape, what
    np.testing.assert_array_equal(a_data, b_data, err_msg=what)


def assert_same_episodes(mine: list[Any], rllib: list[Any], ids: dict[str, str]) -> None:
    """Element for element; ``ids`` maps RLlib's episode ids to ours (one to one)."""
    assert len(mine) == len(rllib)
    for a, b in zip(mine, rllib, strict=True):
        assert ids.setdefault(b.id_, a.id_) == a.id_, "an episode changed its id between chunks"
        what = f"episode {b.id_} t_started={b.t_started}"
        assert (a.t_started, a.t, len(a)) == (b.t_started, b.t, len(b)), what
        assert (a.is_terminated, a.is_truncated) == (b.is_terminated, b.is_truncated), what
        assert a.is_numpy and b.is_numpy
        for name in ("observations", "actions", "rewards", "infos"):
            same_buffer(getattr(a, name), getattr(b, name), f"{what}: {name}")
        assert a.extra_model_outputs.keys() == b.extra_model_outputs.keys(), what
        for key in b.extra_model_outputs:
            same_buffer(a.extra_model_outputs[key], b.extra_model_outputs[key], f"{what}: {key}")
    assert len(set(ids.values())) == len(ids), "two of RLlib's episodes became one"


def episode_metrics(r) -> dict[str, float]:
    m = r.get_metrics()
    keys = ("episode_return_mean", "episode_len_mean", "num_episodes_lifetime")
    return {k: m[k].peek() for k in keys if k in m} | {
        "steps": m["num_env_steps_sampled_lifetime"].peek()
    }


def sample_both(algorithm: str = "PPO", calls=CALLS, **kwargs):
    """(batched episodes per call, rllib episodes per call, both runners' metrics)."""
    out = {}
    for sampler in (atari.BATCHED, atari.RLLIB):
        r = runner(sampler, algorithm=algorithm, **kwargs)
        try:
            per_call = [r.sample(num_timesteps=n) for n in calls]
            out[sampler] = (per_call, episode_metrics(r), r)
        finally:
            r.stop()
    return out[atari.BATCHED], out[atari.RLLIB]


def test_batched_runner_gives_rllibs_episodes_element_for_element():
    (mine, mine_metrics, r), (rllib, rllib_metrics, _) = sample_both()
    ids: dict[str, str] = {}
    for a, b in zip(mine, rllib, strict=True):
        assert_same_episodes(a, b, ids)
    flat = [e for call in rllib for e in call]
    # The calls covered what the test is about: cuts of both kinds, chunks continuing.
    assert any(e.is_terminated for e in flat) and any(e.is_truncated for e in flat)
    assert any(e.t_started > 0 for e in flat)
    assert {e.get_observations().dtype for call in mine for e in call} == {np.dtype(np.uint8)}
    assert {"action_logp", "action_dist_inputs"} <= set(flat[0].extra_model_outputs)
    # Episode metrics and step counts: the same numbers, under RLlib's keys.
    assert mine_metrics == rllib_metrics
    assert mine_metrics["num_episodes_lifetime"] > 0
    assert r.batched_unsupported is None


def weight_casts_in_a_call(r, steps: int) -> tuple[int, int]:
    """(weight casts to 16 bits in one sample() of ``steps`` steps per env, weights)."""
    import torch

    r.sample(num_timesteps=4)
    shapes = [list(p.shape) for p in r.module.parameters()]
    with torch.profiler.profile(record_shapes=True) as prof:
        r.sample(num_timesteps=steps * r.num_envs)
    casts = sum(
        e.count
        for e in prof.key_averages(group_by_input_shape=True)
        if e.key == "aten::_to_copy" and e.input_shapes and e.input_shapes[0] in shapes
    )
    return casts, len(shapes)


@pytest.mark.parametrize("sampler", [atari.BATCHED, atari.RLLIB])
def test_bfloat16_inference_casts_each_weight_once_per_sample_call_with_rllibs_episodes(sampler):
    import torch

    # Both AMP runners enter one autocast region per sample() call: each weight is cast to
    # bfloat16 once per call (20 steps here), not once per step as the forward passes' own
    # regions alone would (RLlib's loop without the outer region: 20 casts per weight).
    r = runner(sampler, amp=True)
    try:
        assert r.amp_inference_precision.dtype == torch.bfloat16
        casts, weights = weight_casts_in_a_call(r, 20)
        assert weights <= casts <= weights + 2, (casts, weights)
        r.sample = lambda **kw: SingleAgentEnvRunner.sample(r, **kw)  # no outer region
        casts, _ = weight_casts_in_a_call(r, 20)
        assert casts >= 15 * weights, (casts, weights)
    finally:
        r.stop()
    # The same episodes as without the outer region (RLlib's runner, per-step regions only).
    out = []
    for outer in (True, False):
        r = runner(sampler, amp=True)
        try:
            call = r.sample if outer else functools.partial(SingleAgentEnvRunner.sample, r)
            out.append([call(num_timesteps=n) for n in CALLS])
        finally:
            r.stop()
    ids: dict[str, str] = {}
    for a, b in zip(*out, strict=True):
        assert_same_episodes(a, b, ids)
    if sampler == atari.BATCHED:  # and RLlib's runner's episodes, the batched sampler's
        (mine, _, _), (rllib, _, _) = sample_both(amp=True)
        ids = {}
        for a, b in zip(mine, rllib, strict=True):
            assert_same_episodes(a, b, ids)


@pytest.mark.slow
def test_dqn_epsilon_greedy_and_random_actions_match_rllib():
    out = []
    for sampler in (atari.BATCHED, atari.RLLIB):
        r = runner(sampler, algorithm="DQN", num_envs=2, seed=3)
        r.env.action_space.seed(5)  # random_actions draw from the env's action space
        try:
            calls = [r.sample(num_timesteps=24, random_actions=True)]
            calls += [r.sample(num_timesteps=n) for n in (50, 33)]
            out.append(calls)
        finally:
            r.stop()
    ids: dict[str, str] = {}
    for a, b in zip(*out, strict=True):
        assert_same_episodes(a, b, ids)
    actions = np.concatenate([e.get_actions() for e in out[1][1]])
    assert len(set(actions.tolist())) > 1  # exploring, not one argmax action


@pytest.mark.slow
def test_sample_episodes_and_inference_fall_back_or_match():
    # num_episodes runs RLlib's own loop; explore=False (deterministic actions) is batched.
    out = []
    for sampler in (atari.BATCHED, atari.RLLIB):
        r = runner(sampler, num_envs=2, seed=1)
        try:
            calls = [r.sample(num_timesteps=30, explore=False), r.sample(num_episodes=2)]
            calls.append(r.sample(num_timesteps=20))
            out.append(calls)
        finally:
            r.stop()
    ids: dict[str, str] = {}
    for a, b in zip(*out, strict=True):
        assert_same_episodes(a, b, ids)


@pytest.mark.parametrize(
    "sampler", [atari.BATCHED, pytest.param(atari.RLLIB, marks=pytest.mark.slow)]
)
def test_state_round_trips_between_the_two_runners(sampler):
    other = atari.RLLIB if sampler == atari.BATCHED else atari.BATCHED
    a, b = runner(sampler, seed=1), runner(other, seed=2)
    try:
        a.sample(num_timesteps=8)
        b.set_state(a.get_state())
        state_a, state_b = a.get_state(), b.get_state()
        assert state_a.keys() == state_b.keys()
        weights_a = state_a["rl_module"]
        for key, value in weights_a.items():
            np.testing.assert_array_equal(value, state_b["rl_module"][key])
        assert b.sample(num_timesteps=8)
    finally:
        a.stop()
        b.stop()


@pytest.mark.slow
def test_a_failed_env_step_restarts_the_envs_as_rllib_does(monkeypatch):
    r = runner(atari.BATCHED, num_envs=2)
    r.config.restart_failed_sub_environments = True
    try:
        r.sample(num_timesteps=6)
        ale_cls = type(r.env.unwrapped)
        real_step, calls = ale_cls.step, []

        def flaky(self, actions):
            calls.append(1)
            if len(calls) == 3:
                raise RuntimeError("emulator crashed")
            return real_step(self, actions)

        monkeypatch.setattr(ale_cls, "step", flaky)
        episodes = r.sample(num_timesteps=10)
        assert len(calls) > 3  # it went on after the failure, on a new env
        # The steps before the failure are dropped with their episodes: fresh episodes only.
        assert all(e.t_started == 0 for e in episodes)
        assert sum(len(e) for e in episodes) >= 10
        assert r.get_metrics()["num_env_step_failures"].peek() == 1
    finally:
        r.stop()


# PPO, APPO and DQN train on the batched sampler, and checkpoints move between the samplers.
#
# Tiny on purpose (mini preset, 2 envs, tiny batches): what is checked is that each algorithm
# trains on the batched runner's episodes, that results keep RLlib's keys, and that a checkpoint
# saved on one sampler restores on the other, not learning.


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
@pytest.mark.usefixtures("ray_local")
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
@pytest.mark.usefixtures("ray_local")
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
@pytest.mark.usefixtures("ray_local")
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
