"""What one trial asks Ray for, whether a machine can ever give it, and how to scale it down.

The request is RLlib's own: ``Algorithm.default_resource_request`` (the placement group Tune
reserves per trial: the trial process, which hosts the local learner when
``num_learners=0``, then one bundle per env runner and per learner), totalled by Tune's
``PlacementGroupFactory.required_resources``: nothing here repeats RLlib's arithmetic.

Example:
    >>> from rllib_amp import experiment
    >>> exp = experiment.load("tune_configs/pong_ppo_amp.yaml")
    >>> trial_request(exp.algorithm_config()).total
    {'CPU': 9.0, 'GPU': 1.0}
    >>> fit_overrides(exp, {"CPU": 2, "GPU": 0})  # doctest: +NORMALIZE_WHITESPACE
    {'resources.num_gpus_per_learner': 0, 'resources.num_learners': 0,
     'resources.num_env_runners': 1}
"""

from __future__ import annotations

import itertools
import logging
import logging.handlers
import math
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.tune import PlacementGroupFactory

    from rllib_amp.experiment import Experiment

# Resource kinds the check compares; custom resources are left to Ray.
KINDS = ("CPU", "GPU")


class ResourceError(ValueError):
    """A trial can never get its resources here: the message has the numbers and the fix."""


class RllibNotices:
    """Holds what RLlib logs while it validates a config ("You are running PPO on the new API
    stack!"), so a start refused before its trials stays one line: ``release()`` shows it, as
    does leaving the block without an error.

    Example:
        >>> with RllibNotices() as notices:
        ...     logging.getLogger("ray.rllib").warning("held")
        ...     len(notices.held)
        1
    """

    def __init__(self) -> None:
        self._holder = logging.handlers.BufferingHandler(capacity=sys.maxsize)
        self.held = self._holder.buffer
        self._logger = logging.getLogger("ray.rllib")
        self._handlers: list[logging.Handler] | None = None

    def __enter__(self) -> RllibNotices:
        self._handlers = self._logger.handlers[:]
        self._logger.handlers = [self._holder]
        return self

    def release(self) -> None:
        if self._handlers is None:
            return
        self._logger.handlers, self._handlers = self._handlers, None
        for record in self.held:
            self._logger.handle(record)
        self.held.clear()

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None:
            self.held.clear()
        self.release()


@dataclass(frozen=True)
class TrialRequest:
    """One trial's placement group as RLlib asks Tune for it: the trial process's bundle,
    then the env runners', then the learners'."""

    bundles: tuple[Mapping[str, float], ...]
    total: dict[str, float]
    num_env_runners: int
    num_learners: int

    def fits(self, capacity: Mapping[str, float]) -> bool:
        return all(self.total[k] <= capacity.get(k, 0.0) + 1e-9 for k in KINDS)

    def describe(self) -> str:
        """``1 CPU for the trial process, 8 env runners x 1 CPU, 1 learner x 1 GPU``."""
        rest = self.bundles[1:]
        runners, learners = self.num_env_runners, len(rest) - self.num_learners
        groups = {
            "env runner": rest[:runners],
            "learner": rest[learners:],
            "actor": rest[runners:learners],  # what RLlib adds between them (evaluation)
        }
        parts = [f"{_bundle(self.bundles[0])} for the trial process"]
        for label, group in groups.items():
            if group:
                plural = "s" if len(group) > 1 else ""
                parts.append(f"{len(group)} {label}{plural} x {_bundle(group[0])}")
        return ", ".join(parts)


def _bundle(b: Mapping[str, float]) -> str:
    return " + ".join(f"{b[k]:g} {k}" for k in KINDS if b.get(k)) or "0 CPU"


def format_amount(amounts: Mapping[str, float]) -> str:
    """``{'CPU': 9, 'GPU': 1}`` -> ``9 CPUs and 1 GPU``."""
    counts = capacity_of(amounts)
    return " and ".join(f"{counts[k]:g} {k}{'' if counts[k] == 1 else 's'}" for k in KINDS)


def trial_request(config: AlgorithmConfig) -> TrialRequest:
    """Example:
    >>> from ray.rllib.algorithms.ppo import PPOConfig
    >>> trial_request(PPOConfig().env_runners(num_env_runners=2)).total
    {'CPU': 3.0, 'GPU': 0.0}
    """
    # On RLlib's new API stack the answer is a PlacementGroupFactory.
    request = cast("type[Algorithm]", config.algo_class).default_resource_request
    pgf = cast("PlacementGroupFactory", request(config.to_dict()))
    return TrialRequest(
        bundles=tuple(pgf.bundles),
        total=capacity_of(pgf.required_resources),
        num_env_runners=int(config.num_env_runners or 0),
        num_learners=int(config.num_learners or 0),
    )


def requests(exp: Experiment) -> list[tuple[dict[str, object], TrialRequest]]:
    """``(searched resource values, request)`` per combination of the searched
    ``resources.*`` keys' edge values (``[({}, request)]`` when none is searched)."""
    searched = {k: s.edges() for k, s in exp.search.items() if k.startswith("resources.")}
    out = []
    for values in itertools.product(*searched.values()):
        combo = dict(zip(searched, values))
        config = (exp.with_overrides(combo) if combo else exp).algorithm_config()
        out.append((combo, trial_request(config)))
    return out


def check_fits(exp: Experiment, capacity: Mapping[str, float]) -> None:
    """ResourceError when a trial needs more than ``capacity``, with the ``--set`` that fit.

    Example:
        >>> from rllib_amp import experiment
        >>> check_fits(experiment.load("tune_configs/pong_ppo_amp.yaml"), {"CPU": 2})
        Traceback (most recent call last):
        rllib_amp.sweep.resources.ResourceError: resources: each trial needs 9 CPUs and 1 GPU
        (...), but this machine's Ray has 2 CPUs and 0 GPUs, ...
    """
    for combo, request in requests(exp):
        if request.fits(capacity):
            continue
        where = "".join(f", with search.{k}={v!r}" for k, v in combo.items())
        if isinstance(plan := _plan(exp, capacity), str):
            advice = plan
        else:
            fix = " ".join(f"--set {k}={v}" for k, v in plan.items())
            advice = f"fit them with {fix} (or pass --fit-to-machine)"
        raise ResourceError(
            f"resources: each trial needs {format_amount(request.total)} "
            f"({request.describe()}{where}), but this machine's Ray has "
            f"{format_amount(capacity)}, so the trials would wait forever; {advice}"
        )


def fit_overrides(exp: Experiment, capacity: Mapping[str, float]) -> dict[str, int]:
    """The ``resources.*`` overrides that make every trial fit ``capacity`` (``{}``: it fits).

    Scales down in the order that costs the least: GPUs the machine does not have go first,
    a CPU learner moves into the trial process (``num_learners=0``, saving its CPU), then
    env runners go until the rest fits. ResourceError when a searched resource key does not
    fit (only the search can change it) or even the smallest setup does not.
    """
    if isinstance(plan := _plan(exp, capacity), str):
        raise ResourceError(f"--fit-to-machine: {plan}")
    return plan


def _plan(exp: Experiment, capacity: Mapping[str, float]) -> dict[str, int] | str:
    """``fit_overrides``'s answer, or why none fits (the fix)."""
    bad = [combo for combo, r in requests(exp) if not r.fits(capacity)]
    if not bad:
        return {}
    if bad[0]:  # searched resource keys: every combination has them
        key, value = next(iter(bad[0].items()))
        return (
            f"search.{key} can give {value!r}, which does not fit "
            f"{format_amount(capacity)}; narrow the values of search.{key} to what fits"
        )
    cpus, gpus = capacity.get("CPU", 0.0), capacity.get("GPU", 0.0)
    over: dict[str, int] = {}

    def scaled(**changes: int) -> tuple[AlgorithmConfig, TrialRequest]:
        over.update({f"resources.{k}": v for k, v in changes.items()})
        config = exp.with_overrides(over).algorithm_config()
        return config, trial_request(config)

    config, req = scaled()
    if req.total["GPU"] > gpus:
        changes = {"num_gpus_per_env_runner": 0} if config.num_gpus_per_env_runner else {}
        per_learner = config.num_gpus_per_learner
        if per_learner > gpus:
            changes["num_gpus_per_learner"] = 0
        elif per_learner and config.num_learners > 1:
            changes["num_learners"] = max(1, int(gpus // per_learner))
        config, req = scaled(**changes)
    if req.total["CPU"] > cpus and config.num_learners >= 1 and not config.num_gpus_per_learner:
        config, req = scaled(num_learners=0)
    per_learner_cpus = config.num_cpus_per_learner
    if req.total["CPU"] > cpus and per_learner_cpus != "auto" and float(per_learner_cpus) > 1:
        config, req = scaled(num_cpus_per_learner=1)
    per_runner = float(config.num_cpus_per_env_runner or 0)
    if req.total["CPU"] > cpus and config.num_env_runners and per_runner > 0:
        rest = req.total["CPU"] - config.num_env_runners * per_runner
        config, req = scaled(num_env_runners=max(0, math.floor((cpus - rest) / per_runner)))
    if req.fits(capacity):
        return over
    return (
        f"even scaled down ({req.describe()}) a trial needs {format_amount(req.total)}; "
        f"lower num_cpus_per_env_runner / num_cpus_per_learner in the file's resources "
        f"section, or run on a cluster (--address)"
    )


def capacity_of(resources: Mapping[str, float]) -> dict[str, float]:
    """The CPU and GPU amounts of a Ray resource mapping (``ray.cluster_resources()``)."""
    return {k: float(resources.get(k, 0.0) or 0.0) for k in KINDS}


def local_capacity() -> dict[str, float] | None:
    """The CPUs and GPUs a Ray ``ray.init()`` starts will have (cgroup limits, visible GPUs),
    as Ray works them out, before starting it; None if this Ray cannot tell."""
    try:
        from ray._private.resource_and_label_spec import ResourceAndLabelSpec

        spec = ResourceAndLabelSpec().resolve(is_head=True, node_ip_address="127.0.0.1")
        return {"CPU": float(spec.num_cpus or 0), "GPU": float(spec.num_gpus or 0)}
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
