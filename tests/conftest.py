"""Shared fixtures: one local Ray per test session, kept on 127.0.0.1, and a home folder of
the tests' own."""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap

# A test run started in the background by a shell without job control (`cmd &` in a script,
# some CI runners) inherits SIGINT ignored, and every command the tests start would inherit it
# too: the Ctrl-C tests would send a signal that nothing hears. Python's own handler here is
# reset to the default in each command at exec, as in a terminal.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# Before ray is imported anywhere: keep Ray on 127.0.0.1 instead of the machine's interface
# address, so tests never touch the network and multi-node Clusters can be joined.
os.environ.setdefault("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")

# Before ray is imported anywhere: Ray reads the home folder at import time
# (ray.train.constants.DEFAULT_STORAGE_PATH = ~/ray_results, where Tune and every Algorithm
# built outside Tune write), and the CLI's default storage is ~/ray_results too. One home for
# the whole session, not one per test: `ray start` nodes a fixture keeps across tests write
# their auth token to ~/.ray and the drivers joining them read it from there. Subprocesses
# (the CLI tests) inherit it.
# The variable keeps a second import of this file (as tests.conftest) on the same home.
TEST_HOME_ENV = "RLLIB_AMP_TEST_HOME"
TEST_HOME = os.environ.get(TEST_HOME_ENV, "")
if not TEST_HOME:
    TEST_HOME = tempfile.mkdtemp(prefix="rllib_amp_test_home_")
    atexit.register(shutil.rmtree, TEST_HOME, ignore_errors=True)
    os.environ[TEST_HOME_ENV] = TEST_HOME
os.environ["HOME"] = TEST_HOME
# What else would take runs out of that home or into a user's choice of storage: Tune's
# deprecated result-folder variables (Tune raises on them) and the CLI's storage default.
HOME_DERIVED_ENV = (
    "TUNE_RESULT_DIR",
    "RAY_AIR_LOCAL_CACHE_DIR",
    "RAY_STORAGE",
    "RLLIB_AMP_STORAGE",
)
for _name in HOME_DERIVED_ENV:
    os.environ.pop(_name, None)

import pytest  # noqa: E402


@pytest.fixture(autouse=True)
def test_home(monkeypatch) -> str:
    """Every test runs with HOME at the session's own folder, whatever an earlier test set,
    and without the variables that would send runs elsewhere (a test sets its own)."""
    monkeypatch.setenv("HOME", TEST_HOME)
    for name in HOME_DERIVED_ENV:
        monkeypatch.delenv(name, raising=False)
    return TEST_HOME


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_METRICS_PORT = _free_port()


@pytest.fixture(scope="session")
def ray_local():
    """A local Ray instance for the whole test session (starting Ray costs seconds)."""
    import ray

    started = False
    if not ray.is_initialized():
        # address="local": always a fresh in-process Ray, never a cluster some other process
        # left registered in Ray's temp folder.
        ray.init(
            address="local",
            num_cpus=4,
            include_dashboard=False,
            _node_ip_address="127.0.0.1",
            _metrics_export_port=_METRICS_PORT,
            log_to_driver=False,
        )
        started = True
    yield ray
    if started:
        ray.shutdown()


@pytest.fixture(scope="session")
def ray_metrics_url(ray_local) -> str:
    """The Prometheus endpoint of the test session's Ray node."""
    return f"http://127.0.0.1:{_METRICS_PORT}/metrics"


# -- helpers shared by the tests of several tiers --------------------------------------------
TINY_EXPERIMENT = """
# a tiny sweep for tests
algorithm: PPO
env: CartPole-v1
model: {{fcnet_hiddens: [16]}}
amp: {{dtype: float16}}
training: {{train_batch_size_per_learner: 200, minibatch_size: 100, num_epochs: 1}}
resources: {{num_env_runners: 0}}
search:
  amp.init_scale: {{grid: {scales}}}
  amp.growth_interval: {{choice: [5, 2000]}}
  training.train_batch_size_per_learner: {{choice: [100, 200]}}
tune: {{max_concurrent_trials: 1}}
stop: {{training_iteration: {iterations}}}
checkpoint: {{frequency: 1, num_to_keep: 2}}
seed: 0
"""


@pytest.fixture
def tiny_file():
    """``tiny_file(folder, iterations=2, scales=(1024.0, 65536.0))``: writes a tiny CartPole
    sweep file into ``folder`` and returns its path."""

    def write(folder, iterations=2, scales=(1024.0, 65536.0)):
        p = folder / "tiny.yaml"
        text = TINY_EXPERIMENT.format(iterations=iterations, scales=list(scales))
        p.write_text(textwrap.dedent(text))
        return str(p)

    return write


@pytest.fixture
def trial_results():
    """``trial_results(path)``: a trial's result.json lines; a last line Tune is still writing
    is left out."""

    def read(path):
        """The trial's result lines; a last line Tune is still writing is left out."""
        with open(path, encoding="utf-8") as f:
            lines = [line for line in f if line.strip()]
        out = []
        for i, line in enumerate(lines):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                if i != len(lines) - 1:
                    raise
        return out

    return read


@pytest.fixture
def ray_must_not_start(monkeypatch):
    import ray

    def refuse(*args, **kwargs):
        raise AssertionError("Ray was started for a config pre-flight should have refused")

    monkeypatch.setattr(ray, "init", refuse)
    # As if no Ray ran in this process (another test file's session Ray may).
    monkeypatch.setattr(ray, "is_initialized", lambda: False)


def pytest_terminal_summary(terminalreporter):
    """The command start times the tests measured (``record_property("start_seconds", ...)``),
    printed in every run's log: the figures, not a timed assertion, show how fast it starts."""
    rows = [
        value
        for outcome in ("passed", "failed")
        for report in terminalreporter.stats.get(outcome, [])
        for name, value in getattr(report, "user_properties", [])
        if name == "start_seconds"
    ]
    if rows:
        terminalreporter.write_sep("-", "command start times (2-core target: under 1.5 s idle)")
        for label, seconds in rows:
            terminalreporter.write_line(f"{seconds:6.2f} s  {label}")


@pytest.fixture
def session_sweep(ray_local):
    """``session_sweep(config, storage, name, *extra)``: the argv of ``python -m rllib_amp.tune``
    in a child process that joins the test session's Ray."""

    def command(config, storage, name, *extra):
        address = ray_local.get_runtime_context().gcs_address
        return [
            sys.executable, "-m", "rllib_amp.tune", "--config", str(config),
            "--address", address, "--storage-path", str(storage), "--name", name, *extra,
        ]  # fmt: skip

    return command


# A process that holds an experiment lock as a running command does: filelock's lock on the
# file, the file naming its host and pid (or ``content``), until it is killed.
_HOLDER = """
import filelock, json, os, socket, sys, time
lock = filelock.FileLock(sys.argv[1])
lock.acquire(timeout=0)
with open(sys.argv[1], "w") as f:
    f.write(sys.argv[2] if len(sys.argv) > 2 else json.dumps(
        {"host": socket.gethostname(), "pid": os.getpid()}))
print("held", flush=True)
time.sleep(120)
"""


@pytest.fixture
def own_ray_env():
    """The environment of a sweep that starts its own local Ray, with Ray's files in a
    folder of the test's own (short: Ray's socket paths)."""
    ray_tmp = tempfile.mkdtemp(prefix="rd", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = ray_tmp
    yield env
    shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.fixture
def lock_holder():
    """``hold(path, content=None)``: starts a live process of this host that holds the lock
    at ``path``; returns its pid. Each is killed at the end of the test."""
    procs = []

    def hold(path, content=None):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        args = [sys.executable, "-c", _HOLDER, str(path), *([content] if content else [])]
        proc = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
        procs.append(proc)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
        return proc.pid

    yield hold
    for proc in procs:
        proc.kill()
        proc.wait()
