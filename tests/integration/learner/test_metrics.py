"""Learners publish the AMP metrics as Ray metrics, read back from the node's endpoint; the
Grafana dashboard shipped for them queries exactly those metrics. Every result carries the AMP
metrics, also an iteration in which no update finished, and APPO reports the grad scale after
the iteration's last update."""

from __future__ import annotations

import json
import math
import numbers
import os
import re
import threading
import time
import urllib.request
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

import rllib_amp.learner.mixin as mixin
from rllib_amp import experiment as E
from rllib_amp.learner import metrics as M
from rllib_amp.learner.metrics import tag_learners_with_trial
from rllib_amp.sweep import grafana as G
from rllib_amp.sweep import main as tune_cli
from tests.integration.common import amp_config, learner, train_until_learned

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def _scrape(url: str) -> str:
    with urllib.request.urlopen(url, timeout=5) as r:
        return r.read().decode()


def test_amp_metrics_reach_the_nodes_prometheus_endpoint(ray_metrics_url, tmp_path):
    (tmp_path / "m.yaml").write_text(
        "algorithm: PPO\nenv: CartPole-v1\nmodel: {fcnet_hiddens: [8]}\n"
        "amp: {dtype: float16, init_scale: 4096}\n"
        "training: {train_batch_size_per_learner: 128, minibatch_size: 64, num_epochs: 1}\n"
        "resources: {num_env_runners: 0}\nstop: {training_iteration: 1}\n"
    )
    cfg = E.load(str(tmp_path / "m.yaml")).algorithm_config()
    assert cfg.callbacks_on_algorithm_init is tag_learners_with_trial
    algo = cfg.build_algo()
    try:
        # What Tune's trial does at init, with a trial name no other test uses.
        tag_learners_with_trial(
            algorithm=SimpleNamespace(trial_name="metrics-test", learner_group=algo.learner_group)
        )
        assert learner(algo)._amp_trial == "metrics-test"
        train_until_learned(algo)
        scale = learner(algo).amp_scalers["default_policy"].get_scale()
        deadline = time.time() + 60
        found = {}
        while time.time() < deadline:
            text = _scrape(ray_metrics_url)
            for name in ("grad_scale", "skipped_steps", "skip_fraction"):
                m = re.search(
                    rf'^ray_rllib_amp_{name}\{{[^}}]*module="default_policy"[^}}]*'
                    rf'trial="metrics-test"[^}}]*\}} (\S+)$',
                    text,
                    re.M,
                )
                if m:
                    found[name] = float(m.group(1))
            if len(found) == 3:
                break
            train_until_learned(algo)  # keep the gauges fresh while Ray exports them
            scale = learner(algo).amp_scalers["default_policy"].get_scale()
            time.sleep(1)
        assert set(found) == {"grad_scale", "skipped_steps", "skip_fraction"}, found
        assert found["grad_scale"] in (scale, scale / 2, scale * 2)  # one update of lag at most
        assert found["skipped_steps"] >= 0 and 0 <= found["skip_fraction"] <= 1
    finally:
        algo.stop()


# -- the Grafana dashboard ------------------------------------------------------------------
def _dashboard() -> dict:
    with open(G.GRAFANA_DASHBOARD, encoding="utf-8") as f:
        return json.load(f)


def test_dashboard_is_a_valid_grafana_dashboard():
    d = _dashboard()
    assert d["title"] and d["uid"] and len(d["uid"]) <= 40  # Grafana's uid limit
    assert isinstance(d["schemaVersion"], int) and d["panels"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource"
    assert variables["datasource"]["query"] == "prometheus"
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in d["panels"]:
        assert p["type"] == "timeseries" and p["title"] and p["datasource"] == "${datasource}"
        g = p["gridPos"]
        assert all(isinstance(g[k], int) for k in "hwxy") and g["w"] > 0 and g["x"] + g["w"] <= 24
        # panels do not overlap on Grafana's 24-column grid
        mine = {
            (x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])
        }
        assert not cells & mine, p["title"]
        cells |= mine
        refs = [t["refId"] for t in p["targets"]]
        assert len(refs) == len(set(refs)) and all(t["expr"] for t in p["targets"])
        for t in p["targets"]:
            # every $variable a query uses is defined, and the legend names trial and module
            assert set(re.findall(r"\$(\w+)", t["expr"])) <= set(variables), t["expr"]
            assert "{{trial}}" in t["legendFormat"] and "{{module}}" in t["legendFormat"]
    # shipped in the wheel, not only in a checkout
    with open(os.path.join(ROOT, "pyproject.toml"), encoding="utf-8") as f:
        package_data = f.read().split("[tool.setuptools.package-data]", 1)[1].split("\n[")[0]
    assert f'"rllib_amp.sweep" = ["{os.path.basename(G.GRAFANA_DASHBOARD)}"]' in package_data
    assert os.path.dirname(G.GRAFANA_DASHBOARD) == os.path.join(ROOT, "rllib_amp", "sweep")


def test_dashboard_queries_exactly_the_metrics_the_learners_export():
    d = _dashboard()
    exported = {f"ray_{name}" for name, _ in M.RAY_METRICS.values()}
    queried = {
        name
        for p in d["panels"]
        for t in p["targets"]
        for name in re.findall(r"\bray_\w+", t["expr"])
    }
    assert queried == exported
    variable_queries = " ".join(str(v.get("definition", "")) for v in d["templating"]["list"])
    assert set(re.findall(r"\bray_\w+", variable_queries)) <= exported
    # grouped by the tags the gauges carry
    for p in d["panels"]:
        for t in p["targets"]:
            assert all(f"{tag}=~" in t["expr"] for tag in M.TAG_KEYS), t["expr"]


def test_dashboard_is_installed_where_rays_grafana_provisioning_reads(tmp_path, monkeypatch):
    monkeypatch.delenv(G.GRAFANA_OUTPUT_DIR_ENV, raising=False)
    monkeypatch.delenv(G.METRICS_ROOT_ENV, raising=False)
    session = tmp_path / "session"
    session.mkdir()
    assert G.install_dashboard(str(session), wait_s=0.1) is None  # not a head
    folder = session / "metrics" / "grafana" / "dashboards"
    folder.mkdir(parents=True)
    (folder / G.RAY_DEFAULT_DASHBOARD).write_text("{}")  # Ray has written its provisioning
    path = G.install_dashboard(str(session))
    assert path == str(folder / G.GRAFANA_DASHBOARD_NAME)
    assert json.loads((folder / G.GRAFANA_DASHBOARD_NAME).read_text()) == _dashboard()
    elsewhere = tmp_path / "provisioned"
    monkeypatch.setenv(G.GRAFANA_OUTPUT_DIR_ENV, str(elsewhere))
    assert G.install_dashboard(str(session)) == str(elsewhere / G.GRAFANA_DASHBOARD_NAME)


# About 14 s on 2 cores; slow to keep the default run under 8 minutes. The default run keeps
# test_amp_metrics_reach_the_nodes_prometheus_endpoint (the same endpoint, one algorithm).
@pytest.mark.slow
def test_after_a_tiny_sweep_the_dashboards_metrics_are_on_the_prometheus_endpoint(
    ray_metrics_url, tmp_path, capsys, tiny_file
):
    """The sweep CLI on the session's Ray; the endpoint is read while and after it runs."""
    exported = sorted(f"ray_{name}" for name, _ in M.RAY_METRICS.values())
    seen: dict[str, set[str]] = {name: set() for name in exported}
    done = threading.Event()

    def scrape() -> None:
        while True:
            text = _scrape(ray_metrics_url)
            for name in exported:
                seen[name] |= set(re.findall(rf'^{name}\{{[^}}]*trial="([^"]+)"', text, re.M))
            if done.wait(1.0):
                return

    scraper = threading.Thread(target=scrape, daemon=True)
    scraper.start()
    try:
        rc = tune_cli.main(
            ["--config", tiny_file(tmp_path, iterations=3), "--storage-path", str(tmp_path),
             "--name", "metrics", "--num-samples", "1"]
        )  # fmt: skip
        assert rc == 0, capsys.readouterr().out[-3000:]
        deadline = time.time() + 30  # Ray exports metrics every few seconds
        while time.time() < deadline and not all(seen.values()):
            time.sleep(1)
    finally:
        done.set()
        scraper.join(timeout=30)
    trial_ids = {
        r["trial_id"]
        for r in pq.read_table(str(tmp_path / "metrics" / "results.parquet")).to_pylist()
    }
    for name in exported:
        assert any(tid in tag for tag in seen[name] for tid in trial_ids), (name, seen[name])


# APPO reports the grad scale after the iteration's last update, not a mean over its
# updates. Its learner thread runs many updates per iteration.


MODULE = "default_policy"
UPDATE_NO = "test_update_no"


@pytest.mark.usefixtures("ray_local")
def test_appo_reports_the_scale_after_the_last_update_it_reports(monkeypatch):
    # The scale after every update, and each update's number in the results: the number a
    # result carries (a max) says which update the reported scale must be of.
    scales: list[float] = []
    report_update = mixin.report_update

    def recording(metrics, scalers, **kwargs):
        report_update(metrics, scalers, **kwargs)
        scales.append(scalers[MODULE].get_scale())
        metrics.log_value((MODULE, UPDATE_NO), len(scales) - 1, reduce="max", window=1)

    monkeypatch.setattr(mixin, "report_update", recording)
    # float16 and a scale that doubles after every step it does not halve: it moves in
    # every update.
    cfg = amp_config("APPO", dtype="float16", init_scale=2.0**4, growth_interval=1)
    cfg.training(circular_buffer_num_batches=2, circular_buffer_iterations_per_batch=2)
    cfg.env_runners(num_env_runners=0)
    algo = cfg.build_algo()
    try:
        stats = train_until_learned(algo, iterations=2)["learners"][MODULE]
    finally:
        algo.stop()
    last = int(stats[UPDATE_NO])
    covered = scales[: last + 1]
    assert len(set(covered)) > 1, covered  # the scale moved: a mean would differ
    assert stats[M.GRAD_SCALE] == scales[last], (stats[M.GRAD_SCALE], covered)
    assert not math.isnan(stats[M.GRAD_SCALE])


# Every result carries the AMP metrics, also an iteration in which no update finished: the
# first iterations of APPO (its learner thread has no batch yet), also right after a restore.
# Before, those results read None/NaN for every AMP metric in the progress table and summary.


KEYS = (
    M.GRAD_SCALE,
    M.SKIP_FRACTION,
    M.OPTIMIZER_STEPS_LIFETIME,
    M.SKIPPED_STEPS_LIFETIME,
    M.NONFINITE_LOSS_STEPS_LIFETIME,
)


def _amp_values(result) -> dict[str, float]:
    stats = result.get("learners", {}).get("default_policy", {})
    return {key: stats.get(key) for key in KEYS}


def _finite(values) -> bool:
    return all(isinstance(v, numbers.Real) and math.isfinite(v) for v in values.values())


@pytest.mark.slow  # APPO with a remote env runner, a save and a restore: 18 s on 2 idle cores
@pytest.mark.usefixtures("ray_local")
def test_the_first_appo_iterations_after_a_restore_report_the_restored_scaler(tmp_path):
    cfg = amp_config("APPO", dtype="float16", init_scale=2.0**10, growth_interval=1000)
    a = cfg.build_algo()
    try:
        first = a.train()
        assert _finite(_amp_values(first)), _amp_values(first)  # before any update
        assert _amp_values(first)[M.GRAD_SCALE] == 2.0**10
        train_until_learned(a, iterations=2)
        a.save_to_path(str(tmp_path))
        saved = learner(a).amp_scalers["default_policy"].get_scale()
    finally:
        a.stop()
    b = cfg.build_algo()
    try:
        b.restore_from_path(str(tmp_path))
        after = [_amp_values(b.train()) for _ in range(3)]
    finally:
        b.stop()
    assert all(_finite(values) for values in after), after
    assert after[0][M.GRAD_SCALE] == saved, (after, saved)
