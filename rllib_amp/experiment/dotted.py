"""Dotted keys: one key of an experiment written flat, e.g. ``training.lr``, ``amp.init_scale``.

Command-line overrides (``--set``), search entries and PBT mutations name keys this way.
``with_dotted`` sets one, ``with_override`` applies a ``--set`` override, and
``is_integer_key`` says whether a key takes integers only.

Example:
    >>> with_override({"seed": 0}, "training.lr", 1e-4, "exp.yaml")
    {'seed': 0, 'training': {'lr': 0.0001}}
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rllib_amp.algorithms import algorithm
from rllib_amp.checks import suggest
from rllib_amp.experiment.errors import ExperimentError, err
from rllib_amp.experiment.rllib_keys import RESOURCES, TRAINING_NUMBERS, training_types
from rllib_amp.settings import AmpSettings

if TYPE_CHECKING:
    from rllib_amp.experiment.data import ExperimentData

# The top-level sections of an experiment, in the order ``schema.validate`` checks them (its
# SECTIONS table has one validator for each).
TOP_KEYS: tuple[str, ...] = (
    "algorithm",
    "env",
    "env_config",
    "model",
    "amp",
    "training",
    "resources",
    "tune",
    "stop",
    "checkpoint",
    "seed",
    "storage_path",
    "search",
)


def is_integer_key(exp: ExperimentData, dotted: str) -> bool:
    """True when the experiment key ``dotted`` (e.g. ``training.num_epochs``) takes integers only.

    Example:
        >>> is_integer_key({"algorithm": "PPO"}, "training.minibatch_size")
        True
    """
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


def with_dotted(
    data: Mapping[str, object], parts: Sequence[str], value: object, key: str, path: str
) -> dict[str, object]:
    """A copy of ``data`` with ``data[p0][p1]...`` set to ``value``; copies only that path.

    Example:
        >>> with_dotted({"amp": {"dtype": "float16"}}, ["amp", "init_scale"], 8.0, "k", "<p>")
        {'amp': {'dtype': 'float16', 'init_scale': 8.0}}
    """
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
    """``data`` with a ``--set`` style override; ``search.<dotted key>`` sets one search entry.

    The caller validates the result.

    Example:
        >>> with_override({"seed": 0}, "search.amp.init_scale", {"grid": [1, 2]}, "<p>")
        {'seed': 0, 'search': {'amp.init_scale': {'grid': [1, 2]}}}
    """
    parts = override_parts(key, path)
    top = parts[0]
    if top == "model" and isinstance(data.get("model"), str):
        data = {**data, "model": {"preset": data["model"]}}
    return with_dotted(data, parts, value, key, path)


def _covered(key: str, value: object) -> set[str]:
    """The dotted keys a ``--set key=value`` gives a value: ``key``, and every key inside a
    mapping value (``--set amp={init_scale: 1024}`` sets ``amp.init_scale``)."""
    out = {key}
    if isinstance(value, Mapping):
        for k, v in value.items():
            out |= _covered(f"{key}.{k}", v)
    return out


def _spec_text(spec: object) -> str:
    if isinstance(spec, Mapping) and len(spec) == 1:
        kind, arg = next(iter(spec.items()))
        if kind in ("grid", "choice") and isinstance(arg, list):
            return f"{len(arg)} value{'s' if len(arg) != 1 else ''}"
        return f"{kind} {arg}"
    return str(spec)


def replaced_searches(
    data: Mapping[str, object], key: str, value: object
) -> tuple[dict[str, object], list[str]]:
    """``data`` without the search entries that ``--set key=value`` gives a fixed value, and
    one line per entry dropped: a fixed value the user asked for must not lose to a search.

    Example:
        >>> data = {"search": {"amp.init_scale": {"grid": [1024.0, 65536.0]}}}
        >>> data, lines = replaced_searches(data, "amp.init_scale", 4096.0)
        >>> data
        {'search': {}}
        >>> print(lines[0])
        --set amp.init_scale=4096.0 replaces the search over amp.init_scale (2 values)
    """
    search = data.get("search")
    if key.split(".", 1)[0] == "search" or not isinstance(search, Mapping):
        return dict(data), []
    hit = [k for k in search if str(k) in _covered(key, value)]
    if not hit:
        return dict(data), []
    shown = json.dumps(value, default=str) if isinstance(value, (Mapping, list)) else value
    lines = [
        f"--set {key}={shown} replaces the search over {k} ({_spec_text(search[k])})" for k in hit
    ]
    return {**data, "search": {k: v for k, v in search.items() if k not in hit}}, lines
