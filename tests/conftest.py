"""Shared fixtures: one local Ray per test session, kept on 127.0.0.1."""

from __future__ import annotations

import os
import socket

# Before ray is imported anywhere: keep Ray on 127.0.0.1 instead of the machine's interface
# address, so tests never touch the network and multi-node Clusters can be joined.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

import pytest  # noqa: E402


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_METRICS_PORT = _free_port()


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray instance for the whole test session (starting Ray costs seconds)."""
    import ray

    started = False
    if not ray.is_initialized():
        # address="local": always a fresh in-process Ray, never a cluster some other process
        # left registered in Ray's temp folder.
        ray.init(
            address="local",
            num_cpus=4,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            _metrics_export_port=_METRICS_PORT,
            log_to_driver=False,
        )
        started = True
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def ray_metrics_url(ray_local) -> str:
    """The Prometheus endpoint of the test session's Ray node."""
    return f"http://127.0.0.1:{_METRICS_PORT}/metrics"
