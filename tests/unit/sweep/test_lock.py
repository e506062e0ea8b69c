"""The experiment lock: one command per experiment folder at a time (rllib_amp/sweep/lock.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

from rllib_amp.cli import UsageError
from rllib_amp.sweep import lock as L
from rllib_amp.sweep import resume as R


@pytest.fixture
def dead_pid():
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def _write_lock(folder, host, pid):
    """A lock file left behind, held by no process (its command was killed)."""
    os.makedirs(folder, exist_ok=True)
    (folder / L.LOCK_FILE).write_text(json.dumps({"host": host, "pid": pid}))


def _owner(folder):
    return json.loads((folder / L.LOCK_FILE).read_text())


def test_lock_is_taken_refused_to_a_second_taker_and_released(tmp_path, lock_holder):
    storage = str(tmp_path)
    with L.locks_released():
        L.lock(storage, "exp")
        assert _owner(tmp_path / "exp") == {"host": socket.gethostname(), "pid": os.getpid()}
        # A second command: here the same process, which holds the lock, is refused too.
        with pytest.raises(UsageError) as e:
            L.lock(storage, "exp", "--resume")
    assert not (tmp_path / "exp" / L.LOCK_FILE).exists()
    message = str(e.value)
    assert message.startswith("--resume: experiment 'exp'")
    assert f"pid {os.getpid()} on {socket.gethostname()}" in message
    assert f"delete {tmp_path / 'exp' / L.LOCK_FILE}" in message and "\n" not in message

    holder = lock_holder(tmp_path / "exp" / L.LOCK_FILE)
    with pytest.raises(UsageError, match=f"in use by pid {holder} on "):
        L.lock(storage, "exp")
    with pytest.raises(UsageError, match=f"in use by pid {holder} on "):
        L.check_unlocked(storage, "exp", "--name")
    assert _owner(tmp_path / "exp")["pid"] == holder  # a refusal leaves the owner's lock


def test_a_lock_file_no_process_holds_is_taken_over(tmp_path, dead_pid, capsys):
    _write_lock(tmp_path / "exp", socket.gethostname(), dead_pid)
    L.check_unlocked(str(tmp_path), "exp", "--name")  # stale: no refusal
    with L.locks_released():
        L.lock(str(tmp_path), "exp")
        assert _owner(tmp_path / "exp")["pid"] == os.getpid()
    assert f"taking over the lock of pid {dead_pid}" in capsys.readouterr().out
    assert not (tmp_path / "exp" / L.LOCK_FILE).exists()
    # Another host's file too: the OS, not its pid, says that nobody holds it any more.
    _write_lock(tmp_path / "exp", "another-host.example", 1)
    with L.locks_released():
        L.lock(str(tmp_path), "exp")


def test_a_killed_holder_releases_the_lock(tmp_path, lock_holder):
    import signal

    holder = lock_holder(tmp_path / "exp" / L.LOCK_FILE)
    with pytest.raises(UsageError, match=f"in use by pid {holder} "):
        L.lock(str(tmp_path), "exp")
    os.kill(holder, signal.SIGKILL)
    os.waitpid(holder, 0)
    with L.locks_released():
        L.lock(str(tmp_path), "exp")  # released by the OS with its process


def test_a_held_lock_being_written_or_unreadable_is_refused(tmp_path, lock_holder):
    lock_holder(tmp_path / "exp" / L.LOCK_FILE, content="not json")
    with pytest.raises(UsageError, match="being written or unreadable"):
        L.lock(str(tmp_path), "exp")


def test_a_lone_stale_lock_is_no_experiment_and_release_removes_the_folder(tmp_path, dead_pid):
    _write_lock(tmp_path / "exp", socket.gethostname(), dead_pid)
    assert not R.taken(str(tmp_path / "exp"))
    R.refuse_taken(str(tmp_path), "exp")  # a new run may take the name
    with L.locks_released():
        L.lock(str(tmp_path), "exp")
        R.release(str(tmp_path), "exp")
    assert not (tmp_path / "exp").exists()


def test_a_new_run_name_is_locked(tmp_path):
    with L.locks_released():
        name = R.new_run_name("tiny", str(tmp_path))
        assert _owner(tmp_path / name)["pid"] == os.getpid()
    assert os.listdir(tmp_path / name) == []


def test_on_an_object_store_the_lock_is_a_file_judged_by_its_pid(dead_pid, capsys):
    from tests.cluster.s3 import moto_s3

    with moto_s3() as s3:
        storage = s3.uri("runs")
        key = f"{s3.bucket}/runs/exp/{L.LOCK_FILE}"
        with L.locks_released():
            L.lock(storage, "exp")
            assert json.loads(s3.read(key))["pid"] == os.getpid()
            with pytest.raises(UsageError, match=f"in use by pid {os.getpid()} on "):
                L.lock(storage, "exp", "--resume")
        assert key not in s3.list("runs")
        stale = json.dumps({"host": socket.gethostname(), "pid": dead_pid}).encode()
        with s3.fs.open_output_stream(key) as f:
            f.write(stale)
        with L.locks_released():
            L.lock(storage, "exp")
        assert f"taking over the lock of pid {dead_pid}" in capsys.readouterr().out
        with s3.fs.open_output_stream(key) as f:
            f.write(json.dumps({"host": "another-host.example", "pid": dead_pid}).encode())
        with pytest.raises(UsageError, match="another-host.example"):
            L.lock(storage, "exp")


def test_two_processes_racing_for_one_lock_get_it_once(tmp_path):
    racer = (
        "import sys\nfrom rllib_amp.sweep import lock as L\nfrom rllib_amp.cli import UsageError\n"
        "try:\n    L.lock(sys.argv[1], 'exp')\n    print('got', flush=True)\n"
        "    sys.stdin.read()\nexcept UsageError:\n    print('refused', flush=True)\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", racer, str(tmp_path)],
            cwd=root,
            text=True,
            env=dict(os.environ, PYTHONPATH=root),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
        )  # fmt: skip
        for _ in range(4)
    ]
    answers = [p.stdout.readline().strip() for p in procs]  # type: ignore[union-attr]
    for p in procs:
        p.communicate("", timeout=60)
    assert sorted(answers) == ["got", "refused", "refused", "refused"], answers
