"""The benchmark's fixed-cost row: a PPO update of a tiny network, in ms per
minibatch step, stock float32 against rllib-amp; its row, spread, target and the run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from rllib_amp.bench import command, fixed_cost, fixed_cost_run, report, workloads

DATA = Path(__file__).parents[3] / "docs" / "bench" / "fixed_cost.json"


def test_the_row_is_ms_per_step_with_its_spread_and_the_target_compares_medians():
    """From the raw records a run keeps, or bare seconds per step (JSON written before)."""
    records = [
        {"per_step_s": t, "short_steps": 17, "long_steps": 85} for t in (0.0015, 0.0018, 0.0030)
    ]
    results = {"fixed_cost": {"fp32": [0.002, 0.003, 0.004], "amp-auto": records}}
    rows = [r for r in report.rows_from(results) if r["figure"].startswith("fixed cost")]
    by = {r["variant"]: r for r in rows}
    assert by["fp32"]["unit"] == "ms" and by["fp32"]["better_is"] == "lower"
    assert by["fp32"]["value"] == pytest.approx(3.0)
    assert (by["amp-auto"]["low"], by["amp-auto"]["high"]) == pytest.approx((1.5, 3.0))
    assert by["amp-auto"]["ratio_to_fp32"] == pytest.approx(0.6)
    assert "MLP [8], batch 4096, minibatch 256" in by["fp32"]["workload"]
    assert "| 1.80 ms (1.50-3.00) | 0.60x |" in report.markdown(rows, "h")
    (target,) = [t for t in report.targets(results) if t["target"].startswith("fixed cost")]
    assert target["met"] is True and target["ratio"] == pytest.approx(0.6)
    results["fixed_cost"]["amp-auto"] = [0.004]
    (target,) = [t for t in report.targets(results) if t["target"].startswith("fixed cost")]
    assert target["met"] is False


def test_the_steps_are_counted_from_what_the_learner_did():
    """A real tiny update per variant: the counted steps are the optimizer's own (Adam's step
    count for stock RLlib, a post-step hook for rllib-amp, whose scaler counts them), and
    more than batch / minibatch: PPO's learner connector adds one timestep per episode."""
    work = fixed_cost.FixedCostWorkload("CartPole-v1", (8,), 128, 64, (1, 2))
    batch = workloads.sample_batch(fixed_cost.fixed_cost_config("fp32", 1, work), work.batch)
    episodes, spaces = batch["episodes"], batch["spaces"]
    counted = {}
    for variant in ("fp32", "amp-auto"):
        learner = workloads.seeded_learner(fixed_cost.fixed_cost_config(variant, 1, work), spaces)
        (opt,) = [
            o for m, _ in learner.module.items() for _, o in learner.get_optimizers_for_module(m)
        ]
        hook_calls: list[int] = []
        opt.register_step_post_hook(lambda *_, calls=hook_calls: calls.append(1))
        counter = fixed_cost.StepCounter(learner)
        seconds, counted[variant] = fixed_cost.timed_update(learner, episodes, 1, work, counter)
        assert seconds > 0
        if variant == "fp32":
            assert not getattr(learner, "amp_scalers", {})  # counted by a hook
            param = opt.param_groups[0]["params"][0]
            assert counted[variant] == int(opt.state[param]["step"])
        else:
            assert learner.amp_scalers  # counted by the scaler
            assert counted[variant] == len(hook_calls)
        counter.remove()
    rows = work.batch + len(episodes)  # one extra timestep per episode
    assert counted == {"fp32": -(-rows // work.minibatch), "amp-auto": -(-rows // work.minibatch)}
    assert counted["fp32"] > work.batch // work.minibatch


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


def test_the_docs_table_is_built_from_the_committed_raw_figures():
    data = json.loads(DATA.read_text(encoding="utf-8"))
    assert {"date", "machine", "command", "runs"} <= set(data)
    for run in data["runs"]:
        for records in run["fixed_cost"].values():
            for r in records:  # every repetition's raw figures, steps counted
                steps = r["long_steps"] - r["short_steps"]
                assert r["per_step_s"] == pytest.approx((r["long_s"] - r["short_s"]) / steps)
    doc = (DATA.parents[1] / "benchmark.md").read_text(encoding="utf-8")
    assert fixed_cost_run.table(data) in doc
    assert data["command"] in doc


def test_the_run_command_refuses_bad_counts_and_prints_a_files_table(tmp_path, capsys):
    assert fixed_cost_run.main(["--reps", "0"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "--reps: got 0; must be >= 1" in err
    assert fixed_cost_run.main(["--table", str(tmp_path / "missing.json")]) == 2
    assert "missing.json" in capsys.readouterr().err
    assert fixed_cost_run.main(["--table", str(DATA)]) == 0
    assert "| fp32 (stock RLlib) |" in capsys.readouterr().out


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
    for (record,) in out.values():
        assert math.isfinite(record["per_step_s"])
        assert record["long_steps"] > record["short_steps"] > work.batch // work.minibatch
        steps = record["long_steps"] - record["short_steps"]
        assert record["per_step_s"] == (record["long_s"] - record["short_s"]) / steps
