"""The shape of a validated experiment (``schema.validate``'s result), as TypedDicts.

``ExperimentData`` is what the validators build, one section at a time in ``schema.SECTIONS``
order: each validator reads the sections checked before it, so the keys are not all
required; ``validate`` returns every one. The free-form sections (``env_config``, ``model``,
``amp``, ``training``, ``resources``) are ``Section``: key -> a value read from YAML, checked
by the section's validator, passed on to RLlib or ``AmpSettings`` as it is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, TypeAlias, TypedDict

if TYPE_CHECKING:
    from rllib_amp.experiment.sampler import Sampler

# One normalised free-form section: key -> a checked value read from YAML.
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
    """The ``tune`` section, defaults filled in."""

    metric: str
    mode: str
    num_samples: int
    scheduler: str
    max_concurrent_trials: int | None
    max_failures: int
    pbt: PbtSection | None


class CheckpointSection(TypedDict):
    """The ``checkpoint`` section, defaults filled in."""

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
