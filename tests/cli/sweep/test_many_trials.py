"""Many small trials on few cores: tens of one-iteration trials on a 2-CPU Ray need nothing
special (docs/cli.md). Tune runs as many at once as the CPUs allow and queues the rest; every
trial finishes, and the summary ranks each setting over all of its seeds."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[3]

# 2 settings x 15 samples = 30 trials of one iteration each, 2 CPUs: 2 run at a time.
EXPERIMENT = """
algorithm: PPO
env: CartPole-v1
model: {fcnet_hiddens: [8]}
amp: {dtype: float16}
training: {train_batch_size_per_learner: 64, minibatch_size: 64, num_epochs: 1}
resources: {num_env_runners: 0}
search:
  amp.growth_interval: {grid: [10, 2000]}
tune: {num_samples: 15}
stop: {training_iteration: 1}
checkpoint: {frequency: 0, at_end: false}
seed: 0
"""


# About 3-4 minutes on 2 cores: each trial is a Ray actor of its own.
@pytest.mark.slow
def test_thirty_one_iteration_trials_on_two_cpus_all_finish_and_are_ranked(tmp_path, own_ray_env):
    (tmp_path / "many.yaml").write_text(textwrap.dedent(EXPERIMENT))
    out = subprocess.run(
        [sys.executable, "-m", "rllib_amp.tune", "--config", str(tmp_path / "many.yaml"),
         "--storage-path", str(tmp_path / "runs"), "--name", "many"],
        capture_output=True, text=True, timeout=1200, env=own_ray_env, cwd=ROOT,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-5000:]
    runs = tmp_path / "runs" / "many"
    rows = pq.read_table(str(runs / "results.parquet")).to_pylist()
    assert len(rows) == 30 and {r["status"] for r in rows} == {"DONE"}, rows
    assert {r["training_iteration"] for r in rows} == {1}
    assert len({r["seed"] for r in rows}) == 15  # each sample its own seed, shared by a pair
    groups = pq.read_table(str(runs / "groups.parquet")).to_pylist()
    assert sorted(g["amp.growth_interval"] for g in groups) == [10, 2000]
    assert [g["rank"] for g in groups] == [1, 2] and {g["n_seeds"] for g in groups} == {15}
    assert "Settings, best first" in out.stdout and "Found: " in out.stdout
