"""Small value checks shared by every parser of user input (settings, experiments, CLIs).

Example:
    >>> suggest("init_scal", ("init_scale", "growth_factor"))
    " (did you mean 'init_scale'?)"
    >>> is_number(True), is_number(2.5)
    (False, True)
    >>> dotted({"amp": {"init_scale": 1024.0, "warm_start": {}}, "seed": 0})
    {'amp.init_scale': 1024.0, 'amp.warm_start': {}, 'seed': 0}
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from typing import TypeGuard


def is_number(value: object) -> TypeGuard[int | float]:
    """True for an int or float that is not a bool (YAML's ``true`` is no number)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def suggest(key: str, allowed: Iterable[str]) -> str:
    """Returns `` (did you mean 'x'?)`` for the nearest allowed name, or ``""``."""
    # cutoff: how alike (difflib's ratio) a typo and a real name must be.
    close = difflib.get_close_matches(str(key), [str(a) for a in allowed], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def dotted(d: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """Nested mappings as one level of dotted keys (``amp.init_scale``), in order. An empty
    mapping is a value of its own: ``{}`` set on purpose differs from a key left out."""
    out: dict[str, object] = {}
    for key, value in d.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.update(dotted(value, f"{name}."))
        else:
            out[name] = value
    return out


def is_search_space(value: object) -> bool:
    """True for a Tune sampler (``tune.choice``, ``tune.loguniform``...) or a
    ``{"grid_search": [...]}`` mapping: a value to check once Tune has sampled it.

    Example:
        >>> is_search_space({"grid_search": [1, 2]}), is_search_space({"a": 1})
        (True, False)
    """
    # By module name: checks.py is imported where Ray must not be.
    return type(value).__module__.startswith("ray.tune.search") or (
        isinstance(value, Mapping) and set(value) == {"grid_search"}
    )
