"""`--set` on a searched key, and the sweep's recommendation applied to the experiment that
produced it: the flags it prints must change the run, and say how."""

from __future__ import annotations

import itertools
import os
import shlex

import yaml

from rllib_amp import experiment as E
from rllib_amp.sweep import main as cli
from rllib_amp.sweep import recommend

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
# Searches init_scale (grid of 2), growth_interval (choice of 2) and the batch (grid of 2),
# 2 samples: 8 trials.
DQN = os.path.join(ROOT, "tune_configs", "cartpole_dqn_amp.yaml")
M = "env_runners/episode_return_mean"


def _dry_run(capsys, tmp_path, *args):
    assert cli.main(["--config", DQN, "--dry-run", "--storage-path", str(tmp_path), *args]) == 0
    out = capsys.readouterr().out
    trials = int(out.split("# trials: ")[1].split()[0])
    resolved = yaml.safe_load(out[out.index("algorithm:") : out.index("# search space")])
    return out, trials, resolved


def _rows():
    """A finished sweep's summary rows: growth_interval 2000 from 65536 is the best setting
    and settled at 2**14."""
    rows = []
    for scale, interval, batch in itertools.product((1024.0, 65536.0), (100, 2000), (32, 64)):
        best = (scale, interval) == (65536.0, 2000)
        for seed in (0, 1):
            rows.append(
                {"trial_id": f"{scale:g}_{interval}_{batch}_{seed}", "status": "DONE",
                 "seed": seed, "amp.init_scale": scale, "amp.growth_interval": interval,
                 "training.train_batch_size_per_learner": batch,
                 M: (400.0 if best else 20.0) + seed + batch / 64,
                 "settled_scale": 2.0**14 if best else 512.0, "skipped_steps": 1,
                 "optimizer_steps": 100}
            )  # fmt: skip
    return rows


def test_the_printed_recommendation_applied_to_its_experiment_runs_its_values(tmp_path, capsys):
    out, trials, _ = _dry_run(capsys, tmp_path)
    assert trials == 8 and "replaces the search" not in out

    exp = E.load(DQN)
    recommend.report(exp, _rows(), grid=[], exp_dir=str(tmp_path))
    printed = capsys.readouterr().out.splitlines()
    flags = shlex.split(printed[1])
    assert flags[0] == "--set" and "delete its search entries for amp.init_scale" in printed[2]
    # The file carries the same flags.
    text = (tmp_path / recommend.FILE).read_text()
    (apply_line,) = [line for line in text.splitlines() if line.startswith("# apply with: ")]
    assert shlex.split(apply_line.removeprefix("# apply with: ")) == flags
    amp = yaml.safe_load(text)["amp"]
    assert amp["init_scale"] == 2.0**14 and amp["growth_interval"] == 2000

    out, trials, resolved = _dry_run(capsys, tmp_path, *flags)
    # Only the batch grid is left: 2 settings x 2 samples.
    assert trials == 4
    for key in ("amp.init_scale", "amp.growth_interval"):
        assert f"replaces the search over {key} (2 values)" in out
        assert f"\n{key}:" not in out[out.index("# search space") :]
    assert resolved["amp"]["init_scale"] == 2.0**14
    assert resolved["amp"]["growth_interval"] == 2000
    assert list(resolved["search"]) == ["training.train_batch_size_per_learner"]


def test_a_set_on_a_searched_key_says_in_one_line_that_it_replaces_the_search(tmp_path, capsys):
    out, trials, resolved = _dry_run(capsys, tmp_path, "--set", "amp.init_scale=1024")
    assert trials == 4 and resolved["amp"]["init_scale"] == 1024
    lines = [line for line in out.splitlines() if "replaces the search" in line]
    assert lines == ["--set amp.init_scale=1024 replaces the search over amp.init_scale (2 values)"]
