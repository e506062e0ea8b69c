"""Random input: AmpSettings and the experiment loader accept-and-validate or raise ValueError."""

from __future__ import annotations

import copy
import re

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from rllib_amp import AmpSettings
from rllib_amp import experiment as E
from rllib_amp.sweep import schedulers

ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**6), max_value=10**6),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=5), st.integers(), max_size=2),
)
AMP_KEYS = list(AmpSettings.field_names()) + ["init_scal", "", "dtype "]


@settings(max_examples=400, deadline=None)
@given(st.dictionaries(st.sampled_from(AMP_KEYS), ANY, max_size=6))
def test_amp_settings_accept_valid_or_raise_value_error(d):
    try:
        s = AmpSettings.from_dict(d)
    except ValueError:
        return
    # Accepted: fully valid and stable through a round trip.
    assert AmpSettings.from_dict(s.to_dict()) == s
    assert s.init_scale > 0 and s.growth_factor > 1 and 0 < s.backoff_factor < 1
    assert isinstance(s.growth_interval, int) and s.growth_interval >= 1


BASE = {
    "algorithm": "PPO",
    "env": "CartPole-v1",
    "model": "mini",
    "amp": {"dtype": "float16"},
    "training": {"lr": 0.001, "train_batch_size_per_learner": 200, "minibatch_size": 50},
    "resources": {"num_env_runners": 0},
    "search": {"amp.init_scale": {"grid": [1024.0, 4096.0]}},
    "tune": {"num_samples": 1},
    "stop": {"training_iteration": 1},
    "checkpoint": {"frequency": 1},
    "seed": 0,
}
PATHS = [
    ("algorithm",),
    ("env",),
    ("model",),
    ("amp", "init_scale"),
    ("amp", "growth_interval"),
    ("amp", "dtype"),
    ("amp", "enabled"),
    ("training", "lr"),
    ("training", "train_batch_size_per_learner"),
    ("training", "minibatch_size"),
    ("training", "gamma"),
    ("resources", "num_env_runners"),
    ("resources", "num_learners"),
    ("search", "amp.init_scale"),
    ("search", "training.lr"),
    ("search", "tune.metric"),
    ("tune", "num_samples"),
    ("tune", "mode"),
    ("tune", "scheduler"),
    ("stop", "training_iteration"),
    ("checkpoint", "frequency"),
    ("checkpoint", "num_to_keep"),
    ("seed",),
    ("bogus",),
]
SAMPLER = st.dictionaries(
    st.sampled_from(["grid", "choice", "loguniform", "uniform", "randint", "nope"]),
    st.one_of(
        ANY,
        st.lists(st.floats(allow_nan=False), max_size=3),
        st.lists(st.integers(), min_size=2, max_size=2),
    ),
    min_size=0,
    max_size=2,
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.sampled_from(PATHS), st.one_of(ANY, SAMPLER)), max_size=4))
def test_experiment_loader_accepts_valid_or_raises_value_error(mutations):
    d = copy.deepcopy(BASE)
    for path, value in mutations:
        node = d
        for key in path[:-1]:
            node = node.setdefault(key, {}) if isinstance(node.get(key), dict) else node
        node[path[-1]] = value
    try:
        exp = E.Experiment(E.validate(d, "<prop>"), "<prop>")
    except ValueError as e:
        assert str(e).startswith("<prop>"), str(e)
        return
    # Accepted: it builds an RLlib config and a Tune search space, and its plain form
    # validates back to the same experiment.
    exp.algorithm_config()
    schedulers.param_space(exp)
    assert E.validate(exp.resolved(), "<prop>") == exp.data


@settings(max_examples=400, deadline=None)
@given(SAMPLER)
def test_sampler_parses_once_into_something_tune_can_sample_or_raises_value_error(spec):
    try:
        s = E.Sampler.parse(spec)
    except ValueError:
        return
    edges = s.edges()
    assert edges and s.grid_size() >= 1
    assert E.Sampler.parse(s.to_dict()) == s
    domain = s.to_tune()
    if s.kind == "grid":
        assert domain == {"grid_search": edges} and s.grid_size() == len(edges)
    elif s.kind == "choice":
        assert domain.sample() in edges
    else:
        assert min(edges) <= domain.sample() <= max(edges)


# -- any file the loader accepts: --dry-run builds it or refuses it in one line -----------------
VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**3), max_value=10**3),
    st.integers(min_value=2**31, max_value=2**1100),  # beyond int32, int64, float64
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=6),
    st.lists(st.integers(min_value=-4, max_value=64), max_size=3),
)
# Mostly values a sweep could use, so that many documents get past the schema to pre-flight.
NUMBER = st.one_of(
    st.integers(min_value=1, max_value=300),
    st.integers(min_value=1, max_value=300),
    st.floats(min_value=1e-6, max_value=1.0),
    VALUE,
)
STOP_KEYS = [
    "training_iteration",
    "time_total_s",
    "env_runners/episode_return_mean",
    "num_env_steps_sampled_lifetime",
    "episode_reward_mean",
    "timesteps_total",
    "config/lr",
    "learners/default_policy/qf_loss",
    "nope",
]
SEARCH_KEYS = [
    "amp.init_scale",
    "amp.growth_interval",
    "training.lr",
    "training.num_epochs",
    "training.train_batch_size_per_learner",
    "env_config.max_episode_steps",
    "model.fcnet_hiddens",
    "seed",
    "stop.training_iteration",
]
# Valid experiments to start from: each example changes a few keys of one of them.
BASES = [
    {
        "algorithm": algo,
        "env": env,
        "model": {"fcnet_hiddens": [8]} if env != "ALE/Pong-v5" else "mini",
        "amp": {"dtype": "float16"},
        "training": training,
        "resources": {"num_env_runners": 0},
        "search": {"amp.init_scale": {"grid": [256.0, 1024.0]}},
        "stop": {"training_iteration": 1},
        "seed": 0,
    }
    for algo, env, training in [
        ("PPO", "CartPole-v1", {"train_batch_size_per_learner": 64, "minibatch_size": 32}),
        ("DQN", "CartPole-v1", {"train_batch_size_per_learner": 16, "n_step": 1}),
        ("APPO", "Acrobot-v1", {"train_batch_size_per_learner": 64}),
        ("PPO", "Pendulum-v1", {"num_epochs": 1}),
        ("DQN", "ALE/Pong-v5", {"train_batch_size_per_learner": 16}),
    ]
]
# (path, values): what a mutation may write where; paths end in a key of a mapping.
MUTATIONS = st.one_of(
    st.tuples(st.just(("algorithm",)), st.one_of(st.sampled_from(["PPO", "DQN", "sac"]), VALUE)),
    st.tuples(
        st.just(("env",)),
        st.one_of(
            st.sampled_from(["CartPole-v1", "FrozenLake-v1", "MountainCarContinuous-v0"]), VALUE
        ),
    ),
    st.tuples(st.tuples(st.just("stop"), st.sampled_from(STOP_KEYS)), NUMBER),
    st.tuples(st.just(("tune", "metric")), st.one_of(st.sampled_from(STOP_KEYS), VALUE)),
    st.tuples(st.just(("tune", "mode")), st.sampled_from(["max", "min", "up"])),
    st.tuples(
        st.tuples(
            st.just("env_config"), st.sampled_from(["max_episode_steps", "foo", "frameskip"])
        ),
        NUMBER,
    ),
    st.tuples(
        st.just(("model", "fcnet_hiddens")),
        st.one_of(st.lists(st.integers(min_value=-1, max_value=16), max_size=2), VALUE),
    ),
    st.tuples(st.just(("model", "fcnet_activation")), st.sampled_from(["relu", "bogus"])),
    st.tuples(
        st.tuples(st.just("search"), st.sampled_from(SEARCH_KEYS)), st.one_of(SAMPLER, VALUE)
    ),
    st.tuples(
        st.tuples(
            st.just("training"),
            st.sampled_from(
                [
                    "lr",
                    "minibatch_size",
                    "num_epochs",
                    "entropy_coeff",
                    "grad_clip_by",
                    "n_step",
                    "gamma",
                ]
            ),
        ),
        st.one_of(NUMBER, st.sampled_from(["norm", "sideways"])),
    ),
    st.tuples(
        st.tuples(st.just("amp"), st.sampled_from(["dtype", "init_scale", "growth_interval"])),
        st.one_of(NUMBER, st.sampled_from(["bfloat16", "fp16", "fp8"])),
    ),
    st.tuples(
        st.tuples(
            st.just("resources"),
            st.sampled_from(["num_env_runners", "num_envs_per_env_runner", "num_gpus_per_learner"]),
        ),
        NUMBER,
    ),
    st.tuples(st.just(("seed",)), st.one_of(st.integers(min_value=-1, max_value=2**33), VALUE)),
    st.tuples(st.tuples(st.text(max_size=8)), VALUE),
)


@st.composite
def documents(draw):
    """One of BASES with up to three keys rewritten (or added) by MUTATIONS."""
    doc = copy.deepcopy(draw(st.sampled_from(BASES)))
    for path, value in draw(st.lists(MUTATIONS, max_size=3)):
        node = doc
        for key in path[:-1]:
            if not isinstance(node.get(key), dict):
                node[key] = {}
            node = node[key]
        node[path[-1]] = value
    return doc


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(documents())
def test_dry_run_of_any_loadable_file_exits_0_or_2_with_one_line(doc):
    import contextlib
    import io
    import os
    import tempfile
    from unittest import mock

    import ray
    import yaml

    from rllib_amp.experiment.reading import read_file
    from rllib_amp.sweep import main as cli

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "exp.yaml")
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(doc, f, sort_keys=False, allow_unicode=True)
        try:
            read_file(path)
        except E.ExperimentError:
            event("refused by the loader")
            return  # nothing for --dry-run to do
        out, err = io.StringIO(), io.StringIO()
        # --dry-run must never start Ray (a session Ray of other test files may be running).
        no_ray = mock.patch.object(ray, "init", side_effect=AssertionError("Ray was started"))
        with no_ray, contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            rc = cli.main(["--dry-run", "--config", path, "--storage-path", tmp])
    if rc == 0:
        event("built")
        assert "# pre-flight: " in out.getvalue()
        return
    lines = err.getvalue().splitlines()
    stage = re.search(r"(never reports|failed)", err.getvalue())
    event(f"refused: {stage.group(1) if stage else 'schema'}")
    assert rc == 2, (rc, err.getvalue())
    assert len(lines) == 1 and lines[0].startswith("python -m rllib_amp.tune: error: "), lines
