"""Metric keys rllib-amp reports, in one place.

Per module, in the learner results (``result["learners"][module_id][KEY]``), so Tune,
TensorBoard and the Ray dashboard see them.

Example:
    >>> GRAD_SCALE
    'amp_grad_scale'
"""

from __future__ import annotations

import os
import re
import shutil
import time
from typing import Any

# The loss scale after the learner's last update (1.0 when no scaling: bfloat16).
GRAD_SCALE = "amp_grad_scale"
# Optimizer steps skipped because a gradient was inf/nan, since the run started.
SKIPPED_STEPS_LIFETIME = "amp_skipped_steps_lifetime"
# Optimizer steps taken or skipped, since the run started.
OPTIMIZER_STEPS_LIFETIME = "amp_optimizer_steps_lifetime"
# Skipped / optimizer steps of the last iteration (mean over its learner updates, which all
# take the same number of optimizer steps).
SKIP_FRACTION = "amp_skip_fraction"

# Optimizer steps whose loss itself was inf/nan (bad data, not an fp16 overflow).
NONFINITE_LOSS_STEPS_LIFETIME = "amp_nonfinite_loss_steps_lifetime"

ALL_KEYS: tuple[str, ...] = (
    GRAD_SCALE,
    SKIPPED_STEPS_LIFETIME,
    OPTIMIZER_STEPS_LIFETIME,
    SKIP_FRACTION,
    NONFINITE_LOSS_STEPS_LIFETIME,
)


# -- Ray metrics (dashboard / Prometheus) ---------------------------------------------------
# Published by every learner after each update, tagged by trial and module; Ray exports them
# on each node's metrics endpoint as ray_<name> (e.g. ray_rllib_amp_grad_scale).
RAY_METRICS: dict[str, tuple[str, str]] = {
    GRAD_SCALE: ("rllib_amp_grad_scale", "Loss scale of the policy's GradScaler (1 = none)"),
    SKIPPED_STEPS_LIFETIME: (
        "rllib_amp_skipped_steps",
        "Optimizer steps skipped on inf/nan gradients, since the run started",
    ),
    SKIP_FRACTION: (
        "rllib_amp_skip_fraction",
        "Skipped / optimizer steps in the learner's last update",
    ),
}
TAG_KEYS = ("trial", "module")
_gauges: dict[str, Any] = {}


def publish(values: dict[str, float], *, trial: str, module: str) -> None:
    """Sets the Ray gauges for one module; does nothing outside a Ray worker or driver."""
    import ray

    if not ray.is_initialized():
        return
    from ray.util.metrics import Gauge

    for key, value in values.items():
        if key not in RAY_METRICS:
            continue
        if key not in _gauges:
            name, description = RAY_METRICS[key]
            _gauges[key] = Gauge(name, description, tag_keys=TAG_KEYS)
        _gauges[key].set(float(value), tags={"trial": trial, "module": str(module)})


# Tune names a trial's folder "<trial name>_<experiment tag>_<date>", the trial name being
# "<trainable>_<trial id>" with ids like "f1412_00000" (variant generator) or 8 hex digits.
_TRIAL_IN_DIRNAME = re.compile(r"^(.+?_(?:[0-9a-f]{5}_\d{5}|[0-9a-f]{8}))(?:_|$)")


def trial_name(algorithm: Any) -> str:
    """The Tune trial an Algorithm serves, or "default" outside Tune.

    RLlib drops Tune's trial info when it turns the trial's config dict into an
    AlgorithmConfig, so ``Algorithm.trial_name`` is "default" in every Tune trial; the trial's
    storage folder, which Tune sets before ``setup``, still names it.

    Example:
        >>> trial_name(SimpleNamespace(trial_name="default", _storage=SimpleNamespace(
        ...     trial_dir_name="PPO_CartPole-v1_f1412_00000_0_lr=0.001_2026-11-30_15-01-38")))
        'PPO_CartPole-v1_f1412_00000'
    """
    name = getattr(algorithm, "trial_name", None)
    if name and name != "default":
        return str(name)
    dirname = getattr(getattr(algorithm, "_storage", None), "trial_dir_name", None)
    if dirname:
        match = _TRIAL_IN_DIRNAME.match(dirname)
        return match.group(1) if match else str(dirname)
    return "default"


def tag_learners_with_trial(*, algorithm: Any, **kwargs: Any) -> None:
    """RLlib ``on_algorithm_init`` callback: tells the learners which trial they serve."""
    trial = trial_name(algorithm)

    def tag(learner: Any) -> None:
        if hasattr(learner, "set_amp_trial"):
            learner.set_amp_trial(trial)

    algorithm.learner_group.foreach_learner(tag)


# -- Grafana ---------------------------------------------------------------------------------
# The dashboard for the gauges above (package data), and the file name it gets beside Ray's own
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
    """The folder Ray's Grafana provisioning reads dashboards from, on this node; None where
    there is none (a worker node, or a Ray without its dashboard)."""
    explicit = os.environ.get(GRAFANA_OUTPUT_DIR_ENV)
    if explicit:
        return explicit
    if session_dir is None:
        import ray

        node = ray._private.worker.global_worker.node if ray.is_initialized() else None
        if node is None:
            return None
        session_dir = node.get_session_dir_path()
    root = os.environ.get(METRICS_ROOT_ENV) or os.path.join(session_dir, "metrics")
    if not os.path.isdir(root):  # only the head's dashboard makes it
        return None
    return os.path.join(root, "grafana", "dashboards")


def install_grafana_dashboard(session_dir: str | None = None, wait_s: float = 15.0) -> str | None:
    """Copies the AMP dashboard where Ray's Grafana provisioning picks it up; returns its
    path, or None when this node has no such folder (run it on the head).

    Ray's metrics module clears and rewrites that folder when the dashboard starts, so this
    waits (up to ``wait_s``) for Ray's own dashboard file before adding ours.

    Example:
        >>> ray.init()  # doctest: +SKIP
        >>> install_grafana_dashboard()  # doctest: +SKIP
        '/tmp/ray/session_.../metrics/grafana/dashboards/rllib_amp_grafana_dashboard.json'
    """
    folder = grafana_dashboard_dir(session_dir)
    if folder is None:
        return None
    if not os.environ.get(GRAFANA_OUTPUT_DIR_ENV):
        deadline = time.monotonic() + wait_s
        while not os.path.isfile(os.path.join(folder, RAY_DEFAULT_DASHBOARD)):
            if time.monotonic() > deadline:
                return None
            time.sleep(0.2)
    os.makedirs(folder, exist_ok=True)
    target = os.path.join(folder, GRAFANA_DASHBOARD_NAME)
    shutil.copyfile(GRAFANA_DASHBOARD, target)
    return target
