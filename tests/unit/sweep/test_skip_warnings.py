"""The learner's "module keeps skipping optimizer steps" WARNING reaches the sweep's user: the
learner logs it in its own process (whose log the CLI does not show), marks the iteration with
``amp_skip_warning`` = 1, and the sweep's summary repeats it per trial with the advice."""

from __future__ import annotations

import math

import pandas as pd
import pytest
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_amp.learner import metrics as M
from rllib_amp.learner.report import report_update
from rllib_amp.scaling.scaler import PolicyScaler
from rllib_amp.settings import AMP_CONFIG_KEY, AmpSettings
from rllib_amp.sweep import summary

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
