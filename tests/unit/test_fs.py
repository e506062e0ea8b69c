"""fs: one rule for "is this a URI", the one checkpoint-folder listing, the one decoder."""

from __future__ import annotations

import pickle

import pyarrow.fs
import pytest

from rllib_amp import fs
from rllib_amp.settings import WarmStart
from rllib_amp.sweep import storage


@pytest.mark.parametrize(
    "location, uri",
    [
        ("s3://bucket/exp", True),
        ("gs://bucket/exp", True),
        ("file:///tmp/x", True),
        ("C://runs", False),  # a drive letter, not a scheme
        ("C:/runs", False),
        ("runs:2", False),
        ("~/ray_results", False),
        ("/abs/path", False),
    ],
)
def test_one_rule_for_uris_everywhere(location, uri):
    assert fs.is_uri(location) is uri
    assert storage.is_uri(location) is uri
    if not uri:  # resolving an s3:// URI would ask the network for the bucket's region
        assert fs.resolve(location)[0].type_name == "local"


def test_home_is_expanded_for_local_paths_everywhere(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "ckpt").mkdir()
    assert fs.resolve("~/ckpt")[1] == str(tmp_path / "ckpt")
    assert WarmStart.parse({"from": "~/ckpt"}).path == str(tmp_path / "ckpt")
    assert storage.resolve("~/runs", None, {}) == str(tmp_path / "runs")


def test_checkpoint_folders_are_newest_first_and_never_moved_aside_ones(tmp_path):
    for name in ("checkpoint_000002", "checkpoint_000010", "checkpoint_000011.damaged"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint_000012").write_text("a file, not a folder")
    local = pyarrow.fs.LocalFileSystem()
    assert fs.checkpoint_folders(local, str(tmp_path)) == [
        str(tmp_path / "checkpoint_000010"),
        str(tmp_path / "checkpoint_000002"),
    ]


def test_decode_reads_each_state_format_and_refuses_others(tmp_path):
    import msgpack

    assert fs.decode("a/state.pkl", pickle.dumps({"x": 1})) == {"x": 1}
    assert fs.decode("a/state.msgpack", msgpack.packb({"x": 1})) == {"x": 1}
    with pytest.raises(ValueError, match=r"^a/state\.txt: no state file"):
        fs.decode("a/state.txt", b"")


def test_write_then_read_bytes_makes_the_folder(tmp_path):
    local, path = fs.resolve(tmp_path / "deep" / "er" / "f.bin")
    fs.write_bytes(local, path, b"\x00\x01")
    assert fs.read_bytes(local, path) == b"\x00\x01"
