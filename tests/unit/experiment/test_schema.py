"""experiment.schema's dotted keys: setting one, the integer keys, a --set on a searched key."""

from __future__ import annotations

import pytest

from rllib_amp.experiment import ExperimentError, replaced_searches
from rllib_amp.experiment.rllib_keys import is_integer_key
from rllib_amp.experiment.schema import with_dotted, with_override


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


SEARCHED = {
    "search": {
        "amp.init_scale": {"grid": [1024.0, 65536.0, 2.0**20, 2.0**24]},
        "amp.growth_interval": {"loguniform": [10, 2000]},
        "seed": {"grid": [0, 1]},
    }
}


def test_a_set_on_a_searched_key_replaces_that_search_entry_and_says_so():
    out, lines = replaced_searches(SEARCHED, "amp.init_scale", 1024)
    assert list(out["search"]) == ["amp.growth_interval", "seed"]
    assert lines == ["--set amp.init_scale=1024 replaces the search over amp.init_scale (4 values)"]
    assert len(SEARCHED["search"]) == 3  # the caller's data is not changed
    # A whole section set as a mapping covers the searched keys inside it; a range says so.
    out, lines = replaced_searches(SEARCHED, "amp", {"growth_interval": 100, "dtype": "float16"})
    assert list(out["search"]) == ["amp.init_scale", "seed"]
    assert lines == [
        '--set amp={"growth_interval": 100, "dtype": "float16"} replaces the search over '
        "amp.growth_interval (loguniform [10, 2000])"
    ]


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("amp.dtype", "float16"),  # not searched
        ("amp.init", 1),  # a prefix of a searched key's name is another key
        ("search.amp.init_scale", {"grid": [1.0]}),  # sets the search entry itself
        ("amp", "float16"),  # not a mapping: covers no key inside
    ],
)
def test_a_set_on_a_key_that_is_not_searched_leaves_the_search_alone(key, value):
    out, lines = replaced_searches(SEARCHED, key, value)
    assert out == SEARCHED and lines == []
