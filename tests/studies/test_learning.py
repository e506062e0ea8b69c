"""The Pong learning-evidence command: settings, milestones, the report from parquet alone,
resumable runs (kill, resume, no gap or duplicate), bad input."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
import types

import pyarrow.parquet as pq
import pytest
import yaml

from studies import curves as C
from studies import learning as P

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
MACHINE = "test machine"


def _rows(run: str, path: str, seed: int, points, date="2026-12-01", episodes=20):
    return [
        {"run": run, "path": path, "seed": seed, "iteration": i + 1, "env_steps": s,
         "seconds": t, "return": r, "episodes": episodes, "date": date, "machine": MACHINE}
        for i, (s, t, r) in enumerate(points)
    ]  # fmt: skip


def test_the_settings_are_the_pong_experiments_and_cleanrls():
    with open(os.path.join(ROOT, "tune_configs", "pong_ppo_amp.yaml"), encoding="utf-8") as f:
        exp = yaml.safe_load(f)
    steps = exp["stop"]["num_env_steps_sampled_lifetime"]
    assert exp["training"] == {**P.TRAINING, "lr": P.lr_schedule(steps)}
    # CleanRL's ppo_atari, where RLlib's PPO defaults differ.
    t = P.TRAINING
    assert (t["clip_param"], t["vf_loss_coeff"], t["entropy_coeff"]) == (0.1, 0.5, 0.01)
    assert t["use_kl_loss"] is False and t["kl_coeff"] == 0.0
    assert (t["grad_clip"], t["grad_clip_by"]) == (0.5, "global_norm")
    assert t["train_batch_size_per_learner"] // t["minibatch_size"] == 4
    assert P.lr_schedule(steps) == [[0, 2.5e-4], [steps, 0.0]]


def test_the_pong_experiment_file_passes_the_schema():
    from rllib_amp import experiment as E

    exp = E.load(os.path.join(ROOT, "tune_configs", "pong_ppo_amp.yaml"))
    assert exp.data["training"]["lr"][0] == [0, 2.5e-4]
    assert exp.algorithm_config().lr == [[0, 2.5e-4], [3_000_000, 0.0]]


@pytest.mark.parametrize(
    "lr, fragment",
    [
        ([[100, 1e-3]], "must start at step 0"),
        ([[0, 1e-3], [0, 0.0]], "got the pair [0, 0.0]"),
        ([[0, -1.0]], "got the pair [0, -1.0]"),
        ("fast", "expected a number or RLlib's schedule form"),
        (-1.0, "must be >= 0"),
    ],
)
def test_a_bad_lr_schedule_names_the_key_and_the_form(lr, fragment):
    from rllib_amp.experiment.errors import ExperimentError
    from rllib_amp.experiment.schema import validate

    raw = {"algorithm": "PPO", "env": "CartPole-v1", "training": {"lr": lr}}
    with pytest.raises(ExperimentError, match="training.lr") as e:
        validate(raw)
    assert fragment in str(e.value)


def test_milestones_returns_at_1m_2m_3m_and_steps_and_time_to_0_and_18():
    rows = _rows("r", P.AMP, 0, [(5e5, 600.0, -20.0), (1.0e6, 1200.0, math.nan),
                                 (1.1e6, 1300.0, -8.0), (2.2e6, 2600.0, 3.0),
                                 (3.0e6, 3600.0, 18.5)])  # fmt: skip
    m = C.run_milestones(rows)
    # At 1M the return is NaN (no episode ended): the first finite point past 1M counts.
    assert m["return_at_1M"] == -8.0 and m["return_at_2M"] == 3.0 and m["return_at_3M"] == 18.5
    assert (m["steps_to_0"], m["seconds_to_0"]) == (2.2e6, 2600.0)
    assert (m["steps_to_18"], m["seconds_to_18"]) == (3.0e6, 3600.0)
    assert m["final"] == 18.5
    never = C.run_milestones(_rows("q", P.AMP, 1, [(1e5, 10.0, -21.0)]))
    assert never["return_at_1M"] is None and never["steps_to_0"] is None


def test_time_to_score_gives_per_path_the_seeds_that_got_there_median_and_range():
    rows = (
        _rows("a", P.AMP, 0, [(5e5, 600.0, -3.0), (1e6, 1200.0, 1.0), (2e6, 3000.0, 18.2)])
        + _rows("b", P.AMP, 1, [(5e5, 300.0, 2.0), (1e6, 900.0, 10.0)])
        + _rows("c", P.FP32_NATIVE, 0, [(1e6, 1800.0, -5.0)])
    )
    lines = C.time_to_score(rows).splitlines()
    assert lines[0].startswith("| path | seeds | run length | reached 0 | minutes, median | range")
    # amp: both seeds reach 0 (at 20 and 5 min), one of two reaches +18 (at 50 min).
    amp = "| amp-native | 2 | 1.00M-2.00M | 2 of 2 | 12 | 5-20 | 1 of 2 | 50 | 50-50 |"
    assert lines[2] == f"{amp} {MACHINE} |"
    assert lines[3] == f"| fp32-native | 1 | 1.00M | 0 of 1 | - | - | 0 of 1 | - | - | {MACHINE} |"
    # report_text (table.md, the pages' copies) carries it under the runs' table.
    assert "\n".join(lines) in C.report_text(rows)


def test_milestones_use_the_last_20_episodes_not_one_lucky_game():
    # One episode per iteration: a single +18 game among losses is no +18 agent.
    points = [(1e5 * i, 10.0 * i, -20.0) for i in range(1, 31)] + [(3.1e6, 310.0, 18.0)]
    m = C.run_milestones(_rows("w", P.AMP, 0, points, episodes=1))
    assert m["steps_to_18"] is None and m["final"] == pytest.approx((19 * -20.0 + 18.0) / 20)
    assert m["return_at_1M"] == -20.0
    # Before 20 episodes have ended the window is not full, and nothing counts.
    assert C.run_milestones(_rows("v", P.AMP, 0, [(1e6, 1.0, 5.0)], episodes=3))["final"] is None


def test_a_run_stopped_at_its_budget_has_its_last_window_at_that_milestone():
    # The last iterations, at and past 3M, ended no episode: the window as the run left it.
    rows = _rows("b", P.AMP, 1, [(2.9e6, 3500.0, 19.0), (3.0e6, 3600.0, math.nan)])
    assert C.run_milestones(rows)["return_at_3M"] == 19.0
    # A run that stopped short of 3M has no figure there.
    short = _rows("s", P.AMP, 1, [(2.9e6, 3500.0, 19.0), (2.95e6, 3550.0, math.nan)])
    assert C.run_milestones(short)["return_at_3M"] is None
    # The same rule for the AMP-vs-float32 pair at 1M, whose runs stop at 1M.
    runs = {("d", path, seed): _rows(f"{path}{seed}", path, seed,
                                     [(0.99e6, 1.0, -5.0 - seed), (1e6, 2.0, math.nan)])
            for path in (P.AMP, P.FP32_NATIVE) for seed in (0, 1)}  # fmt: skip
    assert C.compare_at(runs, 1_000_000)["values"] == [-5.0, -6.0]


def test_amp_against_fp32_at_1m_uses_the_seed_spread():
    runs = {}
    for path, vals in ((P.AMP, (-10.0, -16.0)), (P.FP32_NATIVE, (-11.0, -12.0))):
        for seed, v in enumerate(vals):
            runs[("d", path, seed)] = _rows(f"{path}{seed}", path, seed, [(1e6, 1.0, v)])
    c = C.compare_at(runs, 1_000_000)
    assert c["mean"] == -13.0 and c["reference_mean"] == -11.5 and c["no_worse"]
    # Pooled -10, -16, -11, -12: of the 6 splits, AMP's {-10,-16} (difference -1.5) and the
    # lower {-16,-12} (-3.5) and {-16,-11} (-2.5) are at most as high: 3 of 6.
    assert (c["as_low"], c["splits"]) == (3, 6)
    runs[("d", P.AMP, 0)] = _rows("a0", P.AMP, 0, [(1e6, 1.0, -20.0)])
    runs[("d", P.AMP, 1)] = _rows("a1", P.AMP, 1, [(1e6, 1.0, -20.5)])
    assert C.compare_at(runs, 1_000_000)["no_worse"] is False
    del runs[("d", P.AMP, 1)]
    assert C.compare_at(runs, 1_000_000) is None  # one seed is no evidence


def test_the_replication_is_judged_on_its_own_seeds_once_all_of_them_got_to_1m():
    # Seeds 0 and 1: AMP far ahead; the replication's seeds: AMP far behind. The replication's
    # verdict reads its seeds alone, and only once every one of them, of both paths, got there.
    assert C.REPLICATION_SEEDS == (4, 5)
    vals = {P.AMP: {0: 15.0, 1: 16.0, 4: -10.0, 5: -11.0},
            P.FP32_NATIVE: {0: -5.0, 1: -6.0, 4: 12.0, 5: 13.0}}  # fmt: skip
    rows = [r for path, by_seed in vals.items() for seed, v in by_seed.items()
            for r in _rows(f"{path}{seed}", path, seed, [(1e6, 1.0, v)])]  # fmt: skip
    r = C.compare_at(C.group_runs(rows), 1_000_000, seeds=C.REPLICATION_SEEDS)
    assert r["values"] == [-10.0, -11.0] and r["reference_values"] == [12.0, 13.0]
    assert r["no_worse"] is False and (r["as_low"], r["splits"]) == (1, 6)
    text = C.report_text(rows)
    assert "every seed on record: amp-native 2.5 (15.0, 16.0, -10.0, -11.0)" in text
    assert (
        "The replication decided before its runs (seeds 4 and 5 of each path, docs/pong.md), "
        "at 1M env steps: amp-native -10.5 (-10.0, -11.0) vs fp32-native 12.5 (12.0, 13.0): "
        "WORSE beyond the seed spread." in text
    )
    # Three of its four runs in: no replication verdict yet, the pooled one as before.
    partial = [r for r in rows if (r["path"], r["seed"]) != (P.FP32_NATIVE, 5)]
    assert "replication" not in C.report_text(partial)
    assert "every seed on record" in C.report_text(partial)


def test_plot_only_builds_the_figure_and_table_from_the_parquet_files_alone(tmp_path, capsys):
    pytest.importorskip("matplotlib")
    day1 = _rows("amp-native-seed0", P.AMP, 0, [(1e6, 3600.0, -15.0), (2e6, 7200.0, 1.0)])
    day2 = _rows("amp-native-seed1", P.AMP, 1, [(1e6, 3500.0, -12.0)], date="2026-12-02")
    C.write_rows(day1, str(tmp_path / "2026-12-01.parquet"))
    os.makedirs(tmp_path / "later")
    C.write_rows(day2, str(tmp_path / "later" / "curves.parquet"))
    assert P.main(["--plot-only", str(tmp_path)]) == 0
    assert "wrote" in capsys.readouterr().out
    with open(tmp_path / "learning.png", "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    table = (tmp_path / "table.md").read_text()
    assert "| 2026-12-01 | amp-native | 0 | 2.00M | 2.00 | -15.0 | 1.0 | - | 1.0 |" in table
    assert "| 2026-12-02 | amp-native | 1 | 1.00M |" in table
    assert "0.00M" not in table


def test_the_table_gives_speed_and_peak_memory_once_a_file_records_memory(tmp_path):
    old = _rows("amp-native-seed0", P.AMP, 0, [(1e6, 5000.0, -15.0)])
    new = _rows("fp32-native-seed0", P.FP32_NATIVE, 0, [(5e5, 2500.0, -20.0), (1e6, 4000.0, -9.0)])
    new[0]["peak_rss_mib"], new[1]["peak_rss_mib"] = 3000.0, 3584.0
    # Written and read back: the column survives parquet; older rows read it as None.
    C.write_rows(old + new, str(tmp_path / "c.parquet"))
    rows = C.read_rows(str(tmp_path / "c.parquet"))
    assert [r["peak_rss_mib"] for r in rows] == [None, 3000.0, 3584.0]
    text = C.table(rows)
    assert "| env steps/s | peak memory | machine |" in text
    assert "| 200 | - | " + MACHINE in text  # the older run: its speed, no memory on record
    assert "| 250 | 3.5 GiB | " + MACHINE in text  # the largest peak of the run
    assert "peak memory" not in C.table(old)  # tables of older files stay as they were


def test_plot_only_of_a_folder_without_curves_exits_2(tmp_path, capsys):
    assert P.main(["--plot-only", str(tmp_path)]) == 2
    assert "no curve rows" in capsys.readouterr().err


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--steps", "0"], "--steps: got 0; must be >= 1"),
        (["--seeds", "a,b"], "--seeds: got 'a,b'; give integers"),
        (["--seeds", ","], "--seeds: got no seed"),
        (["--batch", "1"], "--batch: got 1; must be >= 2"),
        (["--paths", "amp"], "--paths: got 'amp'; give one or more of stock, fp32-native"),
        (
            ["--task", "cartpole-dqn", "--paths", "amp-native"],
            "--paths: got 'amp-native'; give one or more of amp, fp32 (--task cartpole-dqn)",
        ),
        (["--task", "pong-sac"], "--task: invalid choice: 'pong-sac'"),
        (["--checkpoint-every", "0"], "--checkpoint-every: got 0; must be >= 1"),
        (["--steps", "100", "--stop-at", "200"], "--stop-at: got 200; must be between 1 and"),
        (["--stop-at", "0"], "--stop-at: got 0; must be between 1 and --steps (3000000)"),
        (["--stepz", "5"], "unrecognized arguments: --stepz 5"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, tmp_path, args, fragment):
    assert P.main([*args, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err and err.startswith(P.PROG)


def test_cartpole_dqn_paths_differ_in_precision_only():
    """The two CartPole DQN paths are the YAML's recipe; fp32 only turns AMP off."""
    amp, fp32 = (
        P.build_config(p, 3, 500_000, "cpu", None, "cartpole-dqn") for p in ("amp", "fp32")
    )
    a, f = amp.learner_config_dict["rllib_amp"], fp32.learner_config_dict["rllib_amp"]
    assert (a.pop("enabled"), a["dtype"], f.pop("enabled")) == ("auto", "float16", False)
    assert a == f
    for cfg in (amp, fp32):
        assert (cfg.seed, cfg.lr, cfg.train_batch_size_per_learner, cfg.rollout_fragment_length,
                cfg.target_network_update_freq, cfg.double_q, cfg.dueling) == (
                3, 0.00025, 128, 10, 500, False, False)  # fmt: skip
    assert (
        P.build_config("fp32", 0, 1, "cpu", 64, "cartpole-dqn").train_batch_size_per_learner == 64
    )


def test_pong_dqn_paths_are_the_file_on_one_machine_differing_in_precision_or_batchnorm():
    """Tianshou's recipe from the file; the cluster resources become one local EnvRunner and a
    local learner; fp32 turns AMP off and amp-native-bn adds the write-up's BatchNorm."""
    amp, fp32, bn = (
        P.build_config(p, 1, 2_000_000, "cpu", None, "pong-dqn")
        for p in ("amp-native", "fp32-native", "amp-native-bn")
    )
    assert [c.learner_config_dict["rllib_amp"]["enabled"] for c in (amp, fp32, bn)] == [
        "auto", False, "auto"]  # fmt: skip
    names = [c.rl_module_spec.module_class.__name__ for c in (amp, fp32, bn)]
    assert "BatchNorm" in names[2] and "BatchNorm" not in names[0] and names[0] == names[1]
    for cfg in (amp, fp32, bn):
        assert (cfg.seed, cfg.lr, cfg.train_batch_size_per_learner, cfg.training_intensity,
                cfg.n_step, cfg.target_network_update_freq, cfg.double_q, cfg.gamma) == (
                1, 0.0001, 32, 3.2, 3, 5000, True, 0.99)  # fmt: skip
        assert (cfg.num_env_runners, cfg.num_learners, cfg.num_gpus_per_learner) == (0, 0, 0)
        assert cfg.num_envs_per_env_runner * cfg.get_rollout_fragment_length() == 40
        assert cfg.replay_buffer_config["capacity"] == 100_000
    # One update of 32 per 10 env steps: 4 updates per sampling round of 10 envs x 4 steps.
    from ray.rllib.algorithms.dqn.dqn import calculate_rr_weights

    assert calculate_rr_weights(amp) == [1, 4]


def test_pong_appo_paths_are_the_file_on_one_machine_differing_in_precision():
    """pong_appo_amp.yaml's training settings; its 32 remote EnvRunners and 2 GPU learners
    become one local EnvRunner of 16 envs (as the PPO Pong runs) and a local learner."""
    amp, fp32 = (
        P.build_config(p, 2, 3_000_000, "cpu", None, "pong-appo")
        for p in ("amp-native", "fp32-native")
    )
    assert [c.learner_config_dict["rllib_amp"]["enabled"] for c in (amp, fp32)] == ["auto", False]
    for cfg in (amp, fp32):
        assert type(cfg).__name__ == "APPOConfig" and cfg.env.__name__ == "AleVectorEnv"
        # RLlib's tuned example (tuned_examples/appo/pong_appo.py) key by key.
        assert (cfg.seed, cfg.lr, cfg.train_batch_size_per_learner, cfg.grad_clip,
                cfg.vf_loss_coeff, cfg.entropy_coeff, cfg.circular_buffer_num_batches,
                cfg.broadcast_interval) == (
                2, 0.0005, 500, 40.0, 1.0, [[0, 0.01], [3_000_000, 0.0]], 4, 5)  # fmt: skip
        assert (cfg.num_env_runners, cfg.num_envs_per_env_runner) == (0, 16)
        assert (cfg.num_learners, cfg.num_gpus_per_learner) == (0, 0)
    assert P.build_config("amp-native", 0, 1, "cuda", None, "pong-appo").num_gpus_per_learner == 1
    assert P.TASK_PATHS["pong-appo"].keys() == {
        "amp-native", "fp32-native", "stock", "amp-native-2epochs"}  # fmt: skip
    # The data-reuse path differs from the AMP path in one key: each batch is trained twice.
    reuse = P.build_config("amp-native-2epochs", 2, 3_000_000, "cpu", None, "pong-appo")
    differ = {k for k, v in amp.to_dict().items() if reuse.to_dict().get(k) != v}
    assert differ == {"num_epochs"} and (amp.num_epochs, reuse.num_epochs) == (1, 2)


def test_the_stock_pong_appo_path_is_rllib_as_it_ships_with_the_file_s_training_keys():
    # The control: if it learns where rllib-amp's paths do not, the fault is ours.
    stock = P.build_config("stock", 2, 3_000_000, "cpu", None, "pong-appo")
    amp = P.build_config("amp-native", 2, 3_000_000, "cpu", None, "pong-appo")
    assert type(stock).__name__ == "APPOConfig" and stock.env.__name__ == "AtariEnv"
    assert "rllib_amp" not in stock.learner_config_dict  # no AMP: RLlib's learner as it is
    keys = ("lr", "train_batch_size_per_learner", "grad_clip", "vf_loss_coeff", "entropy_coeff",
            "circular_buffer_num_batches", "broadcast_interval", "seed", "num_env_runners",
            "num_envs_per_env_runner", "num_learners", "num_gpus_per_learner")  # fmt: skip
    assert [getattr(stock, k) for k in keys] == [getattr(amp, k) for k in keys]
    assert P.build_config("stock", 0, 1, "cpu", 64, "pong-appo").train_batch_size_per_learner == 64


def test_the_cartpole_report_reads_its_own_milestones_and_paths():
    rows = []
    for path, finals in (("amp", (480.0, 490.0, 500.0)), ("fp32", (470.0, 500.0, 495.0))):
        for seed, final in enumerate(finals):
            points = [(1e5, 60.0, 20.0), (2.5e5, 150.0, 300.0), (5e5, 300.0, final)]
            rows += _rows(f"{path}-seed{seed}", path, seed, points)
    text = C.report_text(rows, C.CARTPOLE_DQN)
    assert "| return at 100k | 250k | 500k | final | to 195 (steps / time) | to 475 |" in text
    assert (
        "| 2026-12-01 | amp | 0 | 0.50M | 0.08 | 20.0 | 300.0 | 480.0 | 480.0 | 0.25M / 2 min"
        in text
    )
    assert "(seeds 0, 1 and 2 of each path, docs/dqn.md), at 500k env steps: amp 490.0" in text
    assert "vs fp32 488.3 (470.0, 500.0, 495.0): no worse beyond the seed spread" in text


def test_resume_of_a_folder_without_a_run_and_a_second_start_exit_2(tmp_path, capsys):
    assert P.main(["--resume", str(tmp_path)]) == 2
    assert "holds no run.json" in capsys.readouterr().err
    (tmp_path / P.RUN_FILE).write_text("{}")
    assert P.main(["--out", str(tmp_path)]) == 2
    assert f"continue it with --resume {tmp_path}" in capsys.readouterr().err


class _FakeAlgo:
    """An Algorithm that samples 100 env steps per train() and saves an empty folder."""

    def __init__(self, built):
        self.steps, self.built = 0, built

    def restore_from_path(self, folder):
        with open(os.path.join(folder, "steps.json")) as f:
            self.steps = json.load(f)

    def train(self):
        self.steps += 100
        return {"num_env_steps_sampled_lifetime": self.steps,
                "env_runners": {"episode_return_mean": -21.0, "num_episodes": 1}}  # fmt: skip

    def save_to_path(self, folder):
        # RLlib's save_to_path reads a relative path as a URI: "URI has empty scheme".
        assert os.path.isabs(folder), folder
        os.makedirs(folder)
        with open(os.path.join(folder, "steps.json"), "w") as f:
            json.dump(self.steps, f)

    def stop(self):
        pass


def test_stop_at_ends_the_runs_early_on_the_schedule_of_the_whole_budget(tmp_path, monkeypatch):
    # The AMP-vs-float32 pair at 1M compares runs on one lr schedule: a run stopped at 1M
    # anneals over --steps like the long runs, not to 0 at 1M.
    import rllib_amp.bench.harness as H

    built = []

    def build_config(path, seed, steps, device, batch, task):
        built.append(P.lr_schedule(steps))
        return types.SimpleNamespace(build_algo=lambda: _FakeAlgo(built))

    monkeypatch.setattr(P, "build_config", build_config)
    monkeypatch.setattr(H, "in_child", lambda fn, *a, timeout_s: fn(*a))
    monkeypatch.chdir(tmp_path)
    out = "o"  # relative, as users type it
    args = ["--paths", "fp32-native", "--seeds", "0,1", "--steps", "1000", "--stop-at", "300",
            "--checkpoint-every", "2", "--device", "cpu", "--out", out]  # fmt: skip
    assert P.main(args) == 0
    assert built == [[[0, 2.5e-4], [1000, 0.0]]] * 2
    rows = C.read_rows(os.path.join(out, P.CURVES))
    assert {r["run"]: r["env_steps"] for r in rows} == {"fp32-native-seed0": 300,
                                                        "fp32-native-seed1": 300}  # fmt: skip
    assert P.last_checkpoint(out, "fp32-native", 1)["env_steps"] == 300
    with open(os.path.join(out, P.RUN_FILE)) as f:
        assert json.load(f)["stop_at"] == 300
    # Both runs reached their stop: a resume trains nothing more.
    assert P.main(["--resume", out]) == 0
    assert len(built) == 2 and len(C.read_rows(os.path.join(out, P.CURVES))) == 6


def _curve(out):
    rows = pq.read_table(str(out / P.CURVES)).to_pylist()
    return [(r["iteration"], r["env_steps"]) for r in rows]


@pytest.mark.slow  # a killed and resumed Pong run in fresh processes: about a minute
def test_a_killed_run_resumes_from_its_checkpoint_without_gap_or_duplicate(tmp_path):
    # OUT given as a relative path, as users type it (RLlib's restore refuses a relative one).
    out = tmp_path / "pong"
    cmd = [sys.executable, "-m", "studies.learning", "--paths", "amp-native",
           "--seeds", "0", "--steps", "2048", "--batch", "128", "--checkpoint-every", "3",
           "--device", "cpu", "--out", "pong"]  # fmt: skip
    # The studies are imported from the repository root, wherever the command runs.
    env = {**os.environ, "PYTHONPATH": ROOT}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True, cwd=tmp_path, env=env)  # fmt: skip
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        if (out / P.CURVES).exists() and len(_curve(out)) >= 5:
            break
        time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    before = _curve(out)
    assert 5 <= len(before) < 16, before
    ckpt = P.last_checkpoint(str(out), P.AMP, 0)
    assert ckpt is not None and ckpt["iteration"] % 3 == 0
    resume = [sys.executable, "-m", "studies.learning", "--resume", "pong"]
    done = subprocess.run(
        resume, capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env
    )
    assert done.returncode == 0, done.stderr[-2000:]
    after = _curve(out)
    # Points up to the checkpoint are kept as they were; the rest trained again once.
    assert after[: ckpt["iteration"]] == before[: ckpt["iteration"]]
    assert [i for i, _ in after] == list(range(1, len(after) + 1))
    steps = [s for _, s in after]
    assert steps == sorted(set(steps)) and steps[-1] >= 2048
    assert all(b - a <= 2 * 128 for a, b in zip(steps, steps[1:]))  # no gap
    assert (out / "learning.png").exists() or "matplotlib" not in sys.modules


def test_the_committed_pong_evidence_is_built_from_its_parquet_files():
    # docs/pong/ holds every run's curve; its table and docs/pong.md's copy of it are what
    # --plot-only builds from those files, so a figure in the docs cannot drift from the data.
    # A resumed run's file replaces the stopped run's rows past its checkpoint.
    folder = os.path.join(ROOT, "docs", "pong")
    _committed_evidence(folder, P.PATHS, C.PONG_PPO, ("docs/pong.md", "README.md"))


def _committed_evidence(folder: str, paths, task, pages) -> list:
    """The rows under ``folder`` (docs/...), checked as --plot-only's input: known paths, one
    row per iteration of each run in order, ``table.md`` and each page's copy equal to what the
    files give, the figure present."""
    rows = C.read_rows(folder)
    assert rows, f"{folder} holds no curve"
    assert {r["path"] for r in rows} <= set(paths)
    for key, run_rows in C.group_runs(rows).items():
        its = [r["iteration"] for r in run_rows]
        assert its == list(range(1, len(its) + 1)), key
    expected = C.report_text(rows, task)
    with open(os.path.join(folder, "table.md"), encoding="utf-8") as f:
        assert f.read() == expected
    for page in pages:
        with open(os.path.join(ROOT, page), encoding="utf-8") as f:
            assert expected.strip() in f.read(), f"{page}: its {task.name} table differs"
    assert os.path.exists(os.path.join(folder, "learning.png"))
    return rows


def test_the_committed_cartpole_dqn_evidence_is_built_from_its_parquet_files():
    # docs/dqn/cartpole/ holds the CartPole DQN curves; its table and the copies in
    # docs/dqn.md and the README are what --plot-only builds from those files.
    folder = os.path.join(ROOT, "docs", "dqn", "cartpole")
    _committed_evidence(folder, P.DQN_PATHS, C.CARTPOLE_DQN, ("docs/dqn.md", "README.md"))


def test_the_committed_cartpole_dqn_sweep_is_what_docs_dqn_md_says():
    # docs/dqn/cartpole_sweep/ is the default CartPole DQN sweep's own output; the page's
    # figures on the scaler's skipped steps are computed here from its results.parquet.
    import pyarrow.parquet as pq

    folder = os.path.join(ROOT, "docs", "dqn", "cartpole_sweep")
    rows = pq.read_table(os.path.join(folder, "results.parquet")).to_pylist()
    assert len(rows) == 8 and {(r["status"], r["env_steps"]) for r in rows} == {("DONE", 5e5)}
    returns = sorted({r["env_runners/episode_return_mean"] for r in rows})
    parts = []
    for interval in (100, 2000):
        skipped = sorted(r["skipped_steps"] for r in rows if r["amp.growth_interval"] == interval)
        updates = {r["optimizer_steps"] for r in rows if r["amp.growth_interval"] == interval}
        parts.append(
            f"growth_interval {interval}: {skipped[0]} to {skipped[-1]} skipped steps of "
            f"{max(updates):,} updates ({len(skipped)} trials)"
        )
    line = f"final returns {', '.join(f'{r:g}' for r in returns)}; " + "; ".join(parts)
    with open(os.path.join(ROOT, "docs", "dqn.md"), encoding="utf-8") as f:
        assert line in f.read(), line
    for name in ("groups.parquet", "recommended_amp.yaml", "sweep.png", "summary.txt"):
        assert os.path.exists(os.path.join(folder, name)), name


def test_the_committed_pong_dqn_evidence_is_built_from_its_parquet_files():
    # docs/dqn/pong/ holds the Pong DQN curves; its table and docs/dqn.md's copy of it are
    # what --plot-only builds from those files.
    folder = os.path.join(ROOT, "docs", "dqn", "pong")
    rows = _committed_evidence(folder, P.PONG_DQN_PATHS, C.PONG_DQN, ("docs/dqn.md",))
    with open(os.path.join(ROOT, "docs", "dqn.md"), encoding="utf-8") as f:
        page = f.read()
    # The page's sentences on each path's seed 0 are the table's figures.
    runs = C.group_runs(rows)
    (m,) = [C.run_milestones(r, C.PONG_DQN) for k, r in runs.items() if k[1:] == ("amp-native", 0)]
    assert f"+{m['return_at_2M']:.1f} at 2M env steps" in page
    assert (
        f"first 0 at {m['steps_to_0'] / 1e6:.2f}M and +15 at {m['steps_to_15'] / 1e6:.2f}M" in page
    )
    fp32 = [C.run_milestones(r, C.PONG_DQN) for k, r in runs.items() if k[1:] == ("fp32-native", 0)]
    for f in fp32:
        assert f"fp32-native seed 0 is at {f['return_at_1M']:+.1f} at 1M" in page
    assert os.path.exists(os.path.join(folder, "learning.png"))
    # docs/dqn/pong_seed1_2m/: the seed-1 2M run while it is under way (docs/dqn.md's copy).
    seed1 = os.path.join(ROOT, "docs", "dqn", "pong_seed1_2m")
    _committed_evidence(seed1, P.PONG_DQN_PATHS, C.PONG_DQN, ("docs/dqn.md",))


def test_the_committed_pong_appo_evidence_is_built_from_its_parquet_files():
    # docs/appo/pong/ holds the APPO run with RLlib's tuned example's keys, its table copied
    # into docs/dqn.md; docs/appo/pong_vtrace/ the run after the V-trace fix, its table there
    # too; docs/appo/pong_batch2000/ the run with the file's first settings.
    appo = C.TASKS["pong-appo"]
    _committed_evidence(
        os.path.join(ROOT, "docs", "appo", "pong"), P.PONG_APPO_PATHS, appo, ("docs/dqn.md",)
    )
    _committed_evidence(
        os.path.join(ROOT, "docs", "appo", "pong_vtrace"), P.PONG_APPO_PATHS, appo, ("docs/dqn.md",)
    )
    first = _committed_evidence(
        os.path.join(ROOT, "docs", "appo", "pong_batch2000"), P.PONG_APPO_PATHS, appo, ()
    )
    assert max(r["env_steps"] for r in first) < 1e6


_NICE_CHILD = """
import os, sys
sys.path.insert(0, {root!r})
os.nice(7)
from studies.learning import honour_nice
print(honour_nice({group!r}))
with open({group!r}) as f:
    print(f.read().split()[-1:])
"""


# The child's nice: this process's plus 7 (a test run under `nice` must not fail for it).
CHILD_NICE = str(min(19, os.nice(0) + 7))


def _niced_child(group: str, own_session: bool, script: str = _NICE_CHILD) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", script.format(root=ROOT, group=group)],
        start_new_session=own_session, capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    return out.stdout.splitlines()


@pytest.mark.parametrize(
    ("own_session", "before", "said", "after"),
    [
        (True, "/autogroup-35 nice 0\n", CHILD_NICE, CHILD_NICE),
        # A run left in its parent's session must not renice that session (pytest's here).
        (False, "/autogroup-35 nice 0\n", "None", "/autogroup-35 nice 0\n"),
        # Some sandboxes' kernels give the file but an empty one: nothing to set.
        (True, "", "None", ""),
    ],
)
def test_a_niced_run_in_a_session_of_its_own_gives_its_session_group_that_nice(
    tmp_path, own_session, before, said, after
):
    group = tmp_path / "autogroup"
    group.write_text(before, encoding="ascii")
    assert _niced_child(str(group), own_session)[0] == said
    assert group.read_text(encoding="ascii") == after


def test_a_kernel_without_the_group_file_leaves_the_run_as_it_is(tmp_path):
    # No /proc/self/autogroup (a kernel built without autogroup): nothing set, nothing made.
    group = tmp_path / "autogroup"
    without_reading_back = _NICE_CHILD.split("with open")[0]
    assert _niced_child(str(group), True, without_reading_back) == ["None"]
    assert not group.exists()


def _kernel_autogroup() -> bool:
    try:
        with open("/proc/self/autogroup", encoding="ascii") as f:
            return "nice" in f.read().split()
    except OSError:
        return False


@pytest.mark.skipif(not _kernel_autogroup(), reason="this kernel has no autogroup to set")
def test_the_kernel_s_own_session_group_takes_the_nice():
    # A fresh session's group starts at nice 0, so CHILD_NICE read back is the run's own doing.
    # The kernel reads the group back as "/autogroup-N nice CHILD_NICE".
    assert _niced_child("/proc/self/autogroup", own_session=True) == [
        CHILD_NICE,
        f"['{CHILD_NICE}']",
    ]
