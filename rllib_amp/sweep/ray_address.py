"""The Ray the sweep runs on: the address to join (``--address`` or ``RAY_ADDRESS``), a probe
that fails fast where nothing Ray-like answers, ``ray.init`` with its failures as exit 2, and
``LocalRayWatchdog``, which ends the command once the local Ray it started died under it.

Example:
    >>> from types import SimpleNamespace
    >>> ray_address(SimpleNamespace(address=" 127.0.0.1:6379 "))
    ('127.0.0.1:6379', '--address')
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING

from rllib_amp.cli import Interrupted, UsageError, end_process_now, root_error

if TYPE_CHECKING:
    import psutil

# Connecting to a Ray address that is not there: Ray itself retries for a minute or more.
ADDRESS_PROBE_TIMEOUT_S = 5.0
# HTTP/2 client preface and an empty SETTINGS frame (RFC 9113 3.4, 6.5); type 4 = SETTINGS.
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"


def ray_address(args: argparse.Namespace) -> tuple[str | None, str]:
    """The cluster to join and where it was given (RAY_ADDRESS counts, as in every Ray tool);
    ``(None, "")`` for a Ray of our own."""
    if args.address is not None:
        if not args.address.strip():
            raise UsageError(
                "--address: got an empty address; pass auto, HOST:PORT or ray://HOST:PORT, "
                "or drop --address for a local Ray"
            )
        return args.address.strip(), "--address"
    if env := os.environ.get("RAY_ADDRESS", "").strip():
        return env, "RAY_ADDRESS"
    return None, ""


def probe_address(address: str, where: str, timeout_s: float = ADDRESS_PROBE_TIMEOUT_S) -> None:
    """UsageError naming ``where`` and the fix when nothing Ray-like answers at ``address``
    (malformed, unknown, refused, silent, not gRPC), before ``ray.init`` waits on it."""
    if address == "local":
        return
    local = "unset RAY_ADDRESS" if where == "RAY_ADDRESS" else "drop --address"
    fix = (
        f"start the cluster (ray start --head) or pass the address it printed, or {local} to "
        f"run on a local Ray"
    )
    target = address
    if address == "auto":
        from ray._private import services

        try:
            target = services.canonicalize_bootstrap_address_or_die("auto")
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise UsageError(
                f"{where}: auto found no Ray cluster ({root_error(e)}); {fix}"
            ) from None
    try:
        u = urllib.parse.urlsplit(target if "://" in target else f"ray://{target}")
        host, port = u.hostname, u.port
        bad = u.scheme != "ray" or u.path not in ("", "/") or bool(u.query or u.fragment)
    except ValueError:
        host, port, bad = None, None, True
    if bad or not host or not port:
        raise UsageError(
            f"{where}: got {address!r}; expected auto, HOST:PORT or ray://HOST:PORT "
            f"(e.g. 127.0.0.1:6379)"
        )
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.sendall(_HTTP2_HELLO)
            with conn.makefile("rb") as reader:
                answer = reader.read(9)  # 9 bytes unless the server closes first
    except OSError as e:
        raise UsageError(
            f"{where}: nothing answers at {host}:{port} ({root_error(e)}); {fix}"
        ) from None
    # Ray's GCS and client server speak gRPC: a server that answers HTTP/2's preface with no
    # SETTINGS frame is something else, which ray.init would wait on for minutes.
    if len(answer) < 9 or answer[3] != 4:
        raise UsageError(
            f"{where}: {host}:{port} answers but is not a Ray cluster (no gRPC there); pass "
            f"the address `ray start --head` printed (GCS port 6379 by default, or "
            f"ray://HOST:10001 for Ray Client)"
        )


# What ray/_private/node.py raises once a new raylet has not registered within its fixed 30 s.
RAY_START_TIMEOUT = "The current node timed out during startup"


# What a local Ray's processes get unless the user's environment sets it: OpenMP threads that
# sleep when idle instead of spinning, which on shared cores made one forward pass 50-100x
# slower (docs/performance.md). OpenMP reads it once, when a process loads torch.
LOCAL_RAY_ENV = {"OMP_WAIT_POLICY": "PASSIVE"}


@contextlib.contextmanager
def local_ray_env(apply: bool = True) -> Iterator[dict[str, str]]:
    """``LOCAL_RAY_ENV`` in this process's environment where unset, for the block (processes
    started in it inherit it); yields what it set (nothing unless ``apply``), removed after."""
    added = {k: v for k, v in LOCAL_RAY_ENV.items() if k not in os.environ} if apply else {}
    os.environ.update(added)
    try:
        yield added
    finally:
        for key in added:
            os.environ.pop(key, None)


def start_ray(address: str | None, where: str) -> str | None:
    """``ray.init`` (no address: a fresh local Ray, whose processes inherit ``LOCAL_RAY_ENV``
    where unset), its failures as UsageError, the SIGTERM handler kept (it puts its own
    ``sys.exit(15)`` there); the session folder (Ray Client: None)."""
    import ray

    sigterm = signal.getsignal(signal.SIGTERM)
    try:
        with local_ray_env(apply=not address):  # the raylet and its workers inherit it
            context = ray.init(address=address or "local", log_to_driver=False)
    except SystemExit as e:
        if e.code == signal.SIGTERM:  # Ray's own SIGTERM handler, during ray.init
            raise Interrupted(signal.SIGTERM) from None
        raise
    except Exception as e:  # noqa: BLE001 - Ray raises a bare Exception for a start timeout
        # No ray.shutdown here: in a caller's process it would end a Ray that was up before
        # (a half-started local Ray's processes end with this process).
        if address is None and str(e).startswith(RAY_START_TIMEOUT):
            raise UsageError(
                "ray.init: the local Ray did not start within 30 s (its raylet never "
                "registered: a loaded machine, or a raylet stopped while starting); run the "
                "command again once the machine is quieter, or start Ray with "
                "`ray start --head` and pass --address"
            ) from None
        if address is None:
            raise UsageError(
                f"ray.init: could not start a local Ray ({root_error(e)}); check free disk "
                f"space and memory in /tmp (or $RAY_TMPDIR), or pass --address of a cluster"
            ) from None
        raise UsageError(
            f"{where}: could not join the Ray cluster at {address} ({root_error(e)}); check "
            f"the address and that the cluster runs the same Ray and Python versions"
        ) from None
    finally:
        if sigterm is not None and threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, sigterm)
    info = getattr(context, "address_info", None) or {}  # Ray Client's context has none
    return info.get("session_dir")


# How often the command checks the local Ray it started, and how long Tune then gets to save
# the experiment state before a command stuck in a call to the dead Ray is ended anyway.
WATCH_PERIOD_S = 1.0
RAY_DEATH_GRACE_S = 40.0
RAY_PROCESSES = ("raylet", "gcs_server")  # the names of Ray's executables


@dataclass(eq=False)  # one watchdog is one thread: compared by identity
class LocalRayWatchdog:
    """For the command's own process only (``cli.may_end_process``): a daemon thread waits on
    the raylet and GCS server of the local Ray this process started. Once one is gone it calls
    ``on_death(what)``; if not released ``grace_s`` later (stuck in a call to the dead Ray),
    ``on_stuck(what)``, then ends what is left of that Ray and exits 1."""

    on_death: Callable[[str], None]
    on_stuck: Callable[[str], None]
    period_s: float = WATCH_PERIOD_S
    grace_s: float = RAY_DEATH_GRACE_S
    _checking: threading.Event = field(default_factory=threading.Event, init=False)
    _released: threading.Event = field(default_factory=threading.Event, init=False)
    _calling: threading.Lock = field(default_factory=threading.Lock, init=False)

    def start(self, session_dir: str) -> None:
        """Watches the Ray processes among this process's children."""
        import psutil  # Ray's own copy (ray/thirdparty_files), importable once ray is

        watched = {p: p.name() for p in psutil.Process().children() if p.name() in RAY_PROCESSES}
        if not watched:
            return
        self._checking.set()
        thread = threading.Thread(target=self._run, args=(watched, session_dir), daemon=True)
        thread.name = "rllib_amp-ray-watchdog"
        thread.start()

    def stop_checking(self) -> None:
        self._checking.clear()

    def release(self) -> None:
        """Past the calls to Ray: no callback and no exit from now on (a running one ends)."""
        self._checking.clear()
        with self._calling:
            self._released.set()

    def _run(self, watched: dict[psutil.Process, str], session_dir: str) -> None:
        import psutil

        gone: list[psutil.Process] = []
        while not gone and self._checking.is_set():
            gone, _ = psutil.wait_procs(list(watched), timeout=self.period_s)  # reaps the dead
        with self._calling:
            if not gone or not self._checking.is_set():
                return  # stopped: ray.shutdown may have ended them
            dead = gone[0]
            what = f"its {watched[dead]} (pid {dead.pid}) {_how_it_ended(dead.returncode)}"
            self.on_death(what)
        if self._released.wait(self.grace_s):
            return
        with self._calling:
            if self._released.is_set():
                return
            for last in (partial(self.on_stuck, what), partial(end_local_ray, session_dir)):
                with contextlib.suppress(Exception):  # the watchdog has no one to raise to
                    last()
            end_process_now(1)


def end_local_ray(session_dir: str) -> None:
    """Kills this process's descendants and the processes naming ``session_dir`` (workers
    and agents whose raylet is gone outlive it otherwise), for an exit without ray.shutdown."""
    import psutil

    me = psutil.Process()
    doomed = set(me.children(recursive=True))
    for proc in psutil.process_iter(["cmdline"]):
        if any(session_dir in part for part in proc.info.get("cmdline") or []):
            doomed.add(proc)
    for proc in doomed - {me}:
        with contextlib.suppress(psutil.Error):
            proc.kill()


def _how_it_ended(status: int | None) -> str:
    """Example:
    >>> _how_it_ended(-9)
    'was killed by SIGKILL'
    """
    if status is None:  # reaped by someone else: no status to tell
        return "exited"
    if status >= 0:
        return f"exited with {status}"
    with contextlib.suppress(ValueError):
        return f"was killed by {signal.Signals(-status).name}"
    return f"was killed by signal {-status}"
