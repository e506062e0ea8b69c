"""`python -m rllib_amp.tune`: one error path (exit 2, one line, before Ray), names and reruns,
bounds, and the address a Ray comes from."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest
import yaml

from rllib_amp import cli as C
from rllib_amp.sweep import main as cli
from rllib_amp.sweep import resume as R
from rllib_amp.sweep import summary
from rllib_amp.sweep import tuner as T

PROG = "python -m rllib_amp.tune: error: "


def closed_port() -> int:
    """A port on 127.0.0.1 nothing listens at (bound, then released)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def no_ray(monkeypatch, request):
    """Any attempt to start or join Ray fails the test: these inputs are refused before."""
    request.getfixturevalue("ray_must_not_start")
    monkeypatch.delenv("RAY_ADDRESS", raising=False)


def refused(capsys, argv) -> str:
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith(PROG) and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


# -- names ----------------------------------------------------------------------------------
@pytest.mark.usefixtures("no_ray")
@pytest.mark.parametrize("name", ["../../x", "a/b", "", ".", "..", "-x", "a\\b", "x?y", "a\nb"])
def test_a_name_that_is_a_path_is_refused(tmp_path, capsys, name, tiny_file):
    store = tmp_path / "store"
    err = refused(capsys, ["--config", tiny_file(tmp_path), "--storage-path", str(store),
                           f"--name={name}"])  # fmt: skip
    assert "--name: got" in err and "not a path" in err
    assert not store.exists() and not (tmp_path / "x").exists()


def fake_run(tmp_path, name="old") -> dict[str, bytes]:
    """An earlier run's folder: results, a checkpoint and Tune's state."""
    root = tmp_path / "store" / name
    files = {
        "results.parquet": b"PAR1 earlier results",
        "tuner.pkl": b"tune state",
        "experiment_state-2026.json": b"{}",
        "PPO_CartPole-v1_abcde_00000_0/checkpoint_000001/rllib_checkpoint.json": b"{}",
    }
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return files


def snapshot(root) -> dict[str, bytes]:
    return {
        os.path.relpath(os.path.join(d, f), root): open(os.path.join(d, f), "rb").read()
        for d, _, fs in os.walk(root)
        for f in fs
    }


@pytest.mark.usefixtures("no_ray")
@pytest.mark.parametrize("dry_run", [False, True])
def test_an_existing_name_without_resume_is_refused_and_kept(tmp_path, capsys, dry_run, tiny_file):
    fake_run(tmp_path)
    before = snapshot(tmp_path / "store" / "old")
    err = refused(capsys, ["--config", tiny_file(tmp_path), "--storage-path",
                           str(tmp_path / "store"), "--name", "old",
                           *(["--dry-run"] if dry_run else [])])  # fmt: skip
    assert "already exists" in err and "--resume" in err and "another --name" in err
    assert snapshot(tmp_path / "store" / "old") == before


def stored_run(tmp_path, tiny_file, *sets: str) -> list[str]:
    """A fake interrupted run whose experiment.yaml is what these --set values resolve to."""
    fake_run(tmp_path)
    config = tiny_file(tmp_path)
    argv = ["--config", config, "--storage-path", str(tmp_path / "store"), "--name", "old"]
    for s in sets:
        argv += ["--set", s]
    from rllib_amp import experiment as E

    exp = E.load(config, overrides=list(sets))
    (tmp_path / "store" / "old" / R.EXPERIMENT_FILE).write_bytes(R.dump(R.run_spec(exp, None)))
    return argv


@pytest.mark.usefixtures("no_ray")
def test_resume_with_a_changed_experiment_is_refused_with_the_keys(tmp_path, tiny_file, capsys):
    argv = stored_run(tmp_path, tiny_file, "amp.growth_interval=100")
    before = snapshot(tmp_path / "store" / "old")
    err = refused(capsys, [*argv[:-2], "--resume", "--set", "stop.training_iteration=5",
                           "--dry-run"])  # fmt: skip
    assert "--resume: the experiment differs" in err
    assert "amp.growth_interval: 100 -> (not set)" in err
    assert "stop.training_iteration: 2 -> 5" in err
    assert "--accept-changes" in err
    assert snapshot(tmp_path / "store" / "old") == before
    # The same values resume; other values with --accept-changes too.
    assert cli.main([*argv, "--resume", "--dry-run"]) == 0
    assert cli.main([*argv[:-2], "--resume", "--accept-changes", "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "resuming as first started; these changes take no effect" in out
    assert "amp.growth_interval" in out


@pytest.mark.usefixtures("no_ray")
def test_accept_changes_without_resume_is_refused(tmp_path, capsys, tiny_file):
    err = refused(capsys, ["--config", tiny_file(tmp_path), "--accept-changes", "--dry-run"])
    assert "--accept-changes: only applies with --resume" in err


# -- bounds ---------------------------------------------------------------------------------
BOUNDS = [
    ("resources.num_env_runners=100000000", "resources.num_env_runners: got 100000000; must be <="),
    ("resources.num_envs_per_env_runner=100000", "num_envs_per_env_runner: got 100000; must be <="),
    ("resources.num_learners=5000", "resources.num_learners: got 5000; must be <="),
    ("training.train_batch_size_per_learner=100000000",
     "train_batch_size_per_learner: got 100000000; must be <="),
    ("training.minibatch_size=100000000", "training.minibatch_size: got 100000000; must be <="),
]  # fmt: skip


@pytest.mark.usefixtures("no_ray")
@pytest.mark.parametrize("item, fragment", BOUNDS, ids=[b[0] for b in BOUNDS])
def test_sizes_beyond_any_machine_are_refused_at_once(tmp_path, capsys, item, fragment, tiny_file):
    start = time.monotonic()
    err = refused(capsys, ["--config", tiny_file(tmp_path), "--storage-path", str(tmp_path),
                           "--set", item])  # fmt: skip
    assert fragment in err
    assert time.monotonic() - start < 15


@pytest.mark.usefixtures("no_ray")
def test_trial_count_is_capped_unless_lifted(tmp_path, capsys, tiny_file):
    argv = ["--config", tiny_file(tmp_path), "--storage-path", str(tmp_path), "--dry-run"]
    err = refused(capsys, [*argv, "--num-samples", "600"])  # 2 init_scales x 600
    assert "1,200 trials" in err and "--max-trials 1200" in err
    assert cli.main([*argv, "--num-samples", "600", "--max-trials", "1200"]) == 0
    assert "# trials: 1200" in capsys.readouterr().out
    assert "--max-trials: got 0" in refused(capsys, [*argv, "--max-trials", "0"])


# -- storage and addresses: refused before Ray ----------------------------------------------
@pytest.mark.usefixtures("no_ray")
def test_storage_path_that_is_a_file_exits_2_before_ray(tmp_path, capsys, tiny_file):
    f = tmp_path / "a_file"
    f.write_bytes(b"not a folder")
    err = refused(capsys, ["--config", tiny_file(tmp_path), "--storage-path", str(f)])
    assert "--storage-path: cannot write to" in err
    assert f.read_bytes() == b"not a folder"


ADDRESSES = [
    ("garbage", "--address: got 'garbage'; expected auto, HOST:PORT"),
    ("127.0.0.1:99999", "expected auto, HOST:PORT"),
    ("ray://", "expected auto, HOST:PORT"),
    ("   ", "--address: got an empty address"),
    ("no-such-host.invalid:6379", "--address: nothing answers at no-such-host.invalid:6379"),
]


@pytest.mark.usefixtures("no_ray")
@pytest.mark.parametrize("address, fragment", ADDRESSES, ids=[a for a, _ in ADDRESSES])
def test_a_bad_address_exits_2_before_ray(tmp_path, capsys, address, fragment, tiny_file):
    err = refused(capsys, ["--config", tiny_file(tmp_path), "--storage-path", str(tmp_path),
                           "--address", address])  # fmt: skip
    assert fragment in err


@pytest.mark.usefixtures("no_ray")
@pytest.mark.parametrize("via", ["--address", "RAY_ADDRESS"])
def test_a_closed_port_exits_2_within_15_s(tmp_path, capsys, monkeypatch, via, tiny_file):
    port = closed_port()
    argv = ["--config", tiny_file(tmp_path), "--storage-path", str(tmp_path / "s")]
    if via == "--address":
        argv += ["--address", f"127.0.0.1:{port}"]
    else:
        monkeypatch.setenv("RAY_ADDRESS", f"127.0.0.1:{port}")
    start = time.monotonic()
    err = refused(capsys, argv)
    assert time.monotonic() - start < 15
    assert f"{via}: nothing answers at 127.0.0.1:{port}" in err
    assert ("unset RAY_ADDRESS" in err) == (via == "RAY_ADDRESS")
    assert not (tmp_path / "s").exists()


@pytest.fixture
def listener():
    """A server on 127.0.0.1 that accepts connections and answers with ``reply`` (None: says
    nothing), like a web server or a port some other program holds."""
    servers = []

    def start(reply: bytes | None) -> int:
        srv = socket.socket()
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        servers.append(srv)

        def serve() -> None:
            while True:
                try:
                    conn, _ = srv.accept()
                except OSError:
                    return
                if reply is not None:
                    conn.recv(1024)
                    conn.sendall(reply)
                servers.append(conn)

        threading.Thread(target=serve, daemon=True).start()
        return int(srv.getsockname()[1])

    yield start
    for s in servers:
        s.close()


@pytest.mark.usefixtures("no_ray")
@pytest.mark.parametrize(
    "reply, fragment",
    [(b"HTTP/1.1 400 Bad Request\r\n\r\n", "answers but is not a Ray cluster"),
     (None, "nothing answers at")],
    ids=["http server", "silent"],
)  # fmt: skip
def test_an_open_port_that_is_not_ray_exits_2_within_15_s(
    tmp_path, capsys, listener, reply, fragment, tiny_file
):
    port = listener(reply)
    start = time.monotonic()
    err = refused(capsys, ["--config", tiny_file(tmp_path), "--storage-path", str(tmp_path),
                           "--address", f"127.0.0.1:{port}"])  # fmt: skip
    assert time.monotonic() - start < 15
    assert fragment in err and f"127.0.0.1:{port}" in err


@pytest.mark.usefixtures("no_ray")
def test_address_auto_with_only_a_stale_record_exits_2(tmp_path, capsys, monkeypatch, tiny_file):
    ray_tmp = tmp_path / "raytmp"
    (ray_tmp / "ray").mkdir(parents=True)
    (ray_tmp / "ray" / "ray_current_cluster").write_text(f"127.0.0.1:{closed_port()}")
    monkeypatch.setenv("RAY_TMPDIR", str(ray_tmp))
    # `auto` also joins any Ray running on this machine (Ray greps for GCS processes); other
    # test sessions may run one, so that scan sees none here.
    from ray._private import services

    monkeypatch.setattr(services, "find_gcs_addresses", lambda: [])
    err = refused(capsys, ["--config", tiny_file(tmp_path), "--storage-path", str(tmp_path),
                           "--address", "auto"])  # fmt: skip
    assert "--address:" in err and "ray start --head" in err


@pytest.mark.parametrize(
    ("raised", "said"),
    [
        (
            RuntimeError("Failed to start the GCS\nmore detail"),
            "ray.init: could not start a local Ray (RuntimeError: Failed to start the GCS)",
        ),
        # What ray/_private/node.py raises when its raylet never registers within 30 s (a
        # loaded machine, a raylet stopped during start): a bare Exception, once a traceback.
        (
            Exception(
                "The current node timed out during startup. This could happen because some "
                "of the raylet failed to startup or the GCS has become overloaded."
            ),
            "ray.init: the local Ray did not start within 30 s",
        ),
    ],
)
def test_ray_init_failures_are_one_line(tmp_path, capsys, monkeypatch, tiny_file, raised, said):
    import ray

    def broken(*args, **kwargs):
        raise raised

    monkeypatch.setattr(ray, "init", broken)
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    err = refused(capsys, ["--config", tiny_file(tmp_path), "--storage-path", str(tmp_path)])
    assert said in err, err


def test_ctrl_c_before_any_trial_is_exit_130(capsys):
    def run(argv):
        raise KeyboardInterrupt

    assert C.main_wrapper("prog", run, []) == 130
    assert capsys.readouterr().err == "prog: interrupted\n"


def test_fit_tells_an_interrupted_sweep_from_a_finished_one():
    class Tuner:
        """Does what Tune's loop does with signals: a stop handler on SIGUSR1 always, on
        SIGINT unless TUNE_DISABLE_SIGINT_HANDLER; the loop ends once it was called."""

        def __init__(self, *signals):
            self.signals = signals

        def fit(self):
            stopped = []
            signal.signal(signal.SIGUSR1, lambda signum, frame: stopped.append(signum))
            if os.environ.get("TUNE_DISABLE_SIGINT_HANDLER") != "1":
                signal.signal(signal.SIGINT, lambda signum, frame: stopped.append(signum))
            for sig in self.signals:  # the second one arrives while the state is saved
                os.kill(os.getpid(), sig)
                time.sleep(0.1)
            assert len(stopped) <= 1, "Tune was told to stop twice"
            return "grid"

    def fit(tuner):
        with T.StopOnSignals() as stop:
            return stop.fit(tuner)

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)}
    assert fit(Tuner()) == ("grid", 0)
    assert fit(Tuner(signal.SIGINT)) == ("grid", signal.SIGINT)
    assert fit(Tuner(signal.SIGTERM, signal.SIGINT)) == ("grid", signal.SIGTERM)
    assert fit(Tuner(signal.SIGINT, signal.SIGINT)) == ("grid", signal.SIGINT)
    assert {s: signal.getsignal(s) for s in before} == before
    assert "TUNE_DISABLE_SIGINT_HANDLER" not in os.environ


@pytest.mark.usefixtures("ray_local")
def test_a_damaged_experiment_state_on_resume_exits_2(tmp_path, capsys, monkeypatch, tiny_file):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    fake_run(tmp_path)  # its tuner.pkl is no pickle
    err = refused(capsys, ["--config", tiny_file(tmp_path), "--storage-path",
                           str(tmp_path / "store"), "--name", "old", "--resume"])  # fmt: skip
    assert "--resume:" in err and "another --name" in err
    assert (tmp_path / "store" / "old" / "results.parquet").read_bytes() == b"PAR1 earlier results"


# -- failures after trials start ------------------------------------------------------------
def test_a_trial_without_results_shows_its_id_and_root_error_without_colour(tmp_path, tiny_file):
    from rllib_amp import experiment as E

    class Cause(ValueError):
        pass

    wrapped = RuntimeError(
        "\x1b[36mray::PPO.__init__()\x1b[39m (pid=1, ip=127.0.0.1)\n  File ...\n"
        "\x1b[31mValueError: env 'X' exploded\x1b[0m"
    )
    wrapped.cause = Cause("env 'X' exploded")  # type: ignore[attr-defined]
    result = SimpleNamespace(
        config=None, metrics=None, checkpoint=None, error=wrapped,
        path=str(tmp_path / "PPO_CartPole-v1_3c1f5_00001_1_init_scale=1024_2026-11-30"),
    )  # fmt: skip
    exp = E.load(tiny_file(tmp_path))
    (row,) = summary.summarize(exp, [result])
    assert row["trial_id"] == "3c1f5_00001" and row["status"] == "ERROR"
    assert row["error"] == "Cause: env 'X' exploded"
    plain = RuntimeError("\x1b[31mray::T()\x1b[0m\nTraceback\nKeyError: 'x'")
    assert C.root_error(plain) == "KeyError: 'x'"


# -- the in-process Ray ---------------------------------------------------------------------
@pytest.mark.slow  # slow (18 s): starts a Ray of its own
def test_no_address_starts_its_own_ray_despite_a_stale_cluster_record(tmp_path, tiny_file):
    """A `ray start` cluster that died leaves its address in Ray's temp folder; the default
    job must start a Ray of its own, not try to join that one."""
    ray_tmp = tempfile.mkdtemp(prefix="rt", dir="/tmp")  # short: Ray's socket paths
    os.makedirs(os.path.join(ray_tmp, "ray"))
    with open(os.path.join(ray_tmp, "ray", "ray_current_cluster"), "w") as f:
        f.write(f"127.0.0.1:{closed_port()}")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_TMPDIR"] = ray_tmp
    config = tiny_file(tmp_path, iterations=1, scales=[1024.0])
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "rllib_amp.tune", "--config", config,
         "--storage-path", str(tmp_path), "--name", "fresh"],
        capture_output=True, text=True, timeout=300, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = pq.read_table(str(tmp_path / "fresh" / "results.parquet")).to_pylist()
    assert [r["status"] for r in table] == ["DONE"]
    assert time.monotonic() - start < 240
    stored = yaml.safe_load((tmp_path / "fresh" / R.EXPERIMENT_FILE).read_text())
    assert stored["amp"]["dtype"] == "float16" and "storage_path" not in stored


# -- paths ----------------------------------------------------------------------------------
@pytest.mark.usefixtures("no_ray")
@pytest.mark.parametrize("home", ["~", "$HOME"])
def test_every_path_flag_expands_home_and_variables(tmp_path, capsys, monkeypatch, tiny_file, home):
    """As a shell would have, had the path not been quoted: ``--config '~/x.yaml'`` was not
    expanded, and ``--storage-path '$HOME/runs'`` made a folder named ``$HOME``."""
    monkeypatch.setenv("HOME", str(tmp_path))
    tiny_file(tmp_path)
    argv = ["--config", f"{home}/tiny.yaml", "--storage-path", f"{home}/runs", "--name", "x",
            "--dry-run"]  # fmt: skip
    assert cli.main(argv) == 0, capsys.readouterr().err
    first = capsys.readouterr().out.splitlines()[0]
    assert first == f"# experiment {tmp_path / 'tiny.yaml'} -> {tmp_path / 'runs' / 'x'}", first


@pytest.mark.usefixtures("no_ray")
def test_a_path_flag_naming_an_unset_variable_is_one_line(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("RLLIB_AMP_NOT_SET", raising=False)
    err = refused(capsys, ["--config", "$RLLIB_AMP_NOT_SET/tiny.yaml"])
    assert err.startswith(f"{PROG}--config: ") and "$RLLIB_AMP_NOT_SET, which is not set" in err


def test_a_failed_ray_init_leaves_a_ray_the_process_had_up(monkeypatch, ray_local):
    """In a caller's process (a notebook that had Ray up, this test session), a failed start
    must not shut that Ray down: it did once, and every later test lost its metrics agent."""
    import ray

    from rllib_amp.sweep.ray_address import start_ray

    def broken(*args, **kwargs):
        raise RuntimeError("Failed to start the GCS")

    monkeypatch.setattr(ray, "init", broken)
    with pytest.raises(C.UsageError):
        start_ray(None, "")
    monkeypatch.undo()
    assert ray.is_initialized()
