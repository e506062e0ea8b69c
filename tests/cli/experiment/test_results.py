"""The result-key catalog that pre-flight checks `stop` and `tune.metric` against, proven true.

A real training iteration of each algorithm on CartPole: every key of its flattened result
must be accepted (pre-flight never refuses a real key), and every key the catalog suggests
("did you mean ...") must be in the result (a suggestion is never itself a dead key).
"""

from __future__ import annotations

import pytest

from rllib_amp import experiment as E
from rllib_amp.experiment.results import catalog

TINY = {
    "env": "CartPole-v1",
    "model": {"fcnet_hiddens": [8]},
    "amp": {"dtype": "float16"},
    "stop": {"training_iteration": 1},
    "seed": 0,
}
SETTINGS = {
    "PPO": {
        "training": {"train_batch_size_per_learner": 128, "minibatch_size": 64, "num_epochs": 1},
        "resources": {"num_env_runners": 0},
    },
    "DQN": {
        "training": {
            "train_batch_size_per_learner": 16,
            "num_steps_sampled_before_learning_starts": 0,
            "target_network_update_freq": 1,
        },
        "resources": {"num_env_runners": 0},
    },
    "APPO": {
        "training": {"train_batch_size_per_learner": 64},
        "resources": {"num_env_runners": 0},
    },
}
# Iterations at most: APPO's learner answers asynchronously, so its first result may come
# before the learner's.
MAX_ITERATIONS = 6


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize(
    "name",
    # DQN and APPO (about 7 s each) are slow: the default run checks the catalog against
    # PPO's real results; DQN's and APPO's own key lists meet real results in the slow run.
    [n if n == "PPO" else pytest.param(n, marks=pytest.mark.slow) for n in SETTINGS],
)
def test_catalog_accepts_every_real_key_and_suggests_only_real_ones(name):
    from ray.tune.utils import flatten_dict

    exp = E.Experiment(E.validate({"algorithm": name, **TINY, **SETTINGS[name]}, "<t>"), "<t>")
    config = exp.algorithm_config()
    # Enough env steps per iteration for whole episodes (DQN's default is one per update).
    config.reporting(min_sample_timesteps_per_iteration=200, min_time_s_per_iteration=0)
    cat = catalog(name)
    config_keys = set(config.to_dict())
    seen: set[str] = set()
    algo = config.build_algo()
    try:
        for _ in range(MAX_ITERATIONS):
            result = flatten_dict(algo.train(), delimiter="/")
            refused = sorted(k for k in result if not cat.accepts(k, config_keys))
            assert not refused, f"{name} reports keys the catalog refuses: {refused}"
            seen.update(result)
            if set(cat.suggestions) <= seen:
                break
    finally:
        algo.stop()
    missing = sorted(set(cat.suggestions) - seen)
    assert not missing, f"{name}: suggested keys never reported: {missing}"
