"""The sweep's answer per setting, on fake result histories (no Ray): grouping over seeds,
intervals, the tie rule, the single-seed wording, the settled scale, groups.parquet,
sweep.png and the recommendation that follows from them."""

from __future__ import annotations

import math
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from rllib_amp import experiment as E
from rllib_amp.sweep import figure, groups, summary
from rllib_amp.sweep.recommend import recommend

R = "env_runners/episode_return_mean"
SCALE = "learners/default_policy/amp_grad_scale"
SKIP = "learners/default_policy/amp_skip_fraction"
STEPS = "num_env_steps_sampled_lifetime"
KEYS = ["amp.init_scale", "amp.growth_interval"]


def _exp(**overrides):
    return E.load(
        "tune_configs/cartpole_ppo_amp.yaml",
        overrides={
            "stop": {R: 450, STEPS: 6000},
            "search": {
                "amp.init_scale": {"grid": [1024.0, 65536.0]},
                "amp.growth_interval": {"grid": [10, 2000]},
            },
            "seed": 0,
            **overrides,
        },
    )


def _result(trial, *, scale0, gi, seed, returns, scales, skips, optimizer_steps=200):
    """A finished trial: one result per 1,000 env steps, its history and final metrics."""
    steps = [1000.0 * (i + 1) for i in range(len(returns))]
    frame = pd.DataFrame(
        {R: returns, STEPS: steps, SCALE: scales, SKIP: skips,
         "time_total_s": [2.0 * (i + 1) for i in range(len(returns))]}
    )  # fmt: skip
    skipped = round(sum(skips) * optimizer_steps / len(skips))
    final = {
        "trial_id": trial,
        "done": True,
        "training_iteration": len(returns),
        STEPS: steps[-1],
        "time_total_s": 2.0 * len(returns),
        "env_runners": {"episode_return_mean": returns[-1]},
        "learners": {
            "default_policy": {
                "amp_grad_scale": scales[-1],
                # RLlib reports numpy scalars.
                "amp_skipped_steps_lifetime": np.int64(skipped),
                "amp_optimizer_steps_lifetime": np.int64(optimizer_steps),
                "amp_skip_fraction": skips[-1],
            }
        },
    }
    config = {
        "seed": seed,
        "learner_config_dict": {"rllib_amp": {"init_scale": scale0, "growth_interval": gi}},
    }
    return SimpleNamespace(
        config=config, metrics=final, metrics_dataframe=frame,
        path=f"/x/AmpPPO_CartPole-v1_{trial}_0", error=None, checkpoint=None,
    )  # fmt: skip


def _issue_grid():
    """A recorded run, with three seeds: growth_interval 10 reaches 450 a little sooner but
    keeps doubling its scale into overflow (11% of updates skipped); growth_interval 2000 is
    tied with it and skips nothing; 1024/10 is clearly slower."""
    out = []
    for seed in range(3):
        # 65536 / 10: 450 at 3,000-4,000 steps, the scale saw-toothing 2^19 <-> 2^20.
        n = 3 + (seed == 2)
        out.append(_result(
            f"a_{seed}0", scale0=65536.0, gi=10, seed=seed,
            returns=[100.0] * (n - 1) + [460.0],
            scales=[2.0**19, 2.0**20, 2.0**19, 2.0**20][:n], skips=[0.11] * n, optimizer_steps=200,
        ))  # fmt: skip
        # 1024 / 2000: 450 at 4,000 steps every seed, scale steady, nothing skipped.
        out.append(_result(
            f"b_{seed}1", scale0=1024.0, gi=2000, seed=seed,
            returns=[100.0, 200.0, 300.0, 455.0],
            scales=[1024.0] * 4, skips=[0.0] * 4,
        ))  # fmt: skip
        # 1024 / 10: one seed learns at 6,000 steps, two never do within the 6,000 budget.
        returns = [50.0] * 5 + ([451.0] if seed == 0 else [200.0])
        out.append(_result(
            f"c_{seed}2", scale0=1024.0, gi=10, seed=seed, returns=returns,
            scales=[2048.0] * 6, skips=[0.0] * 6,
        ))  # fmt: skip
    return out


def _groups(exp=None, grid=None):
    exp = exp or _exp()
    rows = summary.summarize(exp, grid or _issue_grid())
    return exp, rows, groups.of_experiment(exp, rows)


def test_trials_group_by_their_searched_values_with_seed_left_out():
    exp, rows, found = _groups()
    assert {r["seed"] for r in rows} == {0, 1, 2} and {r["base_seed"] for r in rows} == {0}
    assert len(found) == 3
    for g in found:
        assert len(g.trials) == 3 and sorted(g.seeds) == [0, 1, 2]
        assert len({(t["amp.init_scale"], t["amp.growth_interval"]) for t in g.trials}) == 1
    assert set(found[0].values) == set(KEYS)


def test_interval_is_the_student_t_95_percent_interval():
    i = groups.interval([1.0, 2.0, 3.0])
    half = 4.302652729911275 * 1.0 / math.sqrt(3)  # t(0.975, 2 dof) * sd / sqrt(n)
    assert (i.mean, i.n) == (2.0, 3)
    assert i.lo == pytest.approx(2.0 - half) and i.hi == pytest.approx(2.0 + half)
    one = groups.interval([5.0, math.nan])
    assert (one.mean, one.lo, one.hi, one.n) == (5.0, None, None, 1)
    assert groups.interval_text(one) == "5 (1 run)"


def test_steps_to_the_target_count_seeds_that_never_got_there_at_the_budget():
    _, _, found = _groups()
    slow = next(g for g in found if g.values == dict(zip(KEYS, (1024.0, 10))))
    # One seed at 6,000 steps, two censored at the 6,000-step budget: a lower bound, not 6,000
    # from the one lucky seed alone, and "1 of 3" says so.
    assert slow.reached == 1 and slow.steps is not None and slow.steps.mean == 6000.0
    fast = next(g for g in found if g.values["amp.growth_interval"] == 2000)
    assert fast.reached == 3 and fast.steps is not None and fast.steps.mean == 4000.0


def test_groups_rank_by_the_mean_and_those_overlapping_the_best_are_tied():
    _, _, found = _groups()
    assert [g.rank for g in found] == [1, 2, 3]
    assert found[0].values == {"amp.init_scale": 65536.0, "amp.growth_interval": 10}
    assert found[0].steps is not None and found[0].steps.mean == pytest.approx(3333.33, abs=0.01)
    assert [g.tied for g in found] == [True, True, False]
    table = groups.format_table(found, R)
    assert "best" in table.splitlines()[2] and "tied" in table.splitlines()[3]
    assert "[95% CI]" in table.splitlines()[0] and "3/3" in table and "1/3" in table


def test_the_settled_scale_is_the_median_over_seeds_of_each_runs_last_quarter():
    # Last quarter of 8 results: the last 2; median of (2, 4) is 3.
    frame = pd.DataFrame({SCALE: [8.0] * 6 + [2.0, 4.0]})
    assert summary.settled_scale(frame) == 3.0
    assert summary.settled_scale(None, 16.0) == 16.0  # no history: the final scale
    assert summary.scale_swing(frame) == 1.0
    _, rows, found = _groups()
    saw = next(g for g in found if g.values["amp.growth_interval"] == 10 and g.rank == 1)
    # Seeds 0 and 1 end on 2^19 (last quarter: 1 result), seed 2 on 2^20: median 2^19.
    assert sorted(r["settled_scale"] for r in rows if r["trial_id"].startswith("a_")) == [
        2.0**19, 2.0**19, 2.0**20,
    ]  # fmt: skip
    assert saw.settled_scale == 2.0**19
    assert saw.skip_fraction == pytest.approx(0.11, abs=0.005)


def test_the_finding_names_the_key_that_separates_the_groups():
    rows = [
        {"amp.growth_interval": gi, "training.train_batch_size_per_learner": b, "seed": s,
         "status": "DONE", "m": m + s}
        for gi in (10, 2000) for s in range(3)
        for b, m in [(500, 100.0), (1000, 300.0)]
    ]  # fmt: skip
    keys = ["amp.growth_interval", "training.train_batch_size_per_learner"]
    found = groups.group(rows, keys=keys, metric="m", mode="max")
    line = groups.finding(found)
    assert line.startswith("train_batch_size_per_learner decides (500: ")
    assert "vs 1000: " in line and "growth_interval does not separate the groups" in line


def test_a_group_of_one_run_decides_nothing_beside_groups_of_several():
    rows = [
        {"amp.growth_interval": gi, "seed": s, "status": "DONE", "m": m}
        for gi, ms in [(10, (1.0, 1.5, 1.2)), (2000, (9.0,))]
        for s, m in enumerate(ms)
    ]
    found = groups.group(rows, keys=["amp.growth_interval"], metric="m", mode="max")
    assert not groups.single_seed(found)
    assert "decides" not in groups.finding(found), groups.finding(found)


def test_when_nothing_separates_the_groups_the_finding_says_so():
    rows = [
        {"amp.growth_interval": gi, "seed": s, "status": "DONE", "m": m}
        for gi, ms in [(10, (1.0, 5.0, 3.0)), (2000, (2.0, 4.0, 3.5))]
        for s, m in enumerate(ms)
    ]
    found = groups.group(rows, keys=["amp.growth_interval"], metric="m", mode="max")
    assert all(g.tied for g in found)
    assert groups.finding(found).startswith("nothing separates the groups: all 2 intervals")


def test_one_seed_per_setting_says_it_rests_on_a_single_run():
    grid = [r for r in _issue_grid() if r.config["seed"] == 0]
    exp, rows, found = _groups(grid=grid)
    assert groups.single_seed(found)
    line = groups.finding(found)
    # One value per setting: no key "decides", however far apart the single runs are.
    assert line.startswith("nothing can be told apart (one seed per setting"), line
    assert "decides" not in line and "highest single run: " in line
    assert "(1 run)" in groups.format_table(found, R)
    rec = recommend(found, metric=R, base={"dtype": "float16"})
    assert rec is not None and rec.reason.startswith("On a single run per setting")


def test_the_issues_run_recommends_the_tied_setting_that_skips_nothing():
    exp, rows, found = _groups()
    rec = recommend(found, metric=R, base=exp.data["amp"])
    assert rec is not None
    # Not the 11%-skipping "winner": the tied setting that skips nothing, at its settled scale.
    assert rec.amp["growth_interval"] == 2000 and rec.amp["init_scale"] == 1024.0
    assert "tied with the best" in rec.reason and "skipped the fewest steps" in rec.reason
    assert "4k [4k, 4k]" in rec.reason  # the chosen group's interval
    assert "3.3k [" in rec.reason and "11.0% of updates" in rec.reason  # the best's numbers
    assert not rec.reason.startswith("On a single run")


def test_equal_skips_fall_back_to_the_steadiest_scale():
    rows = [
        {"trial_id": f"{gi}{s}", "amp.growth_interval": gi, "seed": s, "status": "DONE",
         "m": 400.0 + s, "skipped_steps": 0, "optimizer_steps": 50, "settled_scale": scale,
         "scale_swing": swing}
        for gi, scale, swing in [(10, 4096.0, 3.0), (2000, 1024.0, 0.0)] for s in range(3)
    ]  # fmt: skip
    found = groups.group(rows, keys=["amp.growth_interval"], metric="m", mode="max")
    rec = recommend(found, metric="m", base={"dtype": "float16"})
    assert rec is not None and rec.amp["growth_interval"] == 2000
    assert "swung least" in rec.reason


def test_report_writes_groups_parquet_and_sweep_png(tmp_path, capsys):
    exp, rows, _ = _groups()
    found = groups.report(exp, rows, str(tmp_path))
    print(figure.report(exp, found, _issue_grid(), str(tmp_path)))
    out = capsys.readouterr().out
    assert "Settings, best first by the mean env steps to the target" in out
    assert f"Groups: {tmp_path / groups.FILE}" in out
    assert f"Figure: {tmp_path / figure.FILE}" in out and out.count("Found: ") == 1
    table = pq.read_table(str(tmp_path / groups.FILE)).to_pylist()
    assert [r["rank"] for r in table] == [1, 2, 3] and [r["tied"] for r in table] == [
        True, True, False,
    ]  # fmt: skip
    assert table[0]["seeds"] == [0, 1, 2] and table[0]["seeds_reached_target"] == 3
    assert table[0]["env_steps_to_target_ci_lo"] < table[0]["env_steps_to_target_mean"]
    assert len(found) == 3


def test_the_figure_has_three_panels_and_decodes_as_a_png(tmp_path):
    import matplotlib.image

    exp, rows, found = _groups()
    curves = figure.curves(_issue_grid(), (R, figure.SCALE, figure.SKIP))
    fig = figure.build(found, curves, metric=R, threshold=450.0)
    assert len(fig.axes) == 3
    assert [ax.get_title() for ax in fig.axes] == [
        "episode_return_mean", "log2 loss scale", "skipped share of optimizer steps",
    ]  # fmt: skip
    # One mean line per setting in each panel (the metric panel also has the target line).
    assert [len(ax.get_lines()) for ax in fig.axes] == [4, 3, 3]
    assert max(fig.axes[1].get_lines()[0].get_ydata()) == 20.0  # log2 of 2^20
    location = str(tmp_path / figure.FILE)
    figure.write(fig, location)
    with open(location, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    image = matplotlib.image.imread(location)
    assert image.ndim == 3 and image.shape[0] > 100 and image.shape[1] > 300


def test_a_figure_of_trials_without_results_says_so_and_warns_nothing():
    """Trials that ended before their first result have no curve: matplotlib's "No artists
    with labels found to put in legend" warning came after the sweep's last line."""
    import warnings

    exp, rows, found = _groups()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fig = figure.build(found, {}, metric=R, threshold=450.0)
    assert fig.axes[0].get_legend() is None
    assert [t.get_text() for t in fig.axes[0].texts] == ["no results to plot"]
