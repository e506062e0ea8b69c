"""The AMP Grafana dashboard for the Ray gauges of ``rllib_amp.learner.metrics``, installed
beside Ray's own dashboards on the head node, where Ray's Grafana provisioning picks it up.

Example:
    >>> os.path.basename(GRAFANA_DASHBOARD)
    'grafana_dashboard.json'
"""

from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path

from rllib_amp.cli import root_error
from rllib_amp.log_events import event

logger = logging.getLogger(__name__)

# The dashboard for those gauges (package data), and the file name it gets beside Ray's own
# dashboards (Ray names them <what>_grafana_dashboard.json).
GRAFANA_DASHBOARD = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), "grafana_dashboard.json"
)
GRAFANA_DASHBOARD_NAME = "rllib_amp_grafana_dashboard.json"
# Ray's dashboard on the head writes its Grafana provisioning under <session>/metrics/grafana
# (ray/dashboard/modules/metrics/metrics_head.py); these variables move it.
GRAFANA_OUTPUT_DIR_ENV = "RAY_METRICS_GRAFANA_DASHBOARD_OUTPUT_DIR"
METRICS_ROOT_ENV = "RAY_METRICS_OUTPUT_ROOT"
# Ray's own dashboard file there: once it exists, Ray has finished (re)writing the folder.
RAY_DEFAULT_DASHBOARD = "default_grafana_dashboard.json"


def grafana_dashboard_dir(session_dir: str | None = None) -> str | None:
    """The folder Ray's Grafana provisioning reads dashboards from on this node, or None."""
    if explicit := os.environ.get(GRAFANA_OUTPUT_DIR_ENV):
        return explicit
    if session_dir is None:
        import ray

        if not ray.is_initialized():
            return None
        context = ray.get_runtime_context()
        try:
            session_dir = os.path.join(context.get_temp_dir(), context.get_session_name())
        except AttributeError:  # through Ray Client: the session folder is not on this node
            return None
    root = os.environ.get(METRICS_ROOT_ENV) or os.path.join(session_dir, "metrics")
    if not os.path.isdir(root):  # only the head's dashboard makes it
        return None
    return os.path.join(root, "grafana", "dashboards")


def install_dashboard(session_dir: str | None = None, wait_s: float = 15.0) -> str | None:
    """Copies the AMP dashboard where Ray's Grafana provisioning picks it up, once Ray has
    (re)written that folder (up to ``wait_s``); its path, or None when this node has no such
    folder (run it on the head) or it cannot take it (one WARNING says why).

    Example:
        >>> ray.init()  # doctest: +SKIP
        >>> install_dashboard()  # doctest: +SKIP
        '/tmp/ray/session_.../metrics/grafana/dashboards/rllib_amp_grafana_dashboard.json'
    """
    folder = grafana_dashboard_dir(session_dir)
    if folder is None:
        return None
    # The nearest existing path at or above the folder: a file there stops Ray too (no use
    # waiting for Ray to write the folder).
    path = Path(os.path.abspath(folder))
    existing = next((p for p in (path, *path.parents) if os.path.lexists(p)), path)
    if not existing.is_dir():
        _not_installed(folder, f"{existing} is a file, not a folder")
        return None
    if not os.environ.get(GRAFANA_OUTPUT_DIR_ENV):
        deadline = time.monotonic() + wait_s
        while not os.path.isfile(os.path.join(folder, RAY_DEFAULT_DASHBOARD)):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)
    target = os.path.join(folder, GRAFANA_DASHBOARD_NAME)
    try:
        os.makedirs(folder, exist_ok=True)
        shutil.copyfile(GRAFANA_DASHBOARD, target)
    except OSError as e:
        _not_installed(folder, root_error(e))
        return None
    return target


def _not_installed(folder: str, why: str) -> None:
    fix = (
        f"point {GRAFANA_OUTPUT_DIR_ENV} at a writable folder"
        if os.environ.get(GRAFANA_OUTPUT_DIR_ENV)
        else f"make it writable, or set {GRAFANA_OUTPUT_DIR_ENV} to a writable folder"
    )
    logger.warning(
        "rllib_amp: the AMP Grafana dashboard was not installed in %s (%s); the sweep goes on "
        "without it; %s",
        folder,
        why,
        fix,
        extra=event("grafana_dashboard_not_installed", folder=folder, error=why),
    )
