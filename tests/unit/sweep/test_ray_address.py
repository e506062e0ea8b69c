"""sweep/ray_address.py without a Ray: the watchdog on stand-in raylet and GCS processes (copies
of ``sleep`` under those names), and who may be ended (tests/cli/sweep/test_ray_death.py kills
a real Ray's processes)."""

from __future__ import annotations

import runpy
import shutil
import signal
import subprocess
import sys
import threading
import time

import pytest
import ray

from rllib_amp import cli
from rllib_amp.sweep import ray_address as RA

# Stand-in names: the test session's own Ray (a child of this process) is never watched.
NAMES = ("fake-raylet", "fake-gcs")


@pytest.fixture
def ray_like(tmp_path, monkeypatch):
    """Starts stand-ins for a local Ray's raylet and GCS as children of this process, and a
    worker that names the session folder in its command line; returns them and the folder."""
    monkeypatch.setattr(RA, "RAY_PROCESSES", NAMES)
    session = tmp_path / "session_2026-12-03_x"
    session.mkdir()
    started = []
    for name in NAMES:
        exe = tmp_path / name
        shutil.copy(shutil.which("sleep"), exe)
        started.append(subprocess.Popen([str(exe), "300"]))
    worker = [sys.executable, "-c", "import time; time.sleep(300)", str(session)]
    started.append(subprocess.Popen(worker, start_new_session=True))
    yield started, str(session)
    for proc in started:
        proc.kill()
        proc.wait(10)


def _watchdog(grace_s, **calls):
    events = {name: [] for name in ("died", "stuck", "exit")}
    watchdog = RA.LocalRayWatchdog(
        on_death=events["died"].append,
        on_stuck=events["stuck"].append,
        period_s=0.05,
        grace_s=grace_s,
    )
    return watchdog, events


def _wait_for(condition, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.02)
    return condition()


def test_a_dead_raylet_is_reported_once_and_a_released_watchdog_never_ends_the_process(
    ray_like, monkeypatch
):
    (raylet, gcs, worker), session = ray_like
    watchdog, events = _watchdog(grace_s=30)
    monkeypatch.setattr(RA, "end_process_now", events["exit"].append)
    watchdog.start(session)
    raylet.kill()
    assert _wait_for(lambda: events["died"])
    assert events["died"] == [f"its fake-raylet (pid {raylet.pid}) was killed by SIGKILL"]
    watchdog.release()  # the command got past its calls to Ray in time
    assert events["stuck"] == [] and events["exit"] == []
    assert gcs.poll() is None and worker.poll() is None  # nothing else ended


def test_a_command_stuck_on_a_dead_ray_ends_what_is_left_of_it_then_exits_1(ray_like, monkeypatch):
    import psutil  # Ray's own copy (ray/thirdparty_files), importable once ray is

    assert ray  # imported
    (raylet, gcs, worker), session = ray_like
    watchdog, events = _watchdog(grace_s=0.2)
    monkeypatch.setattr(RA, "end_process_now", events["exit"].append)
    monkeypatch.setattr(psutil.Process, "children", _children_but_pytests_ray(raylet, gcs))
    watchdog.start(session)
    gcs.send_signal(signal.SIGTERM)
    assert _wait_for(lambda: events["exit"])
    assert (
        events["died"] == events["stuck"] == [f"its fake-gcs (pid {gcs.pid}) was killed by SIGTERM"]
    )
    assert events["exit"] == [1]
    # The raylet (a child) and the worker (names the session folder) are ended with it.
    assert raylet.wait(10) == -signal.SIGKILL and worker.wait(10) == -signal.SIGKILL


def _children_but_pytests_ray(*mine):
    """``psutil.Process.children`` limited to the stand-ins: ``end_local_ray`` ends this
    process's descendants, and the test session's Ray is one of them."""
    import psutil

    real = psutil.Process.children
    pids = {p.pid for p in mine}

    def children(self, recursive=False):
        return [p for p in real(self, recursive=recursive) if p.pid in pids]

    return children


def test_a_watchdog_stopped_before_ray_shuts_down_reports_nothing(ray_like, monkeypatch):
    (raylet, _, _), session = ray_like
    watchdog, events = _watchdog(grace_s=0.1)
    monkeypatch.setattr(RA, "end_process_now", events["exit"].append)
    watchdog.start(session)
    watchdog.stop_checking()  # ray.shutdown ends the processes next
    raylet.kill()
    time.sleep(0.5)
    assert events == {"died": [], "stuck": [], "exit": []}


def test_without_a_ray_of_its_own_the_watchdog_watches_nothing(monkeypatch):
    monkeypatch.setattr(RA, "RAY_PROCESSES", NAMES)  # none of this process's children
    before = threading.active_count()
    RA.LocalRayWatchdog(on_death=print, on_stuck=print).start("/nowhere")
    assert threading.active_count() == before


def test_a_library_call_is_never_a_command_that_may_end_the_process(monkeypatch):
    monkeypatch.setattr(cli, "_command_process", False)
    assert not cli.may_end_process()  # rllib_amp.sweep.main.main(argv) from Python
    cli.run_as_command()
    assert cli.may_end_process()
    in_thread = []
    t = threading.Thread(target=lambda: in_thread.append(cli.may_end_process()))
    t.start()
    t.join(10)
    assert in_thread == [False]  # a worker thread never ends the process


def test_python_m_rllib_amp_tune_is_the_one_entry_point_that_opts_in(monkeypatch):
    import rllib_amp.sweep.main as sweep_main

    monkeypatch.setattr(cli, "_command_process", False)
    # As `python -m` finds it: not yet imported (else runpy warns that it runs a second copy).
    monkeypatch.delitem(sys.modules, "rllib_amp.tune", raising=False)
    seen = []
    monkeypatch.setattr(sweep_main, "main", lambda: seen.append(cli.may_end_process()) or 0)
    with pytest.raises(SystemExit) as e:
        runpy.run_module("rllib_amp.tune", run_name="__main__")
    assert e.value.code == 0 and seen == [True]
    monkeypatch.setattr(cli, "_command_process", False)
    runpy.run_module("rllib_amp.tune")  # imported, not run: no opt-in
    assert not cli.may_end_process()


@pytest.mark.parametrize(
    "address, user_value, seen",
    [
        (None, None, "PASSIVE"),  # a local Ray of our own: OpenMP threads that sleep
        (None, "ACTIVE", "ACTIVE"),  # the user's setting wins
        ("127.0.0.1:1", None, None),  # a cluster's processes are not ours to set
    ],
)
def test_a_local_ray_inherits_passive_openmp_threads_unless_the_user_set_them(
    monkeypatch, address, user_value, seen
):
    import os

    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    if user_value is not None:
        monkeypatch.setenv("OMP_WAIT_POLICY", user_value)
    during = []
    monkeypatch.setattr(ray, "init", lambda **kw: during.append(os.environ.get("OMP_WAIT_POLICY")))
    RA.start_ray(address, "--address")
    assert during == [seen]
    assert os.environ.get("OMP_WAIT_POLICY") == user_value  # this process's environment as before


def test_the_workers_of_the_local_ray_start_ray_starts_see_passive_openmp(own_ray_env):
    # A real local Ray in a process of its own: a task on one of its workers reads the variable.
    code = (
        "import os, ray\n"
        "from rllib_amp.sweep.ray_address import start_ray\n"
        "start_ray(None, '')\n"
        "print(ray.get(ray.remote(lambda: os.environ.get('OMP_WAIT_POLICY')).remote()))\n"
        "print(os.environ.get('OMP_WAIT_POLICY'))\n"
        "ray.shutdown()\n"
    )
    env = {k: v for k, v in own_ray_env.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["PASSIVE", "None"]
