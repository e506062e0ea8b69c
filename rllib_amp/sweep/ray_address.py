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
from typing import Any

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
# How often the sweep checks the Ray it runs on: its own local Ray's processes every second
# (a PID poll, free); a cluster's GCS every 5 s (one small RPC per driver). A cluster's GCS
# silent for as long as Ray itself waits for it (``gcs_rpc_server_reconnect_timeout_s``, 60 s
# by default; past it Ray ends its own processes and drivers) is gone: a GCS that restarts
# within it (GCS fault tolerance, KubeRay's HA head) is waited for, as Ray waits. How long
# Tune gets to save the experiment state once Ray died before a command stuck in a call to
# the dead Ray is ended anyway (only a command's process: see ``end_process``).
RAY_WATCH_PERIOD_S = 1.0
CLUSTER_WATCH_PERIOD_S = 5.0
GCS_RECONNECT_CONFIG = "gcs_rpc_server_reconnect_timeout_s"  # Ray's RAY_CONFIG
GCS_RECONNECT_DEFAULT_S = 60.0  # its default in Ray 2.60 (src/ray/common/ray_config_def.h)
GCS_QUERY_TIMEOUT_S = 5.0
RAY_DEATH_GRACE_S = 40.0
_WATCHED = ("raylet", "gcs_server")  # ray_constants.PROCESS_TYPE_RAYLET, _GCS_SERVER


class RayDied(RuntimeError):
    """The Ray a sweep ran on died under it, and the sweep runs in a library call (not the
    command's process, which ``RayWatch`` may end): raised in the thread that runs the sweep.
    Its message names what died and the ``--resume`` command."""


def gcs_silence_limit_s() -> float:
    """How long a cluster's GCS may stay silent before the cluster counts as gone: Ray's own
    reconnect timeout, as the cluster (``ray start --system-config``), then this process's
    ``RAY_gcs_rpc_server_reconnect_timeout_s`` set it, else Ray's default (60 s).

    Example:
        >>> gcs_silence_limit_s()  # doctest: +SKIP
        60.0
    """
    import ray

    candidates: list[object] = []
    with contextlib.suppress(Exception):  # no GCS to ask (yet), or another Ray's API
        candidates.append(ray._private.state.state.get_system_config().get(GCS_RECONNECT_CONFIG))
    candidates.append(os.environ.get(f"RAY_{GCS_RECONNECT_CONFIG}"))
    for value in candidates:
        try:
            limit = float(value)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            continue
        if limit > 0:
            return limit
    return GCS_RECONNECT_DEFAULT_S


class RayWatch:
    """Checks, in a daemon thread, that the Ray the sweep runs on is alive, and calls
    ``on_death(what)`` once when it is not (``what``: which process died, and how). Without it
    a sweep whose raylet or GCS died hangs ("Cluster resources not detected") or ends in
    tracebacks ("Failed to get node info ... Deadline Exceeded").

    A local Ray this process started is watched through its processes, every second: the
    raylet or the GCS server exiting is death, known at once. A cluster (``--address``) is
    watched through its GCS, every ``CLUSTER_WATCH_PERIOD_S``: this node's raylet marked dead,
    or no answer for as long as Ray waits for its GCS (``gcs_silence_limit_s``).

    If the watch is not released ``grace_s`` after ``on_death`` (the sweep's thread stuck in a
    call to the dead Ray), ``on_stuck(what)`` runs in the watch thread; with ``end_process``
    (only the command's own process: ``rllib_amp.cli.may_end_process``) the process then
    exits with status 1, so a dead Ray never leaves the command hanging. In a library call
    the caller's process is never ended. Once ``release`` returned, neither callback runs.

    Example:
        >>> with RayWatch(on_death=print, on_stuck=print) as watch:  # doctest: +SKIP
        ...     watch.start()  # once Ray is up
        ...     tuner.fit()
    """

    def __init__(
        self,
        on_death: Callable[[str], None],
        on_stuck: Callable[[str], None],
        period_s: float | None = None,
        grace_s: float = RAY_DEATH_GRACE_S,
        end_process: bool = False,
    ) -> None:
        self.on_death = on_death
        self.on_stuck = on_stuck
        self.period_s = period_s  # None: by what is watched (RAY_WATCH_PERIOD_S, cluster's)
        self.grace_s = grace_s
        self.end_process = end_process
        self.silence_s = GCS_RECONNECT_DEFAULT_S
        self.dead: str | None = None
        self._checking = threading.Event()
        self._released = threading.Event()
        self._calling = threading.Lock()  # held while a callback runs: release waits for it
        self._thread: threading.Thread | None = None
        self._last_answer = time.monotonic()
        self._watch_cluster = True
        self._selectors: list[Any] | None = None

    def start(self) -> None:
        """Starts checking (once Ray is up)."""
        if self._local_processes() is None:
            self.silence_s = gcs_silence_limit_s()
        self._checking.set()
        self._last_answer = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="rllib_amp-ray-watch", daemon=True)
        self._thread.start()

    def stop_checking(self) -> None:
        """No check from now on (before ``ray.shutdown``, which ends Ray's processes)."""
        self._checking.clear()

    def release(self) -> None:
        """The command is past its calls to Ray: no callback and no forced exit from now on
        (one already running finishes first)."""
        self._checking.clear()
        with self._calling:
            self._released.set()

    def __enter__(self) -> RayWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()

    def period(self) -> float:
        """Seconds between checks: ``period_s``, else by what is watched."""
        if self.period_s is not None:
            return self.period_s
        return RAY_WATCH_PERIOD_S if self._local_processes() else CLUSTER_WATCH_PERIOD_S

    @staticmethod
    def _local_processes() -> dict[str, Any] | None:
        """The processes of the local Ray this process started, None for a joined cluster."""
        import ray

        node = getattr(ray._private.worker, "_global_node", None)
        processes = getattr(node, "all_processes", None) or {}
        return processes if any(kind in processes for kind in _WATCHED) else None

    def check(self) -> str | None:
        """What of the Ray died (``"its raylet (pid 123) was killed by SIGKILL"``), or None
        while it lives."""
        processes = self._local_processes()
        if processes is not None:
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
            mine = ray.get_runtime_context().get_node_id()
            if self._selectors is None:
                from ray._raylet import NodeID
                from ray.core.generated.gcs_service_pb2 import (  # type: ignore[attr-defined]
                    GetAllNodeInfoRequest,
                )

                node = NodeID.from_hex(mine).binary()
                self._selectors = [GetAllNodeInfoRequest.NodeSelector(node_id=node)]
            # This node's entry only: not the whole node table from every driver.
            nodes = gcs.get_all_node_info(
                timeout=GCS_QUERY_TIMEOUT_S, node_selectors=self._selectors
            )
        except (AttributeError, TypeError, NameError, ImportError):
            self._watch_cluster = False  # another Ray's API: no watch rather than a false alarm
            return None
        except Exception:  # noqa: BLE001 - unreachable, timed out, shut down: judged by silence
            silent = time.monotonic() - self._last_answer
            if silent >= self.silence_s:
                return f"its GCS has not answered for {silent:.0f} s"
            return None
        self._last_answer = time.monotonic()
        for node_id, info in nodes.items():
            if node_id.hex() == mine and getattr(info, "state", 0) != 0:  # 0: ALIVE
                return f"the raylet of this node ({mine[:8]}) is dead"
        return None

    def _run(self) -> None:
        what = None
        period = self.period()
        while what is None:
            if self._released.wait(period) or not self._checking.is_set():
                return
            try:
                what = self.check()
            except Exception:  # noqa: BLE001 - a check that fails says nothing about Ray
                what = None
            if not self._checking.is_set():
                return  # stopped while checking: ray.shutdown may have ended the processes
        self.dead = what
        if not self._call(self.on_death, what):
            return
        if self._released.wait(self.grace_s):
            return
        if self._call(self.on_stuck, what) and self.end_process:
            os._exit(1)

    def _call(self, callback: Callable[[str], None], what: str) -> bool:
        """``callback(what)`` unless released; False once released."""
        with self._calling:
            if self._released.is_set():
                return False
            try:
                callback(what)
            except Exception:  # noqa: BLE001 - the watch thread has no one to raise to
                if not self.end_process:
                    raise
            return True


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
