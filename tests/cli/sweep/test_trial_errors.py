"""A trial whose env raises mid-run: the fault is named once on the terminal (Tune printed a
77-line traceback per attempt, 237 lines for one trial), and the summary gives the trial, the
exception's own line and where the full traceback is."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[3]

# A user's env in a module of their own (``env: module:Name-v0``, as gym.make takes it).
FAILING_ENV = """
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class Failing(CartPoleEnv):
    def step(self, action):
        self.steps = getattr(self, "steps", 0) + 1
        if self.steps > 150:
            raise RuntimeError("the simulator lost its licence server")
        return super().step(action)


gym.register("Failing-v0", entry_point=Failing, max_episode_steps=500)
"""

EXPERIMENT = """
algorithm: PPO
env: failing_env:Failing-v0
model: {fcnet_hiddens: [16]}
amp: {dtype: float16}
training: {train_batch_size_per_learner: 100, minibatch_size: 100, num_epochs: 1}
resources: {num_env_runners: 0}
tune: {max_failures: 1}
stop: {training_iteration: 5}
"""


# About 55 s on 2 cores (a Ray of its own, with the env's module on its PYTHONPATH); the
# default run has the filter's own example (rllib_amp.sweep.tuner.OneLinePerFault).
@pytest.mark.slow
def test_a_trial_whose_env_raises_is_named_once_with_its_error_file(tmp_path, own_ray_env):
    (tmp_path / "failing_env.py").write_text(FAILING_ENV)
    (tmp_path / "failing.yaml").write_text(textwrap.dedent(EXPERIMENT))
    # The env runners import it too; the project's root as for any test's subprocess.
    env = dict(own_ray_env, PYTHONPATH=os.pathsep.join([str(tmp_path), str(ROOT)]))
    out = subprocess.run(
        [sys.executable, "-m", "rllib_amp.tune", "--config", str(tmp_path / "failing.yaml"),
         "--storage-path", str(tmp_path / "runs"), "--name", "f"],
        capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path,
    )  # fmt: skip
    assert out.returncode == 1, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr, out.stderr[-5000:]
    cause = "RuntimeError: the simulator lost its licence server"
    # Tune's own line per attempt (the first, and the retry that failed the same way) is one.
    assert out.stderr.count(cause) == 1, out.stderr[-5000:]
    (row,) = pq.read_table(str(tmp_path / "runs" / "f" / "results.parquet")).to_pylist()
    assert row["status"] == "ERROR" and row["error"] == cause, row
    line = out.stdout.strip().splitlines()[-1]
    error_file = row["error_file"]
    assert error_file.startswith(str(tmp_path / "runs" / "f")) and error_file.endswith("error.txt")
    assert line == f"trial {row['trial_id']} failed: {cause} (traceback: {error_file})", line
    assert row["trial_id"] != "default" and "licence server" in Path(error_file).read_text()
