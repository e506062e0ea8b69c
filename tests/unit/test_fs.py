"""fs: one rule for "is this a URI", the one checkpoint-folder listing, the one decoder."""

from __future__ import annotations

import os
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
    if not uri:  # resolving an s3:// URI would ask the network for the bucket's region
        assert fs.resolve(location)[0].type_name == "local"


@pytest.mark.parametrize("home", ["~", "$HOME", "${HOME}"])
def test_home_and_variables_are_expanded_for_local_paths_everywhere(tmp_path, monkeypatch, home):
    """One rule for every path flag and key: ``~`` and ``$VAR`` / ``${VAR}`` expanded (a quoted
    ``'$HOME/runs'`` made a folder literally named ``$HOME``)."""
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "ckpt").mkdir()
    assert fs.resolve(f"{home}/ckpt")[1] == str(tmp_path / "ckpt")
    assert WarmStart.parse({"from": f"{home}/ckpt"}).path == str(tmp_path / "ckpt")
    assert storage.resolve(f"{home}/runs", None, {}) == str(tmp_path / "runs")
    assert fs.local_path(f"{home}/x.yaml") == str(tmp_path / "x.yaml")


def test_a_path_naming_an_unset_variable_is_refused_naming_it(monkeypatch):
    monkeypatch.delenv("RLLIB_AMP_NOT_SET", raising=False)
    with pytest.raises(ValueError, match=r"\$RLLIB_AMP_NOT_SET, which is not set"):
        fs.local_path("$RLLIB_AMP_NOT_SET/runs")
    with pytest.raises(storage.StorageError, match=r"^--storage-path: .*RLLIB_AMP_NOT_SET"):
        storage.resolve("${RLLIB_AMP_NOT_SET}/runs", None, {})
    assert fs.local_path("/a/b$") == "/a/b$"  # a dollar that names nothing is kept


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


@pytest.mark.parametrize(
    "location, parts, joined",
    [
        ("/runs", ("a", "b.json"), "/runs/a/b.json"),
        ("s3://b/exp", ("t", "checkpoint_000001"), "s3://b/exp/t/checkpoint_000001"),
        (
            "s3://b/exp/ck?endpoint_override=127.0.0.1:9000&scheme=http",
            ("learner_group/learner", "state.pkl"),
            "s3://b/exp/ck/learner_group/learner/state.pkl?endpoint_override=127.0.0.1:9000"
            "&scheme=http",
        ),
        ("gs://b?endpoint_override=h:1", ("x",), "gs://b/x?endpoint_override=h:1"),
    ],
)
def test_join_puts_the_parts_before_a_uris_query(location, parts, joined):
    assert fs.join(location, *parts) == joined


def test_remote_timeout_comes_from_the_environment_and_bad_values_name_it():
    assert fs.remote_timeout_s({}) == fs.DEFAULT_REMOTE_TIMEOUT_S
    assert fs.remote_timeout_s({fs.REMOTE_TIMEOUT_ENV: "2.5"}) == 2.5
    for bad in ("0", "-1", "inf", "soon"):
        with pytest.raises(ValueError, match=rf"^{fs.REMOTE_TIMEOUT_ENV}: got '{bad}'"):
            fs.remote_timeout_s({fs.REMOTE_TIMEOUT_ENV: bad})


def _no_cloud_credentials_lookup(monkeypatch, port):
    """Credentials that never leave 127.0.0.1: dummy AWS keys, no EC2 metadata, GCE's
    metadata server at a closed local port."""
    from tests.cluster.s3 import ENV

    for key, value in ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("GCE_METADATA_HOST", f"127.0.0.1:{port}")
    monkeypatch.setenv("GCE_METADATA_ROOT", f"127.0.0.1:{port}")
    monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)


def test_s3_and_gcs_filesystems_get_the_remote_timeout(monkeypatch):
    from tests.cluster.s3 import closed_port

    port = closed_port()
    _no_cloud_credentials_lookup(monkeypatch, port)
    monkeypatch.setenv(fs.REMOTE_TIMEOUT_ENV, "9")
    s3, _ = fs.resolve(f"s3://b/x?endpoint_override=127.0.0.1:{port}&scheme=http")
    options = s3.__reduce__()[1][0]
    assert options["connect_timeout"] == options["request_timeout"] == 3.0
    assert options["endpoint_override"] == f"127.0.0.1:{port}"  # the URI's own options kept
    gcs, path = fs.resolve(f"gs://b/x?endpoint_override=127.0.0.1:{port}&scheme=http")
    assert path == "b/x" and gcs.__reduce__()[1][0]["retry_time_limit"].total_seconds() == 9
    # A limit in the URI wins.
    gcs, _ = fs.resolve(f"gs://b/x?endpoint_override=127.0.0.1:{port}&retry_limit_seconds=4")
    assert gcs.__reduce__()[1][0]["retry_time_limit"].total_seconds() == 4


def test_probe_gives_up_on_a_remote_that_never_answers_and_reports_a_refusal(monkeypatch):
    import time

    from tests.cluster.s3 import closed_port, silent_listener

    port = closed_port()
    _no_cloud_credentials_lookup(monkeypatch, port)
    with pytest.raises(OSError, match="Could not connect|connect"):
        fs.probe(f"s3://b/x?endpoint_override=127.0.0.1:{port}&scheme=http")
    # pyarrow's own timeouts end the call: a third of the timeout a try, REMOTE_ATTEMPTS tries.
    monkeypatch.setenv(fs.REMOTE_TIMEOUT_ENV, "1.5")
    with silent_listener() as (silent, accepted):
        start = time.monotonic()
        uri = f"s3://b/x?endpoint_override=127.0.0.1:{silent}&scheme=http"
        with pytest.raises(fs.RemoteTimeout, match=r"^no answer from s3://b/x\?.* within 1.5 s$"):
            fs.probe(uri)
        assert accepted.is_set()  # it did reach the listener, which never answered
        assert time.monotonic() - start < 30
    fs.probe("/no/such/local/folder")  # local paths: nothing to reach


def test_s3_calls_are_bounded_by_pyarrow_with_a_bounded_retry_strategy(monkeypatch):
    from tests.cluster.s3 import closed_port

    _no_cloud_credentials_lookup(monkeypatch, closed_port())
    monkeypatch.setenv(fs.REMOTE_TIMEOUT_ENV, "6")
    built = []
    real = pyarrow.fs.S3FileSystem
    monkeypatch.setattr(pyarrow.fs, "S3FileSystem", lambda **kw: built.append(kw) or real(**kw))
    fs.resolve("s3://b/x?endpoint_override=127.0.0.1:1&scheme=http")
    (options,) = built
    assert options["connect_timeout"] == options["request_timeout"] == 2.0
    assert isinstance(options["retry_strategy"], pyarrow.fs.AwsStandardS3RetryStrategy)


def test_a_warm_start_source_that_cannot_be_opened_is_one_line(monkeypatch):
    from rllib_amp.scaling.warm_start import read_scaler_states
    from tests.cluster.s3 import closed_port

    port = closed_port()
    _no_cloud_credentials_lookup(monkeypatch, port)
    # hdfs:// without a JVM here (pyarrow's 40-line libjvm search), or refusing connections.
    source = f"hdfs://127.0.0.1:{port}/run/checkpoint_000001"
    with pytest.raises(ValueError) as e:
        read_scaler_states(source)
    line = str(e.value)
    assert line.startswith(f"amp.warm_start.from: cannot read {source!r} (") and "\n" not in line
    assert "drop warm_start" in line


def test_the_write_probe_leaves_nothing_behind_and_names_an_unwritable_place(tmp_path):
    fresh = tmp_path / "fresh"
    with fs.write_probe(str(fresh)) as (marker, token):
        assert fs.read_bytes(*fs.resolve(marker)) == token
        assert os.path.basename(marker).startswith(fs.PROBE_PREFIX)
    assert not fresh.exists()  # made for the probe, removed again (it was empty)
    blocked = tmp_path / "file"
    blocked.write_text("a file where a folder should be")
    with pytest.raises(OSError), fs.write_probe(str(blocked / "sub")):
        pass
    assert sorted(os.listdir(tmp_path)) == ["file"]


def test_the_newest_experiment_state_file_is_found_by_name(tmp_path):
    local = pyarrow.fs.LocalFileSystem()
    assert fs.experiment_state_file(local, str(tmp_path)) is None
    for stamp in ("2026-12-01_16-20-03", "2026-12-02_08-00-00"):
        (tmp_path / f"experiment_state-{stamp}.json").write_text("{}")
    (tmp_path / "experiment_state-2027.json.before-fallback").write_text("{}")
    newest = fs.experiment_state_file(local, str(tmp_path))
    assert newest == str(tmp_path / "experiment_state-2026-12-02_08-00-00.json")
