"""Storage on a real multi-node cluster: S3 (moto's server) works; a disk only the driver has
makes the CLI exit 2 before any trial starts.

One cluster for the module, each node in a process of its own: a ray.cluster_utils.Cluster
(a 0-CPU head with the dashboard, so trials run on workers, and one 2-CPU worker) and, where
the OS allows it, a second 2-CPU worker in its own mount namespace with a private tmpfs over
one folder: the situation of a cluster whose nodes do not share a disk.
"""

from __future__ import annotations

import importlib
import json
import os
import pickle
import posixpath
import select
import shlex
import signal
import subprocess
import sys
import textwrap
import time

import pyarrow.parquet as pq
import pytest

from tests.cluster.s3 import moto_s3

HERE = os.path.dirname(os.path.abspath(__file__))
NODES = os.path.join(HERE, "nodes.py")
ROOT = os.path.dirname(os.path.dirname(HERE))

# Two trials of 2 CPUs each (trial process + one env runner): one per worker node.
SWEEP = """
algorithm: PPO
env: CartPole-v1
model: {fcnet_hiddens: [16]}
amp: {dtype: float16, growth_interval: 4}
training: {train_batch_size_per_learner: 200, minibatch_size: 100, num_epochs: 1}
resources: {num_env_runners: 1}
search:
  amp.init_scale: {grid: [256.0, 512.0]}
tune: {max_concurrent_trials: 2, max_failures: 0}
stop: {training_iteration: %(iterations)d}
checkpoint: {frequency: 1, num_to_keep: 2}
seed: 0
"""


class Proc:
    """A child process that speaks in lines: ``READY {json}`` once up, ``OK {json}`` per
    command. Stopped by its PID only."""

    def __init__(self, args: list[str], env: dict[str, str]):
        self.p = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env=env,
            cwd=ROOT,
        )

    def expect(self, tag: str, timeout: float) -> object:
        deadline = time.time() + timeout
        assert self.p.stdout is not None
        while time.time() < deadline:
            ready, _, _ = select.select([self.p.stdout], [], [], 1.0)
            if ready:
                line = self.p.stdout.readline()
                if not line:
                    break
                if line.startswith(tag + " "):
                    return json.loads(line[len(tag) + 1 :])
        raise AssertionError(f"no {tag} line from {self.p.args} (exit {self.p.poll()})")

    def ask(self, command: str, timeout: float = 150) -> object:
        assert self.p.stdin is not None
        self.p.stdin.write(command + "\n")
        self.p.stdin.flush()
        return self.expect("OK", timeout)

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGTERM)
            try:
                self.p.wait(timeout=90)
            except subprocess.TimeoutExpired:
                self.p.kill()
                self.p.wait(timeout=30)


def _node_env() -> dict[str, str]:
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0", PYTHONPATH=ROOT)
    env.pop("RAY_ADDRESS", None)
    return env


def _unshare_refusal(folder: str) -> str | None:
    """Why this OS will not give a process its own mount namespace with a tmpfs, or None."""
    try:
        proc = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             'mount -t tmpfs none "$1"', "sh", folder],
            capture_output=True, text=True, timeout=30,
        )  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as e:
        return str(e)
    return None if proc.returncode == 0 else (proc.stderr.strip() or f"exit {proc.returncode}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """The module's cluster and S3 server: yields a dict with the keeper (``head``), the
    cluster address, node ids, the private folder and the S3 handle."""
    with moto_s3() as s3:
        env = _node_env()  # after moto_s3: every node inherits its credentials
        head = Proc([sys.executable, NODES, "head"], env)
        started = [head]
        try:
            info = dict(head.expect("READY", timeout=240))
            private = str(tmp_path_factory.mktemp("node_local_disk"))
            refusal = _unshare_refusal(private)
            info["unshared"] = None
            if refusal is None:
                script = 'mount -t tmpfs none "$1" && exec "$2" "$3" worker "$4" 2'
                node = Proc(
                    ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh",
                     private, sys.executable, NODES, info["address"]],
                    env,
                )  # fmt: skip
                started.append(node)
                info["unshared"] = node.expect("READY", timeout=240)["node"]
            alive = head.ask(f"nodes {3 if refusal is None else 2}")
            assert len(alive) == (3 if refusal is None else 2), alive
            yield {**info, "keeper": head, "private": private, "refusal": refusal, "s3": s3}
        finally:
            for proc in reversed(started):
                proc.stop()


def _cli(cluster, config: str, storage: str, name: str, *extra: str, **popen) -> subprocess.Popen:
    env = dict(os.environ, PYTHONPATH=ROOT, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)
    cmd = [sys.executable, "-m", "rllib_amp.tune", "--config", config,
           "--address", cluster["address"], "--storage-path", storage,
           "--name", name, *extra]  # fmt: skip
    return subprocess.Popen(cmd, env=env, cwd=ROOT, text=True, **popen)


@pytest.mark.slow  # a two-node Cluster of its own: 31 s on 2 idle cores
def test_node_local_storage_exits_2_before_any_trial(cluster, tmp_path):
    if cluster["refusal"]:
        pytest.skip(f"no private mount namespace here: {cluster['refusal']}")
    config = tmp_path / "sweep.yaml"
    config.write_text(textwrap.dedent(SWEEP % {"iterations": 2}))
    before = sorted(os.listdir(cluster["private"]))
    start = time.time()
    proc = _cli(cluster, str(config), cluster["private"], "local",
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 2, out[-2000:] + err[-3000:]
    # One error line, last (before it only Ray's own "Connected to Ray cluster" lines).
    lines = err.strip().splitlines()
    errors = [line for line in lines if "error" in line.lower()]
    assert errors == lines[-1:], err
    line = lines[-1]
    assert line.startswith("python -m rllib_amp.tune: error: --storage-path: "), line
    assert "not reachable from 1 of 3 nodes" in line and cluster["unshared"][:8] in line
    assert "s3://" in line and "shared mount" in line
    assert "Traceback" not in err
    # Nothing started, nothing left behind: no experiment folder, no marker.
    assert sorted(os.listdir(cluster["private"])) == before
    assert cluster["keeper"].ask("actors AmpPPO") == []
    assert time.time() - start < 240


def _states_in_bucket(s3, trial_dir: str) -> dict[int, dict]:
    """training_iteration -> the AMP scaler state saved in each checkpoint of a trial
    (``trial_dir`` as pyarrow lists it: ``bucket/...``)."""
    out = {}
    for path in s3.list(trial_dir.removeprefix(f"{s3.bucket}/")):
        if not path.endswith("/algorithm_state.pkl"):
            continue
        ck = posixpath.dirname(path)
        iteration = pickle.loads(s3.read(path))["training_iteration"]
        learner = pickle.loads(s3.read(f"{ck}/learner_group/learner/state.pkl"))
        out[iteration] = learner["amp_scalers"]["default_policy"]
    return out


def _results_in_bucket(s3, trial_dir: str) -> list[dict]:
    text = s3.read(f"{trial_dir}/result.json").decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


# slow (49 s): the printed-URI round trip has a fast unit test in tests/unit/sweep/test_storage.py.
@pytest.mark.slow
def test_s3_sweep_on_the_cluster_resumes_from_the_bucket_with_exact_scaler_state(cluster, tmp_path):
    s3 = cluster["s3"]
    config = tmp_path / "sweep.yaml"
    config.write_text(textwrap.dedent(SWEEP % {"iterations": 8}))
    storage = s3.uri("experiments")
    prefix = "experiments/s3sweep"

    # 1. Interrupt the sweep once both trials have checkpoints in the bucket.
    log = open(tmp_path / "first.log", "w")  # noqa: SIM115
    proc = _cli(cluster, str(config), storage, "s3sweep", stdout=log, stderr=subprocess.STDOUT)
    deadline = time.time() + 360
    trial_dirs: set[str] = set()
    while time.time() < deadline and proc.poll() is None:
        paths = s3.list(prefix)
        counts: dict[str, int] = {}
        for p in paths:
            if p.endswith("/algorithm_state.pkl"):
                trial = posixpath.dirname(posixpath.dirname(p))
                counts[trial] = counts.get(trial, 0) + 1
        if len(counts) == 2 and all(n >= 2 for n in counts.values()):
            trial_dirs = set(counts)
            break
        time.sleep(0.5)
    assert len(trial_dirs) == 2, (tmp_path / "first.log").read_text()[-3000:]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=180) == 130, (tmp_path / "first.log").read_text()[-3000:]
    log.close()
    saved = {t: _states_in_bucket(s3, t) for t in trial_dirs}

    # 2. Resume from the bucket URI, with the command the interrupted run printed: its
    # --storage-path is the URI with its query (?endpoint_override=...), as given.
    printed = (tmp_path / "first.log").read_text()
    resume = shlex.split(printed.split("continue with: ")[-1].splitlines()[0])
    assert resume[:3] == ["python", "-m", "rllib_amp.tune"] and resume[-1] == "--resume"
    assert resume[resume.index("--storage-path") + 1] == storage
    env = dict(os.environ, PYTHONPATH=ROOT, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.Popen([sys.executable, *resume[1:]], env=env, cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)  # fmt: skip
    out, _ = proc.communicate(timeout=540)
    assert proc.returncode == 0, out[-4000:]

    # Results and checkpoints are in the bucket, listed through pyarrow.
    listing = s3.list(prefix)
    assert f"{s3.bucket}/{prefix}/results.parquet" in listing
    for t in trial_dirs:
        assert any(p.startswith(f"{t}/checkpoint_") for p in listing), t
    table = pq.read_table(f"{s3.bucket}/{prefix}/results.parquet", filesystem=s3.fs).to_pylist()
    assert len(table) == 2 and all(r["status"] == "DONE" for r in table)
    assert all(r["checkpoint"].startswith(f"s3://{s3.bucket}/{prefix}/") for r in table)
    best = next(line for line in out.splitlines() if line.startswith("Best trial checkpoint: "))
    assert best.split(": ", 1)[1] == table[0]["checkpoint"]
    assert f"endpoint_override={s3.endpoint}" in table[0]["checkpoint"]
    # The printed checkpoint URI works as a warm-start source as printed (its component
    # paths go before the query): the experiment's check reads its scaler state.
    warm = tmp_path / "warm.yaml"
    source = f'warm_start: {{from: "{table[0]["checkpoint"]}"}}'
    sweep = textwrap.dedent(SWEEP % {"iterations": 1})
    warm.write_text(sweep.replace("growth_interval: 4}", f"growth_interval: 4, {source}}}"))
    checked = subprocess.run(
        [sys.executable, "-m", "rllib_amp.tune", "--config", str(warm), "--dry-run"],
        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert checked.returncode == 0, checked.stdout[-2000:] + checked.stderr[-3000:]
    assert "warm_start" in checked.stdout and s3.endpoint in checked.stdout

    # Each interrupted trial continued from a checkpoint in the bucket with its scaler state
    # exactly: the first update after the restore starts from the saved counters, growth
    # tracker and scale.
    for t in trial_dirs:
        states = saved[t]
        (k1, s1), (k2, s2) = sorted(states.items())[-2:]
        per_iteration = (s2["optimizer_steps_lifetime"] - s1["optimizer_steps_lifetime"]) // (
            k2 - k1
        )
        rows = _results_in_bucket(s3, t)
        first = next(
            r for r in rows if r["iterations_since_restore"] == 1 and r["training_iteration"] > 1
        )
        k = first["training_iteration"] - 1
        assert k in states, (k, sorted(states))
        state, amp = states[k], first["learners"]["default_policy"]
        assert amp["amp_optimizer_steps_lifetime"] == (
            state["optimizer_steps_lifetime"] + per_iteration
        )
        if amp["amp_skipped_steps_lifetime"] == state["skipped_steps_lifetime"]:
            torch_state = state["torch"]
            growths = (torch_state["_growth_tracker"] + per_iteration) // torch_state[
                "growth_interval"
            ]
            expected = torch_state["scale"] * torch_state["growth_factor"] ** growths
            assert amp["amp_grad_scale"] == expected
        assert rows[-1]["training_iteration"] == 8

    # The trials ran on the workers (the head has no CPUs), the one with a disk of its own
    # included.
    nodes = set(cluster["keeper"].ask("actors AmpPPO"))
    assert nodes and nodes <= {cluster["worker"], cluster["unshared"]}, nodes
    if cluster["unshared"]:
        assert cluster["unshared"] in nodes, (nodes, cluster["unshared"])
    # The CLI ran beside the head: the AMP dashboard is in Ray's Grafana folder.
    dashboards = os.path.join(cluster["session_dir"], "metrics", "grafana", "dashboards")
    assert "rllib_amp_grafana_dashboard.json" in os.listdir(dashboards)


# Last in the module: it adds a node to the module's cluster and kills it.
@pytest.mark.slow  # a third worker, a three-trial sweep into the bucket, a node killed: minutes
def test_a_node_lost_mid_trial_with_s3_storage_restores_its_trial_from_the_bucket(
    cluster, tmp_path
):
    """A worker node dies (its raylet SIGKILLed) while its trial trains with s3:// storage:
    Tune retries the trial (max_failures 1) on a node that frees up, from the trial's newest
    checkpoint in the bucket, and the sweep ends 0 with every trial DONE. Nothing is read from
    the dead node's disk: the bucket is the only copy."""
    import ray  # noqa: F401  (Ray's own copy of psutil is on the path once ray is imported)

    psutil = importlib.import_module("psutil")

    s3 = cluster["s3"]
    extra = Proc([sys.executable, NODES, "worker", cluster["address"], "2"], _node_env())
    try:
        lost = extra.expect("READY", timeout=240)["node"]
        # One trial per worker node (2 CPUs each), so one trains on the node that dies.
        workers = 3 if cluster["unshared"] else 2
        alive = cluster["keeper"].ask(f"nodes {workers + 1}")  # the head, and the workers
        assert lost in alive, alive
        config = tmp_path / "lost.yaml"
        sweep = textwrap.dedent(SWEEP % {"iterations": 10})
        grid = ", ".join(str(256.0 * 2**i) for i in range(workers))
        sweep = sweep.replace("grid: [256.0, 512.0]", f"grid: [{grid}]")
        sweep = sweep.replace("max_concurrent_trials: 2, max_failures: 0", "max_failures: 1")
        config.write_text(sweep)
        prefix = "experiments/lost"
        log = open(tmp_path / "lost.log", "w")  # noqa: SIM115
        proc = _cli(cluster, str(config), s3.uri("experiments"), "lost", stdout=log,
                    stderr=subprocess.STDOUT)  # fmt: skip
        # Each trial takes a whole worker (the head has no CPUs), so one trains on the extra
        # node: once every trial has two checkpoints in the bucket, kill that node's raylet.
        deadline = time.time() + 420
        victim = None
        while time.time() < deadline and proc.poll() is None and victim is None:
            counts: dict[str, int] = {}
            for p in s3.list(prefix):
                if p.endswith("/algorithm_state.pkl"):
                    trial = posixpath.dirname(posixpath.dirname(p))
                    counts[trial] = counts.get(trial, 0) + 1
            if len(counts) == workers and all(n >= 2 for n in counts.values()):
                raylets = [
                    c for c in psutil.Process(extra.p.pid).children(recursive=True)
                    if c.name() == "raylet"
                ]  # fmt: skip
                assert len(raylets) == 1, raylets
                raylets[0].kill()
                victim = raylets[0].pid
            time.sleep(1)
        assert victim is not None, (tmp_path / "lost.log").read_text()[-3000:]
        status = proc.wait(timeout=600)
        log.close()
    finally:
        if "proc" in locals() and proc.poll() is None:
            proc.kill()
        extra.stop()
    out = (tmp_path / "lost.log").read_text()
    assert status == 0, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    table = pq.read_table(f"{s3.bucket}/{prefix}/results.parquet", filesystem=s3.fs).to_pylist()
    assert len(table) == workers and all(r["status"] == "DONE" for r in table), table
    assert all(r["training_iteration"] == 10 for r in table), table
    # The lost node's trial restarted from a checkpoint in the bucket, not from iteration 0:
    # a result that is the first since a restore, past iteration 1.
    restored = []
    for row in table:
        trial_dir = row["checkpoint"].split("?")[0].removeprefix("s3://")
        trial_dir = posixpath.dirname(trial_dir)
        rows = _results_in_bucket(s3, trial_dir)
        restored += [
            r["training_iteration"] for r in rows
            if r["iterations_since_restore"] == 1 and r["training_iteration"] > 1
        ]  # fmt: skip
    assert restored, "no trial continued from a checkpoint after the node was lost"
    assert lost in set(cluster["keeper"].ask("actors AmpPPO"))  # a trial ran on the lost node
