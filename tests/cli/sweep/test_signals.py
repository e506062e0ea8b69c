"""`python -m rllib_amp.tune` stopped by a signal: SIGTERM (what `ray job stop` and most
schedulers send) behaves like Ctrl-C, and a second signal while the experiment state is being
saved does not cut it short. Each run is then resumed to the end."""

from __future__ import annotations

import glob
import signal
import subprocess
import time

import pyarrow.parquet as pq
import pytest


def _start(tmp_path, tiny_file, session_sweep, name):
    config = tiny_file(tmp_path, iterations=4)
    cmd = session_sweep(config, tmp_path, name)
    log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return cmd, proc, log


def _wait_for_a_result(tmp_path, name, trial_results, proc):
    pattern = str(tmp_path / name / "*" / "result.json")
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if any(trial_results(f) for f in glob.glob(pattern)):
            return
        time.sleep(0.1)
    raise AssertionError(f"no trial reported before the signal (exit {proc.poll()})")


def _resume_finishes(cmd, tmp_path, name):
    out = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = pq.read_table(str(tmp_path / name / "results.parquet")).to_pylist()
    assert len(rows) == 2 and all(r["status"] == "DONE" for r in rows), rows


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize(
    ("signals", "status"),
    [
        # About 45 s each on 2 cores: the default run keeps the one that covers both faults
        # (tests/cli/sweep/test_cli_errors.py has the handler's logic without Ray).
        pytest.param([signal.SIGTERM], 143, marks=pytest.mark.slow),
        # The second one lands while Tune saves the experiment state.
        pytest.param([signal.SIGINT, signal.SIGINT], 130, marks=pytest.mark.slow),
        ([signal.SIGTERM, signal.SIGINT], 143),
    ],
    ids=["sigterm", "sigint-twice", "sigterm-then-sigint"],
)
def test_a_signal_saves_the_state_prints_resume_and_resume_finishes(
    tmp_path, tiny_file, trial_results, session_sweep, signals, status
):
    name = "signalled"
    cmd, proc, log = _start(tmp_path, tiny_file, session_sweep, name)
    try:
        _wait_for_a_result(tmp_path, name, trial_results, proc)
        for i, sig in enumerate(signals):
            if i:
                time.sleep(0.3)
            proc.send_signal(sig)
        assert proc.wait(timeout=180) == status
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = (tmp_path / f"{name}.log").read_text()
    assert "Traceback" not in text, text[-3000:]
    if len(signals) > 1:
        assert "still saving the experiment state" in text, text[-3000:]
    resume = [line for line in text.splitlines() if line.rstrip().endswith("--resume")]
    assert resume and f"--name {name}" in resume[-1], text[-3000:]
    assert glob.glob(str(tmp_path / name / "experiment_state-*.json"))
    _resume_finishes(cmd, tmp_path, name)
