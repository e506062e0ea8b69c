"""The RLlib keys an experiment sets: the keyword arguments of ``AlgorithmConfig.training``
(in every class of the config's MRO: RLlib's signature is the schema, so a new release brings
its keys), their kinds, those a YAML file cannot set, and the ``resources`` keys.

Example:
    >>> from rllib_amp.algorithms import algorithm
    >>> "lambda_" in training_keys(algorithm("PPO").config_class)
    True
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import math
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING

from rllib_amp.algorithms import algorithm
from rllib_amp.experiment.errors import err
from rllib_amp.settings import AmpSettings

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    from rllib_amp.experiment.data import ExperimentData

# Upper bounds far above any real setup and far below what hangs: RLlib builds one
# placement-group bundle per env runner up front (num_env_runners: 100000000 never returned),
# and a batch is allocated whole.
MAX_ENV_RUNNERS = 1024
MAX_ENVS_PER_ENV_RUNNER = 4096
MAX_BATCH = 10**7
# resources key -> (builder method, allowed python types, minimum, maximum)
RESOURCES: dict[str, tuple[str, tuple[type, ...], float, float | None]] = {
    "num_env_runners": ("env_runners", (int,), 0, MAX_ENV_RUNNERS),
    "num_envs_per_env_runner": ("env_runners", (int,), 1, MAX_ENVS_PER_ENV_RUNNER),
    # Env steps per env per sample round: with DQN's default training intensity, one update
    # per round, so this sets the train frequency.
    "rollout_fragment_length": ("env_runners", (int,), 1, None),
    "num_cpus_per_env_runner": ("env_runners", (int, float), 0, None),
    "num_gpus_per_env_runner": ("env_runners", (int, float), 0, None),
    "num_learners": ("learners", (int,), 0, MAX_ENV_RUNNERS),
    "num_cpus_per_learner": ("learners", (int, float), 0, None),
    "num_gpus_per_learner": ("learners", (int, float), 0, None),
}
# Numeric training keys whose bounds are checked here (RLlib checks the rest when the config
# is built): key -> (allowed python types, minimum, maximum).
TRAINING_NUMBERS: dict[str, tuple[tuple[type, ...], float, float | None]] = {
    "gamma": ((int, float), 0.0, 1.0),
    "train_batch_size": ((int,), 1, MAX_BATCH),
    "train_batch_size_per_learner": ((int,), 1, MAX_BATCH),
    "minibatch_size": ((int,), 1, MAX_BATCH),
    "num_epochs": ((int,), 1, None),
    "grad_clip": ((int, float), 0.0, None),
}


def _training_parameters(cls: type[AlgorithmConfig]) -> Iterator[inspect.Parameter]:
    """``training``'s keyword parameters in ``cls``'s MRO, most derived first (with repeats)."""
    for klass in cls.__mro__:
        fn = vars(klass).get("training")
        for p in inspect.signature(fn).parameters.values() if fn else ():
            if p.name != "self" and p.kind is not p.VAR_KEYWORD:
                yield p


@functools.cache
def training_keys(cls: type[AlgorithmConfig]) -> tuple[str, ...]:
    """The keyword arguments of ``cls.training`` and its parents' (RLlib's own schema)."""
    return tuple(dict.fromkeys(p.name for p in _training_parameters(cls)))


# Python types named by RLlib's type hints (and by ``kinds_of``) -> the kind of YAML value.
_KINDS = {bool: "bool", int: "int", float: "float", str: "str", Mapping: "mapping", list: "list"}
_HINT_TYPES = {
    **{t: t for t in ("bool", "int", "float", "str")},
    **dict.fromkeys(("dict", "Dict"), "mapping"),
    **dict.fromkeys(("list", "List", "tuple", "Tuple"), "list"),
}
_UNCHECKED_HINTS = re.compile(r"\b(Any|Callable|Type|ForwardRef|Space|Learner)\b|_empty")


def kinds_of(value: object) -> str:
    """The kind of a YAML value (bool, int, float, str, mapping, list), as ``training_types``."""
    # bool before int (a bool is an int); a tuple is a list
    kind = next((k for t, k in _KINDS.items() if isinstance(value, t)), None)
    return kind or ("list" if isinstance(value, tuple) else type(value).__name__)


@functools.cache
def training_types(cls: type[AlgorithmConfig]) -> dict[str, frozenset[str]]:
    """``training`` key -> the kinds of value RLlib takes for it (e.g. {"int", "list"}): the
    type hints in every class of ``cls``'s MRO (they disagree: ``grad_clip`` is an int in one,
    a float in another) and the default's type. Hints naming callables or classes are skipped.

    Example:
        >>> from rllib_amp.algorithms import algorithm
        >>> sorted(training_types(algorithm("DQN").config_class)["n_step"])
        ['int', 'list']
    """
    from ray._common.deprecation import DEPRECATED_VALUE

    defaults = cls()
    kinds: dict[str, set[str]] = {}
    unchecked: set[str] = set()
    for p in _training_parameters(cls):
        hint = str(p.annotation)
        if _UNCHECKED_HINTS.search(hint):
            unchecked.add(p.name)
            continue
        names = re.findall(r"[A-Za-z_]+", hint)
        kinds.setdefault(p.name, set()).update(_HINT_TYPES[n] for n in names if n in _HINT_TYPES)
    out: dict[str, frozenset[str]] = {}
    for key, found in kinds.items():
        default = getattr(defaults, key, None)
        if key in unchecked or default is DEPRECATED_VALUE:
            continue
        if default is not None and not callable(default):
            found.add(kinds_of(default))
        if "float" in found:
            # An int is a fine float; and RLlib takes a schedule ([[timestep, value], ...])
            # for coefficients whose hint says float only (PPO's entropy_coeff).
            found.update(("int", "list"))
        if found:
            out[key] = frozenset(found)
    return out


@functools.cache
def unsettable_training_keys(cls: type[AlgorithmConfig]) -> dict[str, str]:
    """``training`` keys a YAML file must not set -> why: deprecated (RLlib ignores some with
    a log line, e.g. PPO's ``vf_share_layers``), or Python objects only."""
    from ray._common.deprecation import DEPRECATED_VALUE

    out: dict[str, str] = {}
    for p in _training_parameters(cls):
        if type(p.default) is int and p.default == DEPRECATED_VALUE:
            out.setdefault(p.name, "deprecated in RLlib (ignored or refused there); remove it")
        elif re.search(r"\b(Callable|Type)\b", str(p.annotation)):
            out.setdefault(
                p.name,
                "takes a Python class or function, which a YAML file cannot give; set it "
                "through the Python API (rllib_amp.with_amp on your AlgorithmConfig)",
            )
    return out


def check_training_type(path: str, key: str, value: object, kinds: frozenset[str]) -> None:
    """ExperimentError when ``training.key``'s value is of none of the kinds RLlib takes."""
    if value is None:
        return  # RLlib's hints are all Optional
    if kinds_of(value) not in kinds:
        number = "float" in kinds
        named = (
            (number, "a number"),
            (number and "list" in kinds, "a [[timestep, value], ...] schedule"),
            (not number and "int" in kinds, "an integer"),
            ("bool" in kinds, "true or false"),
            ("str" in kinds, "a string"),
            ("mapping" in kinds, "a mapping"),
            (not number and "list" in kinds, "a list"),
        )
        words = [word for wanted, word in named if wanted]
        fix = f"; write {int(value)}" if isinstance(value, float) and value.is_integer() else ""
        raise err(
            path, f"training.{key}", f"got {value!r}; RLlib expects {' or '.join(words)}{fix}"
        )
    if isinstance(value, float) and math.isnan(value):
        raise err(path, f"training.{key}", f"got {value!r}; expected a number, not NaN")


def is_integer_key(exp: ExperimentData, dotted: str) -> bool:
    """True when the key ``dotted`` (e.g. ``training.num_epochs``) takes integers only."""
    top, _, rest = dotted.partition(".")
    if top == "seed":
        return True
    if top == "resources":
        return rest in RESOURCES and RESOURCES[rest][1] == (int,)
    if top == "amp":
        default = next((f.default for f in dataclasses.fields(AmpSettings) if f.name == rest), 0.0)
        return isinstance(default, int) and not isinstance(default, bool)
    if top == "training":
        if rest in TRAINING_NUMBERS:
            return TRAINING_NUMBERS[rest][0] == (int,)
        kinds = training_types(algorithm(exp["algorithm"]).config_class).get(rest, frozenset())
        return "int" in kinds and "float" not in kinds
    return False
