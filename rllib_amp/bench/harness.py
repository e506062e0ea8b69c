"""Fresh child processes for each measurement, and this process's memory from /proc.

Example:
    >>> import operator
    >>> in_child(operator.add, 1, 2)
    3
"""

from __future__ import annotations

import multiprocessing as mp
import multiprocessing.queues
import os
import queue as queue_mod
import resource
import sys
import time
from collections.abc import Callable
from typing import TypeAlias, TypeVar, cast

CHILD_TIMEOUT_S = 1800
_T = TypeVar("_T")
# What a child puts on its queue: ("ok", the value) or ("error", its line), and the keys of
# the once-only messages it has shown.
_Reply: TypeAlias = "multiprocessing.queues.Queue[tuple[str, object, set[str]]]"


def shown_once_keys() -> set[str]:
    """The keys (in ``ray.util.debug``) of the once-per-process messages, RLlib's deprecation
    notices among them, that Ray/RLlib have logged in this process; empty without Ray."""
    registry = getattr(sys.modules.get("ray.util.debug"), "_logged", None)
    return set(registry) if isinstance(registry, set) else set()


def adopt_once_keys(keys: set[str]) -> None:
    """Marks ``keys`` as already logged in this process, so RLlib does not log them again."""
    if not keys:
        return
    from ray.util import debug

    registry = getattr(debug, "_logged", None)
    if isinstance(registry, set):
        registry.update(keys)


def _child_entry(
    fn: Callable[..., object], args: tuple[object, ...], shown: set[str], queue: _Reply
) -> None:
    try:
        import torch

        torch.set_num_threads(max(1, os.cpu_count() or 1))
        # The children are one benchmark run: what the run has shown, a child does not repeat.
        adopt_once_keys(shown)
        value = fn(*args)
        queue.put(("ok", value, shown_once_keys()))
    except BaseException as e:  # reported, not swallowed: the parent raises it
        queue.put(("error", f"{type(e).__name__}: {e}", shown_once_keys()))


def in_child(fn: Callable[..., _T], *args: object, timeout_s: float = CHILD_TIMEOUT_S) -> _T:
    """``fn(*args)`` in a fresh (spawned) process: no heap, caches or Ray state from the
    figures before it: in one long process the end-to-end AMP figure comes out lower (see
    docs/benchmark.md).

    ``timeout_s``: how long the child may take (a learning run takes hours, a figure minutes).
    RLlib's once-per-process messages travel both ways, so each appears once per run and
    not once per child.
    """
    ctx = mp.get_context("spawn")
    queue: _Reply = ctx.Queue()
    proc = ctx.Process(target=_child_entry, args=(fn, args, shown_once_keys(), queue))
    proc.start()
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            try:
                status, value, shown = queue.get(timeout=5)
                break
            except queue_mod.Empty:
                if not proc.is_alive():
                    raise RuntimeError(
                        f"{fn.__name__}{args}: the child process died (exit code "
                        f"{proc.exitcode}) without a result"
                    ) from None
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"{fn.__name__}{args}: no result in {timeout_s:g} s"
                    ) from None
    except KeyboardInterrupt as e:
        # SIGTERM or SIGHUP sent to this process alone (``kill``, ``timeout``, a scheduler)
        # goes to the child too, which ends through its own ``finally`` blocks instead of
        # running on until the SIGKILL below. Ctrl-C reached it already: a terminal signals
        # its whole foreground group, and a second SIGINT would cut the child's cleanup short.
        signum = getattr(e, "signum", None)  # cli.Interrupted's; a plain Ctrl-C has none
        if signum is not None and proc.pid is not None and proc.is_alive():
            os.kill(proc.pid, signum)
        raise
    finally:
        try:
            proc.join(60)
        finally:  # also after a second signal during the wait: the child must not outlive it
            if proc.is_alive():
                proc.kill()
    adopt_once_keys(shown)
    if status != "ok":
        raise RuntimeError(f"{fn.__name__}{args}: {value}")
    return cast(_T, value)


def rss_bytes() -> int:
    """This process's resident memory now."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def reset_peak_rss() -> None:
    """Resets this process's peak resident memory (VmHWM) to its current RSS (Linux >= 4.0)."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        raise RuntimeError("cannot reset peak RSS (/proc/self/clear_refs)") from None


def peak_rss_bytes() -> int:
    """This process's peak resident memory since start or the last ``reset_peak_rss``."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
