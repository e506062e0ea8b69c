"""Dotted keys: one key of an experiment written flat, e.g. ``training.lr``, ``amp.init_scale``.

Command-line overrides (``--set``), search entries and PBT mutations name keys this way.
``with_dotted`` sets one, ``replaced_searches`` drops the search entries a ``--set`` fixes,
and ``is_integer_key`` says whether a key takes integers only.

Example:
    >>> with_dotted({"seed": 0}, ["training", "lr"], 1e-4, "training.lr", "exp.yaml")
    {'seed': 0, 'training': {'lr': 0.0001}}
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

from rllib_amp.algorithms import algorithm
from rllib_amp.experiment.errors import err
from rllib_amp.experiment.rllib_keys import RESOURCES, TRAINING_NUMBERS, training_types
from rllib_amp.settings import AmpSettings

if TYPE_CHECKING:
    from rllib_amp.experiment.data import ExperimentData


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


def _covered(key: str, value: object) -> set[str]:
    """``key`` and every key inside a mapping value (``--set amp={init_scale: 1}`` sets
    ``amp.init_scale``)."""
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
    one line per entry dropped: a fixed value the user asked for must not lose to a search
    (tests/unit/experiment/test_dotted.py shows the lines)."""
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
