"""Random input: AmpSettings and the experiment loader accept-and-validate or raise ValueError."""

from __future__ import annotations

import copy

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from rllib_amp import AmpSettings
from rllib_amp import experiment as E

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
    exp.tune_param_space()
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
