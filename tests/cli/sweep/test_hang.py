"""A trial that hangs (an env step that never returns): Tune has no per-trial timeout, so the
sweep waits; Ctrl-C ends it within seconds with 130, the summary and the --resume command, and
the resume, once the env is fixed, finishes the trial from its last checkpoint (a changed stop
rule, accepted with --accept-changes, takes no effect)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[3]

# A user's env in a module of their own; it hangs from its 250th step on while HANG is set,
# after writing that file (the test's sign that the trial is stuck).
HANGING_ENV = """
import os, time
import gymnasium as gym
from gymnasium.envs.classic_control import CartPoleEnv


class Hanging(CartPoleEnv):
    def step(self, action):
        self.steps = getattr(self, "steps", 0) + 1
        marker = os.environ.get("HANG")
        if marker and self.steps > 250:
            open(marker, "w").close()
            time.sleep(10**6)
        return super().step(action)


gym.register("Hanging-v0", entry_point=Hanging, max_episode_steps=500)
"""

EXPERIMENT = """
algorithm: PPO
env: hanging_env:Hanging-v0
model: {fcnet_hiddens: [16]}
amp: {dtype: float16}
training: {train_batch_size_per_learner: 100, minibatch_size: 100, num_epochs: 1}
resources: {num_env_runners: 0}
stop: {training_iteration: 4}
checkpoint: {frequency: 1}
"""


# About 60 s on 2 cores: a Ray of its own (the env's module on its PYTHONPATH), the hang, the
# resume.
@pytest.mark.slow
def test_ctrl_c_ends_a_sweep_with_a_hung_trial_and_the_resume_finishes_it(tmp_path, own_ray_env):
    (tmp_path / "hanging_env.py").write_text(HANGING_ENV)
    (tmp_path / "hanging.yaml").write_text(textwrap.dedent(EXPERIMENT))
    marker = tmp_path / "hung"
    path = os.pathsep.join([str(tmp_path), str(ROOT)])
    env = dict(own_ray_env, PYTHONPATH=path, HANG=str(marker))
    cmd = [sys.executable, "-m", "rllib_amp.tune", "--config", str(tmp_path / "hanging.yaml"),
           "--storage-path", str(tmp_path / "runs"), "--name", "h"]  # fmt: skip
    log = open(tmp_path / "h.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=tmp_path)
    try:
        deadline = time.time() + 300
        while not marker.exists() and proc.poll() is None and time.time() < deadline:
            time.sleep(0.2)
        assert marker.exists(), f"the trial never hung (exit {proc.poll()})"
        time.sleep(2)  # the status loop keeps running: nothing ends a hung trial by itself
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        start = time.time()
        status = proc.wait(timeout=120)
        took = time.time() - start
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    out = (tmp_path / "h.log").read_text()
    assert status == 130, out[-3000:]
    assert took < 60, f"Ctrl-C took {took:.0f} s to end the sweep"
    (row,) = pq.read_table(str(tmp_path / "runs" / "h" / "results.parquet")).to_pylist()
    assert row["status"] == "UNFINISHED" and row["training_iteration"] == 2, row
    resume = out.strip().splitlines()[-1]
    assert resume.endswith("--resume") and "continue with: " in resume, resume
    # The env fixed (HANG unset), the printed command finishes the trial from iteration 2.
    # The user also raised the stop rule: refused (exit 2, the key named), then accepted with
    # --accept-changes, which says the change takes no effect, and it does not: Tune restores
    # the trial's stop rule as first started.
    env.pop("HANG")
    args = resume.split("continue with: ", 1)[1].split()
    assert args[:3] == ["python", "-m", "rllib_amp.tune"], args
    changed = [sys.executable, *args[1:], "--set", "stop.training_iteration=6"]
    refused = subprocess.run(changed, capture_output=True, text=True, timeout=120, env=env)
    assert refused.returncode == 2, refused.stdout[-3000:] + refused.stderr[-3000:]
    assert "stop.training_iteration: 4 -> 6" in refused.stderr, refused.stderr
    done = subprocess.run(
        [*changed, "--accept-changes"], capture_output=True, text=True, timeout=600, env=env,
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "these changes take no effect" in done.stdout, done.stdout[-3000:]
    (row,) = pq.read_table(str(tmp_path / "runs" / "h" / "results.parquet")).to_pylist()
    assert row["status"] == "DONE" and row["training_iteration"] == 4, row
    assert not marker.exists() or marker.stat().st_mtime < start  # it did not hang again
