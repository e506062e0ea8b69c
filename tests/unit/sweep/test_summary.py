"""The sweep summary (fake Tune results, no Ray): with a target in ``stop``, steps to reach it,
ranking, the closing line; a restored trial's history read along the line of training that led
to its final result; and the learner's skipping-steps warning repeated per trial."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pandas as pd
import pytest
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_amp import experiment as E
from rllib_amp.learner import metrics as M
from rllib_amp.learner.report import report_update
from rllib_amp.scaling.scaler import PolicyScaler
from rllib_amp.settings import AMP_CONFIG_KEY, AmpSettings
from rllib_amp.sweep import figure, storage, summary

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


# A restored trial's history: Tune appends the re-trained iterations to its result file, so
# one ``training_iteration`` appears twice (Tune's doing, by design: ray-project/ray#4187). The
# summary, ``results.parquet`` and ``sweep.png`` read the line of training that led to the final
# result, not the abandoned run's rows (fake Tune results, no Ray).


LIFETIME_STEPS = "num_env_steps_sampled_lifetime"
SCALE = summary.amp_metric_key(M.GRAD_SCALE)
WARN = summary.amp_metric_key(M.SKIP_WARNING)


def _restored_trial():
    """Iterations 1-4, a crash (or a PBT exploit) restoring iteration 2's checkpoint, then
    iterations 3-5 again. The abandoned run's 3 and 4 reached the target, warned about skipped
    steps and sat at scale 2; the run that carried on did none of that."""
    its = [1, 2, 3, 4, 3, 4, 5]
    frame = pd.DataFrame(
        {
            "training_iteration": its,
            LIFETIME_STEPS: [1000.0 * i for i in its],
            "time_total_s": [2.0 * i for i in its],
            R: [10.0, 100.0, 460.0, 470.0, 150.0, 200.0, 300.0],
            SCALE: [1024.0, 1024.0, 2.0, 2.0, 1024.0, 1024.0, 1024.0],
            WARN: [0, 0, 1, 1, 0, 0, 0],
        }
    )
    final = {
        "trial_id": "b0000_00000",
        "done": True,
        "training_iteration": 5,
        LIFETIME_STEPS: 5000.0,
        "time_total_s": 10.0,
        "env_runners": {"episode_return_mean": 300.0},
        "learners": {"default_policy": {M.GRAD_SCALE: 1024.0}},
    }
    return SimpleNamespace(
        config={"learner_config_dict": {"rllib_amp": {"growth_interval": 10}}},
        metrics=final,
        metrics_dataframe=frame,
        path="/x/AmpPPO_CartPole-v1_b0000_00000_0",
        error=None,
        checkpoint=None,
    )


def test_the_history_keeps_one_row_per_iteration_the_last_line_of_training():
    frame = summary.history(_restored_trial())
    assert frame["training_iteration"].tolist() == [1, 2, 3, 4, 5]
    assert frame[R].tolist() == [10.0, 100.0, 150.0, 200.0, 300.0]


def test_a_history_without_restores_is_left_as_it_is():
    frame = pd.DataFrame({"training_iteration": [1, 2, 3], R: [1.0, 2.0, 3.0]})
    assert summary.lineage(frame) is frame
    # PBT's recipient restored twice from the donor's iteration 3: the second 4 carries on.
    frame = pd.DataFrame({"training_iteration": [1, 2, 3, 4, 4, 5, 6], "x": range(7)})
    assert summary.lineage(frame)["x"].tolist() == [0, 1, 2, 4, 5, 6]


def test_the_summary_counts_neither_the_abandoned_runs_target_nor_its_warnings():
    exp = E.load(
        "tune_configs/cartpole_ppo_amp.yaml",
        overrides={"stop": {R: 450, LIFETIME_STEPS: 5000}, "search": {}},
    )
    (row,) = summary.summarize(exp, [_restored_trial()])
    # Read from all rows, the trial "reached 450 at 3,000 steps", warned twice, settled at 2.
    assert row["env_steps_to_450"] is None
    assert row["skip_warnings"] == 0
    assert row["settled_scale"] == 1024.0 and row["scale_swing"] == 0.0


def test_the_figures_curves_run_forward_in_env_steps():
    curves = figure.curves([_restored_trial()], [R])
    xs = curves["b0000_00000"][LIFETIME_STEPS]
    assert xs == sorted(xs) and len(xs) == len(set(xs)) == 5


# The learner's "module keeps skipping optimizer steps" WARNING reaches the sweep's user: the
# learner logs it in its own process (whose log the CLI does not show), marks the iteration with
# ``amp_skip_warning`` = 1, and the sweep's summary repeats it per trial with the advice.


KEY = summary.amp_metric_key(M.SKIP_WARNING)


def _iteration(logger, scaler, steps, skipped):
    """One learner update of ``steps`` optimizer steps, ``skipped`` of them skipped, and the
    iteration's reduced results."""
    scaler._window_steps, scaler._window_skipped = steps, skipped
    report_update(logger, {"default_policy": scaler}, merged_results=False, trial="t")
    return logger.reduce()["default_policy"][M.SKIP_WARNING].peek()


def test_the_iteration_whose_update_warned_carries_the_mark(caplog):
    settings = AmpSettings(dtype="float16", init_scale=1024.0, skip_warning_updates=2)
    scaler = PolicyScaler(settings, "cpu", scaling=True)
    logger = MetricsLogger(root=True)
    marks = [_iteration(logger, scaler, 4, skipped) for skipped in (4, 4, 4, 0, 4)]
    # The WARNING is due on the second troubled update in a row, once per episode of trouble.
    assert marks == [0.0, 1.0, 0.0, 0.0, 0.0]
    logged = [r for r in caplog.records if getattr(r, "amp_event", None) == "persistent_skips"]
    assert len(logged) == 1


def _trial(marks, dtype="float16", scale=2.0, nonfinite=0):
    frame = pd.DataFrame({"training_iteration": range(1, len(marks) + 1), KEY: marks})
    final = {
        "learners": {
            "default_policy": {
                M.GRAD_SCALE: scale,
                M.NONFINITE_LOSS_STEPS_LIFETIME: nonfinite,
            }
        }
    }
    amp = AmpSettings(dtype=dtype, init_scale=1e6, growth_interval=7).to_dict()
    cfg = {"learner_config_dict": {AMP_CONFIG_KEY: amp}}
    return frame, final, cfg


@pytest.mark.parametrize(
    ("dtype", "nonfinite", "advice"),
    [
        ("float16", 0, "lower init_scale (now 1e+06)"),
        ("float16", 3, "the loss itself has been nan/inf"),
        ("bfloat16", 0, "bfloat16 needs no scaling"),
    ],
)
def test_the_summary_repeats_the_warning_with_the_advice(dtype, nonfinite, advice):
    row = {"trial_id": "abcde_00001", "skip_fraction": 0.75, "grad_scale": 2.0}
    row.update(summary.skip_warnings(*_trial([0, 1, math.nan, 1], dtype, nonfinite=nonfinite)))
    assert row["skip_warnings"] == 2 and row["skip_warning_iteration"] == 2
    (line,) = summary.warning_lines([row])
    assert line.startswith("WARNING trial abcde_00001: module default_policy kept skipping")
    assert "from iteration 2" in line and "skip frac 0.75" in line and advice in line, line


def test_a_trial_without_the_warning_adds_no_line():
    quiet = {"trial_id": "abcde_00000", **summary.skip_warnings(*_trial([0, 0, 0]))}
    older = {"trial_id": "abcde_00002", **summary.skip_warnings(None, {}, {})}  # no history
    assert quiet["skip_warnings"] == older["skip_warnings"] == 0
    assert summary.warning_lines([quiet, older]) == []
