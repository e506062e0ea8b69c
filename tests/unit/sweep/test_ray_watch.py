"""RayWatch, without a Ray: what it calls when the Ray under a sweep died, and how it judges a
cluster it joined (tests/cli/sweep/test_ray_death.py kills real Ray processes)."""

from __future__ import annotations

import threading
from types import SimpleNamespace

import pytest
import ray

from rllib_amp.sweep import ray_address as RA


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


def test_a_cluster_whose_gcs_stays_silent_is_dead_after_the_silence(joined, monkeypatch):
    def silent(timeout):
        raise ConnectionError("Failed to get node info: Deadline Exceeded")

    joined(SimpleNamespace(get_all_node_info=silent))
    watch = RA.RayWatch(on_death=print, on_stuck=print)
    assert watch.check() is None  # silent for less than GCS_SILENCE_S: a busy head
    monkeypatch.setattr(RA, "GCS_SILENCE_S", 0.0)
    assert watch.check().startswith("its GCS has not answered for")


def test_a_cluster_that_marks_this_node_dead(joined):
    nodes = {_Node("ab" * 28): SimpleNamespace(state=1), _Node("cd" * 28): SimpleNamespace(state=0)}
    joined(SimpleNamespace(get_all_node_info=lambda timeout: nodes))
    assert RA.RayWatch(on_death=print, on_stuck=print).check().startswith("the raylet of this")
    nodes = {_Node("ab" * 28): SimpleNamespace(state=0)}
    assert RA.RayWatch(on_death=print, on_stuck=print).check() is None


def test_another_rays_gcs_api_turns_the_watch_off_instead_of_a_false_alarm(joined, monkeypatch):
    def other_api():  # no timeout argument
        return {}

    joined(SimpleNamespace(get_all_node_info=other_api))
    monkeypatch.setattr(RA, "GCS_SILENCE_S", 0.0)
    watch = RA.RayWatch(on_death=print, on_stuck=print)
    assert watch.check() is None and watch.check() is None
