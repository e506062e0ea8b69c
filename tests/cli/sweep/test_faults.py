"""A trial whose process is killed mid-run is restored by Tune with its scaler state."""

from __future__ import annotations

import glob
import os
import signal
import subprocess
import time

import pyarrow.parquet as pq
import pytest
from ray._private.state import jobs


@pytest.mark.slow  # a sweep, a killed trial, Tune's restore: 24 s on 2 idle cores
@pytest.mark.usefixtures("ray_local")
def test_killed_trial_restores_from_its_checkpoint_and_finishes(
    tmp_path, tiny_file, trial_results, session_sweep
):
    config = tiny_file(tmp_path, iterations=10, scales=[1024.0])
    cmd = session_sweep(config, tmp_path, "faults")
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


def _interrupt_with_checkpoints(
    tmp_path, tiny_file, trial_results, session_sweep, name, iterations
):
    """A one-trial sweep stopped by SIGINT once its trial has saved checkpoints: the command
    and the trial folder."""

    config = tiny_file(tmp_path, iterations=iterations, scales=[1024.0])
    cmd = session_sweep(config, tmp_path, name)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    pattern = str(tmp_path / name / "*" / "result.json")
    deadline = time.time() + 300
    trial = None
    while time.time() < deadline and trial is None:
        for f in glob.glob(pattern):
            if len(trial_results(f)) >= 3:
                trial = os.path.dirname(f)
        time.sleep(0.1)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130
    assert trial, "could not catch the trial mid-run"
    return cmd, trial


def _truncate_biggest_file(checkpoint: str) -> None:
    biggest = max(
        (os.path.join(d, f) for d, _, fs in os.walk(checkpoint) for f in fs), key=os.path.getsize
    )
    with open(biggest, "r+b") as f:
        f.truncate(os.path.getsize(biggest) // 2)


# About 16 s. In the default run: a damaged latest checkpoint passed over
# (integration/checkpoints/test_fallback.py) and damaged checkpoints refused whole
# (unit/checkpoints).
@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_resume_with_every_checkpoint_damaged_exits_2_naming_the_trial(
    tmp_path, tiny_file, trial_results, session_sweep
):
    cmd, trial = _interrupt_with_checkpoints(
        tmp_path, tiny_file, trial_results, session_sweep, "stranded", 50
    )
    saved = sorted(glob.glob(os.path.join(trial, "checkpoint_*")))
    assert saved
    for checkpoint in saved:
        _truncate_biggest_file(checkpoint)
    results_before = len(trial_results(os.path.join(trial, "result.json")))
    jobs_before = sorted(job["JobID"] for job in jobs())

    out = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=600)

    assert out.returncode == 2, out.stdout[-3000:] + out.stderr[-3000:]
    assert "Traceback" not in out.stderr and "RayTaskError" not in out.stderr
    # Said before Ray starts: the command never joined the session's Ray (no "Connecting to
    # existing Ray cluster" line, no job of its own there), and the line is all it wrote.
    lines = [line for line in out.stderr.splitlines() if line]
    assert len(lines) == 1, out.stderr[-3000:]
    assert sorted(job["JobID"] for job in jobs()) == jobs_before  # (listed in no set order)
    assert os.path.basename(trial) in lines[0] and "no intact checkpoint" in lines[0]
    assert "--restart-damaged" in lines[0]
    # Refused before anything changed: the damaged checkpoints stay where they were, and the
    # trial did not run.
    assert sorted(glob.glob(os.path.join(trial, "checkpoint_*"))) == saved
    assert len(trial_results(os.path.join(trial, "result.json"))) == results_before


@pytest.mark.slow  # a sweep, its interruption and a resume that trains again: 35-40 s
@pytest.mark.usefixtures("ray_local")
def test_restart_damaged_runs_a_trial_without_intact_checkpoints_again(
    tmp_path, tiny_file, trial_results, session_sweep
):
    cmd, trial = _interrupt_with_checkpoints(
        tmp_path, tiny_file, trial_results, session_sweep, "restart", 10
    )
    saved = sorted(glob.glob(os.path.join(trial, "checkpoint_*")))
    for checkpoint in saved:
        _truncate_biggest_file(checkpoint)

    out = subprocess.run(
        cmd + ["--resume", "--restart-damaged"],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip

    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    warning = [line for line in out.stderr.splitlines() if line.startswith("WARNING")]
    assert any(os.path.basename(trial) in w and "from scratch" in w for w in warning), warning
    for checkpoint in saved:  # kept aside for inspection, never deleted
        assert os.path.isdir(checkpoint + ".damaged"), checkpoint
    rs = trial_results(os.path.join(trial, "result.json"))
    assert rs[-1]["done"]
    # Started again from its first iteration: no restore took place.
    assert rs[-1]["iterations_since_restore"] == rs[-1]["training_iteration"]
    table = pq.read_table(str(tmp_path / "restart" / "results.parquet")).to_pylist()
    assert [r["status"] for r in table] == ["DONE"]


@pytest.mark.slow  # a real sweep (about 20 s); tests/unit/sweep/test_grafana.py covers each case
@pytest.mark.usefixtures("ray_local")
def test_a_grafana_folder_that_is_a_file_does_not_stop_the_sweep(
    tmp_path, tiny_file, session_sweep
):
    from rllib_amp.sweep import grafana

    blocker = tmp_path / "not-a-folder"
    blocker.write_text("a file where the dashboard folder should be")
    config = tiny_file(tmp_path, iterations=1, scales=[1024.0])
    cmd = session_sweep(config, tmp_path, "grafana")
    env = {**os.environ, grafana.GRAFANA_OUTPUT_DIR_ENV: str(blocker / "dashboards")}
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    warning = [line for line in out.stderr.splitlines() if "Grafana dashboard" in line]
    assert len(warning) == 1, out.stderr[-3000:]
    assert warning[0].startswith("WARNING") and f"{blocker} is a file" in warning[0]
    assert "AMP Grafana dashboard:" not in out.stdout
    table = pq.read_table(str(tmp_path / "grafana" / "results.parquet")).to_pylist()
    assert [r["status"] for r in table] == ["DONE"]
