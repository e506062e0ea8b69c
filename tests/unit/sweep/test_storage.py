"""Storage locations: resolution order, URI joins, and reads/writes through pyarrow (a local
folder and moto's S3 server)."""

from __future__ import annotations

import os

import pytest

from rllib_amp.sweep import storage as S
from tests.cluster.s3 import moto_s3

URI = "s3://bucket/exp?endpoint_override=127.0.0.1:9000&scheme=http"


def test_flag_wins_over_file_which_wins_over_env_which_wins_over_default(tmp_path):
    env = {S.STORAGE_ENV: str(tmp_path / "env")}
    assert S.resolve(URI, str(tmp_path / "file"), env) == URI
    assert S.resolve(None, str(tmp_path / "file"), env) == str(tmp_path / "file")
    assert S.resolve(None, None, env) == str(tmp_path / "env")
    assert S.resolve(None, None, {}) == os.path.expanduser("~/ray_results")


def test_local_paths_become_absolute_and_uris_stay_untouched(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert S.resolve("runs", None, {}) == str(tmp_path / "runs")
    assert S.resolve("~/x", None, {}) == os.path.expanduser("~/x")
    assert S.resolve(URI, None, {}) == URI  # not '<cwd>/s3:/bucket/exp'


@pytest.mark.parametrize(
    "flag, file, env, fragment",
    [
        ("", None, {}, "--storage-path: got an empty location"),
        (None, "  ", {}, "storage_path: got an empty location"),
        (None, None, {S.STORAGE_ENV: ""}, f"{S.STORAGE_ENV}: got an empty location"),
        ("bogus://bucket/x", None, {}, "--storage-path: pyarrow cannot open 'bogus://bucket/x'"),
    ],
)
def test_bad_locations_name_where_they_came_from_and_the_fix(flag, file, env, fragment):
    with pytest.raises(S.StorageError) as e:
        S.resolve(flag, file, env)
    assert fragment in str(e.value) and "s3://" in str(e.value)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize(
    "location, fs_path, uri",
    [
        (URI, "bucket/exp/a/checkpoint_000001",
         "s3://bucket/exp/a/checkpoint_000001?endpoint_override=127.0.0.1:9000&scheme=http"),
        ("gs://b/x", "b/x/t/checkpoint_000000", "gs://b/x/t/checkpoint_000000"),
        ("abfs://c@acct.dfs.core.windows.net/x", "c/x/t",
         "abfs://c@acct.dfs.core.windows.net/x/t"),
        ("file:///tmp/r", "/tmp/r/t", "file:///tmp/r/t"),
        ("/tmp/r", "/tmp/r/t", "/tmp/r/t"),
    ],
)  # fmt: skip
def test_checkpoint_paths_become_uris_on_the_same_storage(location, fs_path, uri):
    assert S.to_uri(location, fs_path) == uri


def test_join_keeps_the_query():
    assert S.join(URI, "cartpole", "results.parquet") == (
        "s3://bucket/exp/cartpole/results.parquet?endpoint_override=127.0.0.1:9000&scheme=http"
    )
    assert S.join("/a/b", "c") == "/a/b/c"


def test_local_write_read_and_a_check_that_leaves_nothing_behind(tmp_path):
    target = S.join(str(tmp_path), "new", "deep", "f.bin")
    S.write_bytes(target, b"abc")
    assert S.read_bytes(target) == b"abc" and S.exists(target)
    fresh = str(tmp_path / "fresh")
    S.check_writable(fresh)
    assert not os.path.exists(fresh)  # made for the check, removed again (it was empty)
    S.check_writable(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == ["new"]


def test_unwritable_storage_is_one_line_and_what_was_there_stays(tmp_path):
    existing = tmp_path / "results.parquet"
    existing.write_bytes(b"precious")
    with pytest.raises(S.StorageError) as e:
        S.check_writable(str(existing / "sub"))  # a file where a folder should be
    assert str(e.value).startswith(f"--storage-path: cannot write to {existing / 'sub'}")
    assert "\n" not in str(e.value)
    assert existing.read_bytes() == b"precious"


def test_s3_write_read_through_the_uri_on_a_real_s3_server():
    with moto_s3() as s3:
        uri = s3.uri("exp")
        S.check_writable(uri)
        S.write_bytes(S.join(uri, "name", "results.parquet"), b"rows")
        assert s3.list("exp") == [f"{s3.bucket}/exp/name", f"{s3.bucket}/exp/name/results.parquet"]
        assert S.read_bytes(S.join(uri, "name", "results.parquet")) == b"rows"
        assert S.exists(S.join(uri, "name")) and not S.exists(S.join(uri, "other"))


def test_unreachable_storage_is_one_line_and_asked_once(monkeypatch):
    import time

    from tests.cluster.s3 import ENV, closed_port

    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    uri = f"s3://bucket/exp?endpoint_override=127.0.0.1:{closed_port()}&scheme=http"
    with pytest.raises(S.StorageError) as e:
        S.check_reachable(uri)
    line = str(e.value)
    assert line.startswith(f"--storage-path: cannot reach {uri} (") and "\n" not in line
    assert "Could not connect" in line and "pass another --storage-path" in line
    # Every later access to that endpoint says the same at once, not after another timeout.
    start = time.monotonic()
    for call in (S.exists, S.read_bytes, S.check_writable):
        with pytest.raises(S.StorageError, match="cannot reach"):
            call(S.join(uri, "name"))
    assert time.monotonic() - start < 5
    S.check_reachable("/no/such/local/folder")  # local: nothing to reach


def _keep_files_whole(monkeypatch):
    """keep_files_whole for one test: Tune's copy function comes back after it."""
    from ray.train._internal import storage as train_storage

    monkeypatch.setattr(
        train_storage, "_pyarrow_fs_copy_files", train_storage._pyarrow_fs_copy_files
    )
    S.keep_files_whole()
    S.keep_files_whole()  # idempotent: one wrapper
    return train_storage


def test_tune_uploads_to_local_storage_replace_files_whole_or_not_at_all(tmp_path, monkeypatch):
    import shutil

    import pyarrow.fs

    train_storage = _keep_files_whole(monkeypatch)
    staging, store = tmp_path / "staging", tmp_path / "store"
    (staging / "trial").mkdir(parents=True)
    (staging / "experiment_state.json").write_text('{"rows": 2}')
    (staging / "trial" / "result.json").write_text("row1\nrow2\n")
    (staging / "trial" / "skip.tmp").write_text("excluded")
    local = pyarrow.fs.LocalFileSystem()
    # Tune's two upload paths: a whole folder, and one with exclude patterns (fsspec).
    train_storage._upload_to_fs_path(str(staging), local, str(store))
    assert (store / "trial" / "result.json").read_text() == "row1\nrow2\n"
    train_storage._upload_to_fs_path(str(staging), local, str(store / "x"), exclude=["*.tmp"])
    assert (store / "x" / "trial" / "result.json").is_file()
    assert not (store / "x" / "trial" / "skip.tmp").exists()

    # The disk fills up half-way through the next upload of a longer file.
    (staging / "trial" / "result.json").write_text("row1\nrow2\nrow3\n")

    def full_disk(source, target, length=0):
        target.write(source.read(3))
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shutil, "copyfileobj", full_disk)
    with pytest.raises(OSError, match="No space left"):
        train_storage._upload_to_fs_path(str(staging / "trial"), local, str(store / "trial"))
    assert (store / "trial" / "result.json").read_text() == "row1\nrow2\n"  # the whole old one
    assert not [p for p in store.rglob("*") if p.name.endswith(S.PARTIAL_SUFFIX)]


def test_the_summary_names_a_storage_error_once(tmp_path):
    from rllib_amp.sweep.summary import storage_fault

    rows = [
        {"trial_id": "a_00000", "error": "OSError: [Errno 28] No space left on device"},
        {"trial_id": "a_00001", "error": "OSError: [Errno 28] No space left on device"},
        {"trial_id": "a_00002", "error": "ValueError: the trial's own fault"},
        {"trial_id": "a_00003", "error": None},
    ]
    line = storage_fault(str(tmp_path), rows)
    assert line is not None and "\n" not in line
    assert line.startswith(f"the storage at {tmp_path} is full (ENOSPC): OSError: [Errno 28]")
    assert line.endswith("trial(s) a_00000, a_00001 stopped on it")
    assert storage_fault(str(tmp_path), rows[2:]) is None  # no storage error: nothing said
    # Storage that refuses a write now is named even when no trial saw it.
    blocked = tmp_path / "file"
    blocked.write_text("a file where the experiment folder should be")
    line = storage_fault(str(blocked), rows[2:])
    assert line is not None and line.startswith(f"the storage at {blocked} failed: ")
    assert os.listdir(tmp_path) == ["file"]  # the check leaves nothing behind


def test_a_checkpoint_uri_as_the_summary_prints_it_reads_back_as_a_warm_start(tmp_path):
    import pickle

    import pyarrow.fs

    from rllib_amp.checkpoint_files import write_manifest
    from rllib_amp.scaling.scaler import PolicyScaler
    from rllib_amp.scaling.state import AMP_STATE_KEY
    from rllib_amp.scaling.warm_start import read_scaler_states
    from rllib_amp.settings import AmpSettings

    scaler = PolicyScaler(AmpSettings(growth_interval=2000), "cpu", scaling=True)
    scaler.seed(512.0, 7)
    ckpt = tmp_path / "checkpoint_000003"
    (ckpt / "learner_group" / "learner").mkdir(parents=True)
    (ckpt / "learner_group" / "learner" / "state.pkl").write_bytes(
        pickle.dumps({"optimizer": {}, AMP_STATE_KEY: {"default_policy": scaler.state_dict()}})
    )
    (ckpt / "algorithm_state.pkl").write_bytes(pickle.dumps({"training_iteration": 4}))
    write_manifest(ckpt)
    with moto_s3() as s3:
        storage = s3.uri("experiments")
        fs_path = f"{s3.bucket}/experiments/run/trial_0/checkpoint_000003"
        pyarrow.fs.copy_files(str(ckpt), fs_path, destination_filesystem=s3.fs)
        printed = S.to_uri(storage, fs_path)  # what "Best trial checkpoint:" shows
        assert printed.endswith(f"/checkpoint_000003?endpoint_override={s3.endpoint}&scheme=http")
        saved = read_scaler_states(printed)
    assert saved["default_policy"]["torch"]["scale"] == 512.0
    assert saved["default_policy"]["torch"]["_growth_tracker"] == 7
