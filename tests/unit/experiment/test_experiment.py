"""The experiment file format: strict schema, clear errors, builder-built configs."""

from __future__ import annotations

import glob
import os
import textwrap

import pytest
from ray.rllib.algorithms.dqn import DQNConfig
from ray.rllib.algorithms.ppo import PPOConfig

from rllib_amp import experiment as E
from rllib_amp.envs import configure as envs
from rllib_amp.experiment import builder
from rllib_amp.settings import AMP_CONFIG_KEY, settings_from_config
from rllib_amp.sweep import schedulers

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CONFIGS = sorted(glob.glob(os.path.join(ROOT, "tune_configs", "*.yaml")))

GOOD = """
algorithm: PPO
env: CartPole-v1
model: mini
amp: {dtype: float16, init_scale: 1024}
training: {lr: 0.001, train_batch_size_per_learner: 200, minibatch_size: 50, num_epochs: 2}
resources: {num_env_runners: 0}
search:
  amp.init_scale: {grid: [256.0, 65536.0]}
  amp.growth_interval: {choice: [10, 100]}
  training.train_batch_size_per_learner: {grid: [100, 200]}
stop: {training_iteration: 2}
seed: 1
"""


def write(tmp_path, text, name="exp.yaml"):
    p = tmp_path / name
    p.write_text(textwrap.dedent(text))
    return str(p)


def test_every_shipped_config_loads_and_builds():
    assert len(CONFIGS) >= 5
    for path in CONFIGS:
        exp = E.load(path)
        config = exp.algorithm_config()
        config.validate()
        assert config.learner_class.__name__.startswith("Amp"), path
        assert exp.search, f"{path} sweeps nothing"
        space = schedulers.param_space(exp)
        assert space.learner_config_dict[AMP_CONFIG_KEY]
        with open(path, encoding="utf-8") as f:
            first = f.readline()
        assert first.startswith("#"), f"{path} must open with a comment saying what it is for"


def test_good_file_builds_through_builder_methods(tmp_path):
    exp = E.load(write(tmp_path, GOOD))
    cfg = exp.algorithm_config()
    assert isinstance(cfg, PPOConfig)
    assert cfg.lr == 0.001 and cfg.train_batch_size_per_learner == 200
    assert cfg.minibatch_size == 50 and cfg.num_epochs == 2
    assert cfg.num_env_runners == 0 and cfg.seed == 1
    assert cfg.model_config["fcnet_hiddens"] == [64, 64]
    s = settings_from_config(cfg)
    assert (s.dtype, s.init_scale) == ("float16", 1024.0)


def test_param_space_places_samplers_at_their_keys(tmp_path):
    from ray.tune.search.sample import Domain

    exp = E.load(write(tmp_path, GOOD))
    space = builder.initial_space(exp.data)  # the file's seed gives each sample its own
    assert set(space) == {
        "amp.init_scale",
        "amp.growth_interval",
        "training.train_batch_size_per_learner",
        "seed",
    }
    cfg = schedulers.param_space(exp)
    assert cfg.learner_config_dict[AMP_CONFIG_KEY]["init_scale"] == {
        "grid_search": [256.0, 65536.0]
    }
    assert isinstance(cfg.learner_config_dict[AMP_CONFIG_KEY]["growth_interval"], Domain)
    assert cfg.train_batch_size_per_learner == {"grid_search": [100, 200]}


def test_overrides_apply_and_validate(tmp_path):
    path = write(tmp_path, GOOD)
    exp = E.load(
        path, overrides=["amp.init_scale=2048", "training.lr=1e-4", "stop.training_iteration=5"]
    )
    assert exp.get("amp.init_scale") == 2048
    assert exp.get("training.lr") == 1e-4
    assert exp.stop == {"training_iteration": 5}
    assert E.load(path, overrides={"model.preset": "full"}).get("model.preset") == "full"
    with pytest.raises(E.ExperimentError, match=r"amp\.init_scale: got -1"):
        E.load(path, overrides=["amp.init_scale=-1"])
    with pytest.raises(E.ExperimentError, match="KEY=VALUE"):
        E.load(path, overrides=["amp.init_scale"])


def test_dqn_preset_uses_dueling_double_q_and_target_network(tmp_path):
    path = os.path.join(ROOT, "tune_configs", "pong_dqn_amp.yaml")
    exp = E.load(path)
    cfg = exp.algorithm_config()
    assert isinstance(cfg, DQNConfig)
    assert cfg.dueling and cfg.double_q and cfg.target_network_update_freq > 0
    # The file is Tianshou's recipe (no BatchNorm); the write-up's BatchNorm is one override.
    assert exp.get("model.batchnorm") is False
    bn = E.load(path, overrides={"model.batchnorm": True}).algorithm_config()
    assert bn.rl_module_spec.module_class.__name__ == "BatchNormDefaultDQNTorchRLModule"


BAD = [
    # (description, file text or None for "missing file", expected message fragment)
    (
        "unknown top key",
        GOOD + "algoritm: PPO\n",
        "algoritm: unknown key (did you mean 'algorithm'?)",
    ),
    (
        "unknown training key",
        GOOD.replace("lr: 0.001", "lrr: 0.001"),
        "training.lrr: unknown key (did you mean 'lr'?)",
    ),
    (
        "wrong type",
        GOOD.replace("lr: 0.001", "lr: fast"),
        "training.lr: got 'fast'; expected a number",
    ),
    (
        "invalid amp value",
        GOOD.replace("init_scale: 1024", "init_scale: 0"),
        "amp.init_scale: got 0.0; must be > 0",
    ),
    (
        "unknown amp key",
        GOOD.replace("init_scale: 1024", "init_scal: 1024"),
        "amp.init_scal: unknown AMP setting",
    ),
    (
        "unknown algorithm",
        GOOD.replace("algorithm: PPO", "algorithm: SAX"),
        "algorithm: 'SAX' is not supported",
    ),
    (
        "unknown env",
        GOOD.replace("CartPole-v1", "CartPol-v1"),
        "env: 'CartPol-v1' is not a registered gymnasium id (did you mean 'CartPole-v1'?)",
    ),
    (
        "empty search list",
        GOOD.replace("{grid: [100, 200]}", "{grid: []}"),
        "search.training.train_batch_size_per_learner: grid needs a non-empty list",
    ),
    (
        "lo >= hi",
        GOOD.replace("{grid: [256.0, 65536.0]}", "{loguniform: [65536, 256]}"),
        "loguniform needs lo < hi",
    ),
    (
        "unknown sampler",
        GOOD.replace("{choice: [10, 100]}", "{choise: [10, 100]}"),
        "unknown sampler 'choise' (did you mean 'choice'?)",
    ),
    (
        "invalid searched value",
        GOOD.replace("{choice: [10, 100]}", "{choice: [0, 100]}"),
        "amp.growth_interval: got 0",
    ),
    (
        "minibatch > batch",
        GOOD.replace("minibatch_size: 50", "minibatch_size: 150"),
        "training.minibatch_size: 150 is larger than the smallest train batch",
    ),
    (
        "bad preset",
        GOOD.replace("model: mini", "model: huge"),
        "model.preset: unknown preset 'huge'",
    ),
    ("no stop", GOOD.replace("stop: {training_iteration: 2}", ""), "stop: missing or empty"),
    (
        "bad resources",
        GOOD.replace("num_env_runners: 0", "num_env_runners: -1"),
        "resources.num_env_runners: got -1; must be >= 0",
    ),
    (
        "bad rollout fragment",
        GOOD.replace("num_env_runners: 0", "num_env_runners: 0, rollout_fragment_length: 0"),
        "resources.rollout_fragment_length: got 0; must be >= 1",
    ),
    (
        "bad tune mode",
        GOOD + "tune: {mode: biggest}\n",
        "tune.mode: got 'biggest'; allowed: max, min",
    ),
    (
        "unsearchable section",
        GOOD.replace("amp.init_scale: {grid", "tune.num_samples: {grid"),
        "search.tune.num_samples: 'tune' cannot be searched",
    ),
    ("yaml syntax", "algorithm: PPO\nenv: [CartPole\n", "YAML syntax error at line 3"),
    ("empty file", "", "the file is empty"),
    ("not a mapping", "- PPO\n", "expected a mapping of experiment keys"),
    ("missing file", None, "no such file"),
]


@pytest.mark.parametrize("desc, text, fragment", BAD, ids=[b[0] for b in BAD])
def test_bad_input_gets_one_clear_error_naming_file_and_key(tmp_path, desc, text, fragment):
    path = str(tmp_path / "missing.yaml") if text is None else write(tmp_path, text)
    with pytest.raises(E.ExperimentError) as e:
        E.load(path)
    msg = str(e.value)
    assert msg.startswith(path + ":"), msg
    assert fragment in msg, msg
    assert "\n" not in msg


def test_experiment_error_is_a_value_error():
    assert issubclass(E.ExperimentError, ValueError)


# -- search specs ------------------------------------------------------------------------------
SAMPLER_CASES = [
    # (spec, edges, grid size)
    ({"grid": [256.0, 1024.0, 65536.0]}, [256.0, 1024.0, 65536.0], 3),
    ({"choice": [10, 100]}, [10, 100], 1),
    ({"loguniform": [1e-5, 1e-3]}, [1e-5, 1e-3], 1),
    ({"uniform": [0.9, 0.99]}, [0.9, 0.99], 1),
    ({"randint": [1, 5]}, [1, 4], 1),  # Tune's randint excludes hi
]


@pytest.mark.parametrize(
    "spec, edges, size", SAMPLER_CASES, ids=[next(iter(c[0])) for c in SAMPLER_CASES]
)
def test_sampler_edges_and_grid_size(spec, edges, size):
    s = E.Sampler.parse(spec)
    assert s.edges() == edges
    assert s.grid_size() == size
    assert E.Sampler.parse(s.to_dict()) == s


def test_sampler_to_tune_gives_tune_domains_with_the_bounds():
    from ray.tune.search.sample import Categorical, Float, Integer

    assert E.Sampler.parse({"grid": [1, 2]}).to_tune() == {"grid_search": [1, 2]}
    choice = E.Sampler.parse({"choice": ["a", "b"]}).to_tune()
    assert isinstance(choice, Categorical) and choice.categories == ["a", "b"]
    log = E.Sampler.parse({"loguniform": [1e-5, 1e-3]}).to_tune()
    assert isinstance(log, Float) and (log.lower, log.upper) == (1e-5, 1e-3)
    assert all(1e-5 <= log.sample() <= 1e-3 for _ in range(20))
    ints = E.Sampler.parse({"randint": [1, 3]}).to_tune()
    assert isinstance(ints, Integer) and {ints.sample() for _ in range(50)} <= {1, 2}


def test_sampler_owns_its_values():
    hiddens = [[16], [32]]
    s = E.Sampler.parse({"grid": hiddens})
    hiddens[0].append(99)
    s.to_tune()["grid_search"][1].append(7)
    assert s.edges() == [[16], [32]]


BAD_SAMPLERS = [
    ({"grid": []}, "grid needs a non-empty list of values"),
    ({"choice": 3}, "choice needs a non-empty list"),
    ({"uniform": [1]}, "uniform needs [lo, hi] (two finite numbers)"),
    ({"uniform": [0, float("inf")]}, "uniform needs [lo, hi] (two finite numbers)"),
    ({"uniform": [True, 2]}, "uniform needs [lo, hi]"),
    ({"uniform": [2, 1]}, "uniform needs lo < hi, got [2, 1]"),
    ({"loguniform": [0, 1]}, "loguniform needs lo > 0"),
    ({"randint": [0.5, 3]}, "randint needs integer bounds"),
    ({"randint": [-(2**64), 0]}, "randint needs bounds within 64-bit integers"),
    ({"uniform": [-1.7e308, 1.7e308]}, "uniform needs hi - lo to be a finite number"),
    ({"choise": [1]}, "unknown sampler 'choise' (did you mean 'choice'?)"),
    ({"grid": [1], "choice": [2]}, "expected one sampler"),
    ([1, 2], "expected one sampler"),
]


@pytest.mark.parametrize("spec, fragment", BAD_SAMPLERS, ids=[repr(b[0]) for b in BAD_SAMPLERS])
def test_bad_sampler_specs_say_what_is_allowed(spec, fragment):
    with pytest.raises(ValueError) as e:
        E.Sampler.parse(spec)
    assert fragment in str(e.value)


def _exp(**sections):
    base = {"algorithm": "PPO", "env": "CartPole-v1", "stop": {"training_iteration": 1}}
    return E.Experiment(E.validate({**base, **sections}, "<t>"), "<t>")


def test_searched_values_are_checked_by_their_section_only(monkeypatch):
    calls = []
    real = envs.check_env_id
    monkeypatch.setattr(envs, "check_env_id", lambda env_id: calls.append(env_id) or real(env_id))
    _exp(
        search={
            "amp.init_scale": {"grid": [2.0**k for k in range(1, 17)]},
            "training.lr": {"loguniform": [1e-5, 1e-2]},
            "seed": {"grid": list(range(10))},
        }
    )
    assert calls == ["CartPole-v1"]  # the env is checked once, not once per searched value


def test_a_bad_searched_value_names_the_value_and_the_search_key():
    with pytest.raises(E.ExperimentError) as e:
        _exp(search={"amp.growth_interval": {"choice": [10, 0]}})
    assert "amp.growth_interval: got 0" in str(e.value)
    assert "(value 0 of search.amp.growth_interval)" in str(e.value)
    with pytest.raises(E.ExperimentError, match=r"seed: got -1; must be >= 0"):
        _exp(search={"seed": {"randint": [-1, 3]}})
    with pytest.raises(E.ExperimentError, match="model.batchnorm: BatchNorm goes after conv"):
        _exp(model={"batchnorm": True}, search={"model.fcnet_hiddens": {"grid": [[8]]}})


def test_randint_is_checked_at_its_largest_reachable_value():
    ok = _exp(
        training={"train_batch_size_per_learner": 200},
        search={"training.minibatch_size": {"randint": [50, 201]}},
    )
    assert ok.search["training.minibatch_size"].edges() == [50, 200]
    with pytest.raises(E.ExperimentError, match="minibatch_size: 201 is larger"):
        _exp(
            training={"train_batch_size_per_learner": 200},
            search={"training.minibatch_size": {"randint": [50, 202]}},
        )


UNSEARCHABLE = [
    ("model.preset", {"grid": ["mini", "full"]}, "search the preset's settings instead"),
    ("model.batchnorm", {"grid": [True, False]}, "it picks the module class"),
    ("amp", {"grid": [{"init_scale": 1.0}]}, "name one key of 'amp', e.g. search.amp.<key>"),
    ("seed.x", {"grid": [1]}, "name one key of 'seed', e.g. search.seed"),
    ("training.", {"grid": [1]}, "name one key of 'training'"),
    ("stop.training_iteration", {"grid": [1]}, "'stop' cannot be searched"),
]


@pytest.mark.parametrize("key, spec, fragment", UNSEARCHABLE, ids=[u[0] for u in UNSEARCHABLE])
def test_keys_that_cannot_become_samplers_are_refused(key, spec, fragment):
    with pytest.raises(E.ExperimentError) as e:
        _exp(search={key: spec})
    assert str(e.value).startswith(f"<t>: search.{key}: ")
    assert fragment in str(e.value)


def test_searched_seed_env_config_and_model_keys_reach_the_param_space():
    exp = _exp(
        model="mini",
        search={
            "seed": {"grid": [0, 1, 2]},
            "env_config.max_episode_steps": {"choice": [100, 200]},
            "model.fcnet_hiddens": {"grid": [[16], [32, 32]]},
        },
    )
    cfg = schedulers.param_space(exp)
    assert cfg.seed == {"grid_search": [0, 1, 2]}
    assert cfg.env_config["max_episode_steps"].categories == [100, 200]
    assert cfg.model_config["fcnet_hiddens"] == {"grid_search": [[16], [32, 32]]}
    assert cfg.model_config["fcnet_activation"] == "tanh"  # the rest of the preset stays
    plain = exp.algorithm_config()
    assert plain.seed is None and plain.model_config["fcnet_hiddens"] == [64, 64]


def test_tune_domains_written_inside_a_section_are_refused():
    # Samplers go in `search`, where they are checked; a raw Tune dict in a section is a value.
    with pytest.raises(E.ExperimentError, match=r"training\.lr: got \{'grid_search'"):
        _exp(training={"lr": {"grid_search": [1e-3, 1e-4]}})


def test_search_entries_can_be_overridden_by_their_dotted_key(tmp_path):
    path = write(tmp_path, GOOD)
    exp = E.load(path, overrides=["search.amp.init_scale={grid: [8.0, 16.0, 32.0]}"])
    assert exp.search["amp.init_scale"].edges() == [8.0, 16.0, 32.0]
    assert set(exp.search) == set(E.load(path).search)
    with pytest.raises(E.ExperimentError, match=r"search\.amp\.init_scale: grid needs"):
        E.load(path, overrides=["search.amp.init_scale={grid: []}"])


def test_a_fixed_value_for_a_searched_key_replaces_its_search_in_the_order_given(tmp_path):
    """Tune's sample of a search entry would overwrite a --set value in every trial."""
    path = write(tmp_path, GOOD)
    exp = E.load(path, overrides=["amp.init_scale=2048", "amp.growth_interval=100"])
    assert exp.get("amp.init_scale") == 2048 and exp.get("amp.growth_interval") == 100
    assert list(exp.search) == ["training.train_batch_size_per_learner"]
    assert "amp.init_scale" not in builder.initial_space(exp.data)
    assert exp.notes == (
        "--set amp.init_scale=2048 replaces the search over amp.init_scale (2 values)",
        "--set amp.growth_interval=100 replaces the search over amp.growth_interval (2 values)",
    )
    # A later search entry for the key searches it again: the last --set wins.
    again = exp.with_overrides(["search.amp.init_scale={grid: [8.0, 16.0]}"])
    assert again.search["amp.init_scale"].edges() == [8.0, 16.0] and again.notes == exp.notes
    assert E.load(path, overrides=["amp.dtype=float16"]).notes == ()


def test_resolved_is_plain_data_that_validates_to_the_same_experiment(tmp_path):
    import yaml

    exp = E.load(write(tmp_path, GOOD))
    plain = exp.resolved()
    assert plain["search"]["amp.init_scale"] == {"grid": [256.0, 65536.0]}
    assert yaml.safe_load(yaml.safe_dump(plain)) == plain
    assert E.validate(plain, exp.path) == exp.data


# -- values RLlib, numpy and torch cannot take ----------------------------------------------------
RLLIB_TYPES = [
    # (section overrides, expected message fragment)
    ({"seed": 2**32}, "seed: got 4294967296; must be <= 4294967295"),
    ({"seed": 2**70}, "seed: got 1180591620717411303424; must be <= 4294967295"),
    ({"training": {"entropy_coeff": "high"}}, "training.entropy_coeff: got 'high'; RLlib expects"),
    ({"training": {"clip_param": float("nan")}}, "training.clip_param: got nan; expected a number"),
    ({"training": {"num_epochs": 2.0}}, "training.num_epochs: got 2.0; expected an integer"),
    ({"training": {"use_gae": "maybe"}}, "training.use_gae: got 'maybe'; RLlib expects true or"),
    ({"training": {"grad_clip_by": 1}}, "training.grad_clip_by: got 1; RLlib expects a string"),
    ({"training": {"optimizer": 3}}, "training.optimizer: got 3; RLlib expects a mapping"),
    ({"training": {"vf_share_layers": True}}, "training.vf_share_layers: deprecated in RLlib"),
    ({"training": {"learner_class": "x"}}, "training.learner_class: takes a Python class"),
    (
        {"algorithm": "DQN", "training": {"target_network_update_freq": 500.0}},
        "training.target_network_update_freq: got 500.0; RLlib expects an integer; write 500",
    ),
    (
        {"algorithm": "DQN", "training": {"double_q": 1}},
        "training.double_q: got 1; RLlib expects true or false",
    ),
]


@pytest.mark.parametrize("sections, fragment", RLLIB_TYPES, ids=[f[1][:40] for f in RLLIB_TYPES])
def test_values_of_the_wrong_type_for_rllib_are_refused(sections, fragment):
    with pytest.raises(E.ExperimentError) as e:
        _exp(**sections)
    assert fragment in str(e.value)


def test_values_rllib_takes_in_several_forms_are_accepted():
    _exp(training={"entropy_coeff": [[0, 0.01], [100, 0.0]], "kl_coeff": 1})
    _exp(algorithm="DQN", training={"n_step": [1, 3], "epsilon": 0.1, "hiddens": [64]})
    _exp(algorithm="APPO", training={"grad_clip": 40, "learner_queue_timeout": 30.5})


@pytest.mark.parametrize(
    "key, spec, fix",
    [
        ("training.num_epochs", {"loguniform": [1, 10]}, "{randint: [1, 11]}"),
        ("training.minibatch_size", {"uniform": [16.5, 32]}, "{randint: [17, 33]}"),
        ("amp.growth_interval", {"loguniform": [100, 4000]}, "{randint: [100, 4001]}"),
        ("resources.num_env_runners", {"uniform": [0, 2]}, "{randint: [0, 3]}"),
        ("seed", {"uniform": [0, 100]}, "{randint: [0, 101]}"),
    ],
)
def test_a_float_sampler_on_an_integer_key_names_the_integer_samplers(key, spec, fix):
    with pytest.raises(E.ExperimentError) as e:
        _exp(search={key: spec})
    msg = str(e.value)
    assert msg.startswith(f"<t>: search.{key}: ") and "takes an integer" in msg
    assert f"use {fix} or a grid/choice of integers" in msg


def test_integer_samplers_on_integer_keys_and_float_samplers_on_float_keys_pass():
    _exp(
        search={
            "training.num_epochs": {"randint": [1, 4]},
            "amp.growth_interval": {"choice": [10, 100]},
            "amp.init_scale": {"loguniform": [256.0, 65536.0]},
            "training.lr": {"loguniform": [1e-5, 1e-3]},
            "seed": {"grid": [0, 2**32 - 1]},
        }
    )
    with pytest.raises(E.ExperimentError, match=r"got 2\.5; expected an integer"):
        _exp(search={"training.num_epochs": {"grid": [1, 2.5]}})


def test_rollout_fragment_length_sets_the_env_runners_fragment(tmp_path):
    """DQN's train frequency: env steps per env per sample round (RLlib's default: auto)."""
    f = tmp_path / "e.yaml"
    f.write_text(
        GOOD.replace("num_env_runners: 0", "num_env_runners: 0, rollout_fragment_length: 7")
    )
    assert E.load(str(f)).algorithm_config().rollout_fragment_length == 7
