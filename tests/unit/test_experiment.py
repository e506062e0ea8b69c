"""The experiment file format: strict schema, clear errors, builder-built configs."""

from __future__ import annotations

import glob
import os
import textwrap

import pytest
from ray.rllib.algorithms.dqn import DQNConfig
from ray.rllib.algorithms.ppo import PPOConfig

from rllib_amp import experiment as E
from rllib_amp.settings import AMP_CONFIG_KEY, settings_from_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
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
        space = exp.tune_param_space()
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
    space = exp.param_space()
    assert set(space) == {
        "amp.init_scale",
        "amp.growth_interval",
        "training.train_batch_size_per_learner",
    }
    cfg = exp.tune_param_space()
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
    exp = E.load(os.path.join(ROOT, "tune_configs", "pong_dqn_amp.yaml"))
    cfg = exp.algorithm_config()
    assert isinstance(cfg, DQNConfig)
    assert cfg.dueling and cfg.double_q and cfg.target_network_update_freq > 0
    assert exp.get("model.batchnorm") is True
    assert cfg.rl_module_spec.module_class.__name__ == "BatchNormDefaultDQNTorchRLModule"


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
