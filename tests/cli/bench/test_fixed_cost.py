"""The benchmark's fixed-cost row (issue 22 point 3): a PPO update of a tiny network, in ms per
minibatch step, stock float32 against rllib-amp; its row, spread, target and the run."""

from __future__ import annotations

import math

import pytest

from rllib_amp import bench
from rllib_amp.bench import command, fixed_cost, report


def test_the_row_is_ms_per_step_with_its_spread_and_the_target_compares_medians():
    results = {"fixed_cost": {"fp32": [0.002, 0.003, 0.004], "amp-auto": [0.0015, 0.0018, 0.0030]}}
    rows = [r for r in bench.rows_from(results) if r["figure"].startswith("fixed cost")]
    by = {r["variant"]: r for r in rows}
    assert by["fp32"]["unit"] == "ms" and by["fp32"]["better_is"] == "lower"
    assert by["fp32"]["value"] == pytest.approx(3.0)
    assert (by["amp-auto"]["low"], by["amp-auto"]["high"]) == pytest.approx((1.5, 3.0))
    assert by["amp-auto"]["ratio_to_fp32"] == pytest.approx(0.6)
    assert "MLP [8], batch 4096, minibatch 256" in by["fp32"]["workload"]
    assert "| 1.80 ms (1.50-3.00) | 0.60x |" in bench.markdown(rows, "h")
    (target,) = [t for t in report.targets(results) if t["target"].startswith("fixed cost")]
    assert target["met"] is True and target["ratio"] == pytest.approx(0.6)
    results["fixed_cost"]["amp-auto"] = [0.004]
    (target,) = [t for t in report.targets(results) if t["target"].startswith("fixed cost")]
    assert target["met"] is False


def test_the_workload_counts_the_steps_rllibs_cyclic_iterator_takes():
    work = fixed_cost.FixedCostWorkload("CartPole-v1", (8,), 4096, 256, (1, 5))
    assert work.minibatch_steps(1) == 16 and work.minibatch_steps(5) == 80
    assert fixed_cost.FixedCostWorkload("x", (8,), 1000, 256, (1, 2)).minibatch_steps(1) == 4


def test_the_cell_runs_when_ppo_is_benchmarked(monkeypatch):
    """The row is measured in its own child, after the learner cells."""
    called = []

    def in_child(fn, *args, **kwargs):
        called.append(fn.__name__)
        if fn is fixed_cost.fixed_cost_cell:
            raise KeyboardInterrupt  # stop the run here
        return {"fp32": [1.0], "amp-auto": [2.0]}

    monkeypatch.setattr(command, "collect_data", lambda *a, **k: None)
    monkeypatch.setattr(command, "in_child", in_child)
    monkeypatch.setattr(command.figures, "bench_memory", lambda *a: {"fp32": 2.0, "amp-auto": 1.0})
    with pytest.raises(KeyboardInterrupt):
        command.run(["--quick", "--device", "cpu", "--algos", "PPO"])
    assert called == ["throughput_cell", "fixed_cost_cell"]


@pytest.mark.slow
def test_a_tiny_run_measures_both_variants_on_the_same_batch():
    """Stock float32 and rllib-amp (auto) learners built from one config each, timed (slow:
    16 s on 2 shared cores, most of it building an EnvRunner and two learners)."""
    work = fixed_cost.FixedCostWorkload("CartPole-v1", (8,), 128, 64, (1, 2))
    learner_classes = {
        v: fixed_cost.fixed_cost_config(v, 1, work).learner_class.__name__
        for v in ("fp32", "amp-auto")
    }
    assert learner_classes["fp32"] == "PPOTorchLearner"
    assert learner_classes["amp-auto"].startswith("Amp")
    out = fixed_cost.bench_fixed_cost(("fp32", "amp-auto"), "cpu", reps=1, work=work)
    assert set(out) == {"fp32", "amp-auto"}
    assert all(len(v) == 1 and math.isfinite(v[0]) for v in out.values())
