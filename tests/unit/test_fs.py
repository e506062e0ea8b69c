"""fs: one rule for "is this a URI", the one checkpoint-folder listing, the one decoder."""

from __future__ import annotations

import pickle

import pyarrow.fs
import pytest

from rllib_amp import fs
from rllib_amp.settings import WarmStart
from rllib_amp.sweep import storage


@pytest.mark.parametrize(
    "location, uri",
    [
        ("s3://bucket/exp", True),
        ("gs://bucket/exp", True),
        ("file:///tmp/x", True),
        ("C://runs", False),  # a drive letter, not a scheme
        ("C:/runs", False),
        ("runs:2", False),
        ("~/ray_results", False),
        ("/abs/path", False),
    ],
)
def test_one_rule_for_uris_everywhere(location, uri):
    assert fs.is_uri(location) is uri
    assert storage.is_uri(location) is uri
    if not uri:  # resolving an s3:// URI would ask the network for the bucket's region
        assert fs.resolve(location)[0].type_name == "local"


@pytest.mark.parametrize("home", ["~", "$HOME", "${HOME}"])
def test_home_and_variables_are_expanded_for_local_paths_everywhere(tmp_path, monkeypatch, home):
    """One rule for every path flag and key: ``~`` and ``$VAR`` / ``${VAR}`` expanded (a quoted
    ``'$HOME/runs'`` made a folder literally named ``$HOME``)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "ckpt").mkdir()
    assert fs.resolve(f"{home}/ckpt")[1] == str(tmp_path / "ckpt")
    assert WarmStart.parse({"from": f"{home}/ckpt"}).path == str(tmp_path / "ckpt")
    assert storage.resolve(f"{home}/runs", None, {}) == str(tmp_path / "runs")
    assert fs.local_path(f"{home}/x.yaml") == str(tmp_path / "x.yaml")


def test_a_path_naming_an_unset_variable_is_refused_naming_it(monkeypatch):
    monkeypatch.delenv("RLLIB_AMP_NOT_SET", raising=False)
    with pytest.raises(ValueError, match=r"\$RLLIB_AMP_NOT_SET, which is not set"):
        fs.local_path("$RLLIB_AMP_NOT_SET/runs")
    with pytest.raises(storage.StorageError, match=r"^--storage-path: .*RLLIB_AMP_NOT_SET"):
        storage.resolve("${RLLIB_AMP_NOT_SET}/runs", None, {})
    assert fs.local_path("/a/b$") == "/a/b$"  # a dollar that names nothing is kept


def test_checkpoint_folders_are_newest_first_and_never_moved_aside_ones(tmp_path):
    for name in ("checkpoint_000002", "checkpoint_000010", "checkpoint_000011.damaged"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint_000012").write_text("a file, not a folder")
    local = pyarrow.fs.LocalFileSystem()
    assert fs.checkpoint_folders(local, str(tmp_path)) == [
        str(tmp_path / "checkpoint_000010"),
        str(tmp_path / "checkpoint_000002"),
    ]


def test_decode_reads_each_state_format_and_refuses_others(tmp_path):
    import msgpack

    assert fs.decode("a/state.pkl", pickle.dumps({"x": 1})) == {"x": 1}
    assert fs.decode("a/state.msgpack", msgpack.packb({"x": 1})) == {"x": 1}
    with pytest.raises(ValueError, match=r"^a/state\.txt: no state file"):
        fs.decode("a/state.txt", b"")


def test_write_then_read_bytes_makes_the_folder(tmp_path):
    local, path = fs.resolve(tmp_path / "deep" / "er" / "f.bin")
    fs.write_bytes(local, path, b"\x00\x01")
    assert fs.read_bytes(local, path) == b"\x00\x01"


@pytest.mark.parametrize(
    "location, parts, joined",
    [
        ("/runs", ("a", "b.json"), "/runs/a/b.json"),
        ("s3://b/exp", ("t", "checkpoint_000001"), "s3://b/exp/t/checkpoint_000001"),
        (
            "s3://b/exp/ck?endpoint_override=127.0.0.1:9000&scheme=http",
            ("learner_group/learner", "state.pkl"),
            "s3://b/exp/ck/learner_group/learner/state.pkl?endpoint_override=127.0.0.1:9000"
            "&scheme=http",
        ),
        ("gs://b?endpoint_override=h:1", ("x",), "gs://b/x?endpoint_override=h:1"),
    ],
)
def test_join_puts_the_parts_before_a_uris_query(location, parts, joined):
    assert fs.join(location, *parts) == joined
    assert storage.join(location, *parts) == joined  # one rule: storage asks fs


def test_remote_timeout_comes_from_the_environment_and_bad_values_name_it():
    assert fs.remote_timeout_s({}) == fs.DEFAULT_REMOTE_TIMEOUT_S
    assert fs.remote_timeout_s({fs.REMOTE_TIMEOUT_ENV: "2.5"}) == 2.5
    for bad in ("0", "-1", "inf", "soon"):
        with pytest.raises(ValueError, match=rf"^{fs.REMOTE_TIMEOUT_ENV}: got '{bad}'"):
            fs.remote_timeout_s({fs.REMOTE_TIMEOUT_ENV: bad})


def _no_cloud_credentials_lookup(monkeypatch, port):
    """Credentials that never leave 127.0.0.1: dummy AWS keys, no EC2 metadata, GCE's
    metadata server at a closed local port."""
    from tests.cluster.s3 import ENV

    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{port}")
    monkeypatch.setenv("GCE_METADATA_ROOT", f"127.0.0.1:{port}")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)


def test_s3_and_gcs_filesystems_get_the_remote_timeout(monkeypatch):
    from tests.cluster.s3 import closed_port

    port = closed_port()
    _no_cloud_credentials_lookup(monkeypatch, port)
    monkeypatch.setenv(fs.REMOTE_TIMEOUT_ENV, "9")
    s3, _ = fs.resolve(f"s3://b/x?endpoint_override=127.0.0.1:{port}&scheme=http")
    options = s3.__reduce__()[1][0]
    assert options["connect_timeout"] == options["request_timeout"] == 3.0
    assert options["endpoint_override"] == f"127.0.0.1:{port}"  # the URI's own options kept
    gcs, path = fs.resolve(f"gs://b/x?endpoint_override=127.0.0.1:{port}&scheme=http")
    assert path == "b/x" and gcs.__reduce__()[1][0]["retry_time_limit"].total_seconds() == 9
    # A limit in the URI wins.
    gcs, _ = fs.resolve(f"gs://b/x?endpoint_override=127.0.0.1:{port}&retry_limit_seconds=4")
    assert gcs.__reduce__()[1][0]["retry_time_limit"].total_seconds() == 4


def test_probe_gives_up_on_a_remote_that_never_answers_and_reports_a_refusal(monkeypatch):
    import time

    from tests.cluster.s3 import closed_port, silent_listener

    port = closed_port()
    _no_cloud_credentials_lookup(monkeypatch, port)
    with pytest.raises(OSError, match="Could not connect|connect"):
        fs.probe(f"s3://b/x?endpoint_override=127.0.0.1:{port}&scheme=http", timeout_s=60)
    # The abandoned request ends on the filesystem's own timeouts (1 s a try) soon after.
    monkeypatch.setenv(fs.REMOTE_TIMEOUT_ENV, "3")
    with silent_listener() as (silent, accepted):
        start = time.monotonic()
        uri = f"s3://b/x?endpoint_override=127.0.0.1:{silent}&scheme=http"
        with pytest.raises(fs.RemoteTimeout, match=r"^no answer from s3://b/x\?.* within 1 s$"):
            fs.probe(uri, timeout_s=1)
        assert accepted.is_set()  # it did reach the listener, which never answered
        assert time.monotonic() - start < 30
    fs.probe("/no/such/local/folder", timeout_s=1)  # local paths: nothing to reach


def test_bounded_returns_raises_or_times_out():
    import threading

    assert fs.bounded(lambda: 7, "x", timeout_s=5) == 7
    with pytest.raises(KeyError):
        fs.bounded(lambda: {}["k"], "x", timeout_s=5)
    release = threading.Event()
    with pytest.raises(fs.RemoteTimeout, match="^no answer from s3://far within 0.2 s$"):
        fs.bounded(lambda: release.wait(30), "s3://far", timeout_s=0.2)
    release.set()


# A process that waits in ``bounded`` on a call that never returns, as the CLI (the entry
# point's run_as_command, then main_wrapper) or as a library caller (which catches what
# bounded raises and exits 3). An exit handler registered before the wait says it ran.
_WAITER = """
import atexit, sys, threading
from rllib_amp import cli, fs
atexit.register(lambda: print("earlier exit handler ran", flush=True))
def never_returns():
    print("waiting", flush=True)
    threading.Event().wait()
def wait(argv):
    fs.bounded(never_returns, "s3://never", timeout_s=600)
    return 0
if sys.argv[1] == "command":
    cli.run_as_command()
    sys.exit(cli.main_wrapper("prog", wait, []))
try:
    with cli.signals_as_interrupts():
        wait([])
except fs.RemoteCallInterrupted as e:
    print(f"library: signum={e.signum}: {e}", flush=True)
    sys.exit(3)
"""


def test_a_signal_during_a_remote_wait_exits_with_its_status_and_only_a_command_is_forced():
    import os
    import signal
    import subprocess
    import sys
    import time

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    cases = [(m, s) for m in ("command", "library") for s in (signal.SIGINT, signal.SIGTERM)]
    procs = {}
    for mode, signum in cases:  # all at once: each start is an interpreter and pyarrow
        procs[mode, signum] = subprocess.Popen(
            [sys.executable, "-c", _WAITER, mode], cwd=root, text=True,
            env=dict(os.environ, PYTHONPATH=root),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )  # fmt: skip
    for proc in procs.values():
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "waiting", proc.communicate(timeout=60)
    time.sleep(0.5)  # the main threads are in bounded's wait by now
    for (_, signum), proc in procs.items():
        proc.send_signal(signum)
    for (mode, signum), proc in procs.items():
        out, err = proc.communicate(timeout=60)
        label = f"{mode} {signal.Signals(signum).name}: {out}{err}"
        assert "Traceback" not in err, label
        if mode == "command":  # the shells' status for that signal, not always 130
            assert proc.returncode == 128 + signum, label
        else:  # a library caller's process: its own status, its exit handlers run
            assert proc.returncode == 3, label
            assert f"library: signum={int(signum)}: interrupted while waiting for s3://never" in out
            assert "earlier exit handler ran" in out, label


# A command (or a library caller) whose remote call never answers within bounded's timeout:
# it says so in one line and ends with status 2. The call stays inside its "library" (here a
# wait) on its thread; an exit handler registered before it stands for pyarrow's C++ state,
# which a normal exit destroys under that thread (the SIGSEGV after the line, seen once in
# a gs:// check): it must not run while the call still runs in a command.
_LEFT_RUNNING = """
import atexit, sys, threading
from rllib_amp import cli, fs
stuck = threading.Event()
atexit.register(lambda: print("exit handlers ran", "under the call" if stuck.is_set()
                              else "after the call", flush=True))
def never_answers():
    stuck.set()
    threading.Event().wait(float(sys.argv[2]))
    stuck.clear()
def check(argv):
    try:
        fs.bounded(never_answers, "gs://silent", timeout_s=0.3)
    except fs.RemoteTimeout as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    return 0
if sys.argv[1] == "command":
    cli.run_as_command()
    cli.exit_command(cli.main_wrapper("prog", check, []))
sys.exit(check([]))
"""


@pytest.mark.parametrize("mode", ["command", "library"])
def test_a_command_does_not_exit_under_a_remote_call_left_running(mode):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.run(
        [sys.executable, "-c", _LEFT_RUNNING, mode, "2"], cwd=root, text=True, timeout=60,
        env=dict(os.environ, PYTHONPATH=root), capture_output=True,
    )  # fmt: skip
    label = f"{mode}: {proc.stdout}{proc.stderr}"
    assert proc.returncode == 2, label
    assert proc.stderr == "error: no answer from gs://silent within 0.3 s\n", label
    if mode == "command":  # ended at once: its last line flushed, nothing torn down under it
        assert "exit handlers ran" not in proc.stdout, label
    else:  # a library caller's process is its own: a normal exit, its handlers run
        assert "exit handlers ran" in proc.stdout, label
    # A call that ended before the exit leaves a command a normal exit too.
    if mode == "command":
        proc = subprocess.run(
            [sys.executable, "-c", _LEFT_RUNNING.replace("timeout_s=0.3", "timeout_s=5"),
             mode, "0.1"], cwd=root, text=True, timeout=60,
            env=dict(os.environ, PYTHONPATH=root), capture_output=True,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert "exit handlers ran after the call" in proc.stdout, proc.stdout + proc.stderr


def test_a_warm_start_source_that_cannot_be_opened_is_one_line(monkeypatch):
    from rllib_amp.scaling.warm_start import read_scaler_states
    from tests.cluster.s3 import closed_port

    port = closed_port()
    _no_cloud_credentials_lookup(monkeypatch, port)
    # hdfs:// without a JVM here (pyarrow's 40-line libjvm search), or refusing connections.
    source = f"hdfs://127.0.0.1:{port}/run/checkpoint_000001"
    with pytest.raises(ValueError) as e:
        read_scaler_states(source)
    line = str(e.value)
    assert line.startswith(f"amp.warm_start.from: cannot read {source!r} (") and "\n" not in line
    assert "drop warm_start" in line
