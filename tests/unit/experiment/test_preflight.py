"""Pre-flight: every config a sweep can produce is built and validated, without Ray."""

from __future__ import annotations

import glob
import importlib
import os

import pytest

from rllib_amp import experiment as E
from rllib_amp.experiment.results import catalog

# The module (imported by name: the package does not import it, so there is no cycle).
P = importlib.import_module("rllib_amp.experiment.preflight")

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "tune_configs", "*.yaml")))
BASE = {
    "algorithm": "PPO",
    "env": "CartPole-v1",
    "model": {"fcnet_hiddens": [8]},
    "amp": {"dtype": "float16"},
    "training": {"train_batch_size_per_learner": 64, "minibatch_size": 32, "num_epochs": 1},
    "resources": {"num_env_runners": 0},
    "stop": {"training_iteration": 1},
}


@pytest.fixture(autouse=True)
def _ray_stays_down():
    import ray

    was_up = ray.is_initialized()
    yield
    assert ray.is_initialized() == was_up, "pre-flight started Ray"


def exp(**sections):
    return E.Experiment(E.validate({**BASE, **sections}, "<t>"), "<t>")


def refused(experiment) -> str:
    with pytest.raises(E.ExperimentError) as e:
        P.preflight(experiment)
    msg = str(e.value)
    assert msg.startswith("<t>: ") and "\n" not in msg, msg
    return msg


@pytest.mark.parametrize("path", CONFIGS, ids=[os.path.basename(c) for c in CONFIGS])
def test_every_shipped_config_passes_preflight(path):
    summary = P.preflight(E.load(path))
    assert "built and validated by RLlib" in summary


def test_preflight_prints_nothing_on_stderr_even_for_atari(capfd):
    P.preflight(E.load(os.path.join(ROOT, "tune_configs", "pong_ppo_amp.yaml")))
    assert capfd.readouterr().err == ""  # no RLlib warnings, no ALE banner on fd 2


# -- which configs get built -----------------------------------------------------------------
def test_grids_are_built_fully_and_ranges_at_their_edges_plus_seeded_draws():
    search = {
        "seed": E.Sampler.parse({"grid": [0, 1, 2]}),
        "training.lr": E.Sampler.parse({"loguniform": [1e-5, 1e-3]}),
        "amp.growth_interval": E.Sampler.parse({"randint": [10, 20]}),
    }
    points = P.sweep_points(search)
    assert points == P.sweep_points(search)  # seeded
    assert {p["seed"] for p in points} == {0, 1, 2}
    lrs = {p["training.lr"] for p in points}
    assert {1e-5, 1e-3} <= lrs and len(lrs) == 2 + P.RANGE_DRAWS
    assert all(1e-5 <= lr <= 1e-3 for lr in lrs)
    intervals = {p["amp.growth_interval"] for p in points}
    assert {10, 19} <= intervals and all(isinstance(i, int) and 10 <= i < 20 for i in intervals)
    assert len(points) == 3 * len(lrs) * len(intervals)  # every combination: few of them


def test_a_large_sweep_still_covers_every_grid_point_and_value():
    search = {
        "seed": E.Sampler.parse({"grid": list(range(20))}),
        "training.num_epochs": E.Sampler.parse({"grid": [1, 2, 3, 4]}),
        "amp.init_scale": E.Sampler.parse({"choice": [2.0**k for k in range(30)]}),
    }
    points = P.sweep_points(search)
    assert len(points) <= P.MAX_POINTS
    grid = {(p["seed"], p["training.num_epochs"]) for p in points}
    assert len(grid) == 80
    assert {p["amp.init_scale"] for p in points} == {2.0**k for k in range(30)}


def test_a_value_rllib_rejects_at_one_grid_point_is_found():
    msg = refused(exp(search={"training.entropy_coeff": {"grid": [0.0, -0.5]}}))
    assert "<t>: training.entropy_coeff: RLlib's config.validate() failed" in msg
    assert "training.entropy_coeff=-0.5" in msg and "fix training.entropy_coeff" in msg


def test_a_continuous_sampler_is_checked_at_its_edges():
    msg = refused(exp(search={"training.entropy_coeff": {"uniform": [-0.1, 0.1]}}))
    assert "training.entropy_coeff=-0.1" in msg


def test_builder_errors_name_the_key():
    msg = refused(exp(search={"training.grad_clip_by": {"grid": ["norm", "sideways"]}}))
    assert "training.grad_clip_by: building the AlgorithmConfig failed" in msg
    assert "sideways" in msg


# -- the env and the module -------------------------------------------------------------------
def test_an_env_config_the_env_rejects_is_named():
    msg = refused(exp(env_config={"foo": 1}))
    assert "<t>: env_config.foo: constructing CartPole-v1 with env_config failed" in msg
    assert "unexpected keyword argument 'foo'" in msg


def test_every_env_config_a_search_produces_is_constructed():
    msg = refused(exp(search={"env_config.max_episode_steps": {"grid": [50, -5]}}))
    assert "env_config.max_episode_steps" in msg and "-5" in msg


def test_an_atari_env_config_is_checked_with_the_env_the_config_builds():
    # RLlib's wrappers path: the env itself refuses the option when pre-flight builds it.
    wrappers = {"preprocessing": "wrappers", "obs_type": "smell"}
    msg = refused(exp(env="ALE/Pong-v5", model="mini", env_config=wrappers))
    assert "<t>: env_config: constructing ALE/Pong-v5 with env_config failed" in msg
    assert "Invalid observation type: smell" in msg
    # ALE's native vector env (the default) has no such option: named, with the fix.
    msg = refused(exp(env="ALE/Pong-v5", model="mini", env_config={"obs_type": "smell"}))
    assert "<t>: env_config.obs_type:" in msg and "native" in msg


@pytest.mark.parametrize(
    "model, fragment",
    [
        ({"fcnet_hiddens": [0]}, "IndexError"),
        ({"fcnet_hiddens": ["a"]}, "invalid literal for int()"),
        ({"fcnet_activation": "sigmoidal"}, "Unknown activation (sigmoidal)"),
    ],
)
def test_a_model_rllib_cannot_build_is_named(model, fragment):
    msg = refused(exp(model=model))
    assert "building the RLModule failed" in msg and fragment in msg


def test_dqn_on_a_continuous_action_space_is_refused():
    msg = refused(exp(algorithm="DQN", env="Pendulum-v1", training={}))
    assert "building the RLModule failed" in msg and "'Box' object has no attribute 'n'" in msg


def test_env_and_module_are_built_once_per_distinct_variant(monkeypatch):
    calls = []
    real = P._build_runtime
    monkeypatch.setattr(P, "_build_runtime", lambda *a: calls.append(a[1]) or real(*a))
    P.preflight(exp(search={"seed": {"grid": [0, 1, 2]}, "training.lr": {"grid": [1e-3, 1e-4]}}))
    assert len(calls) == 1
    calls.clear()
    P.preflight(exp(search={"model.fcnet_hiddens": {"grid": [[8], [16]]}}))
    assert len(calls) == 2


# -- stop keys and the metric -------------------------------------------------------------
@pytest.mark.parametrize(
    "stop, near",
    [
        ("episode_reward_mean", "env_runners/episode_return_mean"),
        ("timesteps_total", "num_env_steps_sampled_lifetime"),
        ("env_runners/episode_retrun_mean", "env_runners/episode_return_mean"),
        ("training_iterations", "training_iteration"),
        (
            "num_env_steps_trained_lifetime",
            "learners/__all_modules__/num_env_steps_trained_lifetime",
        ),
    ],
)
def test_a_stop_key_the_algorithm_never_reports_is_refused_with_the_nearest(stop, near):
    msg = refused(exp(stop={stop: 1}))
    assert f"<t>: stop.{stop}: PPO never reports '{stop}'" in msg
    assert f"(did you mean '{near}'?)" in msg
    assert near in catalog("PPO").suggestions


def test_an_unknown_metric_is_refused_with_the_nearest():
    msg = refused(exp(tune={"metric": "learners/default_policy/amp_grad_scal"}))
    assert "<t>: tune.metric: PPO never reports" in msg
    assert "(did you mean 'learners/default_policy/amp_grad_scale'?)" in msg


def test_keys_of_another_algorithm_are_refused():
    assert catalog("DQN").accepts("learners/default_policy/qf_loss")
    msg = refused(exp(stop={"learners/default_policy/qf_loss": 0.1}))
    assert "PPO never reports" in msg


def test_reported_keys_and_config_keys_pass():
    P.preflight(
        exp(
            stop={"env_runners/episode_return_mean": 400, "time_total_s": 60, "config/lr": 1},
            tune={"metric": "learners/default_policy/amp_grad_scale", "mode": "min"},
        )
    )
    assert "config/nope" in refused(exp(stop={"config/nope": 1}))
