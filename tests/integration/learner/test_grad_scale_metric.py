"""APPO reports the grad scale after the iteration's last update, not a mean over its
updates. Its learner thread runs many updates per iteration."""

from __future__ import annotations

import math

import pytest

import rllib_amp.learner.mixin as mixin
from rllib_amp.learner import metrics as M
from tests.integration.common import amp_config, train_until_learned

pytestmark = pytest.mark.usefixtures("ray_local")

MODULE = "default_policy"
UPDATE_NO = "test_update_no"


def test_appo_reports_the_scale_after_the_last_update_it_reports(monkeypatch):
    # The scale after every update, and each update's number in the results: the number a
    # result carries (a max) says which update the reported scale must be of.
    scales: list[float] = []
    report_update = mixin.report_update

    def recording(metrics, scalers, **kwargs):
        report_update(metrics, scalers, **kwargs)
        scales.append(scalers[MODULE].get_scale())
        metrics.log_value((MODULE, UPDATE_NO), len(scales) - 1, reduce="max", window=1)

    monkeypatch.setattr(mixin, "report_update", recording)
    # float16 and a scale that doubles after every step it does not halve: it moves in
    # every update.
    cfg = amp_config("APPO", dtype="float16", init_scale=2.0**4, growth_interval=1)
    cfg.training(circular_buffer_num_batches=2, circular_buffer_iterations_per_batch=2)
    cfg.env_runners(num_env_runners=0)
    algo = cfg.build_algo()
    try:
        stats = train_until_learned(algo, iterations=2)["learners"][MODULE]
    finally:
        algo.stop()
    last = int(stats[UPDATE_NO])
    covered = scales[: last + 1]
    assert len(set(covered)) > 1, covered  # the scale moved: a mean would differ
    assert stats[M.GRAD_SCALE] == scales[last], (stats[M.GRAD_SCALE], covered)
    assert not math.isnan(stats[M.GRAD_SCALE])
