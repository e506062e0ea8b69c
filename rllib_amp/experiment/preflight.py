"""Pre-flight: everything a sweep can be refused for, checked in this process without Ray.

``--dry-run`` runs these checks, and a real run runs them before Ray starts, so that a config
that would crash every trial (each retried ``max_failures`` times) is one line and exit 2:
1. ``stop`` keys and ``tune.metric`` are keys the algorithm reports (``results.catalog``).
2. Every AlgorithmConfig the sweep can produce (``sweep_points``) passes RLlib's own
   ``config.validate()``.
3. The env runner class the config names builds the env (with its ``env_config``) and the
   RLModule, as a trial would (one env, no GPU), once per distinct ``env_config``/``model``.
RLlib's output during these builds is silenced (the real run shows it).

Example:
    >>> from rllib_amp import experiment as E
    >>> preflight(E.load("tune_configs/cartpole_ppo_amp.yaml")).split(";")[0]
    '2 configs built and validated by RLlib'
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
import os
import random
import re
import sys
import traceback
import warnings
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, cast

from rllib_amp.experiment.errors import ExperimentError
from rllib_amp.experiment.sampler import Sampler

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    from rllib_amp.experiment import Experiment
    from rllib_amp.experiment.data import Section
    from rllib_amp.experiment.results import ResultCatalog


# Configs checked with every combination of searched values when there are at most this many;
# beyond it every grid point and every value still appear, but not every combination.
MAX_FULL_PRODUCT = 64
# Grid points built at most: a sweep beyond it has bigger problems than its configs.
MAX_POINTS = 1024
# Seeded draws per range sampler, on top of its two edges.
RANGE_DRAWS = 2
# Env runners (env + RLModule) built at most: one per distinct env_config / model.
MAX_RUNTIME_BUILDS = 4
# Sections a failure message may point into, in the order they are searched for the key.
_SECTIONS = ("training", "amp", "env_config", "model", "resources")


def preflight(exp: Experiment) -> str:
    """Runs every check; returns a one-line summary, raises ExperimentError on the first
    failure (the module's example)."""
    configs = []
    for point in sweep_points(exp.search):
        trial = _trial(exp, point)
        configs.append((point, trial, _build(exp, trial, point)))
        if len(configs) == 1:
            check_result_keys(exp, configs[0][2])  # before building the other points
    variants: dict[str, tuple[dict[str, object], Experiment, AlgorithmConfig]] = {}
    for point, trial, config in configs:
        variants.setdefault(
            repr((trial.data["env_config"], trial.data["model"])), (point, trial, config)
        )
    built = list(variants.values())[:MAX_RUNTIME_BUILDS]
    for point, trial, config in built:
        _build_runtime(exp, trial, config, point)
    return (
        f"{len(configs)} config{'s' if len(configs) != 1 else ''} built and validated by RLlib; "
        f"{exp.env} and its RLModule built "
        f"({len(built)} env_config/model variant{'s' if len(built) != 1 else ''}); stop keys "
        f"and tune.metric are {exp.algorithm} result keys"
    )


def _draws(sampler: Sampler, rng: random.Random) -> list[object]:
    if sampler.kind in ("grid", "choice"):
        return list(sampler.values)
    lo, hi = sampler.values
    draw = {
        "randint": lambda: rng.randrange(lo, hi),
        "loguniform": lambda: math.exp(rng.uniform(math.log(lo), math.log(hi))),
        "uniform": lambda: rng.uniform(lo, hi),
    }[sampler.kind]
    values = [*sampler.edges(), *(draw() for _ in range(RANGE_DRAWS))]
    return list({repr(v): v for v in values}.values())


def sweep_points(search: Mapping[str, Sampler], seed: int = 0) -> list[dict[str, object]]:
    """The searched values to build configs from: dotted key -> value, one dict per config;
    every combination up to ``MAX_FULL_PRODUCT``, else every grid point (up to ``MAX_POINTS``)
    with the other samplers' values cycled. Ranges give their edges and ``RANGE_DRAWS`` draws.

    Example:
        >>> s = {"seed": Sampler.parse({"grid": [0, 1]}), "amp.init_scale":
        ...      Sampler.parse({"choice": [8.0, 16.0]})}
        >>> len(sweep_points(s))
        4
    """
    if not search:
        return [{}]
    rng = random.Random(seed)
    values = {key: _draws(s, rng) for key, s in search.items()}
    keys = list(values)
    if math.prod(len(v) for v in values.values()) <= MAX_FULL_PRODUCT:
        return [dict(zip(keys, combo)) for combo in itertools.product(*values.values())]
    grid = [k for k in keys if search[k].kind == "grid"]
    others = [k for k in keys if k not in grid]
    grid_points = list(itertools.islice(itertools.product(*(values[k] for k in grid)), MAX_POINTS))
    n = max(len(grid_points), *(len(values[k]) for k in others), 1)
    points = []
    for i in range(min(n, MAX_POINTS)):
        point = dict(zip(grid, grid_points[i % len(grid_points)]))
        point.update({k: values[k][i % len(values[k])] for k in others})
        points.append(point)
    return points


def _where(point: Mapping[str, object]) -> str:
    shown = ", ".join(f"{k}={v!r}" for k, v in point.items())
    return f" (with {shown})" if point else ""


def _trial(exp: Experiment, point: Mapping[str, object]) -> Experiment:
    """The experiment one trial runs: the searched values in place, nothing left to search."""
    try:
        return exp.with_overrides({**point, "search": None})
    except ExperimentError as e:
        raise ExperimentError(f"{e}{_where(point)}") from None


def _build(exp: Experiment, trial: Experiment, point: Mapping[str, object]) -> AlgorithmConfig:
    stage = "building the AlgorithmConfig"
    with _quiet():
        try:
            config = trial.algorithm_config()
            stage = "RLlib's config.validate()"
            config.validate()
        except Exception as e:  # RLlib's builder methods raise what they like
            raise _failure(exp, stage, e, point, "training") from None
    return config


def check_result_keys(exp: Experiment, config: AlgorithmConfig) -> None:
    """Refuses ``stop`` keys and a ``tune.metric`` that the algorithm never reports."""
    # Built from RLlib's metric names: imported here, so loading an experiment does not.
    from rllib_amp.experiment.results import catalog

    results = catalog(exp.algorithm)
    config_keys = set(config.to_dict())
    for key in exp.stop:
        if not results.accepts(str(key), config_keys):
            raise ExperimentError(
                f"{exp.path}: stop.{key}: {exp.algorithm} never reports {str(key)!r}, so this "
                f"stop would never trigger{_nearest(results, str(key))}; stop on a reported key "
                f"such as training_iteration, time_total_s or env_runners/episode_return_mean"
            )
    metric = exp.tune["metric"]
    if not results.accepts(metric, config_keys):
        raise ExperimentError(
            f"{exp.path}: tune.metric: {exp.algorithm} never reports {metric!r}, so no trial "
            f"could be ranked{_nearest(results, metric)}; set tune.metric to a reported key such "
            f"as env_runners/episode_return_mean"
        )


def _nearest(results: ResultCatalog, key: str) -> str:
    near = results.nearest(key)
    return f" (did you mean '{near}'?)" if near else ""


def _build_runtime(
    exp: Experiment, trial: Experiment, config: AlgorithmConfig, point: Mapping[str, object]
) -> None:
    """Builds what a trial's env runner builds first, the env and the RLModule; closes them.

    Not built: the Learner (its torch optimizer imports torch's compiler on first use, seconds
    of a dry run). Not run: env steps (an env_config can make one reset take unbounded time,
    e.g. an ALE frameskip of 10**9, and a check that can hang is worse than none).
    """
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    local = config.copy(copy_frozen=False)
    # One env, on this machine's CPU; no global seeding (it would reseed this process and, in
    # torch, import its compiler: seconds). Seeds are checked by the schema.
    local.env_runners(num_envs_per_env_runner=1, num_gpus_per_env_runner=0)
    local.learners(num_learners=0, num_gpus_per_learner=0)
    local.debugging(seed=None)
    runner_cls = local.env_runner_cls or SingleAgentEnvRunner
    default_key = "env_config" if trial.data["env_config"] else "env"
    with _quiet():
        try:
            runner = runner_cls(config=local)
        except Exception as e:
            if any(f.name == "make_module" for f in traceback.extract_tb(e.__traceback__)):
                raise _failure(exp, "building the RLModule", e, point, "model") from None
            raise _failure(
                exp, f"constructing {exp.env} with env_config", e, point, default_key
            ) from None
        with contextlib.suppress(Exception):
            runner.stop()  # closes the env


def _one_line(e: BaseException) -> str:
    text = " ".join(str(e).split())
    text = text[:300] + "..." if len(text) > 300 else text
    return f"{type(e).__name__}: {text}" if text else type(e).__name__


def _named_key(exp: Experiment, message: str, default: str, point: Mapping[str, object]) -> str:
    """The experiment key an RLlib error message names as a word, or ``default``; searched keys
    first (when a sweep fails at one point, its values are the likely cause)."""
    sections: Mapping[str, object] = exp.data  # _SECTIONS are free-form sections
    candidates = [*point, *(f"{s}.{k}" for s in _SECTIONS for k in cast("Section", sections[s]))]
    for dotted in candidates:
        name = re.escape(dotted.rsplit(".", 1)[-1])
        if re.search(rf"(?<![A-Za-z0-9_]){name}(?![A-Za-z0-9_])", message):
            return dotted
    return default


def _failure(
    exp: Experiment, stage: str, e: BaseException, point: Mapping[str, object], default: str
) -> ExperimentError:
    if isinstance(e, ExperimentError):
        return ExperimentError(f"{e}{_where(point)}")
    what = _one_line(e)
    # RLlib re-raises some errors as something else (a module that cannot be built ends as a
    # deprecation message): the one below is the telling one.
    below = e.__cause__ or e.__context__
    if below is not None and str(below) not in str(e):
        what += f" (raised while handling {_one_line(below)})"
    key = _named_key(exp, what, default, point)
    return ExperimentError(
        f"{exp.path}: {key}: {stage} failed{_where(point)}: {what}; fix {key} (the sweep would "
        f"fail the same way in every trial)"
    )


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silences RLlib's log lines, Python warnings and native stderr (the ALE banner)."""
    previous = logging.root.manager.disable
    logging.disable(logging.CRITICAL)
    with contextlib.ExitStack() as stack:
        stack.callback(logging.disable, previous)
        stack.enter_context(warnings.catch_warnings())
        warnings.simplefilter("ignore")
        devnull = stack.enter_context(open(os.devnull, "w"))  # noqa: SIM115 - the stack closes it
        stack.enter_context(contextlib.redirect_stderr(devnull))
        with contextlib.suppress(OSError, ValueError, AttributeError):
            # Native code writes to fd 2 directly; without a real fd 2 this is skipped.
            if sys.__stderr__ is not None:
                sys.__stderr__.flush()
            saved = os.dup(2)
            stack.callback(os.close, saved)
            stack.callback(os.dup2, saved, 2)
            os.dup2(devnull.fileno(), 2)
        yield
