"""A validated experiment -> an RLlib AlgorithmConfig (builder methods only) and a Tune space.

Config flows one way, through RLlib's builder methods; never ``update_from_dict`` (it accepts
typos silently). AMP settings reach the config only through ``settings.store_in_config``.

Example:
    >>> from rllib_amp.experiment.schema import validate
    >>> data = validate({"algorithm": "PPO", "env": "CartPole-v1", "stop": {"time_total_s": 9}})
    >>> type(algorithm_config(data)).__name__
    'PPOConfig'
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from ray import tune
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from rllib_amp.algorithms import algorithm
from rllib_amp.api import with_amp
from rllib_amp.envs import configure as envs
from rllib_amp.envs import models
from rllib_amp.experiment.sampler import Sampler
from rllib_amp.experiment.schema import RESOURCES, SEED_MAX, with_dotted
from rllib_amp.learner.metrics import tag_learners_with_trial
from rllib_amp.settings import AmpSettings, store_in_config

if TYPE_CHECKING:
    from rllib_amp.experiment.data import ExperimentData


def mutation_space(data: ExperimentData) -> dict[str, object]:
    """PBT's mutations by dotted key: a list (PBT moves to a neighbouring value) or a Tune
    Domain (PBT multiplies by 0.8 or 1.2, or redraws); empty without ``tune.scheduler: pbt``.

    Example:
        >>> mutation_space({"tune": {"pbt": {"hyperparam_mutations": {"k": {"choice": [1, 2]}}}}})
        {'k': [1, 2]}
    """
    return {
        key: list(s.values) if s.kind == "choice" else s.to_tune()
        for key, s in _mutations(data).items()
    }


def mutation_bounds(data: ExperimentData) -> dict[str, tuple[float, float]]:
    """Dotted key -> (lo, hi) that a PBT perturbation of a range must stay within.

    Example:
        >>> mutation_bounds({"tune": {"pbt": {"hyperparam_mutations": {"k": {"randint": [1, 5]}}}}})
        {'k': (1, 4)}
    """
    return {key: s.bounds() for key, s in _mutations(data).items() if s.kind != "choice"}


def _mutations(data: ExperimentData) -> dict[str, Sampler]:
    """PBT's ``hyperparam_mutations``, parsed; empty without ``tune.scheduler: pbt``."""
    pbt = data["tune"].get("pbt")
    return {k: Sampler.parse(s) for k, s in (pbt["hyperparam_mutations"] if pbt else {}).items()}


class SeedOfSample:
    """A ``tune.sample_from`` function giving sample k of every setting the seed
    ``base + k`` (modulo 2**32, the seed range numpy and torch take).

    Tune repeats the whole grid once per sample (``num_samples``), calling this once per trial
    in that order, so call n belongs to sample ``n // settings``: setting A's k-th run and
    setting B's k-th run start from the same seed, again in a rerun. Tune deep-copies the
    search space once per sample; the copies must share the count.

    Example:
        >>> seed = SeedOfSample(base=7, settings=2)
        >>> [seed(None) for _ in range(6)]
        [7, 7, 8, 8, 9, 9]
    """

    def __init__(self, base: int, settings: int) -> None:
        self.base = base
        self.settings = max(1, settings)
        self.calls = 0

    def __call__(self, spec: object) -> int:
        k = self.calls // self.settings
        self.calls += 1
        return (self.base + k) % (SEED_MAX + 1)

    def __deepcopy__(self, memo: dict[int, object]) -> SeedOfSample:
        return self

    def __repr__(self) -> str:
        return f"SeedOfSample(base={self.base}, settings={self.settings})"


def initial_space(data: ExperimentData) -> dict[str, object]:
    """The Tune search space of a trial's first config: the search, plus each PBT-mutated
    key not searched drawn from its mutation (so the population starts spread out), plus a
    seed per sample (``SeedOfSample``) when the file sets ``seed`` and does not search it.

    Example:
        >>> initial_space({"search": {}, "tune": {"pbt": None}, "seed": None})
        {}
        >>> initial_space({"search": {}, "tune": {"pbt": None}, "seed": 3})["seed"].func
        SeedOfSample(base=3, settings=1)
    """
    space = {key: sampler.to_tune() for key, sampler in data["search"].items()}
    for key, sampler in _mutations(data).items():
        space.setdefault(key, sampler.to_tune())
    seed = data.get("seed")
    if seed is not None and "seed" not in space:
        settings = math.prod(s.grid_size() for s in data["search"].values())
        space["seed"] = tune.sample_from(SeedOfSample(seed, settings))
    return space


def algorithm_config(
    data: ExperimentData, searched: Mapping[str, object] | None = None
) -> AlgorithmConfig:
    """The AlgorithmConfig for validated experiment ``data`` (``schema.validate``'s result).

    ``searched`` (dotted key -> Tune Domain, from ``initial_space``) puts samplers at their keys,
    so that the config can serve as a Tune ``param_space``; Tune replaces them with values
    before a trial builds its algorithm.
    """
    # Plain data from here: the searched keys hold Tune Domains, and the sections go to
    # RLlib's builder methods as keyword arguments.
    d: dict[str, Any] = dict(data)
    amp_searched: dict[str, object] = {}
    for key, domain in (searched or {}).items():
        top, _, field = key.partition(".")
        if top == "amp":
            amp_searched[field] = domain
        else:
            d = with_dotted(d, key.split("."), domain, key, "search")
    config = algorithm(d["algorithm"]).config_class()
    envs.configure_env(config, d["env"], d["env_config"])
    if d["training"]:
        config.training(**d["training"])
    for method in ("env_runners", "learners"):
        kwargs = {k: v for k, v in d["resources"].items() if RESOURCES[k][0] == method}
        if kwargs:
            getattr(config, method)(**kwargs)
    model = dict(d["model"])
    preset = model.pop("preset", None)
    batchnorm = model.pop("batchnorm", False)
    if preset:
        model = models.model_config(str(preset), image=envs.is_atari(d["env"]), overrides=model)
    config.rl_module(model_config=model)
    if batchnorm:
        module_class = algorithm(d["algorithm"]).batchnorm_module
        config.rl_module(rl_module_spec=RLModuleSpec(module_class=module_class, model_config=model))
    if d["seed"] is not None:
        config.debugging(seed=d["seed"])
    # Tag the learners' Ray metrics (dashboard / Prometheus) with the Tune trial.
    config.callbacks(on_algorithm_init=tag_learners_with_trial)
    settings = AmpSettings.from_dict(d["amp"], where="amp")
    with_amp(config, settings)
    if amp_searched:
        store_in_config(config, settings, searched=amp_searched)
    return config
