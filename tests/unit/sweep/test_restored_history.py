"""A restored trial's history: Tune appends the re-trained iterations to its result file, so
one ``training_iteration`` appears twice (Tune's doing, by design: ray-project/ray#4187). The
summary, ``results.parquet`` and ``sweep.png`` read the line of training that led to the final
result, not the abandoned run's rows (fake Tune results, no Ray)."""

from __future__ import annotations

from types import SimpleNamespace

import pandas as pd

from rllib_amp import experiment as E
from rllib_amp.learner import metrics as M
from rllib_amp.sweep import figure, summary

R = "env_runners/episode_return_mean"
STEPS = "num_env_steps_sampled_lifetime"
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
            STEPS: [1000.0 * i for i in its],
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
        STEPS: 5000.0,
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
        overrides={"stop": {R: 450, STEPS: 5000}, "search": {}},
    )
    (row,) = summary.summarize(exp, [_restored_trial()])
    # Read from all rows, the trial "reached 450 at 3,000 steps", warned twice, settled at 2.
    assert row["env_steps_to_450"] is None
    assert row["skip_warnings"] == 0
    assert row["settled_scale"] == 1024.0 and row["scale_swing"] == 0.0


def test_the_figures_curves_run_forward_in_env_steps():
    curves = figure.curves([_restored_trial()], [R])
    xs = curves["b0000_00000"][STEPS]
    assert xs == sorted(xs) and len(xs) == len(set(xs)) == 5
