"""A sweep on a multi-node cluster survives losing a worker node. (That trials run on the
workers of a cluster whose head has no CPUs is shown in test_storage.py, on its S3 sweep.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def _cluster_sweep(tmp_path, tiny_file, *extra: str, iterations: int = 2) -> dict:
    """Runs sweep_on_cluster.py (its own Ray cluster, in a child process); returns its verdict
    after checking that both trials finished."""
    env = dict(os.environ, RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
    env.pop("RAY_ADDRESS", None)
    script = os.path.join(HERE, "sweep_on_cluster.py")
    config = tiny_file(tmp_path, iterations=iterations)
    proc = subprocess.run(
        [sys.executable, script, config, str(tmp_path), *extra],
        capture_output=True,
        text=True,
        timeout=540,
        env=env,
    )
    lines = [line for line in proc.stdout.splitlines() if line.startswith("VERDICT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-3000:]
    verdict = json.loads(lines[-1][len("VERDICT ") :])
    assert verdict["rc"] == 0  # every trial finished
    table = pq.read_table(str(tmp_path / "cluster" / "results.parquet")).to_pylist()
    assert len(table) == 2 and all(r["status"] == "DONE" for r in table)
    return verdict


@pytest.mark.slow  # slow (28 s): the default run keeps the cluster's node-local storage test
def test_sweep_survives_losing_a_worker_node(tmp_path, tiny_file):
    verdict = _cluster_sweep(tmp_path, tiny_file, "--remove-worker", iterations=6)
    assert verdict["removed"] == [verdict["worker"]], "the worker was not removed mid-sweep"
    assert verdict["spare"] in verdict["trial_nodes"]  # retried / run on the remaining worker
