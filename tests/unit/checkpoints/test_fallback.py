"""newest_intact_checkpoint / resume_from_intact_checkpoints on trial folders (no Ray runtime)."""

from __future__ import annotations

import json
import logging
import os
import pickle
import socket

import numpy as np
import pyarrow.fs
import pytest
from ray.train import Checkpoint, CheckpointConfig
from ray.train._internal.checkpoint_manager import _CheckpointManager
from ray.train._internal.session import _TrainingResult
from ray.tune.trainable.metadata import _TrainingRunMetadata

from rllib_amp.checkpoint_files import write_manifest
from rllib_amp.checkpoints.fallback import (
    KEPT_ASIDE_FILE,
    NoIntactCheckpointError,
    _move_aside,
    intact_checkpoint_before,
    is_kept_aside,
    newest_intact_checkpoint,
    resume_from_intact_checkpoints,
)

WEIGHTS = "learner_group/learner/rl_module/default_policy/module_state.pkl"


def _checkpoint(folder, iteration):
    os.makedirs(folder / os.path.dirname(WEIGHTS))
    with open(folder / WEIGHTS, "wb") as f:
        pickle.dump({"pi.weight": np.full((4, 4), float(iteration), dtype=np.float32)}, f)
    with open(folder / "algorithm_state.pkl", "wb") as f:
        pickle.dump({"training_iteration": iteration}, f)
    write_manifest(folder)


def _damage(folder):
    target = folder / "algorithm_state.pkl"
    target.write_bytes(target.read_bytes()[:5])
    return str(target)


def _trial(root, n=3):
    root.mkdir(parents=True)
    for i in range(n):
        _checkpoint(root / f"checkpoint_{i:06d}", i + 1)
    return root


def test_newest_intact_checkpoint_skips_damaged_newer_ones(tmp_path):
    trial = _trial(tmp_path / "trial", n=3)
    _checkpoint(trial / "checkpoint_000010", 11)  # numbered past 9: order is by number
    files = [_damage(trial / "checkpoint_000010"), _damage(trial / "checkpoint_000002")]
    choice = newest_intact_checkpoint(trial)
    assert choice.intact == str(trial / "checkpoint_000001")
    assert [d.path for d in choice.damaged] == [
        str(trial / "checkpoint_000010"),
        str(trial / "checkpoint_000002"),
    ]
    assert [d.file for d in choice.damaged] == files
    assert all(d.moved_to is None for d in choice.damaged)
    assert (trial / "checkpoint_000002").is_dir()  # nothing moved unless asked
    line = choice.describe()
    assert str(trial / "checkpoint_000001") in line and str(trial / "checkpoint_000002") in line


def test_damaged_checkpoints_are_moved_aside_never_deleted(tmp_path):
    trial = _trial(tmp_path / "trial", n=3)
    (trial / "checkpoint_000002.damaged").mkdir()  # an earlier fallback's leftover
    _damage(trial / "checkpoint_000002")
    before = (trial / "checkpoint_000002" / WEIGHTS).read_bytes()
    choice = newest_intact_checkpoint(trial, move_damaged=True)
    moved = trial / "checkpoint_000002.damaged-2"
    assert [d.moved_to for d in choice.damaged] == [str(moved)]
    assert not (trial / "checkpoint_000002").exists()
    assert (moved / WEIGHTS).read_bytes() == before
    assert choice.intact == str(trial / "checkpoint_000001")
    # The moved-aside folder is no checkpoint any more: a second look finds nothing damaged.
    assert newest_intact_checkpoint(trial).damaged == ()


def test_without_an_intact_checkpoint_nothing_is_moved(tmp_path):
    trial = _trial(tmp_path / "trial", n=2)
    _damage(trial / "checkpoint_000000")
    _damage(trial / "checkpoint_000001")
    choice = newest_intact_checkpoint(trial, move_damaged=True)
    assert choice.intact is None and len(choice.damaged) == 2
    assert (trial / "checkpoint_000000").is_dir() and (trial / "checkpoint_000001").is_dir()
    assert "no intact checkpoint" in choice.describe()


def test_missing_trial_folder_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such trial folder"):
        newest_intact_checkpoint(tmp_path / "nope")


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_trial_folder_on_s3_by_pyarrow_uri(tmp_path, monkeypatch):
    """An object store: no folder rename there, so moving aside is copy-then-remove."""
    moto_server = pytest.importorskip("moto.server")
    import pyarrow.fs

    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    port = _free_port()
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    try:
        endpoint = f"127.0.0.1:{port}"
        s3 = pyarrow.fs.S3FileSystem(
            endpoint_override=endpoint, scheme="http", allow_bucket_creation=True
        )
        s3.create_dir("runs")
        local = _trial(tmp_path / "trial", n=2)
        _damage(local / "checkpoint_000001")
        pyarrow.fs.copy_files(str(local), "runs/sweep/trial", destination_filesystem=s3)
        uri = f"s3://runs/sweep/trial?endpoint_override={endpoint}&scheme=http"
        choice = newest_intact_checkpoint(uri, move_damaged=True)
        assert choice.intact == "s3://runs/sweep/trial/checkpoint_000000"
        assert [(d.path, d.file, d.moved_to) for d in choice.damaged] == [
            (
                "s3://runs/sweep/trial/checkpoint_000001",
                "s3://runs/sweep/trial/checkpoint_000001/algorithm_state.pkl",
                "s3://runs/sweep/trial/checkpoint_000001.damaged",
            )
        ]
        left = {
            i.path
            for i in s3.get_file_info(pyarrow.fs.FileSelector("runs/sweep/trial", recursive=True))
            if i.type == pyarrow.fs.FileType.File
        }
        assert "runs/sweep/trial/checkpoint_000001.damaged/algorithm_state.pkl" in left
        assert not [p for p in left if p.startswith("runs/sweep/trial/checkpoint_000001/")]
        # The restore's walk, on the filesystem and path Tune gives it.
        newer = "runs/sweep/trial/checkpoint_000002"
        pyarrow.fs.copy_files(
            str(local / "checkpoint_000001"), newer, destination_filesystem=s3
        )  # damaged as well
        assert intact_checkpoint_before(s3, newer) == "runs/sweep/trial/checkpoint_000000"
        _move_aside(s3, newer, copy=True)
        assert is_kept_aside(s3, newer)
        assert s3.get_file_info(newer + ".damaged").type == pyarrow.fs.FileType.Directory
    finally:
        server.stop()


def _experiment(tmp_path, trial_names, finished=()):
    """A Tune experiment folder whose state records 3 checkpoints per trial, as Tune writes it;
    the trials named in ``finished`` are TERMINATED."""
    exp = tmp_path / "sweep"
    trial_data = []
    for name in trial_names:
        trial = _trial(exp / name, n=3)
        metadata = _TrainingRunMetadata()
        metadata.checkpoint_manager = _CheckpointManager(CheckpointConfig(num_to_keep=None))
        for i in range(3):
            metadata.checkpoint_manager.register_checkpoint(
                _TrainingResult(
                    checkpoint=Checkpoint(path=str(trial / f"checkpoint_{i:06d}")),
                    metrics={"training_iteration": i + 1},
                )
            )
        status = "TERMINATED" if name in finished else "PENDING"
        trial_data.append(
            [json.dumps({"trial_id": name, "status": status}), metadata.get_json_state()]
        )
    state = {"trial_data": trial_data, "runner_data": {"x": 1}, "stats": {"start_time": 1.0}}
    older = exp / "experiment_state-2026-01-01_00-00-00.json"
    older.write_text(json.dumps(state))
    newest = exp / "experiment_state-2026-01-02_00-00-00.json"
    newest.write_text(json.dumps(state))
    return exp, older, newest


def test_resume_leaves_tunes_experiment_state_and_keeps_the_damaged_checkpoint(tmp_path, caplog):
    exp, older, newest = _experiment(tmp_path, ["trial_a", "trial_b"])
    before_newest, before_older = newest.read_bytes(), older.read_bytes()
    damaged_file = _damage(exp / "trial_a" / "checkpoint_000002")
    caplog.set_level(logging.WARNING, logger="rllib_amp")

    choices = resume_from_intact_checkpoints(exp)

    by_trial = {os.path.basename(c.trial_dir): c for c in choices}
    assert by_trial["trial_a"].intact == str(exp / "trial_a" / "checkpoint_000001")
    assert by_trial["trial_b"].damaged == ()
    # Tune's records are not rewritten: the trial's restore falls back by itself.
    assert newest.read_bytes() == before_newest and older.read_bytes() == before_older
    assert sorted(p.name for p in exp.iterdir()) == sorted(
        ["trial_a", "trial_b", older.name, newest.name]
    )
    # Tune records checkpoint_000002 as the latest: a copy is kept aside, and the original
    # is left for Tune to delete when num_to_keep passes it.
    kept = exp / "trial_a" / "checkpoint_000002.damaged" / "algorithm_state.pkl"
    assert (
        kept.read_bytes()
        == (exp / "trial_a" / "checkpoint_000002" / "algorithm_state.pkl").read_bytes()
    )
    warnings = [r for r in caplog.records if getattr(r, "amp_event", None) == "checkpoint_fallback"]
    assert [(r.levelname, r.amp_fields) for r in warnings] == [
        (
            "WARNING",
            {
                "trial_dir": str(exp / "trial_a"),
                "intact": str(exp / "trial_a" / "checkpoint_000001"),
                "damaged": [str(exp / "trial_a" / "checkpoint_000002")],
                "files": [damaged_file],
                "moved_to": [str(exp / "trial_a" / "checkpoint_000002.damaged")],
            },
        )
    ]
    # What the trial then restores; a second resume says the same and copies nothing again.
    local = pyarrow.fs.LocalFileSystem()
    recorded = str(exp / "trial_a" / "checkpoint_000002")
    assert intact_checkpoint_before(local, recorded) == str(exp / "trial_a" / "checkpoint_000001")
    (again,) = [c for c in resume_from_intact_checkpoints(exp) if c.damaged]
    assert again.describe() == by_trial["trial_a"].describe()
    assert not list(exp.glob("trial_a/*.damaged-*"))


def test_resume_with_nothing_damaged_changes_nothing(tmp_path):
    exp, _, newest = _experiment(tmp_path, ["trial_a"])
    before = newest.read_bytes()
    choices = resume_from_intact_checkpoints(exp)
    assert [c.damaged for c in choices] == [()]
    assert newest.read_bytes() == before


def test_resume_needs_an_experiment_folder(tmp_path):
    _trial(tmp_path / "trial_a")
    with pytest.raises(FileNotFoundError, match="experiment_state"):
        resume_from_intact_checkpoints(tmp_path)


def test_a_trial_to_resume_without_an_intact_checkpoint_is_refused_before_any_change(tmp_path):
    exp, _, newest = _experiment(tmp_path, ["trial_a", "trial_b"])
    _damage(exp / "trial_b" / "checkpoint_000002")  # would fall back, but nothing may move
    for i in range(3):
        _damage(exp / "trial_a" / f"checkpoint_{i:06d}")
    before = newest.read_bytes()
    with pytest.raises(NoIntactCheckpointError) as caught:
        resume_from_intact_checkpoints(exp)
    assert [os.path.basename(c.trial_dir) for c in caught.value.stranded] == ["trial_a"]
    message = str(caught.value)
    assert message.startswith(
        "trial trial_a has no intact checkpoint left (checkpoint_000002/algorithm_state.pkl has 5 "
    )
    assert "\n" not in message
    assert newest.read_bytes() == before
    assert not list(exp.glob("*/*.damaged*"))


def test_a_finished_trial_without_an_intact_checkpoint_does_not_stop_a_resume(tmp_path):
    exp, _, newest = _experiment(tmp_path, ["trial_a", "trial_b"], finished=["trial_a"])
    for i in range(3):
        _damage(exp / "trial_a" / f"checkpoint_{i:06d}")
    choices = resume_from_intact_checkpoints(exp)
    assert [c.intact for c in choices if c.damaged] == [None]
    assert (exp / "trial_a" / "checkpoint_000000").is_dir()  # all it has: left in place


def test_restart_damaged_starts_a_trial_without_an_intact_checkpoint_again(tmp_path, caplog):
    exp, _, newest = _experiment(tmp_path, ["trial_a", "trial_b"])
    for i in range(3):
        _damage(exp / "trial_a" / f"checkpoint_{i:06d}")
    caplog.set_level(logging.WARNING, logger="rllib_amp")
    before = newest.read_bytes()
    resume_from_intact_checkpoints(exp, restart_damaged=True)
    assert newest.read_bytes() == before
    names = [f"checkpoint_{i:06d}" for i in range(3)]
    assert sorted(p.name for p in (exp / "trial_a").iterdir()) == sorted(
        names + [n + ".damaged" for n in names]
    )
    # Its restore finds no intact checkpoint left: the trial starts again.
    recorded = str(exp / "trial_a" / "checkpoint_000002")
    assert intact_checkpoint_before(pyarrow.fs.LocalFileSystem(), recorded) is None
    assert [r.getMessage() for r in caplog.records if "from scratch" in r.getMessage()]


def test_a_checkpoint_cut_off_before_its_manifest_is_never_the_newest_intact(tmp_path):
    # A full disk stopped the upload of checkpoint_000002 after some of its files: those
    # parse, but the manifest (and the weights) never arrived.
    trial = _trial(tmp_path / "trial", n=2)
    cut = trial / "checkpoint_000002"
    cut.mkdir()
    with open(cut / "algorithm_state.pkl", "wb") as f:
        pickle.dump({"training_iteration": 3}, f)
    choice = newest_intact_checkpoint(trial, move_damaged=True)
    assert choice.intact == str(trial / "checkpoint_000001")
    (damaged,) = choice.damaged
    assert damaged.path == str(cut) and "cut off" in damaged.reason
    assert damaged.moved_to == str(trial / "checkpoint_000002.damaged")
    # A trial that never had manifests (stock RLlib) keeps its checkpoints as they are.
    plain = tmp_path / "plain" / "checkpoint_000000"
    plain.mkdir(parents=True)
    with open(plain / "algorithm_state.pkl", "wb") as f:
        pickle.dump({"training_iteration": 1}, f)
    assert newest_intact_checkpoint(tmp_path / "plain").intact == str(plain)


def test_damaged_checkpoints_newer_than_tunes_record_are_moved_aside(tmp_path):
    # Saved after Tune's last experiment state (the driver died in between): Tune never
    # recorded checkpoint_000003 and will write its next checkpoint under that name.
    exp, _, _ = _experiment(tmp_path, ["trial_a"])
    unrecorded = exp / "trial_a" / "checkpoint_000003"
    _checkpoint(unrecorded, 4)
    _damage(unrecorded)
    _damage(exp / "trial_a" / "checkpoint_000002")
    (choice,) = resume_from_intact_checkpoints(exp)
    assert choice.intact == str(exp / "trial_a" / "checkpoint_000001")
    assert not unrecorded.exists() and (exp / "trial_a" / "checkpoint_000003.damaged").is_dir()
    assert (exp / "trial_a" / "checkpoint_000002").is_dir()  # recorded by Tune: copied


def test_intact_checkpoint_before_reads_only_older_checkpoints_not_kept_aside(tmp_path):
    trial = _trial(tmp_path / "trial", n=4)
    local = pyarrow.fs.LocalFileSystem()
    newest = str(trial / "checkpoint_000003")
    assert intact_checkpoint_before(local, newest) == str(trial / "checkpoint_000002")
    # Found damaged by a resume (a copy kept aside): not read again.
    (trial / "checkpoint_000002" / KEPT_ASIDE_FILE).write_text("elsewhere")
    _damage(trial / "checkpoint_000001")
    assert intact_checkpoint_before(local, newest) == str(trial / "checkpoint_000000")
    assert intact_checkpoint_before(local, str(trial / "checkpoint_000000")) is None
    # A record whose folder is gone still finds the older ones.
    assert intact_checkpoint_before(local, str(trial / "checkpoint_000009")) == newest


def test_a_new_checkpoint_under_a_name_moved_aside_before_is_read_and_kept_on_its_own(tmp_path):
    # Resume 1 moved the unrecorded, damaged checkpoint_000003 aside; Tune then wrote its
    # next checkpoint under that name, and it is whole.
    exp, _, _ = _experiment(tmp_path, ["trial_a"])
    trial = exp / "trial_a"
    _checkpoint(trial / "checkpoint_000003.damaged", 4)
    _checkpoint(trial / "checkpoint_000003", 4)
    _checkpoint(trial / "checkpoint_000004", 5)
    local = pyarrow.fs.LocalFileSystem()
    newest = str(trial / "checkpoint_000004")
    assert intact_checkpoint_before(local, newest) == str(trial / "checkpoint_000003")
    # Both damaged later (newer than Tune's record: moved): the old folder keeps its name.
    _damage(trial / "checkpoint_000003")
    _damage(trial / "checkpoint_000004")
    (choice,) = resume_from_intact_checkpoints(exp)  # Tune's record: checkpoint_000002
    assert choice.intact == str(trial / "checkpoint_000002")
    assert [d.moved_to for d in choice.damaged] == [
        str(trial / "checkpoint_000004.damaged"),
        str(trial / "checkpoint_000003.damaged-2"),
    ]
