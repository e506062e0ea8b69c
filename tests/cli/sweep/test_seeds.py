"""Independent repeats: each sample of a setting trains from its own seed (base + k), and a
rerun with the same base seed reproduces every trial (a tiny CartPole PPO through the CLI)."""

from __future__ import annotations

import textwrap

import pyarrow.parquet as pq
import pytest

from rllib_amp.sweep import main as cli

R = "env_runners/episode_return_mean"
TINY = """
algorithm: PPO
env: CartPole-v1
model: {fcnet_hiddens: [16]}
amp: {dtype: float16}
training: {train_batch_size_per_learner: 200, minibatch_size: 100, num_epochs: 1}
resources: {num_env_runners: 0}
search:
  amp.growth_interval: {grid: [2000]}
tune: {num_samples: 2, max_concurrent_trials: 2}
stop: {training_iteration: 3}
checkpoint: {frequency: 0, at_end: false}
seed: 11
"""


def _run(tmp_path, name):
    config = tmp_path / "seeds.yaml"
    config.write_text(textwrap.dedent(TINY))
    rc = cli.main(["--config", str(config), "--storage-path", str(tmp_path), "--name", name])
    assert rc == 0
    rows = pq.read_table(str(tmp_path / name / "results.parquet")).to_pylist()
    return {r["seed"]: r for r in rows}


def _trajectory(row):
    # Episodes finished and their mean return: both follow from the seeded env resets and the
    # seeded initial weights, and from every update after them.
    return (row["env_steps"], row[R], row["settled_scale"])


# About 15 s (two sweeps). In the default run each sample's seed is handed out without Ray
# (experiment.builder.SeedOfSample's doctest) and grouped over seeds (unit/sweep/test_groups).
@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_samples_get_their_own_seeds_and_a_rerun_reproduces_them(tmp_path):
    first = _run(tmp_path, "first")
    assert sorted(first) == [11, 12] and {r["base_seed"] for r in first.values()} == {11}
    assert first[11]["amp.growth_interval"] == first[12]["amp.growth_interval"] == 2000
    # Two samples of one setting: different seeds, different runs.
    assert first[11][R] != first[12][R]
    again = _run(tmp_path, "again")
    assert {s: _trajectory(r) for s, r in again.items()} == {
        s: _trajectory(r) for s, r in first.items()
    }
