"""The dashboard as a user opens it: a `ray start --head` cluster on 127.0.0.1, a sweep sent
with `ray job submit`, a real Prometheus scraping Ray's metrics through the config Ray writes
into its session folder, every PromQL expression of sweep/grafana_dashboard.json run against it,
`ray job stop` then `--resume` losing nothing, and a headless-Chromium screenshot of the job's
page. Needs the Debian packages prometheus and chromium (install-dashboard-check.sh beside
this file); Grafana itself is not packaged for this machine and is not checked."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pyarrow.parquet as pq
import pytest

ROOT = Path(__file__).resolve().parents[3]
INSTALL = "bash tests/cli/sweep/install-dashboard-check.sh (apt-get install prometheus chromium)"
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (shutil.which("prometheus") and shutil.which("chromium")),
        reason=f"needs Prometheus and Chromium: {INSTALL}",
    ),
]

EXPERIMENT = """
algorithm: PPO
env: CartPole-v1
model: {fcnet_hiddens: [16]}
amp: {dtype: float16, init_scale: 1024.0}
training: {train_batch_size_per_learner: 200, minibatch_size: 100, num_epochs: 1}
resources: {num_env_runners: 0}
search:
  amp.growth_interval: {grid: [5, 2000]}
tune: {max_concurrent_trials: 1}
stop: {training_iteration: 60}
checkpoint: {frequency: 1, num_to_keep: 2}
seed: 0
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url: str, timeout: float = 10.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 - 127.0.0.1 only
        return r.read()


def _until(condition, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(1.0)
    raise AssertionError(f"{what}: not within {timeout_s:.0f} s")


def _end_own(proc: subprocess.Popen, temp_dir: str) -> None:
    """Stops exactly what this test started: its process group, and every process naming
    its Ray temp folder (Ray's daemons leave the group)."""
    import ray

    assert ray  # imported first: its own psutil (ray/thirdparty_files) joins the path
    import psutil

    for p in psutil.process_iter(["cmdline"]):
        if any(temp_dir in part for part in p.info.get("cmdline") or []):
            with contextlib.suppress(psutil.Error):
                p.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(30)


@pytest.fixture
def ray_head():
    """`ray start --head --block` on 127.0.0.1 with a temp folder of its own; yields its
    addresses and session folder."""
    temp_dir = tempfile.mkdtemp(prefix="rdash", dir="/tmp")
    # Every port its own: another Ray on this machine holds the defaults (the job agent's 52365).
    gcs, dashboard, metrics, agent, agent_grpc = (_free_port() for _ in range(5))
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    # As cluster.yaml's head: `ray job stop` waits 60 s, not Ray's 3 s, before its SIGKILL
    # (on a loaded machine the sweep's summary came after those 3 s and was cut off).
    env["RAY_JOB_STOP_WAIT_TIME_S"] = "60"
    cmd = ["ray", "start", "--head", "--block", "--node-ip-address=127.0.0.1",
           "--dashboard-host=127.0.0.1", f"--port={gcs}", f"--dashboard-port={dashboard}",
           f"--metrics-export-port={metrics}", f"--dashboard-agent-listen-port={agent}",
           f"--dashboard-agent-grpc-port={agent_grpc}", f"--temp-dir={temp_dir}", "--num-cpus=2",
           "--disable-usage-stats"]  # fmt: skip
    log = open(os.path.join(temp_dir, "head.log"), "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                            start_new_session=True)  # fmt: skip
    try:
        dashboard_url = f"http://127.0.0.1:{dashboard}"
        try:
            _until(lambda: _answers(f"{dashboard_url}/api/version"), 120, "the dashboard")
        except AssertionError as e:
            log.flush()
            with open(os.path.join(temp_dir, "head.log"), encoding="utf-8") as f:
                raise AssertionError(f"{e}; ray start printed: {f.read()[-3000:]}") from None
        session = os.path.realpath(os.path.join(temp_dir, "session_latest"))
        yield {"dashboard": dashboard_url, "session": session, "env": env,
               "gcs": f"127.0.0.1:{gcs}"}  # fmt: skip
    finally:
        _end_own(proc, temp_dir)
        log.close()
        shutil.rmtree(temp_dir, ignore_errors=True)


def _answers(url: str) -> bool:
    try:
        _get(url, timeout=3)
        return True
    except OSError:
        return False


@pytest.fixture
def prometheus(ray_head, tmp_path):
    """Prometheus on 127.0.0.1 with the scrape config Ray wrote into its session folder."""
    config = os.path.join(ray_head["session"], "metrics", "prometheus", "prometheus.yml")
    assert os.path.isfile(config), os.listdir(ray_head["session"])
    port = _free_port()
    proc = subprocess.Popen(
        ["prometheus", f"--config.file={config}", f"--web.listen-address=127.0.0.1:{port}",
         f"--storage.tsdb.path={tmp_path / 'tsdb'}"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        url = f"http://127.0.0.1:{port}"
        _until(lambda: _answers(f"{url}/-/ready"), 60, "Prometheus")
        yield url
    finally:
        proc.kill()
        proc.wait(30)


def _query(prometheus_url: str, expr: str) -> list[dict]:
    url = f"{prometheus_url}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    answer = json.loads(_get(url))
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def _dashboard_queries() -> list[str]:
    with open(ROOT / "rllib_amp" / "sweep" / "grafana_dashboard.json", encoding="utf-8") as f:
        board = json.load(f)
    exprs = [t["expr"] for p in board["panels"] for t in p.get("targets", [])]
    # Grafana fills its variables; "all values" is the regex .* for each.
    return [e.replace('"$SessionName"', '".*"').replace('"$trial"', '".*"')
             .replace('"$module"', '".*"') for e in exprs]  # fmt: skip


def _job(ray_head, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ray", "job", *args], capture_output=True, text=True, timeout=timeout,
        env=dict(ray_head["env"], RAY_ADDRESS=ray_head["dashboard"]),
    )  # fmt: skip


def test_the_dashboard_prometheus_and_a_stopped_job_as_a_user_sees_them(
    ray_head, prometheus, tmp_path
):
    (tmp_path / "dash.yaml").write_text(textwrap.dedent(EXPERIMENT))
    storage = tmp_path / "runs"
    sweep = [sys.executable, "-m", "rllib_amp.tune", "--config", str(tmp_path / "dash.yaml"),
             "--storage-path", str(storage), "--name", "dash"]  # fmt: skip
    runtime_env = json.dumps({"env_vars": {"PYTHONPATH": str(ROOT)}})
    submit = ["submit", "--no-wait", "--submission-id", "rllib-amp-dash",
              "--runtime-env-json", runtime_env, "--", *sweep]  # fmt: skip
    # The head's job agent comes up a few seconds after its dashboard answers.
    submitted = _until(lambda: _job(ray_head, *submit).returncode == 0, 90, "ray job submit")
    assert submitted

    # 1. Every PromQL expression of the Grafana dashboard returns series tagged with a trial.
    queries = _dashboard_queries()

    def every_query_answers():
        results = [_query(prometheus, q) for q in queries]
        return results if all(results) else None

    results = _until(every_query_answers, 240, "a series for every dashboard query")
    for expr, series in zip(queries, results, strict=True):
        for s in series:
            assert s["metric"].get("trial") and s["metric"].get("module"), (expr, s)
    print({q: [s["metric"] for s in r] for q, r in zip(queries, results, strict=True)})

    # 2. A screenshot of the job's page, as a browser renders it.
    shot = tmp_path / "dashboard-job.png"
    subprocess.run(
        ["chromium", "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
         "--window-size=1400,900", "--virtual-time-budget=15000", f"--screenshot={shot}",
         f"{ray_head['dashboard']}/#/jobs/rllib-amp-dash"],
        capture_output=True, timeout=120,
    )  # fmt: skip
    assert shot.is_file() and shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("RLLIB_AMP_SCREENSHOT"):  # where docs/metrics.md's copy comes from
        shutil.copy(shot, os.environ["RLLIB_AMP_SCREENSHOT"])

    # 3. `ray job stop`: the sweep stops as on SIGTERM and saves; --resume loses nothing.
    pattern = str(storage / "dash" / "*" / "result.json")
    before = {f: Path(f).read_text().splitlines() for f in glob.glob(pattern)}
    stopped = _job(ray_head, "stop", "rllib-amp-dash")
    assert stopped.returncode == 0, stopped.stdout + stopped.stderr
    logs = _job(ray_head, "logs", "rllib-amp-dash").stdout
    assert "SIGTERM: stopping; saving the experiment state" in logs, logs[-3000:]
    assert "--resume" in logs.strip().splitlines()[-1], logs[-3000:]
    resumed = subprocess.run(
        [*sweep, "--resume", "--address", ray_head["gcs"]], capture_output=True, text=True,
        timeout=900, env=dict(ray_head["env"], PYTHONPATH=str(ROOT)),
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    rows = pq.read_table(str(storage / "dash" / "results.parquet")).to_pylist()
    assert [r["status"] for r in rows] == ["DONE", "DONE"], rows
    for f, lines in before.items():  # every row written before the stop is still there
        assert Path(f).read_text().splitlines()[: len(lines)] == lines
