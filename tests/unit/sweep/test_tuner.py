"""sweep/tuner.py without a Ray: the progress lines Tune prints while the sweep runs."""

from __future__ import annotations

from types import SimpleNamespace

from ray.tune.progress_reporter import _best_trial_str

from rllib_amp import experiment as E
from rllib_amp.sweep import tuner


def _best_trial_line(search):
    """Tune's "Current best trial: ... parameters={...}" line for a trial of the experiment,
    with the reporter's parameter columns (Tune's own formatter, given a stand-in trial)."""
    exp = E.load("tune_configs/cartpole_ppo_amp.yaml", overrides={"search": search})
    config = exp.algorithm_config().to_dict()
    config["seed"] = 3
    trial = SimpleNamespace(trial_id="ab_00000", last_result={"config": config, "x": 1.0})
    reporter = tuner.progress_reporter(exp)
    return _best_trial_str(trial, "x", reporter._parameter_columns)


def test_a_sweep_without_a_search_prints_a_short_best_trial_line():
    """Without searched keys Tune's reporter printed the whole config as the best trial's
    parameters: one line of 12,521 characters."""
    line = _best_trial_line(search={})
    assert line.endswith("parameters={'seed': 3}"), line[:300]


def test_the_searched_keys_are_the_best_trial_lines_parameters():
    line = _best_trial_line(search={"amp.growth_interval": {"grid": [10, 2000]}})
    assert line.endswith("growth_interval': 2000}") and len(line) < 200, line[:300]
