"""The grad scale a result reports is the scale after the iteration's last update, however
the algorithm merges its learners' results."""

from __future__ import annotations

import pytest
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_amp.learner import metrics as M
from rllib_amp.learner.report import report_update
from rllib_amp.scaling.scaler import PolicyScaler
from rllib_amp.settings import AmpSettings

KEY = ("default_policy", M.GRAD_SCALE)


def _update_result(scale: float, *, merged_results: bool) -> dict:
    """One learner update's reduced results, the scaler at ``scale``."""
    logger = MetricsLogger()
    scaler = PolicyScaler(AmpSettings(init_scale=scale), "cpu", scaling=True)
    report_update(logger, {"default_policy": scaler}, merged_results=merged_results, trial="t")
    return logger.reduce()


@pytest.mark.parametrize("merged_results", [False, True])
def test_the_scale_of_the_last_update_in_sequence_wins(merged_results):
    # APPO, DQN: several updates per iteration, merged one after another.
    scales = [2.0**16, 2.0**10, 2.0**12]
    root = MetricsLogger(root=True)
    for scale in scales:
        root.aggregate([_update_result(scale, merged_results=merged_results)])
    assert root.reduce()[KEY[0]][KEY[1]] == scales[-1]


def test_several_results_merged_at_once_report_the_last():
    # Several learners, or an asynchronous learner group's ready results, in one merge.
    root = MetricsLogger(root=True)
    root.aggregate([_update_result(2.0**8, merged_results=True)])
    root.aggregate([_update_result(s, merged_results=True) for s in (2.0**12, 2.0**4)])
    reduced = root.reduce()
    assert reduced[KEY[0]][KEY[1]] == 2.0**4
    # The next iteration starts afresh.
    root.aggregate([_update_result(2.0**6, merged_results=True)])
    assert root.reduce()[KEY[0]][KEY[1]] == 2.0**6


def test_a_root_restored_from_an_older_checkpoint_still_merges():
    # Older rllib-amp logged APPO's scale as a mean; its checkpoints restore that stat.
    old = MetricsLogger(root=True)
    learner = MetricsLogger()
    learner.log_value(KEY, 2.0**4, window=1)
    old.aggregate([learner.reduce()])
    old.reduce()
    root = MetricsLogger(root=True)
    root.set_state(old.get_state())
    root.aggregate([_update_result(2.0**8, merged_results=True)])
    assert root.reduce()[KEY[0]][KEY[1]] == 2.0**8
