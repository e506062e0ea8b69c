"""checkpoints/algorithm.py's result filling without a Ray: a stand-in learner group."""

from __future__ import annotations

import math
from types import SimpleNamespace

from rllib_amp.checkpoints.algorithm import fill_amp_metrics

NOW = {"default_policy": {"amp_grad_scale": 1024.0, "amp_optimizer_steps_lifetime": 7}}


class _Learners:
    def __init__(self, answer):
        self.answer, self.asked = answer, 0

    def foreach_learner(self, func):
        self.asked += 1
        return [SimpleNamespace(ok=True, get=lambda: self.answer)]


def test_a_result_without_learner_results_gets_the_scalers_values():
    group = _Learners(NOW)
    result = {"learners": {"__all_modules__": {"x": 1}}}
    keys = fill_amp_metrics(result, group, None)
    assert result["learners"]["default_policy"] == NOW["default_policy"]
    assert keys == ("amp_grad_scale", "amp_optimizer_steps_lifetime") and group.asked == 1


def test_a_nan_is_replaced_and_a_reported_value_kept():
    group = _Learners(NOW)
    result = {"learners": {"default_policy": {"amp_grad_scale": math.nan,
                                              "amp_optimizer_steps_lifetime": 9}}}  # fmt: skip
    fill_amp_metrics(result, group, ("amp_grad_scale",))
    assert result["learners"]["default_policy"] == {
        "amp_grad_scale": 1024.0, "amp_optimizer_steps_lifetime": 9,
    }  # fmt: skip


def test_complete_results_and_amp_off_ask_nobody():
    group = _Learners(NOW)
    result = {"learners": {"default_policy": dict(NOW["default_policy"])}}
    assert fill_amp_metrics(result, group, tuple(NOW["default_policy"])) and group.asked == 0
    off = _Learners({})  # learners without scalers: () and the algorithm stops asking
    assert fill_amp_metrics({}, off, None) == () and off.asked == 1
