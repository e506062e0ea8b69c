"""Structured fields on rllib-amp's warnings, so that programs read them by field, not wording.

Every WARNING (and the INFO lines a run is expected to show) carries ``record.amp_event``,
a stable name, and ``record.amp_fields``, a dict of the values the message quotes.

Example:
    >>> import logging
    >>> record = logging.makeLogRecord(event("nonfinite_loss", module_id="p0", count=1))
    >>> record.amp_event, record.amp_fields["module_id"]
    ('nonfinite_loss', 'p0')
"""

from __future__ import annotations


def event(name: str, **fields: object) -> dict[str, object]:
    """The ``extra=`` argument for a log call: ``logger.warning(msg, ..., extra=event(...))``."""
    return {"amp_event": name, "amp_fields": fields}


def is_power_of_two(n: int) -> bool:
    """True for 1, 2, 4, 8, ...: how often a repeating warning is logged (never spammed).

    Example:
        >>> [n for n in range(1, 10) if is_power_of_two(n)]
        [1, 2, 4, 8]
    """
    return n > 0 and n & (n - 1) == 0
