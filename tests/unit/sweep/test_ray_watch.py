"""RayWatch, without a Ray: what it calls when the Ray under a sweep died, and how it judges a
cluster it joined (tests/cli/sweep/test_ray_death.py kills real Ray processes)."""

from __future__ import annotations

import runpy
import threading
import time
from types import SimpleNamespace

import pytest
import ray

from rllib_amp import cli
from rllib_amp.sweep import ray_address as RA
from rllib_amp.sweep import tuner as T


class _Dies(RA.RayWatch):
    def __init__(self, after, **kwargs):
        super().__init__(**kwargs)
        self.after = after
        self.checks = 0

    def check(self):
        self.checks += 1
        return "its raylet (pid 1) was killed by SIGKILL" if self.checks >= self.after else None


def test_death_is_reported_once_and_a_released_watch_never_forces_an_exit():
    died, stuck = [], []
    reported = threading.Event()

    def on_death(what):
        died.append(what)
        reported.set()

    watch = _Dies(3, on_death=on_death, on_stuck=stuck.append, period_s=0.01, grace_s=30)
    with watch:
        watch.start()
        assert reported.wait(10)
    watch._thread.join(10)
    assert died == ["its raylet (pid 1) was killed by SIGKILL"] and watch.dead == died[0]
    assert stuck == [] and not watch._thread.is_alive()


def test_a_watch_stopped_before_ray_shuts_down_reports_nothing():
    died = []
    watch = _Dies(1, on_death=died.append, on_stuck=died.append, period_s=0.2)
    watch.start()
    watch.stop_checking()  # before the first check: ray.shutdown ends the processes now
    watch._thread.join(10)
    assert died == []


@pytest.fixture
def joined(monkeypatch):
    """As a driver that joined a cluster: no Ray processes of its own, a GCS client."""
    monkeypatch.setattr(ray._private.worker, "_global_node", None)
    context = SimpleNamespace(get_node_id=lambda: "ab" * 28)
    monkeypatch.setattr(ray, "get_runtime_context", lambda: context)

    def use(gcs):
        monkeypatch.setattr(ray._private.worker.global_worker, "gcs_client", gcs, raising=False)

    return use


class _Node:
    def __init__(self, hex_id):
        self._hex = hex_id

    def hex(self):
        return self._hex


def test_a_cluster_whose_gcs_stays_silent_is_dead_only_after_rays_own_reconnect_timeout(
    joined, monkeypatch
):
    def silent(timeout, node_selectors):
        raise ConnectionError("Failed to get node info: Deadline Exceeded")

    joined(SimpleNamespace(get_all_node_info=silent))
    watch = RA.RayWatch(on_death=print, on_stuck=print)
    assert watch.silence_s == RA.GCS_RECONNECT_DEFAULT_S  # Ray's own 60 s: GCS restarts fit
    assert watch.check() is None  # a busy or restarting head
    watch._last_answer -= RA.GCS_RECONNECT_DEFAULT_S - 5  # silent, but Ray still waits for it
    assert watch.check() is None
    watch._last_answer -= 5
    assert watch.check().startswith("its GCS has not answered for 6")


def test_the_silence_limit_is_rays_reconnect_timeout_as_the_cluster_or_the_env_sets_it(
    monkeypatch,
):
    monkeypatch.delenv(f"RAY_{RA.GCS_RECONNECT_CONFIG}", raising=False)
    config = {}
    monkeypatch.setattr(ray._private.state.state, "get_system_config", lambda: config)
    assert RA.gcs_silence_limit_s() == RA.GCS_RECONNECT_DEFAULT_S
    monkeypatch.setenv(f"RAY_{RA.GCS_RECONNECT_CONFIG}", "90")
    assert RA.gcs_silence_limit_s() == 90.0
    config[RA.GCS_RECONNECT_CONFIG] = 120  # the cluster's --system-config wins
    assert RA.gcs_silence_limit_s() == 120.0
    config[RA.GCS_RECONNECT_CONFIG] = "junk"
    monkeypatch.setenv(f"RAY_{RA.GCS_RECONNECT_CONFIG}", "0")
    assert RA.gcs_silence_limit_s() == RA.GCS_RECONNECT_DEFAULT_S

    def no_gcs():
        raise ConnectionError("no GCS")

    monkeypatch.setattr(ray._private.state.state, "get_system_config", no_gcs)
    monkeypatch.setenv(f"RAY_{RA.GCS_RECONNECT_CONFIG}", "75")
    assert RA.gcs_silence_limit_s() == 75.0


def test_a_cluster_watch_asks_for_this_node_only_every_few_seconds(joined):
    asked = []

    def node_info(timeout, node_selectors):
        asked.append([s.node_id for s in node_selectors])
        return {_Node("ab" * 28): SimpleNamespace(state=0)}

    joined(SimpleNamespace(get_all_node_info=node_info))
    watch = RA.RayWatch(on_death=print, on_stuck=print)
    assert watch.check() is None and watch.check() is None
    assert asked == [[bytes.fromhex("ab" * 28)]] * 2  # one node, not the whole table
    assert watch.period() == RA.CLUSTER_WATCH_PERIOD_S > RA.RAY_WATCH_PERIOD_S


def test_a_local_ray_is_watched_every_second_through_its_processes(monkeypatch):
    alive = SimpleNamespace(process=SimpleNamespace(pid=7, poll=lambda: None))
    node = SimpleNamespace(all_processes={"raylet": [alive], "gcs_server": [alive]})
    monkeypatch.setattr(ray._private.worker, "_global_node", node)
    watch = RA.RayWatch(on_death=print, on_stuck=print)
    assert watch.period() == RA.RAY_WATCH_PERIOD_S and watch.check() is None
    node.all_processes["gcs_server"] = [
        SimpleNamespace(process=SimpleNamespace(pid=8, poll=lambda: -9))
    ]
    assert watch.check() == "its gcs_server (pid 8) was killed by SIGKILL"


def test_a_cluster_that_marks_this_node_dead(joined):
    nodes = {_Node("ab" * 28): SimpleNamespace(state=1)}
    joined(SimpleNamespace(get_all_node_info=lambda timeout, node_selectors: nodes))
    assert RA.RayWatch(on_death=print, on_stuck=print).check().startswith("the raylet of this")
    nodes = {_Node("ab" * 28): SimpleNamespace(state=0)}
    assert RA.RayWatch(on_death=print, on_stuck=print).check() is None


def test_another_rays_gcs_api_turns_the_watch_off_instead_of_a_false_alarm(joined, monkeypatch):
    def other_api(timeout):  # no node_selectors argument
        return {}

    joined(SimpleNamespace(get_all_node_info=other_api))
    watch = RA.RayWatch(on_death=print, on_stuck=print)
    watch.silence_s = 0.0
    assert watch.check() is None and watch.check() is None


# -- The forced exit: only the command's own process ------------------------------------------


@pytest.fixture
def exits(monkeypatch):
    """Records os._exit instead of ending the test process."""
    calls = []
    monkeypatch.setattr(RA.os, "_exit", calls.append)
    return calls


@pytest.mark.parametrize("end_process", [False, True])
def test_a_stuck_sweep_ends_the_process_only_when_it_is_the_commands(exits, end_process):
    stuck = []
    watch = _Dies(1, on_death=lambda what: None, on_stuck=stuck.append, period_s=0.01,
                  grace_s=0.05, end_process=end_process)  # fmt: skip
    watch.start()
    watch._thread.join(10)
    assert stuck == ["its raylet (pid 1) was killed by SIGKILL"]
    assert exits == ([1] if end_process else [])


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
    seen = []
    monkeypatch.setattr(sweep_main, "main", lambda: seen.append(cli.may_end_process()) or 0)
    with pytest.raises(SystemExit) as e:
        runpy.run_module("rllib_amp.tune", run_name="__main__")
    assert e.value.code == 0 and seen == [True]
    monkeypatch.setattr(cli, "_command_process", False)
    runpy.run_module("rllib_amp.tune")  # imported, not run: no opt-in
    assert not cli.may_end_process()


def test_ray_dying_under_a_sweep_in_a_worker_thread_raises_ray_died_there():
    """No signal handler off the main thread: Tune's loop is ended by RayDied raised in the
    sweep's own thread, never by an interrupt of the caller's main thread."""
    started, outcome = threading.Event(), []

    def sweep():
        try:
            with T.StopOnSignals() as stop:
                outcome.append(stop)
                started.set()
                for _ in range(10_000):  # a Tune loop: Python code between short waits
                    time.sleep(0.001)
            outcome.append("finished")
        except RA.RayDied:
            outcome.append("RayDied")

    t = threading.Thread(target=sweep)
    t.start()
    assert started.wait(10)
    outcome[0].ray_died("its raylet (pid 1) was killed by SIGKILL")
    t.join(30)
    assert outcome[1:] == ["RayDied"] and outcome[0].ray_dead.startswith("its raylet")


def test_a_stuck_library_sweep_gets_ray_died_instead_of_an_exit(exits, monkeypatch):
    """main's on_stuck off the command's process: the exception in the sweep's thread, no
    lock released behind its back, no exit."""
    from rllib_amp.sweep import main as sweep_main

    raised = []
    stop = SimpleNamespace(ray_dead=None, raise_ray_died=lambda: raised.append(True))
    monkeypatch.setattr(sweep_main.experiment_lock, "_held", ["/somewhere/rllib_amp.lock"])
    sweep_main._ray_died_stuck(stop, False, "its GCS has not answered for 61 s")
    assert raised == [True] and stop.ray_dead.startswith("its GCS")
    assert sweep_main.experiment_lock._held == ["/somewhere/rllib_amp.lock"] and exits == []
