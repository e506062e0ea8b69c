"""The aligned text tables the CLIs print, and the two ways they write numbers.

Example:
    >>> print(table([["trial", "return"], ["a_00000", format_value(475.25)], ["b", "-"]]))
      trial  return
    -------  ------
    a_00000   475.2
          b       -
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from rllib_amp.checks import is_number


def table(rows: Sequence[Sequence[str]]) -> str:
    """``rows`` (the first is the header) right-aligned in columns two spaces apart, with a
    rule of dashes under the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def format_value(v: object, *, as_typed: bool = False) -> str:
    """A table cell or a number in a sentence: whole numbers with thousands separators;
    ``as_typed``: a (searched) value as a user would type it, whole floats without ``.0``.

    Example:
        >>> [format_value(v) for v in (None, float("nan"), 19500.0, 1234.56, 0.06931, 28, "x")]
        ['-', 'nan', '19,500', '1,234.6', '0.06931', '28', 'x']
        >>> [format_value(v, as_typed=True) for v in (65536.0, 65536, 0.0003, 1234.56)]
        ['65536', '65536', '0.0003', '1234.56']
    """
    if v is None:
        return "-"
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return str(int(v)) if as_typed else f"{v:,.0f}"
    if as_typed or not is_number(v):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.4g}"


def compact(v: object) -> str:
    """A number in three significant figures or fewer, thousands as ``k``.

    Example:
        >>> [compact(v) for v in (None, 19500.0, 4000, 0.06931, 28.0, 123.4, math.inf)]
        ['-', '19.5k', '4k', '0.0693', '28', '123', 'inf']
    """
    if v is None:
        return "-"
    if not is_number(v):
        return str(v)
    x = float(v)
    if not math.isfinite(x):
        return str(x)
    if abs(x) >= 1000:
        return f"{x / 1000:,.1f}k".replace(".0k", "k")
    if x.is_integer():
        return f"{x:,.0f}"
    return f"{x:.3g}" if abs(x) < 100 else f"{x:,.0f}"
