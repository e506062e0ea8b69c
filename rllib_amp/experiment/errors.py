"""ExperimentError: the one error of the experiment package, the one way to word it, and the
small checks every section uses.

Example:
    >>> str(err("exp.yaml", "training.lr", "got -1; must be >= 0"))
    'exp.yaml: training.lr: got -1; must be >= 0'
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

from rllib_amp.checks import is_number, suggest


class ExperimentError(ValueError):
    """Bad experiment input: the message names the file, the key, the value and the fix.

    The message is one line whatever the input: a key or value with a newline or another
    line-breaking character (``\x1e``, ``\u2028``) is shown escaped.

    Example:
        >>> str(ExperimentError("exp.yaml: env: got 'a\\nb'"))
        "exp.yaml: env: got 'a\\\\nb'"
    """

    def __init__(self, message: object = "") -> None:
        text = str(message)
        super().__init__(
            "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
        )


def err(path: str, key: str, msg: str) -> ExperimentError:
    """The error for ``key`` of the file at ``path``: ``"{path}: {key}: {msg}"``."""
    return ExperimentError(f"{path}: {key}: {msg}")


def check_mapping(path: str, key: str, value: object) -> dict[str, object]:
    """``value`` as a dict (None: empty); anything but a mapping is refused."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise err(path, key, f"expected a mapping, got {type(value).__name__} {value!r}")
    return dict(value)


def check_keys(path: str, section: str, d: Mapping[str, object], allowed: Iterable[str]) -> None:
    """Refuses a key of ``d`` not in ``allowed``, suggesting the nearest."""
    allowed = tuple(allowed)
    for k in d:
        if k not in allowed:
            raise err(
                path,
                f"{section}.{k}" if section else str(k),
                f"unknown key{suggest(str(k), allowed)}; allowed: {', '.join(allowed)}",
            )


def check_number(
    path: str,
    key: str,
    v: object,
    types: tuple[type, ...],
    lo: float | None,
    hi: float | None = None,
) -> float:
    """``v``, refused unless a finite number of ``types`` in [lo, hi] (None: unbounded)."""
    if (
        not is_number(v)
        or not (float in types or isinstance(v, int))
        or (isinstance(v, float) and not math.isfinite(v))
    ):
        expected = "an integer" if types == (int,) else "a number"
        raise err(path, key, f"got {v!r}; expected {expected}")
    if lo is not None and v < lo:
        raise err(path, key, f"got {v!r}; must be >= {lo}")
    if hi is not None and v > hi:
        raise err(path, key, f"got {v!r}; must be <= {hi}")
    return v
