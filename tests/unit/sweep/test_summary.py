"""The sweep summary with a target in ``stop``: steps to reach it, ranking, the closing line
(fake Tune results, no Ray)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd

from rllib_amp import experiment as E
from rllib_amp.sweep import storage, summary

R = "env_runners/episode_return_mean"
STEPS = "env_steps_to_450"


def _exp(stop):
    return E.load(
        "tune_configs/cartpole_ppo_amp.yaml",
        overrides={"stop": stop, "search": {"amp.growth_interval": {"grid": [10, 2000]}}},
    )


def _result(trial, returns, growth_interval, scale=1024.0, skipped=0, history=True):
    steps = [1000.0 * (i + 1) for i in range(len(returns))]
    frame = pd.DataFrame(
        {R: returns, "num_env_steps_sampled_lifetime": steps,
         "time_total_s": [2.0 * (i + 1) for i in range(len(returns))]}
    )  # fmt: skip
    final = {
        "trial_id": trial,
        "done": True,
        "training_iteration": len(returns),
        "num_env_steps_sampled_lifetime": steps[-1],
        "time_total_s": 2.0 * len(returns),
        "env_runners": {"episode_return_mean": returns[-1]},
        "learners": {
            "default_policy": {"amp_grad_scale": scale, "amp_skipped_steps_lifetime": skipped}
        },
    }
    return SimpleNamespace(
        config={"learner_config_dict": {"rllib_amp": {"growth_interval": growth_interval}}},
        metrics=final,
        metrics_dataframe=frame if history else None,
        path=f"/x/AmpPPO_CartPole-v1_{trial}_0",
        error=None,
        checkpoint=None,
    )


GRID = [
    _result("a0000_00000", [20.0, 200.0, 300.0], 10),  # never reached: budget spent
    _result("a0000_00001", [20.0, 460.0, 480.0], 2000, scale=65536.0),  # 2,000 steps
    _result("a0000_00002", [20.0, 100.0, 451.0], 10, scale=4096.0, skipped=7),  # 3,000 steps
    _result("a0000_00003", [20.0, math.nan, 500.0], 2000, history=False),  # no history
]


def test_the_target_is_the_metrics_threshold_in_stop_and_only_for_mode_max():
    assert summary.target(_exp({R: 450, "num_env_steps_sampled_lifetime": 5000})) == 450.0
    assert summary.target(_exp({"training_iteration": 3})) is None
    assert summary.target(_exp({R: 450}).with_overrides({"tune.mode": "min"})) is None


def test_rows_give_steps_and_seconds_to_the_target_and_rank_the_soonest_first():
    exp = _exp({R: 450, "num_env_steps_sampled_lifetime": 3000})
    rows = summary.summarize(exp, GRID)
    order = [r["trial_id"] for r in rows]
    # Reached, soonest first; then the others by their final return.
    assert order == ["a0000_00001", "a0000_00002", "a0000_00003", "a0000_00000"]
    by_id = {r["trial_id"]: r for r in rows}
    assert (by_id["a0000_00001"][STEPS], by_id["a0000_00001"]["time_s_to_450"]) == (2000.0, 4.0)
    assert by_id["a0000_00002"][STEPS] == 3000.0 and by_id["a0000_00002"]["skipped_steps"] == 7
    assert by_id["a0000_00000"][STEPS] is None  # ran out of budget at 300
    assert by_id["a0000_00003"][STEPS] is None  # no result history: unknown, not invented
    table = summary.format_table(exp, rows)
    header = table.splitlines()[0]
    assert "steps to 450" in header and "skipped steps" in header and "final grad scale" in header
    assert summary.target_line(exp, rows, 450.0) == (
        "2 of 4 trials reached episode_return_mean >= 450: in 2,000 to 3,000 env steps "
        "(median 2,500)."
    )


def test_without_a_target_the_rows_rank_by_the_metric_and_have_no_target_columns():
    exp = _exp({"training_iteration": 3})
    rows = summary.summarize(exp, GRID)
    assert [r[R] for r in rows] == [500.0, 480.0, 451.0, 300.0]
    assert all(not any(k.startswith("env_steps_to_") for k in r) for r in rows)
    assert "steps to" not in summary.format_table(exp, rows)


def test_a_sweep_in_which_no_trial_reached_the_target_says_so():
    exp = _exp({R: 450, "num_env_steps_sampled_lifetime": 3000})
    rows = summary.summarize(exp, GRID[:1])
    assert summary.target_line(exp, rows, 450.0) == (
        "No trial reached episode_return_mean >= 450 within the stop's budget."
    )


def test_rows_record_each_trials_seed_and_the_base_seed_and_its_settled_scale():
    exp = _exp({R: 450, "num_env_steps_sampled_lifetime": 3000}).with_overrides({"seed": 7})
    rows = summary.summarize(exp, GRID)
    # The fakes carry no seed in their config: the file's seed stands for it.
    assert {(r["seed"], r["base_seed"]) for r in rows} == {(7, 7)}
    by_id = {r["trial_id"]: r for r in rows}
    # No scale in the fakes' histories: the settled scale is the final one.
    assert by_id["a0000_00001"]["settled_scale"] == 65536.0
    assert by_id["a0000_00001"]["env_steps"] == 3000.0


def test_an_env_error_that_mentions_a_server_is_not_a_storage_fault(tmp_path):
    """Only a trial's root error line of an OSError type names the storage: an env or server
    failure that mentions "Could not connect to server" keeps results.parquet, the figure and
    the recommendation."""
    rows = [
        {"trial_id": "a_00000", "error": "RuntimeError: env server: Could not connect to server"},
        {"trial_id": "a_00001", "error": "ConnectionRefusedError: Could not connect to server"},
        {"trial_id": "a_00002", "error": "ValueError: [Errno 28] No space left on device?"},
        {"trial_id": "a_00003", "error": None},
    ]
    assert storage.storage_fault(str(tmp_path), rows) is None
    stopped = {"trial_id": "a_00004", "error": "OSError: AWS Error NETWORK_CONNECTION during x"}
    line = storage.storage_fault(str(tmp_path), [*rows, stopped])
    assert line is not None and line.endswith("trial(s) a_00004 stopped on it"), line
    assert storage.stopped_on_storage("OSError: [Errno 28] No space left on device")
    assert storage.stopped_on_storage("RuntimeError: Unable to set up cluster storage with x")


def test_results_are_still_tried_on_a_storage_that_failed(tmp_path):
    rows = [{"trial_id": "a_00000", "error": "OSError: [Errno 28] No space left on device"}]
    path = str(tmp_path / "results.parquet")
    assert summary.try_write_parquet(rows, path)
    assert pd.read_parquet(path)["trial_id"].tolist() == ["a_00000"]
    blocked = tmp_path / "file"  # a file where the experiment folder should be
    blocked.write_text("x")
    assert not summary.try_write_parquet(rows, str(blocked / "results.parquet"))
    assert blocked.read_text() == "x"
