"""Logs people already read: TensorBoard event files with the AMP scalars; the W&B flag."""

from __future__ import annotations

import glob
import importlib.util
import struct
from pathlib import Path

import pytest

from rllib_amp.sweep import main as cli

HAS_WANDB = importlib.util.find_spec("wandb") is not None


def read_scalars(path: str) -> dict[str, list[float]]:
    """tag -> values of one TensorBoard event file (TFRecord framing, Event protos)."""
    from tensorboardX.proto.event_pb2 import Event

    out: dict[str, list[float]] = {}
    with open(path, "rb") as f:
        data = f.read()
    i = 0
    while i + 12 <= len(data):
        (length,) = struct.unpack("<Q", data[i : i + 8])
        record = data[i + 12 : i + 12 + length]
        i += 12 + length + 4  # length, its crc, the record, its crc
        event = Event.FromString(record)
        for value in event.summary.value:
            out.setdefault(value.tag, []).append(value.simple_value)
    return out


def run_tiny(tmp_path, tiny_file, capsys, name: str, *flags: str) -> None:
    """One tiny trial through the CLI, into tmp_path/name."""
    config = tiny_file(tmp_path, scales=(1024.0,))
    rc = cli.main(["--config", config, "--storage-path", str(tmp_path), "--name", name, *flags])
    assert rc == 0, capsys.readouterr().out[-3000:]


@pytest.mark.usefixtures("ray_local")
def test_tensorboard_event_files_hold_the_amp_scalars(tmp_path, tiny_file, capsys):
    pytest.importorskip("tensorboardX", reason="Tune writes TensorBoard files with tensorboardX")
    run_tiny(tmp_path, tiny_file, capsys, "tb")
    files = glob.glob(str(tmp_path / "tb" / "*" / "events.out.tfevents.*"))
    assert files
    scalars: dict[str, list[float]] = {}
    for f in files:
        scalars.update(read_scalars(f))
    scale = [
        v for tag, v in scalars.items() if tag.endswith("learners/default_policy/amp_grad_scale")
    ]
    assert scale and all(x >= 1.0 for x in scale[0]), sorted(scalars)[:40]
    assert any(t.endswith("learners/default_policy/amp_skip_fraction") for t in scalars)


def test_wandb_flag_without_wandb_exits_2_naming_the_install(tmp_path, capsys):
    if HAS_WANDB:
        pytest.skip("wandb is installed: the flag is accepted")
    rc = cli.main(["--wandb-project", "p", "--dry-run"])
    err = capsys.readouterr().err
    assert rc == 2 and "pip install wandb" in err and err.count("\n") == 1


@pytest.mark.skipif(not HAS_WANDB, reason="wandb is not installed (pip install wandb)")
@pytest.mark.usefixtures("ray_local")
def test_wandb_logs_offline(tmp_path, tiny_file, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    run_tiny(tmp_path, tiny_file, capsys, "wb", "--wandb-project", "rllib-amp-test")
    assert glob.glob(str(tmp_path / "**" / "offline-run-*"), recursive=True)
    # The run's record file (protobuf records) holds the AMP scalars' keys.
    records = glob.glob(str(tmp_path / "**" / "offline-run-*" / "run-*.wandb"), recursive=True)
    assert records and any(b"amp_grad_scale" in Path(f).read_bytes() for f in records)
