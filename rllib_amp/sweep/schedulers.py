"""Tune schedulers for an experiment's ``tune.scheduler``: ASHA, and Population Based Training.

PBT's exploit copies the donor's checkpoint, scaler state included (docs/update-step.md).
Mutations name dotted experiment keys; Tune needs them where ``config_path`` says they sit in a
trial's config dict (AMP settings under ``learner_config_dict.rllib_amp``).

Example:
    >>> from rllib_amp import experiment as E
    >>> exp = E.load("tune_configs/cartpole_ppo_pbt.yaml")
    >>> from rllib_amp.sweep.summary import config_path
    >>> sched = scheduler(exp, config_path)
    >>> amp = sched._hyperparam_mutations["learner_config_dict"]["rllib_amp"]
    >>> type(sched).__name__, amp["growth_interval"]
    ('PopulationBasedTraining', [10, 100, 2000])
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from rllib_amp.experiment import Experiment, builder

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.tune.schedulers import TrialScheduler

ConfigPath = Callable[[str, dict[str, Any]], tuple[str, ...]]


def nest(flat: Mapping[tuple[str, ...], object]) -> dict[str, Any]:
    """{("a", "b"): 1} -> {"a": {"b": 1}}: the nested shape PBT's mutations take.

    Example:
        >>> nest({("lr",): [1], ("learner_config_dict", "rllib_amp", "growth_interval"): [2]})
        {'lr': [1], 'learner_config_dict': {'rllib_amp': {'growth_interval': [2]}}}
    """
    out: dict[str, Any] = {}
    for path, value in flat.items():
        node = out
        for key in path[:-1]:
            node = node.setdefault(key, {})
        node[path[-1]] = value
    return out


class KeepInRange:
    """PBT's ``custom_explore_fn``: a perturbed range value (x 0.8 or x 1.2) is clipped back
    into the file's range (``backoff_factor`` 0.9 x 1.2 would be >= 1, which the schema refuses)."""

    def __init__(self, bounds: Mapping[tuple[str, ...], tuple[float, float]]) -> None:
        self.bounds = dict(bounds)

    def __call__(self, config: dict[str, object]) -> dict[str, object]:
        for path, (lo, hi) in self.bounds.items():
            node: Any = config
            for key in path[:-1]:
                node = node[key]
            value = node[path[-1]]
            clipped = min(max(value, lo), hi)
            node[path[-1]] = type(value)(clipped) if isinstance(value, int) else clipped
        return config


def param_space(exp: Experiment) -> AlgorithmConfig:
    """The experiment's config with its search space; under PBT each mutated key that is not
    searched drawn from its mutation for the first config."""
    return builder.algorithm_config(exp.data, searched=builder.initial_space(exp.data))


def scheduler(exp: Experiment, config_path: ConfigPath) -> TrialScheduler | None:
    """The Tune scheduler ``exp.tune['scheduler']`` names (None for fifo)."""
    from ray import tune

    if exp.tune["scheduler"] == "asha":
        return tune.schedulers.ASHAScheduler(grace_period=2)  # no trial stopped before iteration 2
    if exp.tune["scheduler"] != "pbt":
        return None
    sample = exp.algorithm_config().to_dict()
    mutations = {config_path(k, sample): v for k, v in builder.mutation_space(exp.data).items()}
    bounds = builder.mutation_bounds(exp.data)
    return tune.schedulers.PopulationBasedTraining(
        # metric and mode come from the TuneConfig (Tune refuses them twice); tune.pbt holds
        # PopulationBasedTraining's own arguments (experiment/pbt.py: PBT_DEFAULTS).
        time_attr="training_iteration",
        **{**exp.tune["pbt"], "hyperparam_mutations": nest(mutations)},
        custom_explore_fn=KeepInRange({config_path(k, sample): b for k, b in bounds.items()}),
    )
