"""cluster.yaml passes Ray's own cluster-config validator, keeps safe defaults, and gives every
node the same shared storage (an S3 bucket named once)."""

from __future__ import annotations

import os
import re
import shlex

import yaml
from ray.autoscaler._private.aws.config import DEFAULT_RAY_INSTANCE_PROFILE
from ray.autoscaler._private.util import prepare_config, validate_config

from rllib_amp.fs import is_uri
from rllib_amp.sweep import storage

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
    # `ray job stop` waits for the sweep's summary instead of Ray's 3 s before SIGKILL.
    assert "RAY_JOB_STOP_WAIT_TIME_S=60 ray start --head" in head_cmds
    # Every node's torch threads sleep when idle, as on the local Ray the command starts.
    for cmds in (cfg["head_start_ray_commands"], cfg["worker_start_ray_commands"]):
        assert "OMP_WAIT_POLICY=PASSIVE" in " ".join(cmds)
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


def _storage_command(cfg) -> str:
    return cfg["metadata"]["rllib_amp_storage"]


def test_every_node_defaults_the_cli_to_one_s3_bucket_named_once():
    cfg = load()
    command = _storage_command(cfg)
    # The command writes `export RLLIB_AMP_STORAGE=s3://...` to a file every shell sources.
    words = shlex.split(command)
    assert words[0] == "echo" and words[2] == ">"
    name, _, uri = words[1].removeprefix("export ").partition("=")
    assert name == storage.STORAGE_ENV
    assert uri.startswith("s3://") and is_uri(uri)
    env_file = words[3]
    # It runs on every node (setup_commands are the head's and the workers'), and Ray sources
    # ~/.bashrc before each command, ray start included.
    assert cfg["setup_commands"][0] == command
    assert any(f"source {env_file}" in c and "~/.bashrc" in c for c in cfg["setup_commands"])
    assert "head_setup_commands" not in cfg and "worker_setup_commands" not in cfg
    # Named once: the bucket appears in one line of the file (the anchor's).
    bucket = uri.removeprefix("s3://").split("/")[0]
    with open(PATH, encoding="utf-8") as f:
        lines = [line for line in f if bucket in line and not line.lstrip().startswith("#")]
    assert len(lines) == 1, lines


def test_every_node_may_write_the_bucket():
    cfg = load()
    head = cfg["available_node_types"][cfg["head_node_type"]]
    # Without a profile of its own, Ray gives the head its default one, which allows S3 ...
    assert "IamInstanceProfile" not in head["node_config"]
    # ... and to the head only: the workers name it themselves.
    for name, node in cfg["available_node_types"].items():
        if name != cfg["head_node_type"]:
            assert node["node_config"]["IamInstanceProfile"] == {
                "Name": DEFAULT_RAY_INSTANCE_PROFILE
            }
