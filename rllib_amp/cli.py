"""What every rllib-amp command line shares: bad input is one line on stderr and exit 2.

Example:
    >>> def run(argv):
    ...     raise UsageError("--reps: got 0; must be >= 1")
    >>> main_wrapper("python -m rllib_amp.bench", run, [])  # prints the line, returns 2
    2
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")
# 128 + SIGINT, what a shell reports for a command ended by Ctrl-C.
EXIT_INTERRUPTED = 130


def signal_exit_status(signum: int) -> int:
    """What a shell reports for a command ended by signal ``signum``: 130 SIGINT, 143 SIGTERM.

    Example:
        >>> signal_exit_status(15)
        143
    """
    return 128 + signum


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit status 2."""


class Parser(argparse.ArgumentParser):
    """argparse without the usage dump: a bad flag is one line that points at --help."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see --help)")


def main_wrapper(
    prog: str,
    run: Callable[[Sequence[str] | None], int],
    argv: Sequence[str] | None,
    errors: tuple[type[BaseException], ...] = (),
) -> int:
    """Runs ``run(argv)``; UsageError and ``errors`` become ``prog: error: ...`` and exit 2,
    Ctrl-C (KeyboardInterrupt) one line and exit 130, the shells' status for SIGINT."""
    caught: tuple[type[BaseException], ...] = (UsageError, *errors)
    try:
        return run(argv)
    except caught as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED


def root_error(e: Any) -> str:
    """The line that says what went wrong, without colour codes: the innermost cause's
    ``Type: message`` (a trial's RayTaskError wraps the exception raised in the trial)."""
    seen = set()
    while id(e) not in seen:
        seen.add(id(e))
        inner = getattr(e, "cause", None) or getattr(e, "__cause__", None)
        if not isinstance(inner, BaseException):
            break
        e = inner
    text = _ANSI.sub("", str(e)).strip()
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not isinstance(e, BaseException):
        return lines[0] if lines else "-"
    # A traceback rendered into the message (Ray's) ends with the raising line.
    typed = [line for line in lines if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", line)]
    if typed:
        return typed[-1]
    return f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
