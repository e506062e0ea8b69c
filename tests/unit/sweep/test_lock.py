"""The experiment lock: one command per experiment folder at a time."""

from __future__ import annotations

import json
import os
import socket
import subprocess

import pytest

from rllib_amp.cli import UsageError
from rllib_amp.sweep import resume as R


@pytest.fixture
def dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _write_lock(folder, host, pid):
    os.makedirs(folder, exist_ok=True)
    (folder / R.LOCK_FILE).write_text(json.dumps({"host": host, "pid": pid}))


def _owner(folder):
    return json.loads((folder / R.LOCK_FILE).read_text())


def test_lock_is_taken_refused_to_a_second_taker_and_released(tmp_path, live_pid):
    storage = str(tmp_path)
    with R.locks_released():
        R.lock(storage, "exp")
        assert _owner(tmp_path / "exp") == {"host": socket.gethostname(), "pid": os.getpid()}
        # A second command: here the same process, whose pid is alive, is refused too.
        with pytest.raises(UsageError) as e:
            R.lock(storage, "exp", "--resume")
    assert not (tmp_path / "exp" / R.LOCK_FILE).exists()
    message = str(e.value)
    assert message.startswith("--resume: experiment 'exp'")
    assert f"pid {os.getpid()} on {socket.gethostname()}" in message
    assert f"delete {tmp_path / 'exp' / R.LOCK_FILE}" in message and "\n" not in message

    _write_lock(tmp_path / "exp", socket.gethostname(), live_pid)
    with pytest.raises(UsageError, match=f"in use by pid {live_pid} on "):
        R.lock(storage, "exp")
    with pytest.raises(UsageError, match=f"in use by pid {live_pid} on "):
        R.check_unlocked(storage, "exp", "--name")
    assert _owner(tmp_path / "exp")["pid"] == live_pid  # a refusal leaves the owner's lock


def test_a_lock_whose_pid_is_gone_is_taken_over(tmp_path, dead_pid, capsys):
    _write_lock(tmp_path / "exp", socket.gethostname(), dead_pid)
    R.check_unlocked(str(tmp_path), "exp", "--name")  # stale: no refusal
    with R.locks_released():
        R.lock(str(tmp_path), "exp")
        assert _owner(tmp_path / "exp")["pid"] == os.getpid()
    assert f"taking over the lock of pid {dead_pid}" in capsys.readouterr().out
    assert not (tmp_path / "exp" / R.LOCK_FILE).exists()


def test_a_lock_of_another_host_or_unreadable_is_never_taken_over(tmp_path, dead_pid):
    _write_lock(tmp_path / "exp", "another-host.example", dead_pid)
    with pytest.raises(UsageError, match=f"pid {dead_pid} on another-host.example"):
        R.lock(str(tmp_path), "exp")
    (tmp_path / "exp" / R.LOCK_FILE).write_text("")  # its owner is writing it right now
    with pytest.raises(UsageError, match="being written or unreadable"):
        R.lock(str(tmp_path), "exp")


def test_a_lone_stale_lock_is_no_experiment_and_release_removes_the_folder(tmp_path, dead_pid):
    _write_lock(tmp_path / "exp", socket.gethostname(), dead_pid)
    assert not R.taken(str(tmp_path / "exp"))
    R.refuse_taken(str(tmp_path), "exp")  # a new run may take the name
    with R.locks_released():
        R.lock(str(tmp_path), "exp")
        R.release(str(tmp_path), "exp")
    assert not (tmp_path / "exp").exists()


def test_a_new_run_name_is_locked(tmp_path):
    with R.locks_released():
        name = R.new_run_name("tiny", str(tmp_path))
        assert _owner(tmp_path / name)["pid"] == os.getpid()
    assert os.listdir(tmp_path / name) == []
