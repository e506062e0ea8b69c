"""Runs a tiny sweep on a two-node ray.cluster_utils.Cluster; prints a JSON verdict.

A separate process, because the test session already holds its own local Ray.
Usage: python sweep_on_cluster.py CONFIG STORAGE [--remove-worker]
With --remove-worker the cluster has two workers and one of them is removed once the first
trial result is in; the sweep must still finish (trials retried on the other worker).
"""

from __future__ import annotations

import json
import os
import sys

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # keep every node on 127.0.0.1

import ray  # noqa: E402
from ray.cluster_utils import Cluster  # noqa: E402

from rllib_amp.sweep import main as cli


def main() -> int:
    config, storage = sys.argv[1], sys.argv[2]
    remove = "--remove-worker" in sys.argv[3:]
    import socket

    with socket.socket() as sock:  # any free port: 8265 may be taken by another Ray
        sock.bind(("127.0.0.1", 0))
        dashboard_port = sock.getsockname()[1]
    cluster = Cluster(
        initialize_head=True,
        # The head runs no trial; its dashboard serves the state API used below.
        head_node_args={"num_cpus": 0, "include_dashboard": True, "dashboard_port": dashboard_port},
    )
    try:
        worker = cluster.add_node(num_cpus=2)
        spare = cluster.add_node(num_cpus=2) if remove else None
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        removed = []
        if remove:
            import glob
            import threading
            import time

            def remove_worker_mid_sweep() -> None:
                deadline = time.time() + 300
                while time.time() < deadline:
                    if glob.glob(os.path.join(storage, "cluster", "*", "checkpoint_*")):
                        cluster.remove_node(worker)
                        removed.append(worker.node_id)
                        return
                    time.sleep(0.2)

            threading.Thread(target=remove_worker_mid_sweep, daemon=True).start()
        rc = cli.main(["--config", config, "--address", cluster.address,
                       "--storage-path", storage, "--name", "cluster"])  # fmt: skip
        from ray.util.state import list_actors

        trial_nodes = {
            a.node_id
            for a in list_actors(filters=[("class_name", "=", "AmpPPO")], detail=True, limit=1000)
        }
        print(
            "VERDICT "
            + json.dumps(
                {
                    "rc": rc,
                    "trial_nodes": sorted(trial_nodes),
                    "worker": worker.node_id,
                    "spare": spare.node_id if spare else None,
                    "removed": removed,
                    "head": cluster.head_node.node_id,
                }
            )
        )
        return 0
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    raise SystemExit(main())
