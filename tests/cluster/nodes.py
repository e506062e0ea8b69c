"""Ray nodes for the multi-node tests, each in a process of its own (the test session already
holds a local Ray). Every node stays on 127.0.0.1.

    python nodes.py head          a ray.cluster_utils.Cluster: a 0-CPU head with the dashboard
                                  and one 2-CPU worker; answers commands on stdin
    python nodes.py worker GCS N  one N-CPU worker joining the cluster at GCS (run it under
                                  `unshare -m` to give it a disk of its own)

Both print ``READY {json}`` once up, and stop exactly the processes they started on "stop",
on end of input or on SIGTERM. The head's commands, one per line, each answered ``OK {json}``:
``nodes N`` waits until N nodes are alive and gives their ids; ``actors CLASS`` gives the node
id of every actor of that class (dead ones included).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time

os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"  # before ray: stay on 127.0.0.1


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _exit(*_: object) -> None:
    raise SystemExit(0)  # unwinds into the finally blocks that stop the nodes


def _say(tag: str, payload: object) -> None:
    print(f"{tag} {json.dumps(payload)}", flush=True)


def head() -> None:
    import ray
    from ray.cluster_utils import Cluster
    from ray.util.state import list_actors

    signal.signal(signal.SIGTERM, _exit)
    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 0, "include_dashboard": True, "dashboard_port": _free_port()},
    )
    try:
        worker = cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address, log_to_driver=False)
        _say(
            "READY",
            {
                "address": cluster.address,
                "session_dir": cluster.head_node.get_session_dir_path(),
                "head": cluster.head_node.node_id,
                "worker": worker.node_id,
            },
        )
        for line in sys.stdin:
            cmd, _, arg = line.strip().partition(" ")
            if cmd == "stop":
                break
            if cmd == "nodes":
                deadline = time.time() + 120
                while time.time() < deadline:
                    alive = [n["NodeID"] for n in ray.nodes() if n["Alive"]]
                    if len(alive) >= int(arg):
                        break
                    time.sleep(0.5)
                _say("OK", alive)
            elif cmd == "actors":
                actors = list_actors(filters=[("class_name", "=", arg)], detail=True, limit=1000)
                _say("OK", sorted({a.node_id for a in actors}))
    finally:
        ray.shutdown()
        cluster.shutdown()
        print("DOWN", flush=True)


def worker(gcs_address: str, num_cpus: int) -> None:
    from ray._private.node import Node
    from ray._private.parameter import RayParams

    stop = threading.Event()
    signal.signal(signal.SIGTERM, _exit)
    params = RayParams(gcs_address=gcs_address, node_ip_address="127.0.0.1", num_cpus=num_cpus)
    node = Node(params, head=False, shutdown_at_exit=True, spawn_reaper=True)
    try:
        _say("READY", {"node": node.node_id})
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
        stop.wait()
    finally:
        node.kill_all_processes(check_alive=False, allow_graceful=True)
        print("DOWN", flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "head":
        head()
    else:
        worker(sys.argv[2], int(sys.argv[3]))
