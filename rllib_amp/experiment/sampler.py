"""One entry of an experiment's ``search`` section, parsed once into a ``Sampler``.

A spec is a one-key mapping: ``{grid: [...]}``, ``{choice: [...]}``, ``{loguniform: [lo, hi]}``,
``{uniform: [lo, hi]}`` or ``{randint: [lo, hi]}`` (``hi`` excluded, as in Tune).

Example:
    >>> s = Sampler.parse({"randint": [1, 5]})
    >>> s.edges(), s.grid_size()
    ([1, 4], 1)
    >>> Sampler.parse({"grid": [256.0, 65536.0]}).to_tune()
    {'grid_search': [256.0, 65536.0]}
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rllib_amp.checks import is_number, suggest

# Samplers that list their values, and samplers that draw from a [lo, hi] range (each
# named as Tune's function that builds it).
LISTS = ("grid", "choice")
RANGES = ("loguniform", "uniform", "randint")
SAMPLERS = (*LISTS, *RANGES)
_INT64 = (-(2**63), 2**63 - 1)


def _finite(x: float) -> bool:
    try:
        return math.isfinite(x)
    except OverflowError:  # an int beyond float64
        return False


@dataclass(frozen=True)
class Sampler:
    """A validated search spec.

    Attributes:
        kind: One of ``SAMPLERS``.
        values: The listed values (grid, choice) or the bounds ``(lo, hi)`` (ranges).
    """

    kind: str
    values: tuple[Any, ...]

    @classmethod
    def parse(cls, spec: object) -> Sampler:
        """The Sampler for ``spec`` (the module's example); ValueError says what is wrong and
        what is allowed."""
        if not isinstance(spec, Mapping) or len(spec) != 1:
            raise ValueError(
                f"expected one sampler ({', '.join(SAMPLERS)}), "
                f"e.g. '{{grid: [1024, 65536]}}', got {spec!r}"
            )
        kind = next(iter(spec))
        arg = spec[kind]
        if kind not in SAMPLERS:
            raise ValueError(
                f"unknown sampler {kind!r}{suggest(str(kind), SAMPLERS)}; "
                f"allowed: {', '.join(SAMPLERS)}"
            )
        if kind in LISTS:
            if not isinstance(arg, list) or not arg:
                raise ValueError(f"{kind} needs a non-empty list of values, got {arg!r}")
            # A copy: the caller's lists (e.g. fcnet_hiddens values) stay theirs.
            return cls(kind, tuple(copy.deepcopy(arg)))
        if not (
            isinstance(arg, list)
            and len(arg) == 2
            and all(is_number(a) and _finite(a) for a in arg)
        ):
            raise ValueError(f"{kind} needs [lo, hi] (two finite numbers), got {arg!r}")
        lo, hi = arg
        if lo >= hi:
            raise ValueError(f"{kind} needs lo < hi, got [{lo}, {hi}]")
        if kind == "loguniform" and lo <= 0:
            raise ValueError(f"loguniform needs lo > 0, got [{lo}, {hi}]")
        if kind == "randint" and not all(isinstance(a, int) for a in arg):
            raise ValueError(f"randint needs integer bounds, got {arg!r}")
        # Tune draws with numpy: 64-bit integers, and a uniform width that is a finite float.
        if kind == "randint" and not (_INT64[0] <= lo and hi - 1 <= _INT64[1]):
            raise ValueError(f"randint needs bounds within 64-bit integers, got [{lo}, {hi}]")
        if kind == "uniform" and not _finite(hi - lo):
            raise ValueError(f"uniform needs hi - lo to be a finite number, got [{lo}, {hi}]")
        if kind in ("uniform", "loguniform"):
            # Tune draws these with numpy floats; a Python int beyond int64 has no numpy type.
            lo, hi = float(lo), float(hi)
        return cls(kind, (lo, hi))

    def edges(self) -> list[object]:
        """The values to validate: every listed value, or the two ends a range can reach."""
        return list(self.values) if self.kind in LISTS else list(self.bounds())

    def bounds(self) -> tuple[float, float]:
        """The two ends a range sampler can reach (``randint`` excludes its ``hi``)."""
        lo, hi = self.values
        return lo, hi - 1 if self.kind == "randint" else hi

    def grid_size(self) -> int:
        """How many trials this multiplies one sample into (Tune repeats every grid point)."""
        return len(self.values) if self.kind == "grid" else 1

    def to_tune(self) -> object:
        """The Tune search-space entry: a ``grid_search`` dict or a Tune ``Domain``."""
        # Tune is imported here: parsing and checking a spec must not load Ray.
        from ray import tune

        if self.kind in LISTS:
            values = copy.deepcopy(list(self.values))
            return tune.grid_search(values) if self.kind == "grid" else tune.choice(values)
        return getattr(tune, self.kind)(*self.values)

    def to_dict(self) -> dict[str, list[object]]:
        """The spec as written in a file, e.g. ``{'grid': [1, 2]}``."""
        return {self.kind: copy.deepcopy(list(self.values))}
