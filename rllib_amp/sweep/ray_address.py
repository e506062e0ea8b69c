"""The Ray the sweep runs on: the address to join (``--address`` or ``RAY_ADDRESS``), a probe
that fails fast where nothing Ray-like answers, and ``ray.init`` with its failures as exit 2.

Example:
    >>> from types import SimpleNamespace
    >>> ray_address(SimpleNamespace(address=" 127.0.0.1:6379 "))
    ('127.0.0.1:6379', '--address')
"""

from __future__ import annotations

import argparse
import os
import socket
import urllib.parse

from rllib_amp.cli import UsageError, root_error

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
    a cluster some earlier ``ray start`` left recorded in Ray's temp folder."""
    import ray

    try:
        if address is None:
            ray.init(address="local", log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
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
