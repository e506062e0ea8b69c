"""The Ray the sweep runs on: the address to join (``--address`` or ``RAY_ADDRESS``), a probe
that fails fast where nothing Ray-like answers, ``ray.init`` with its failures as exit 2, and
``RayWatch``, which notices that Ray died under a running sweep.

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
import time
import urllib.parse
from collections.abc import Callable

from rllib_amp.cli import Interrupted, UsageError, root_error

# Connecting to a Ray address that is not there: Ray itself retries for a minute or more.
ADDRESS_PROBE_TIMEOUT_S = 5.0
# HTTP/2 client preface and an empty SETTINGS frame (RFC 9113 3.4, 6.5); type 4 = SETTINGS.
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_HTTP2_SETTINGS = 4


def ray_address(args: argparse.Namespace) -> tuple[str | None, str]:
    """The cluster to join and where it was given; ``(None, ...)`` for a Ray of our own.

    RAY_ADDRESS counts as --address, as in every Ray tool: ``ray job submit`` sets it for the
    job it starts, which must run on that cluster, not on a Ray of its own.
    """
    if args.address is not None:
        if not args.address.strip():
            raise UsageError(
                "--address: got an empty address; pass auto, HOST:PORT or ray://HOST:PORT, "
                "or drop --address for a local Ray"
            )
        return args.address.strip(), "--address"
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env:
        return env, "RAY_ADDRESS"
    return None, ""


def probe_address(address: str, where: str, timeout_s: float = ADDRESS_PROBE_TIMEOUT_S) -> None:
    """Checks that something listens at a Ray address before ``ray.init`` tries it (Ray
    retries an address nobody answers at for a minute or more): UsageError naming ``where``
    and the fix when the address is malformed, unknown or refuses connections.

    Example:
        >>> probe_address("127.0.0.1:1", "--address")  # doctest: +SKIP
        Traceback (most recent call last):
        rllib_amp.cli.UsageError: --address: nothing answers at 127.0.0.1:1 (...); ...
    """
    fix = (
        "start the cluster (ray start --head) or pass the address it printed"
        + (", or unset RAY_ADDRESS to run on a local Ray" if where == "RAY_ADDRESS" else "")
        + (", or drop --address to run on a local Ray" if where == "--address" else "")
    )
    if address == "local":
        return
    target = address
    if address == "auto":
        from ray._private import services

        try:
            target = services.canonicalize_bootstrap_address_or_die("auto")
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise UsageError(
                f"{where}: auto found no Ray cluster ({root_error(e)}); {fix}"
            ) from None
    host, port = _host_port(target)
    if host is None or port is None:
        raise UsageError(
            f"{where}: got {address!r}; expected auto, HOST:PORT or ray://HOST:PORT "
            f"(e.g. 127.0.0.1:6379)"
        )
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.sendall(_HTTP2_HELLO)
            answer = _read(conn, 9)
    except OSError as e:
        raise UsageError(
            f"{where}: nothing answers at {host}:{port} ({root_error(e)}); {fix}"
        ) from None
    # Ray's GCS and its client server speak gRPC: a server that does not answer HTTP/2's
    # connection preface with a SETTINGS frame is something else, which ray.init would wait
    # on for minutes.
    if len(answer) < 9 or answer[3] != _HTTP2_SETTINGS:
        raise UsageError(
            f"{where}: {host}:{port} answers but is not a Ray cluster (no gRPC there); pass "
            f"the address `ray start --head` printed (GCS port 6379 by default, or "
            f"ray://HOST:10001 for Ray Client)"
        )


def _read(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _host_port(address: str) -> tuple[str | None, int | None]:
    text = address if "://" in address else f"ray://{address}"
    try:
        u = urllib.parse.urlsplit(text)
        port = u.port
    except ValueError:
        return None, None
    if u.scheme != "ray" or not u.hostname or port is None or not port:
        return None, None
    if u.path not in ("", "/") or u.query or u.fragment:
        return None, None
    return u.hostname, port


def start_ray(address: str | None, where: str) -> None:
    """``ray.init``, its failures as UsageError. Without an address: a fresh local Ray, never
    a cluster some earlier ``ray start`` left recorded in Ray's temp folder. The SIGTERM
    handler found before is kept: ``ray.init`` puts one of its own there (``sys.exit(15)``:
    exit 15, no line, no saved state), and a SIGTERM during ``ray.init`` is ``Interrupted``."""
    import ray

    main_thread = threading.current_thread() is threading.main_thread()
    sigterm = signal.getsignal(signal.SIGTERM) if main_thread else None
    try:
        if address is None:
            ray.init(address="local", log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    except SystemExit as e:
        if e.code == signal.SIGTERM:  # Ray's own SIGTERM handler, during ray.init
            raise Interrupted(signal.SIGTERM) from None
        raise
    except (ConnectionError, RuntimeError, ValueError, OSError, TimeoutError) as e:
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
        if main_thread and sigterm is not None:
            signal.signal(signal.SIGTERM, sigterm)


# -- Ray dying under the sweep ---------------------------------------------------------------
# How often the sweep checks the Ray it runs on; how long a cluster's GCS may stay silent
# before the cluster counts as gone (a busy head answers late, a dead one never); how long
# Tune gets to save the experiment state once Ray died before the command ends anyway
# (under Ray's own 60 s, after which a driver that lost its GCS exits with a C++ fatal log).
RAY_WATCH_PERIOD_S = 1.0
GCS_SILENCE_S = 30.0
RAY_DEATH_GRACE_S = 40.0
_WATCHED = ("raylet", "gcs_server")  # ray_constants.PROCESS_TYPE_RAYLET, _GCS_SERVER


class RayWatch:
    """Checks every second, in a daemon thread, that the Ray the sweep runs on is alive, and
    calls ``on_death(what)`` once when it is not (``what``: which process died, and how).
    Without it a sweep whose raylet or GCS died hangs ("Cluster resources not detected") or
    ends in tracebacks ("Failed to get node info ... Deadline Exceeded").

    A local Ray this process started is watched through its processes: the raylet or the GCS
    server exiting is death, known at once. A cluster (``--address``) is watched through its
    GCS: this node's raylet marked dead, or no answer for ``GCS_SILENCE_S``.

    If the watch is not released ``grace_s`` after ``on_death`` (the main thread stuck in a
    call to the dead Ray), ``on_stuck(what)`` runs in the watch thread and the process exits
    with status 1: a dead Ray never leaves the command hanging.

    Example:
        >>> with RayWatch(on_death=print, on_stuck=print) as watch:  # doctest: +SKIP
        ...     watch.start()  # once Ray is up
        ...     tuner.fit()
    """

    def __init__(
        self,
        on_death: Callable[[str], None],
        on_stuck: Callable[[str], None],
        period_s: float = RAY_WATCH_PERIOD_S,
        grace_s: float = RAY_DEATH_GRACE_S,
    ) -> None:
        self.on_death = on_death
        self.on_stuck = on_stuck
        self.period_s = period_s
        self.grace_s = grace_s
        self.dead: str | None = None
        self._checking = threading.Event()
        self._released = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_answer = time.monotonic()
        self._watch_cluster = True

    def start(self) -> None:
        """Starts checking (once Ray is up)."""
        self._checking.set()
        self._last_answer = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="rllib_amp-ray-watch", daemon=True)
        self._thread.start()

    def stop_checking(self) -> None:
        """No check from now on (before ``ray.shutdown``, which ends Ray's processes)."""
        self._checking.clear()

    def release(self) -> None:
        """The command is past its calls to Ray: no forced exit from now on."""
        self._checking.clear()
        self._released.set()

    def __enter__(self) -> RayWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def check(self) -> str | None:
        """What of the Ray died (``"its raylet (pid 123) was killed by SIGKILL"``), or None
        while it lives."""
        import ray

        node = getattr(ray._private.worker, "_global_node", None)
        processes = getattr(node, "all_processes", None) or {}
        if any(kind in processes for kind in _WATCHED):
            for kind in _WATCHED:
                for info in processes.get(kind, []):
                    status = info.process.poll()
                    if status is not None:
                        return f"its {kind} (pid {info.process.pid}) {_how_it_ended(status)}"
            return None
        return self._check_cluster()

    def _check_cluster(self) -> str | None:
        import ray

        if not self._watch_cluster:
            return None
        try:
            gcs = getattr(ray._private.worker.global_worker, "gcs_client")  # noqa: B009
            nodes = gcs.get_all_node_info(timeout=5)
            mine = ray.get_runtime_context().get_node_id()
        except (AttributeError, TypeError, NameError):
            self._watch_cluster = False  # another Ray's API: no watch rather than a false alarm
            return None
        except Exception:  # noqa: BLE001 - unreachable, timed out, shut down: judged by silence
            silent = time.monotonic() - self._last_answer
            if silent >= GCS_SILENCE_S:
                return f"its GCS has not answered for {silent:.0f} s"
            return None
        self._last_answer = time.monotonic()
        for node_id, info in nodes.items():
            if node_id.hex() == mine and getattr(info, "state", 0) != 0:  # 0: ALIVE
                return f"the raylet of this node ({mine[:8]}) is dead"
        return None

    def _run(self) -> None:
        what = None
        while what is None:
            if self._released.wait(self.period_s) or not self._checking.is_set():
                return
            try:
                what = self.check()
            except Exception:  # noqa: BLE001 - a check that fails says nothing about Ray
                what = None
            if not self._checking.is_set():
                return  # stopped while checking: ray.shutdown may have ended the processes
        self.dead = what
        self.on_death(what)
        if self._released.wait(self.grace_s):
            return
        try:
            self.on_stuck(what)
        finally:
            os._exit(1)


def end_local_ray() -> None:
    """Ends what is left of the local Ray this process started, once it died under the
    sweep and the command exits without ``ray.shutdown``: its own processes, and those that
    name its session folder (agents and workers whose raylet is gone outlive it otherwise).
    Nothing of a cluster this process joined."""
    import ray

    node = getattr(ray._private.worker, "_global_node", None)
    if node is None or not getattr(node, "all_processes", None):
        return
    session = node.get_session_dir_path()
    node.kill_all_processes(check_alive=False, allow_graceful=False)
    import psutil  # Ray's own copy (ray/thirdparty_files), importable once ray is

    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if proc.pid != os.getpid() and any(session in part for part in cmdline):
            with contextlib.suppress(psutil.Error):
                proc.kill()


def _how_it_ended(status: int) -> str:
    """``Popen.returncode`` in words: ``-9`` "was killed by SIGKILL", ``1`` "exited with 1".

    Example:
        >>> _how_it_ended(-9)
        'was killed by SIGKILL'
    """
    if status < 0:
        try:
            return f"was killed by {signal.Signals(-status).name}"
        except ValueError:
            return f"was killed by signal {-status}"
    return f"exited with {status}"
