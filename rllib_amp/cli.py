"""What every rllib-amp command line shares: bad input is one line on stderr and exit 2; a
signal (Ctrl-C, SIGTERM) is one line and exit 128 + the signal, at any moment of the command.

Example:
    >>> def run(argv):
    ...     raise UsageError("--reps: got 0; must be >= 1")
    >>> main_wrapper("python -m rllib_amp.bench", run, [])  # prints the line, returns 2
    2
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import stat
import sys
import threading
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import NoReturn

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def signal_exit_status(signum: int) -> int:
    """What a shell reports for a command ended by signal ``signum``: 130 SIGINT, 143 SIGTERM.

    Example:
        >>> signal_exit_status(15)
        143
    """
    return 128 + signum


class Interrupted(KeyboardInterrupt):
    """A signal that ends a command, raised where the command was: ``signum`` SIGINT (Ctrl-C)
    or SIGTERM (``kill``, ``ray job stop``, a scheduler). Exit status 128 + ``signum``."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)


# Set only by a command's entry point: this process is the command, so rllib_amp may end it
# (``os._exit``) where a call it cannot interrupt would hang. Unset, rllib_amp is a library in
# someone else's process (a notebook, a service) and never ends it.
_command_process = False


def run_as_command() -> None:
    """For a command's ``__main__`` only: lets ``may_end_process`` answer True."""
    global _command_process
    _command_process = True


# Ray's switch (ray_constants.ENABLE_RAY_CLUSTER, read once when ray is imported): at "0" a Ray
# started in this process puts its node on 127.0.0.1, at the default "1" on the machine's
# interface address, where other hosts can reach its GCS and raylet ports.
LOOPBACK_RAY_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


def local_ray_on_loopback(argv: Sequence[str]) -> bool:
    """For a command's ``__main__``, before ray is imported: a Ray the command starts itself
    (no ``--address``, no ``RAY_ADDRESS``) listens on 127.0.0.1 only, as nothing joins it; one
    that joins a cluster is left alone (at "0" Ray refuses a multi-node cluster). True if set.

    Example:
        >>> local_ray_on_loopback(["--addr", "127.0.0.1:6379"])  # argparse takes "--addr"
        False
    """
    # argparse takes any unambiguous prefix of a flag: "--ad" and longer are --address.
    joins = any(len(f) >= 4 and "--address".startswith(f) for f in (a.split("=")[0] for a in argv))
    if joins or os.environ.get("RAY_ADDRESS") or "ray" in sys.modules:
        return False
    os.environ.setdefault(LOOPBACK_RAY_ENV, "0")
    return True


def may_end_process() -> bool:
    """Whether rllib_amp may end the process itself (``os._exit``): only in the main thread
    of a ``python -m rllib_amp...`` process.

    Example:
        >>> may_end_process()  # a library call
        False
    """
    return _command_process and threading.current_thread() is threading.main_thread()


def end_process_now(status: int) -> NoReturn:
    """Flushes stdout and stderr, then ``os._exit(status)`` (no exit handler runs). Only for
    a command's own process (``may_end_process``)."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(status)


# Signals that end a command as Ctrl-C does: SIGTERM (``ray job stop``), SIGHUP (terminal gone).
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _raise_interrupted(signum: int, frame: FrameType | None) -> None:
    if signum == signal.SIGHUP:
        silence_closed_terminal()
    raise Interrupted(signum)


def silence_closed_terminal() -> None:
    """After SIGHUP: what the command still prints goes nowhere instead of failing on the
    closed terminal (``OSError: [Errno 5]`` mid-summary). Only standard streams on a character
    device (a hung-up terminal is no longer ``isatty``) are redirected; files and pipes stay."""
    with open(os.devnull, "w") as devnull:
        null = os.fstat(devnull.fileno()).st_rdev
        for fd in (1, 2):
            with contextlib.suppress(OSError):
                info = os.fstat(fd)
                if stat.S_ISCHR(info.st_mode) and info.st_rdev != null:
                    os.dup2(devnull.fileno(), fd)


@contextlib.contextmanager
def signals_as_interrupts() -> Iterator[None]:
    """Within it, SIGTERM and SIGHUP raise ``Interrupted`` as Ctrl-C raises KeyboardInterrupt:
    the command ends through its ``finally`` blocks, not on the spot. Only in the main
    thread, for a signal without a handler of the caller's."""
    main_thread = threading.current_thread() is threading.main_thread()
    installed = [s for s in STOP_SIGNALS if main_thread and signal.getsignal(s) is signal.SIG_DFL]
    for s in installed:
        signal.signal(s, _raise_interrupted)
    try:
        yield
    finally:
        for s in installed:
            signal.signal(s, signal.SIG_DFL)


def interrupted_line(prog: str, e: BaseException) -> tuple[str, int]:
    """The line and the exit status of a command ended by ``e`` (a KeyboardInterrupt).

    Example:
        >>> interrupted_line("prog", Interrupted(signal.SIGTERM))
        ('prog: stopped by SIGTERM', 143)
    """
    signum = getattr(e, "signum", signal.SIGINT)
    what = "interrupted" if signum == signal.SIGINT else "stopped by " + signal.Signals(signum).name
    return f"{prog}: {what}", signal_exit_status(signum)


@contextlib.contextmanager
def interrupts_as_exit(prog: str) -> Iterator[None]:
    """For a command's imports, before ``main_wrapper``: Ctrl-C or SIGTERM while its modules
    load is one line and exit 130 or 143, not a ``KeyboardInterrupt`` traceback."""
    try:
        with signals_as_interrupts():
            yield
    except KeyboardInterrupt as e:
        line, status = interrupted_line(prog, e)
        print(line, file=sys.stderr)
        raise SystemExit(status) from None


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
    Ctrl-C and SIGTERM one line and the shells' exit status (130, 143)."""
    caught: tuple[type[BaseException], ...] = (UsageError, *errors)
    try:
        with signals_as_interrupts():
            return run(argv)
    except caught as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as e:
        line, status = interrupted_line(prog, e)
        print(line, file=sys.stderr)
        return status


def root_error(e: object) -> str:
    """What went wrong, without colour codes: the innermost cause's ``Type: message`` (a
    RayTaskError wraps the trial's), else the last such line of a traceback rendered into an
    outer exception's text (Ray's, when its pickling dropped RLlib's ``raise ... from e``).

    Example:
        >>> root_error(RuntimeError("Traceback ...\\nOSError: disk gone\\n\\nRuntimeError"))
        'OSError: disk gone'
    """
    chain, seen = [e], set()
    while id(e) not in seen:
        seen.add(id(e))
        inner = getattr(e, "cause", None) or getattr(e, "__cause__", None)
        if not isinstance(inner, BaseException):
            break
        e = inner
        chain.append(e)
    if not isinstance(e, BaseException):
        lines = _lines(e)
        return lines[0] if lines else "-"
    for link in reversed(chain):  # innermost first
        # A traceback rendered into the message (Ray's) ends with the raising line.
        typed = [line for line in _lines(link) if _TYPED.match(line)]
        if typed:
            return typed[-1]
        lines = _lines(link)
        if link is e and lines:
            return f"{type(e).__name__}: {lines[0]}"
    return type(e).__name__


# ``Type: message``, the line a traceback ends with.
_TYPED = re.compile(r"^[\w.]+(Error|Exception|Interrupt)(\(\w+\))?: \S")


def _lines(e: object) -> list[str]:
    return [line.strip() for line in _ANSI.sub("", str(e)).splitlines() if line.strip()]
