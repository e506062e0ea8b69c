"""Learners publish the AMP metrics as Ray metrics, read back from the node's endpoint."""

from __future__ import annotations

import re
import time
import urllib.request
from types import SimpleNamespace

from rllib_amp import experiment as E
from rllib_amp.metrics import tag_learners_with_trial
from tests.integration.common import learner, train_until_learned


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
