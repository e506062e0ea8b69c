"""Two `python -m rllib_amp.tune` on one experiment: the second is refused with exit 2 and one
line, before Ray starts, and the first runs on untouched."""

from __future__ import annotations

import os
import socket
import subprocess
import time

import pyarrow.parquet as pq
import pytest

from rllib_amp.sweep import main as cli
from rllib_amp.sweep.lock import LOCK_FILE


@pytest.mark.usefixtures("ray_must_not_start")
@pytest.mark.parametrize(
    ("flags", "where"),
    [
        (["--name", "exp"], "--name"),
        (["--name", "exp", "--resume"], "--resume"),
        (["--resume"], "--resume"),  # the newest run of the file
    ],
    ids=["same-name", "resume-by-name", "resume-newest"],
)
def test_a_command_on_a_locked_experiment_is_refused_before_ray(
    tmp_path, tiny_file, capsys, lock_holder, flags, where
):
    config = tiny_file(tmp_path)
    name = "exp" if "--name" in flags else "tiny_2026-12-01_16-20-03"
    folder = tmp_path / "runs" / name
    folder.mkdir(parents=True)
    holder = lock_holder(folder / LOCK_FILE)  # a running sweep's lock
    (folder / "tuner.pkl").write_bytes(b"the running sweep's")
    args = ["--config", config, "--storage-path", str(tmp_path / "runs"), *flags]
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith(f"python -m rllib_amp.tune: error: {where}: experiment {name!r}")
    assert f"in use by pid {holder} on {socket.gethostname()}" in err
    assert sorted(os.listdir(folder)) == sorted([LOCK_FILE, "tuner.pkl"])
    assert (folder / "tuner.pkl").read_bytes() == b"the running sweep's"


# About 19 s on 2 cores; slow to keep the default run under 8 minutes. The default run keeps
# the lock's rules (tests/unit/sweep/test_lock.py: taken, refused to a second taker, released,
# stale locks) and test_a_new_run_name_is_locked.
@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_a_resume_while_the_sweep_runs_is_refused_and_the_sweep_finishes(
    tmp_path, tiny_file, trial_results, session_sweep
):
    config = tiny_file(tmp_path, iterations=3)
    cmd = session_sweep(config, tmp_path, "busy")
    first = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lock = tmp_path / "busy" / LOCK_FILE
    deadline = time.time() + 120
    while not lock.exists() and time.time() < deadline and first.poll() is None:
        time.sleep(0.05)
    assert lock.exists(), "the first sweep took no lock"
    for flags in ([], ["--resume"]):
        second = subprocess.run(cmd + flags, capture_output=True, text=True, timeout=120)
        assert second.returncode == 2, second.stdout[-2000:] + second.stderr[-2000:]
        assert second.stderr.count("\n") == 1, second.stderr
        assert f"in use by pid {first.pid} on" in second.stderr
    out, _ = first.communicate(timeout=300)
    assert first.returncode == 0, out[-3000:]
    assert not lock.exists()  # released at exit
    rows = pq.read_table(str(tmp_path / "busy" / "results.parquet")).to_pylist()
    assert len(rows) == 2 and all(r["status"] == "DONE" for r in rows)
