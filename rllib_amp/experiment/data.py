"""The shape of a validated experiment (``schema.validate``'s result), as TypedDicts.

The validators build ``ExperimentData`` one section at a time (``schema.SECTIONS``), so its
keys are not all required; ``validate`` returns every one. The free-form sections are
``Section``: key -> a checked value read from YAML, passed on to RLlib or ``AmpSettings``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias, TypedDict

if TYPE_CHECKING:
    from rllib_amp.experiment.sampler import Sampler

Section: TypeAlias = dict[str, object]
# A sampler written as plain data, e.g. {"grid": [0, 1]} (``Sampler.to_dict``).
SamplerSpec: TypeAlias = dict[str, list[object]]


class PbtSection(TypedDict):
    """``tune.pbt``: Tune's PopulationBasedTraining arguments, mutations as plain specs."""

    perturbation_interval: int
    hyperparam_mutations: dict[str, SamplerSpec]
    quantile_fraction: float
    resample_probability: float
    burn_in_period: int
    synch: bool


class TuneSection(TypedDict):
    metric: str
    mode: str
    num_samples: int
    scheduler: str
    max_concurrent_trials: int | None
    max_failures: int
    pbt: PbtSection | None


class CheckpointSection(TypedDict):
    frequency: int
    num_to_keep: int | None
    at_end: bool


class ExperimentData(TypedDict, total=False):
    """A validated experiment: every section, defaults filled in (see the module's note)."""

    algorithm: str
    env: str
    env_config: Section
    model: Section
    amp: Section
    training: Section
    resources: Section
    tune: TuneSection
    stop: dict[str, float]
    checkpoint: CheckpointSection
    seed: int | None
    storage_path: str | None
    search: dict[str, Sampler]
