"""Every result carries the AMP metrics, also an iteration in which no update finished: the
first iterations of APPO (its learner thread has no batch yet), also right after a restore.
Before, those results read None/NaN for every AMP metric in the progress table and summary."""

from __future__ import annotations

import math
import numbers

import pytest

from rllib_amp.learner import metrics as M
from tests.integration.common import amp_config, learner, train_until_learned

pytestmark = pytest.mark.usefixtures("ray_local")

KEYS = (
    M.GRAD_SCALE,
    M.SKIP_FRACTION,
    M.OPTIMIZER_STEPS_LIFETIME,
    M.SKIPPED_STEPS_LIFETIME,
    M.NONFINITE_LOSS_STEPS_LIFETIME,
)


def _amp_values(result) -> dict[str, float]:
    stats = result.get("learners", {}).get("default_policy", {})
    return {key: stats.get(key) for key in KEYS}


def _finite(values) -> bool:
    return all(isinstance(v, numbers.Real) and math.isfinite(v) for v in values.values())


def test_the_first_appo_iterations_after_a_restore_report_the_restored_scaler(tmp_path):
    cfg = amp_config("APPO", dtype="float16", init_scale=2.0**10, growth_interval=1000)
    a = cfg.build_algo()
    try:
        first = a.train()
        assert _finite(_amp_values(first)), _amp_values(first)  # before any update
        assert _amp_values(first)[M.GRAD_SCALE] == 2.0**10
        train_until_learned(a, iterations=2)
        a.save_to_path(str(tmp_path))
        saved = learner(a).amp_scalers["default_policy"].get_scale()
    finally:
        a.stop()
    b = cfg.build_algo()
    try:
        b.restore_from_path(str(tmp_path))
        after = [_amp_values(b.train()) for _ in range(3)]
    finally:
        b.stop()
    assert all(_finite(values) for values in after), after
    assert after[0][M.GRAD_SCALE] == saved, (after, saved)
