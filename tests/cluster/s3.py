"""A real S3-protocol server for tests: moto's, on 127.0.0.1, with one bucket made through
pyarrow. Child processes started inside the context (Ray nodes, the CLI) inherit its dummy
credentials."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

# Dummy credentials for moto; no instance-metadata lookups (they would leave 127.0.0.1).
ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


@dataclass(frozen=True)
class S3:
    endpoint: str
    bucket: str
    fs: Any  # pyarrow.fs.S3FileSystem

    def uri(self, prefix: str) -> str:
        """``s3://bucket/prefix`` with the query that points pyarrow at this server."""
        return f"s3://{self.bucket}/{prefix}?endpoint_override={self.endpoint}&scheme=http"

    def list(self, prefix: str) -> list[str]:
        """Every path under ``bucket/prefix``, listed through pyarrow."""
        import pyarrow.fs as pafs

        where = f"{self.bucket}/{prefix}"
        infos = self.fs.get_file_info(
            pafs.FileSelector(where, recursive=True, allow_not_found=True)
        )
        return sorted(i.path for i in infos)

    def read(self, path: str) -> bytes:
        with self.fs.open_input_stream(path) as f:
            return bytes(f.read())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def moto_s3(bucket: str = "rllib-amp-test") -> Iterator[S3]:
    """Starts moto's server on a free 127.0.0.1 port, makes ``bucket``, stops it at exit."""
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    saved = {k: os.environ.get(k) for k in ENV}
    os.environ.update(ENV)
    port = _free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"127.0.0.1:{port}"
        fs = pafs.S3FileSystem(
            endpoint_override=endpoint,
            scheme="http",
            access_key=ENV["AWS_ACCESS_KEY_ID"],
            secret_key=ENV["AWS_SECRET_ACCESS_KEY"],
            region=ENV["AWS_DEFAULT_REGION"],
            allow_bucket_creation=True,
        )
        fs.create_dir(bucket)
        yield S3(endpoint=endpoint, bucket=bucket, fs=fs)
    finally:
        server.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def closed_port() -> int:
    """A 127.0.0.1 port nothing listens on (bound once, then released): connections to it
    are refused at once."""
    return _free_port()


@contextlib.contextmanager
def silent_listener() -> Iterator[tuple[int, Any]]:
    """A 127.0.0.1 server that accepts connections and never answers: ``(port, accepted)``,
    ``accepted`` a threading.Event set at the first connection. Closed at exit."""
    import threading

    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(64)
    server.settimeout(0.2)
    accepted, done, held = threading.Event(), threading.Event(), []

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = server.accept()
            except OSError:  # the accept timeout: look at ``done`` again
                continue
            held.append(conn)
            accepted.set()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        done.set()
        thread.join(timeout=5)
        for conn in held:
            conn.close()
        server.close()
