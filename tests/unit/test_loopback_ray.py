"""A Ray a command starts in its own process stays on 127.0.0.1; one that joins a cluster is
left as Ray sets it. Checked in fresh interpreters without the switch the test session sets
(conftest keeps every test's Ray on 127.0.0.1 already), as a user's shell starts them."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rllib_amp.cli import LOOPBACK_RAY_ENV

PROBE = (
    "import sys\n"
    "from rllib_amp.cli import local_ray_on_loopback\n"
    "set = local_ray_on_loopback(sys.argv[1:])\n"
    "from ray._private import ray_constants, services\n"
    "print(set, ray_constants.ENABLE_RAY_CLUSTER, services.get_node_ip_address())\n"
)


def _probe(args, **env):
    clean = {k: v for k, v in os.environ.items() if k not in (LOOPBACK_RAY_ENV, "RAY_ADDRESS")}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *args],
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.split()


def test_a_local_ray_is_put_on_loopback_before_ray_loads():
    assert _probe(["--config", "x.yaml"]) == ["True", "False", "127.0.0.1"]


@pytest.mark.parametrize(
    "args, env",
    [
        (["--address", "auto"], {}),
        (["--address=127.0.0.1:6379"], {}),
        (["--addr", "auto"], {}),  # argparse's abbreviation
        ([], {"RAY_ADDRESS": "auto"}),
    ],
)
def test_a_command_that_joins_a_cluster_is_left_as_ray_sets_it(args, env):
    # Joining a multi-node cluster with the switch at "0" is refused by Ray.
    assert _probe(args, **env)[:2] == ["False", "True"]
