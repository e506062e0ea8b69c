"""cluster.yaml passes Ray's own cluster-config validator and keeps safe defaults."""

from __future__ import annotations

import os
import re

import yaml
from ray.autoscaler._private.util import prepare_config, validate_config

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PATH = os.path.join(ROOT, "cluster.yaml")


def load():
    with open(PATH, encoding="utf-8") as f:
        return yaml.safe_load(f)


def test_validates_against_rays_schema():
    validate_config(prepare_config(load()))  # raises on an invalid file


def test_head_and_gpu_workers_and_repo_install():
    cfg = load()
    head = cfg["available_node_types"][cfg["head_node_type"]]
    workers = [n for k, n in cfg["available_node_types"].items() if k != cfg["head_node_type"]]
    assert head["resources"].get("CPU") == 0  # the head schedules no trials
    assert workers and all(w["max_workers"] >= 1 for w in workers)
    assert any(w["node_config"]["InstanceType"].startswith(("g", "p")) for w in workers)
    assert cfg["file_mounts"] == {"~/rllib-amp": "."}
    assert any("pip install" in c and "~/rllib-amp" in c for c in cfg["setup_commands"])


def test_dashboard_on_localhost_auth_on_no_secrets():
    cfg = load()
    head_cmds = " ".join(cfg["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_cmds
    assert "0.0.0.0" not in head_cmds
    with open(PATH, encoding="utf-8") as f:
        text = f.read()
    code = "\n".join(line.split("#", 1)[0] for line in text.splitlines())
    assert "RAY_AUTH_MODE" not in code  # token authentication left on
    for pattern in (
        r"AKIA[0-9A-Z]{16}",
        r"aws_secret_access_key",
        r"-----BEGIN",
        r"ssh_private_key",
    ):
        assert not re.search(pattern, text, re.IGNORECASE), pattern
    # No security group opens Ray's ports to the world.
    assert "security_group" not in cfg["provider"]
