"""experiment.dotted: flat keys of an experiment, and the section list they start with."""

from __future__ import annotations

import pytest

from rllib_amp.experiment import ExperimentError, schema
from rllib_amp.experiment.dotted import TOP_KEYS, is_integer_key, with_dotted, with_override


def test_the_top_keys_are_the_schemas_sections_in_order():
    # with_override refuses what TOP_KEYS lacks; validate checks SECTIONS: they must agree.
    assert tuple(schema.SECTIONS) == TOP_KEYS


def test_with_dotted_copies_only_the_path_it_sets():
    data = {"amp": {"dtype": "float16"}, "training": {"lr": 1e-3}}
    out = with_dotted(data, ["amp", "init_scale"], 8.0, "amp.init_scale", "f.yaml")
    assert out == {"amp": {"dtype": "float16", "init_scale": 8.0}, "training": {"lr": 1e-3}}
    assert data["amp"] == {"dtype": "float16"} and out["training"] is data["training"]


def test_with_override_names_an_unknown_top_key_and_the_nearest():
    with pytest.raises(
        ExperimentError, match=r"f.yaml: trainin.lr: unknown key 'trainin'.*training"
    ):
        with_override({}, "trainin.lr", 1e-4, "f.yaml")


@pytest.mark.parametrize(
    "key, expected",
    [
        ("seed", True),
        ("training.minibatch_size", True),
        ("training.lr", False),
        ("resources.num_env_runners", True),
        ("resources.num_gpus_per_learner", False),
        ("amp.growth_interval", True),
        ("amp.init_scale", False),
        ("env_config.anything", False),
    ],
)
def test_is_integer_key(key, expected):
    assert is_integer_key({"algorithm": "PPO"}, key) is expected
