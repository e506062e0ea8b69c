"""The experiment schema: one validator per top-level section, and the defaults.

``validate`` checks the file's shape, then runs the ``SECTIONS`` table in order: each validator
gets its section's raw value and the sections checked before it (``training`` needs the
algorithm), and returns the normalised section; it also checks a searched key's values.

Example:
    >>> data = validate({"algorithm": "ppo", "env": "CartPole-v1", "stop": {"time_total_s": 9}})
    >>> data["algorithm"], data["tune"]["mode"]
    ('PPO', 'max')
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, cast

from rllib_amp.algorithms import ALGORITHMS, algorithm
from rllib_amp.checks import is_number, suggest
from rllib_amp.experiment.errors import (
    ExperimentError,
    check_keys,
    check_mapping,
    check_number,
    err,
)
from rllib_amp.experiment.pbt import check_pbt_needs, check_tune
from rllib_amp.experiment.rllib_keys import (
    RESOURCES,
    TRAINING_NUMBERS,
    check_training_type,
    is_integer_key,
    training_keys,
    training_types,
    unsettable_training_keys,
)
from rllib_amp.experiment.sampler import Sampler
from rllib_amp.settings import AmpSettings, WarmStart

if TYPE_CHECKING:
    from rllib_amp.experiment.data import CheckpointSection, ExperimentData, Section

CHECKPOINT_DEFAULTS: dict[str, object] = {"frequency": 1, "num_to_keep": 2, "at_end": True}
# Seeds go to numpy's and torch's generators, which take 32-bit seeds.
SEED_MAX = 2**32 - 1
# Sections whose keys may be searched; "seed" is searched whole.
SEARCHABLE = ("amp", "training", "resources", "env_config", "model", "seed")
# A preset expands into several model settings and BatchNorm picks the module class: neither
# can become a Tune sampler inside one config.
NOT_SEARCHABLE = {
    "model.preset": "search the preset's settings instead, e.g. model.fcnet_hiddens",
    "model.batchnorm": "it picks the module class; run one experiment with and one without",
}


def _lr(path: str, v: object) -> None:
    """A learning rate >= 0, or RLlib's schedule: [[env_step, lr], ...], steps rising from 0."""
    if is_number(v):
        check_number(path, "training.lr", v, (int, float), 0.0)
        return
    fix = "expected a number or RLlib's schedule form, e.g. lr: [[0, 2.5e-4], [3000000, 0.0]]"
    if not isinstance(v, list) or not v:
        raise err(path, "training.lr", f"got {v!r}; {fix}")
    previous: Any = -1
    for pair in v:
        step, lr = pair if isinstance(pair, list) and len(pair) == 2 else (None, None)
        ok = isinstance(step, int) and not isinstance(step, bool) and step > previous
        if not (ok and is_number(lr) and math.isfinite(lr) and lr >= 0):
            raise err(path, "training.lr", f"got the pair {pair!r} in {v!r}; {fix}")
        previous = step
    if v[0][0] != 0:
        raise err(path, "training.lr", f"got {v!r}: the schedule must start at step 0; {fix}")


def with_dotted(
    data: Mapping[str, object], parts: Sequence[str], value: object, key: str, path: str
) -> dict[str, object]:
    """A copy of ``data`` with ``data[p0][p1]...`` set to ``value``; copies only that path."""
    out = dict(data)
    head, *rest = parts
    if not rest:
        out[head] = value
        return out
    child = out.get(head)
    if child is None:
        child = {}
    if not isinstance(child, Mapping):
        raise err(path, key, f"'{head}' holds {child!r}, not a mapping; set '{head}' itself")
    out[head] = with_dotted(child, rest, value, key, path)
    return out


# One validator per section: (raw value, sections checked so far, path) -> normalised.
def _algorithm(value: object, exp: ExperimentData, path: str) -> str:
    if value in (None, ""):
        raise err(path, "algorithm", "missing; add e.g. 'algorithm: PPO'")
    if not isinstance(value, str):
        raise err(path, "algorithm", f"got {value!r}; allowed: {', '.join(ALGORITHMS)}")
    try:
        return algorithm(value).name
    except ValueError as e:
        raise ExperimentError(f"{path}: {e}") from None


def _env(value: object, exp: ExperimentData, path: str) -> str:
    if value in (None, ""):
        raise err(path, "env", "missing; add e.g. 'env: CartPole-v1'")
    if not isinstance(value, str):
        raise err(path, "env", f"got {value!r}; expected a gymnasium id such as 'CartPole-v1'")
    from rllib_amp.envs import configure as envs

    try:
        envs.check_env_id(value)
    except ValueError as e:
        raise ExperimentError(f"{path}: {e}") from None
    return value


def _model(value: object, exp: ExperimentData, path: str) -> Section:
    """A preset name, or a mapping of preset / batchnorm / RLlib DefaultModelConfig fields."""
    from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

    from rllib_amp.envs import configure as envs
    from rllib_amp.envs import models

    model = check_mapping(path, "model", {"preset": value} if isinstance(value, str) else value)
    fields = (f.name for f in dataclasses.fields(DefaultModelConfig))
    check_keys(path, "model", model, ("preset", "batchnorm", *fields))
    if "preset" in model and model["preset"] not in models.PRESETS:
        raise err(
            path,
            "model.preset",
            f"unknown preset {model['preset']!r}{suggest(str(model['preset']), models.PRESETS)}; "
            f"allowed: {', '.join(models.PRESETS)}",
        )
    if "batchnorm" in model and not isinstance(model["batchnorm"], bool):
        raise err(path, "model.batchnorm", f"got {model['batchnorm']!r}; expected true or false")
    if model.get("batchnorm") and not envs.is_atari(exp["env"]) and "conv_filters" not in model:
        raise err(
            path,
            "model.batchnorm",
            "BatchNorm goes after conv layers, and this env has vector input; drop it or "
            "use an image env such as ALE/Pong-v5",
        )
    return model


def _amp(value: object, exp: ExperimentData, path: str) -> Section:
    amp = check_mapping(path, "amp", value)
    try:
        settings = AmpSettings.from_dict(amp, where="amp")
        if settings.warm_start is not None:
            # Read the checkpoint now, so that a missing scaler state or a module map naming
            # unknown modules is refused before anything starts, not in every trial.
            _check_warm_start(settings.warm_start.path, settings.warm_start.modules)
    except ValueError as e:
        raise ExperimentError(f"{path}: {e}") from None
    return amp


@functools.lru_cache(maxsize=16)
def _check_warm_start(checkpoint: str, modules: tuple[tuple[str, str], ...] | None) -> None:
    # Cached: every override and search edge validates the amp section again.
    from ray.rllib.core import DEFAULT_MODULE_ID

    from rllib_amp.scaling.warm_start import check_warm_start

    warm = WarmStart(path=checkpoint, modules=modules)
    check_warm_start(AmpSettings(warm_start=warm), [DEFAULT_MODULE_ID])


def _training(value: object, exp: ExperimentData, path: str) -> Section:
    training = check_mapping(path, "training", value)
    cls = algorithm(exp["algorithm"]).config_class
    check_keys(path, "training", training, training_keys(cls))
    if training.get("lr") is not None:
        _lr(path, training["lr"])
    for k, (types, lo, hi) in TRAINING_NUMBERS.items():
        if training.get(k) is not None:
            check_number(path, f"training.{k}", training[k], types, lo, hi)
    kinds = training_types(cls)
    unsettable = unsettable_training_keys(cls)
    for k, v in training.items():
        if k in unsettable:
            raise err(path, f"training.{k}", unsettable[k])
        if k in kinds:
            check_training_type(path, k, v, kinds[k])
    return training


def _resources(value: object, exp: ExperimentData, path: str) -> Section:
    resources = check_mapping(path, "resources", value)
    check_keys(path, "resources", resources, RESOURCES)
    for k, v in resources.items():
        check_number(path, f"resources.{k}", v, *RESOURCES[k][1:])
    return resources


def _stop(value: object, exp: ExperimentData, path: str) -> dict[str, float]:
    stop = check_mapping(path, "stop", value)
    if not stop:
        raise err(path, "stop", "missing or empty; add e.g. 'stop: {training_iteration: 10}'")
    return {k: check_number(path, f"stop.{k}", v, (int, float), None) for k, v in stop.items()}


def _checkpoint(value: object, exp: ExperimentData, path: str) -> CheckpointSection:
    given = check_mapping(path, "checkpoint", value)
    check_keys(path, "checkpoint", given, CHECKPOINT_DEFAULTS)
    ckpt = {**CHECKPOINT_DEFAULTS, **given}
    check_number(path, "checkpoint.frequency", ckpt["frequency"], (int,), 0)
    if ckpt["num_to_keep"] is not None:
        check_number(path, "checkpoint.num_to_keep", ckpt["num_to_keep"], (int,), 1)
    if not isinstance(ckpt["at_end"], bool):
        raise err(path, "checkpoint.at_end", f"got {ckpt['at_end']!r}; expected true or false")
    return cast("CheckpointSection", ckpt)  # every key checked above, or a default


def _seed(value: object, exp: ExperimentData, path: str) -> int | None:
    return None if value is None else int(check_number(path, "seed", value, (int,), 0, SEED_MAX))


def _storage_path(value: object, exp: ExperimentData, path: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise err(
            path,
            "storage_path",
            f"got {value!r}; expected a local path, a shared mount or a URI such as "
            f"s3://BUCKET/experiments",
        )
    return value


def _search(value: object, exp: ExperimentData, path: str) -> dict[str, Sampler]:
    """Dotted key -> Sampler; each edge value is checked by the validator of its section."""
    out: dict[str, Sampler] = {}
    for key, spec in check_mapping(path, "search", value).items():
        key = str(key)
        where = f"search.{key}"
        top, *rest = key.split(".")
        if top not in SEARCHABLE:
            raise err(
                path,
                where,
                f"'{top}' cannot be searched{suggest(top, SEARCHABLE)}; "
                f"searchable sections: {', '.join(SEARCHABLE)}",
            )
        if (not rest) != (top == "seed") or not all(rest):
            example = "seed" if top == "seed" else f"{top}.<key>"
            raise err(path, where, f"name one key of '{top}', e.g. search.{example}")
        if key in NOT_SEARCHABLE:
            raise err(path, where, f"cannot be searched: {NOT_SEARCHABLE[key]}")
        try:
            sampler = Sampler.parse(spec)
        except ValueError as e:
            raise err(path, where, str(e)) from None
        _check_values(exp, key, sampler, where, path)
        out[key] = sampler
    return out


def _check_values(exp: ExperimentData, key: str, sampler: Sampler, where: str, path: str) -> None:
    """Every value ``sampler`` can give the dotted ``key`` passes the key's section validator."""
    top, *rest = key.split(".")
    sections: Mapping[str, object] = exp
    if sampler.kind in ("uniform", "loguniform") and is_integer_key(exp, key):
        lo, hi = sampler.values
        raise err(
            path,
            where,
            f"{sampler.kind} draws floats and '{key}' takes an integer; use "
            f"{{randint: [{math.ceil(lo)}, {math.floor(hi) + 1}]}} or a grid/choice of "
            f"integers",
        )
    for edge in sampler.edges():
        # A dotted key below the top names one key of a free-form section.
        section = (
            with_dotted(cast("Section", sections[top]), rest, edge, key, path) if rest else edge
        )
        try:
            SECTIONS[top](section, exp, path)
        except ExperimentError as e:
            raise ExperimentError(f"{e} (value {edge!r} of {where})") from None


# In the order they run: each may read the sections above it.
SECTIONS: dict[str, Callable[[object, ExperimentData, str], object]] = {
    "algorithm": _algorithm,
    "env": _env,
    "env_config": lambda value, exp, path: check_mapping(path, "env_config", value),
    "model": _model,
    "amp": _amp,
    "training": _training,
    "resources": _resources,
    "tune": lambda value, exp, path: check_tune(value, exp, path, _check_values),
    "stop": _stop,
    "checkpoint": _checkpoint,
    "seed": _seed,
    "storage_path": _storage_path,
    "search": _search,
}
# The top-level sections, in the order they are checked.
TOP_KEYS: tuple[str, ...] = tuple(SECTIONS)


def override_parts(key: str, path: str) -> list[str]:
    """The path a ``--set`` key names; ExperimentError for a key outside the experiment.

    Example:
        >>> override_parts("search.training.lr", "<p>")
        ['search', 'training.lr']
    """
    parts = str(key).split(".")
    top = parts[0]
    if top not in TOP_KEYS or not all(parts):
        raise ExperimentError(
            f"{path}: {key}: unknown key '{top}'{suggest(top, TOP_KEYS)}; dotted keys start "
            f"with one of: {', '.join(TOP_KEYS)}"
        )
    if top == "search" and len(parts) > 1:
        # Search entries are themselves dotted keys: everything after "search." is one key.
        parts = [top, ".".join(parts[1:])]
    return parts


def with_override(
    data: Mapping[str, object], key: str, value: object, path: str
) -> dict[str, object]:
    """``data`` (not validated) with a ``--set`` override; ``search.<dotted key>`` sets one
    search entry.

    Example:
        >>> with_override({"seed": 0}, "search.amp.init_scale", {"grid": [1, 2]}, "<p>")
        {'seed': 0, 'search': {'amp.init_scale': {'grid': [1, 2]}}}
    """
    parts = override_parts(key, path)
    top = parts[0]
    if top == "model" and isinstance(data.get("model"), str):
        data = {**data, "model": {"preset": data["model"]}}
    return with_dotted(data, parts, value, key, path)


def _batch_bounds(exp: ExperimentData, key: str, default: int | None) -> tuple[object, object]:
    """(smallest, largest) value ``training.key`` can take, searched, mutated by PBT or not."""
    value = exp["training"].get(key, default)  # a PBT trial may start at the file's value
    searched = exp["search"].get(f"training.{key}")
    pbt = exp["tune"]["pbt"]
    mutated = pbt["hyperparam_mutations"].get(f"training.{key}") if pbt else None
    edges = searched.edges() if searched else [value]
    edges += Sampler.parse(mutated).edges() if mutated else []
    nums = [v for v in edges if is_number(v)]
    return (min(nums), max(nums)) if nums else (value, value)


def _check_batch_sizes(exp: ExperimentData, path: str) -> None:
    """Learners that split each train batch into minibatches: none may outgrow the batch."""
    if not algorithm(exp["algorithm"]).minibatches:
        return
    defaults = algorithm(exp["algorithm"]).config_class()
    batch_lo, _ = _batch_bounds(
        exp, "train_batch_size_per_learner", defaults.train_batch_size_per_learner
    )
    _, mb_hi = _batch_bounds(exp, "minibatch_size", defaults.minibatch_size)
    if is_number(batch_lo) and is_number(mb_hi) and mb_hi > batch_lo:
        raise err(
            path,
            "training.minibatch_size",
            f"{mb_hi} is larger than the smallest train batch "
            f"(train_batch_size_per_learner={batch_lo}); lower minibatch_size or raise the batch",
        )


def validate(raw: object, path: str = "<dict>") -> ExperimentData:
    """Checks and normalises an experiment mapping; raises ExperimentError.

    The result has every section (defaults filled in, ``model`` a mapping, ``search`` a
    mapping of dotted key -> Sampler).

    Example:
        >>> data = validate({"algorithm": "DQN", "env": "CartPole-v1", "stop": {"time_total_s": 9}})
        >>> data["checkpoint"]
        {'frequency': 1, 'num_to_keep': 2, 'at_end': True}
    """
    if not isinstance(raw, Mapping):
        raise ExperimentError(
            f"{path}: expected a mapping of experiment keys at the top level, got "
            f"{type(raw).__name__}; start the file with e.g. 'algorithm: PPO'"
        )
    check_keys(path, "", raw, TOP_KEYS)
    # Each section is a mapping where one belongs, checked before any section's content: a
    # file of the wrong shape is refused before the env and training checks import RLlib.
    for section in TOP_KEYS:
        value = raw.get(section)
        if section not in ("algorithm", "env", "seed", "storage_path") and not (
            section == "model" and isinstance(value, str)
        ):
            check_mapping(path, section, value)
    out: dict[str, object] = {}
    # The table fills ExperimentData's keys in order; each check reads those before it.
    data = cast("ExperimentData", out)
    for section, check in SECTIONS.items():
        out[section] = check(raw.get(section), data, path)
    _check_batch_sizes(data, path)
    check_pbt_needs(data, path)
    return data
