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


def format_value(v: object) -> str:
    """A table cell or a number in a sentence: whole numbers with thousands separators.

    Example:
        >>> [format_value(v) for v in (None, float("nan"), 19500.0, 1234.56, 0.06931, 28, "x")]
        ['-', 'nan', '19,500', '1,234.6', '0.06931', '28', 'x']
    """
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if v.is_integer() and abs(v) < 1e15:
            return f"{v:,.0f}"
        return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.4g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    return str(v)


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
