"""A trial whose process is killed mid-run is restored by Tune with its scaler state."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest


@pytest.mark.usefixtures("ray_local")
def test_killed_trial_restores_from_its_checkpoint_and_finishes(tmp_path, tiny_file, trial_results):
    import ray

    config = tiny_file(tmp_path, iterations=10, scales=[1024.0])
    cmd = [
        sys.executable, "-m", "rllib_amp.tune", "--config", config,
        "--address", ray.get_runtime_context().gcs_address,
        "--storage-path", str(tmp_path), "--name", "faults",
    ]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pattern = str(tmp_path / "faults" / "*" / "result.json")
    deadline = time.time() + 300
    victim = None
    while time.time() < deadline and victim is None:
        for f in glob.glob(pattern):
            rs = trial_results(f)
            if len(rs) >= 3 and not rs[-1].get("done"):
                victim = (f, rs[-1]["pid"])
                break
        time.sleep(0.1)
    assert victim, "could not catch the trial mid-run"
    os.kill(victim[1], signal.SIGKILL)  # a real kill of the trial actor's process
    out, _ = proc.communicate(timeout=600)
    assert proc.returncode == 0, out[-3000:]

    rs = trial_results(victim[0])
    assert rs[-1]["training_iteration"] == 10 and rs[-1]["done"]
    restored = [r for r in rs if r["iterations_since_restore"] < r["training_iteration"]]
    assert restored, "the trial was not restored from a checkpoint"
    # The restored trial kept its scaler state: the AMP step counter continued from the
    # checkpoint instead of starting again from zero.
    first = restored[0]
    amp = lambda r: r["learners"]["default_policy"]  # noqa: E731
    # (The checkpoint it restored from may be newer than the last result line written.)
    earlier = [
        r
        for r in rs
        if r["training_iteration"] < first["training_iteration"]
        and r["iterations_since_restore"] == r["training_iteration"]
    ]
    assert earlier, [r["training_iteration"] for r in rs]
    assert (
        amp(first)["amp_optimizer_steps_lifetime"]
        > amp(earlier[-1])["amp_optimizer_steps_lifetime"]
    )
    assert amp(first)["amp_grad_scale"] >= 1.0
    table = pq.read_table(str(tmp_path / "faults" / "results.parquet")).to_pylist()
    assert [r["status"] for r in table] == ["DONE"]
