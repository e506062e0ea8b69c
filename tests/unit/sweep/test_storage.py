"""Storage locations: resolution order, URI joins, and reads/writes through pyarrow (a local
folder and moto's S3 server)."""

from __future__ import annotations

import os

import pytest

from rllib_amp import fs
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
    assert fs.to_uri(location, fs_path) == uri


def test_local_write_read_and_a_check_that_leaves_nothing_behind(tmp_path):
    target = fs.join(str(tmp_path), "new", "deep", "f.bin")
    fs.write_bytes(*fs.resolve(target), b"abc")
    assert fs.read_bytes(*fs.resolve(target)) == b"abc" and fs.exists(*fs.resolve(target))
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
        fs.write_bytes(*fs.resolve(fs.join(uri, "name", "results.parquet")), b"rows")
        assert s3.list("exp") == [f"{s3.bucket}/exp/name", f"{s3.bucket}/exp/name/results.parquet"]
        assert fs.read_bytes(*fs.resolve(fs.join(uri, "name", "results.parquet"))) == b"rows"
        assert fs.exists(*fs.resolve(fs.join(uri, "name")))
        assert not fs.exists(*fs.resolve(fs.join(uri, "other")))


def test_unreachable_storage_is_one_line(monkeypatch):
    from tests.cluster.s3 import ENV, closed_port

    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    uri = f"s3://bucket/exp?endpoint_override=127.0.0.1:{closed_port()}&scheme=http"
    with pytest.raises(S.StorageError) as e:
        S.check_reachable(uri)
    line = str(e.value)
    assert line.startswith(f"--storage-path: cannot reach {uri} (") and "\n" not in line
    assert "Could not connect" in line and "pass another --storage-path" in line
    with pytest.raises(S.StorageError, match="cannot reach"):  # the write check: the same line
        S.check_writable(fs.join(uri, "name"))
    S.check_reachable("/no/such/local/folder")  # local: nothing to reach


def test_only_the_storage_failing_is_a_storage_failure(tmp_path, monkeypatch):
    import errno

    exp = tmp_path / "exp"
    exp.mkdir()
    inside = str(exp / "trial" / "result.json")
    # The storage's own errno on a path in it: failed, without asking the storage again.
    monkeypatch.setattr(fs, "write_probe", lambda *a: pytest.fail("asked the storage"))
    for code in (errno.ENOSPC, errno.EROFS, errno.EDQUOT, errno.EACCES):
        assert S.failed(OSError(code, os.strerror(code), inside), str(exp))
    monkeypatch.undo()
    # Anything else is the storage's only when a fresh check of it fails: here it works.
    elsewhere = OSError(errno.ENOSPC, "No space left on device", "/tmp/staging/x")
    for error in (OSError("Could not connect to server"), elsewhere, ConnectionResetError()):
        assert not S.failed(error, str(exp)), error
    assert os.listdir(exp) == []  # the check leaves nothing behind
    blocked = tmp_path / "file"  # a file where the experiment folder should be
    blocked.write_text("x")
    assert S.failed(OSError("When reading information for key"), str(blocked))
    # A URI: its endpoint is asked afresh.
    monkeypatch.setattr(S, "check_reachable", lambda location: _raise(S.StorageError("down")))
    assert S.failed(OSError("AWS Error NETWORK_CONNECTION"), "s3://bucket/exp/name")


def _raise(error):
    raise error


def test_keep_files_whole_applies_within_it_and_gives_tunes_copy_back():
    from ray.train._internal import storage as train_storage

    tunes = train_storage._pyarrow_fs_copy_files
    with S.keep_files_whole():
        inside = train_storage._pyarrow_fs_copy_files
        assert inside is not tunes and inside._rllib_amp_whole
        with S.keep_files_whole():  # nested: one wrapper
            assert train_storage._pyarrow_fs_copy_files is inside
        assert train_storage._pyarrow_fs_copy_files is inside
    assert train_storage._pyarrow_fs_copy_files is tunes
    with pytest.raises(RuntimeError, match="fit failed"), S.keep_files_whole():
        raise RuntimeError("fit failed")
    assert train_storage._pyarrow_fs_copy_files is tunes  # also after an exception


# Ray code keep_files_whole relies on, by a hash of its syntax tree (as test_rllib_api.py):
# Tune uploads through ``_upload_to_fs_path``, which calls the module's
# ``_pyarrow_fs_copy_files`` by name. A new hash means Ray changed it: re-read both, check
# that uploads still pass through the replaced function, then update the hash.
RAY_STORAGE = {
    "_upload_to_fs_path": "5fa3f0719fe8a0b2",
    "_pyarrow_fs_copy_files": "bc7dc89d73a15bc4",
}


@pytest.mark.parametrize("name", sorted(RAY_STORAGE))
def test_the_ray_upload_code_keep_files_whole_replaces_is_unchanged(name):
    import ast
    import hashlib
    import inspect
    import textwrap

    from ray.train._internal import storage as train_storage

    fn = getattr(train_storage, name)
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    digest = hashlib.sha256(ast.dump(node).encode()).hexdigest()[:16]
    assert digest == RAY_STORAGE[name], (
        f"ray.train._internal.storage.{name} changed: re-check keep_files_whole "
        f"(rllib_amp/sweep/storage.py), then update its hash"
    )
    if name == "_upload_to_fs_path":  # calls the module's copy function by its name
        assert "_pyarrow_fs_copy_files" in fn.__code__.co_names


def test_tune_keeps_its_storage_in_the_module_keep_files_whole_patches():
    """Tune's controller and experiment state must use ray.train._internal.storage: a Ray
    that moves Tune to train/v2's storage would bypass keep_files_whole silently."""
    from ray.train._internal import storage as train_storage
    from ray.tune.execution import experiment_state, tune_controller

    for module in (tune_controller, experiment_state):
        assert module.StorageContext is train_storage.StorageContext, module.__name__
        assert module.StorageContext.__module__ == "ray.train._internal.storage"


def test_tune_uploads_to_local_storage_replace_files_whole_or_not_at_all(tmp_path, monkeypatch):
    with S.keep_files_whole():
        _uploads_replace_files_whole(tmp_path, monkeypatch)


def _uploads_replace_files_whole(tmp_path, monkeypatch):
    import shutil

    import pyarrow.fs
    from ray.train._internal import storage as train_storage

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
    rows = [
        {"trial_id": "a_00000", "error": "OSError: [Errno 28] No space left on device"},
        {"trial_id": "a_00001", "error": "OSError: [Errno 28] No space left on device"},
        {"trial_id": "a_00002", "error": "ValueError: the trial's own fault"},
        {"trial_id": "a_00003", "error": None},
    ]
    line = S.storage_fault(str(tmp_path), rows)
    assert line is not None and "\n" not in line
    assert line.startswith(f"the storage at {tmp_path} is full (ENOSPC): OSError: [Errno 28]")
    assert line.endswith("trial(s) a_00000, a_00001 stopped on it")
    assert S.storage_fault(str(tmp_path), rows[2:]) is None  # no storage error: nothing said
    # Storage that refuses a write now is named even when no trial saw it.
    blocked = tmp_path / "file"
    blocked.write_text("a file where the experiment folder should be")
    line = S.storage_fault(str(blocked), rows[2:])
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
        printed = fs.to_uri(storage, fs_path)  # what "Best trial checkpoint:" shows
        assert printed.endswith(f"/checkpoint_000003?endpoint_override={s3.endpoint}&scheme=http")
        saved = read_scaler_states(printed)
    assert saved["default_policy"]["torch"]["scale"] == 512.0
    assert saved["default_policy"]["torch"]["_growth_tracker"] == 7
