"""Warm starts read the scaler state of a checkpoint's learner, and refuse what cannot seed."""

from __future__ import annotations

import logging
import pickle

import pytest

from rllib_amp.scaling.scaler import PolicyScaler
from rllib_amp.scaling.state import AMP_STATE_KEY
from rllib_amp.scaling.warm_start import (
    apply_warm_start,
    check_warm_start,
    learner_state_file,
    read_scaler_states,
    warm_start_seeds,
)
from rllib_amp.settings import AmpSettings, WarmStart


def _scaler_state(scale: float, tracker: int = 0, *, scaling: bool = True) -> dict:
    s = PolicyScaler(AmpSettings(growth_interval=2000), "cpu", scaling=scaling)
    s.seed(scale, tracker)
    s.optimizer_steps_lifetime = 50
    return s.state_dict()


def _checkpoint(folder, states, *, layout="learner_group/learner", fmt="pkl", extra=None):
    """A checkpoint folder whose learner state holds ``states`` (ModuleID -> scaler state)."""
    where = folder / layout if layout else folder
    where.mkdir(parents=True, exist_ok=True)
    state = {"optimizer": {}, **(extra or {})}
    if states is not None:
        state[AMP_STATE_KEY] = states
    if fmt == "pkl":
        (where / "state.pkl").write_bytes(pickle.dumps(state))
    else:
        import msgpack

        (where / "state.msgpack").write_bytes(msgpack.packb(state))
    # An Algorithm checkpoint has a state file of its own at the top: never the learner's.
    if layout == "learner_group/learner":
        (folder / "state.pkl").write_bytes(pickle.dumps({"counters": {}}))
    return folder


@pytest.mark.parametrize("layout", ["learner_group/learner", "learner", ""])
@pytest.mark.parametrize("fmt", ["pkl", "msgpack"])
def test_finds_the_learner_state_in_each_checkpoint_layout(tmp_path, layout, fmt):
    ckpt = _checkpoint(tmp_path / "ckpt", {"p0": _scaler_state(256.0, 3)}, layout=layout, fmt=fmt)
    file = learner_state_file(str(ckpt))
    assert file == str(ckpt / layout / f"state.{fmt}") if layout else str(ckpt / f"state.{fmt}")
    assert warm_start_seeds(WarmStart(path=str(ckpt))) == {"p0": (256.0, 3)}


def test_reads_through_a_uri(tmp_path):
    ckpt = _checkpoint(tmp_path / "ckpt", {"p0": _scaler_state(32.0)})
    assert warm_start_seeds(WarmStart(path=f"file://{ckpt}")) == {"p0": (32.0, 0)}


def test_module_map_renames_and_may_reuse_a_source(tmp_path):
    ckpt = _checkpoint(tmp_path, {"p0": _scaler_state(64.0, 1), "p1": _scaler_state(8.0)})
    warm = WarmStart(path=str(ckpt), modules=(("a", "p0"), ("b", "p0"), ("c", "p1")))
    assert warm_start_seeds(warm, ["a", "b", "c", "d"]) == {
        "a": (64.0, 1),
        "b": (64.0, 1),
        "c": (8.0, 0),
    }


@pytest.mark.parametrize(
    "states, modules, run, key, fragment",
    [
        (None, None, ["p0"], "amp.warm_start.from", "holds no AMP scaler state"),
        ({}, None, ["p0"], "amp.warm_start.from", "holds no AMP scaler state"),
        (
            {"p0": "bf16"},
            None,
            ["p0"],
            "amp.warm_start.from",
            "trained without loss scaling (bfloat16)",
        ),
        ({"p0": 1.0}, None, ["p1"], "amp.warm_start", "add amp.warm_start.modules: {p1: OLD_ID}"),
        ({"p0": 1.0}, {"p1": "px"}, ["p1"], "amp.warm_start.modules.p1", "'px' is not in it"),
        (
            {"p0": 1.0, "p9": "bf16"},
            {"p1": "p9"},
            ["p1"],
            "amp.warm_start.modules.p1",
            "'p9' trained without loss scaling",
        ),
        ({"p0": 1.0}, {"px": "p0"}, ["p1"], "amp.warm_start.modules", "'px' is not a module"),
    ],
)
def test_what_cannot_seed_is_refused_naming_key_and_fix(
    tmp_path, states, modules, run, key, fragment
):
    if states is not None:
        states = {
            mid: _scaler_state(1.0, scaling=False) if v == "bf16" else _scaler_state(v)
            for mid, v in states.items()
        }
    ckpt = _checkpoint(tmp_path, states)
    warm = WarmStart(path=str(ckpt), modules=tuple(modules.items()) if modules else None)
    with pytest.raises(ValueError) as e:
        warm_start_seeds(warm, run)
    msg = str(e.value)
    assert msg.startswith(f"{key}:"), msg
    assert fragment in msg, msg


def test_a_folder_without_learner_state_points_at_its_checkpoints(tmp_path):
    (tmp_path / "checkpoint_000001").mkdir()
    (tmp_path / "checkpoint_000002").mkdir()
    with pytest.raises(ValueError) as e:
        read_scaler_states(str(tmp_path))
    msg = str(e.value)
    assert msg.startswith("amp.warm_start.from:")
    assert "checkpoint_000001, checkpoint_000002: pick one" in msg


def test_a_path_gone_since_the_settings_were_built_is_refused(tmp_path):
    ckpt = _checkpoint(tmp_path / "gone", {"p0": _scaler_state(2.0)})
    settings = AmpSettings(warm_start={"from": str(ckpt)})
    import shutil

    shutil.rmtree(ckpt)
    with pytest.raises(ValueError, match=r"^amp\.warm_start\.from: .* does not exist"):
        check_warm_start(settings, ["p0"])


def test_a_damaged_state_file_is_refused(tmp_path):
    (tmp_path / "state.pkl").write_bytes(b"\x80\x04 not a pickle")
    with pytest.raises(ValueError) as e:
        read_scaler_states(str(tmp_path))
    assert str(e.value).startswith(f"amp.warm_start.from: {tmp_path / 'state.pkl'}: ")
    assert "truncated or corrupted" in str(e.value) and "warm-start from another" in str(e.value)


def _edited(state: dict, key: str, value) -> dict:
    state["torch"][key] = value
    return state


@pytest.mark.parametrize(
    "key, value",
    [
        ("scale", float("inf")),
        ("scale", float("nan")),
        ("scale", 0.0),
        ("scale", -1.0),
        ("scale", [65536.0]),
        ("scale", True),
        ("scale", 1e39),  # beyond float32: GradScaler's scale tensor cannot hold it
        ("_growth_tracker", -1),
        ("_growth_tracker", 2.5),
        ("_growth_tracker", [1]),
    ],
)
def test_an_edited_scale_or_growth_tracker_is_refused_naming_file_and_value(tmp_path, key, value):
    edited = _edited(_scaler_state(256.0, 3), key, value)
    ckpt = _checkpoint(tmp_path, {"p0": _scaler_state(8.0), "p1": edited})
    with pytest.raises(ValueError) as e:
        check_warm_start(AmpSettings(warm_start={"from": str(ckpt)}), ["p0", "p1"])
    msg = str(e.value)
    state_file = ckpt / "learner_group" / "learner" / "state.pkl"
    assert msg.startswith(f"amp.warm_start.from: {state_file}: module 'p1' has the saved ")
    assert f" {value!r};" in msg, msg
    assert "warm-start from another checkpoint" in msg


def test_a_state_file_changed_after_the_save_is_refused_by_its_manifest(tmp_path):
    from rllib_amp.checkpoint_files import write_manifest

    ckpt = _checkpoint(tmp_path / "ckpt", {"p0": _scaler_state(256.0)})
    write_manifest(str(ckpt))
    state_file = ckpt / "learner_group" / "learner" / "state.pkl"
    # A plausible scale that parses: only the manifest's sha256 can tell.
    state = pickle.loads(state_file.read_bytes())
    state[AMP_STATE_KEY]["p0"]["torch"]["scale"] = 512.0
    state_file.write_bytes(pickle.dumps(state))
    with pytest.raises(ValueError) as e:
        warm_start_seeds(WarmStart(path=str(ckpt)))
    assert str(e.value).startswith(f"amp.warm_start.from: {state_file}: checkpoint file ")
    assert "sha256" in str(e.value) or "bytes" in str(e.value)


def test_nonfinite_weights_in_the_checkpoint_refuse_the_warm_start(tmp_path):
    ckpt = _checkpoint(
        tmp_path, {"p0": _scaler_state(256.0)}, extra={"rl_module": {"p0": {"w": float("nan")}}}
    )
    with pytest.raises(ValueError, match=r"^amp\.warm_start\.from: .*non-finite values"):
        warm_start_seeds(WarmStart(path=str(ckpt)))


def test_a_damaged_checkpoint_moved_aside_is_never_offered(tmp_path):
    (tmp_path / "checkpoint_000002").mkdir()
    (tmp_path / "checkpoint_000003.damaged").mkdir()
    (tmp_path / "checkpoint_000004.damaged-2").mkdir()
    with pytest.raises(ValueError) as e:
        read_scaler_states(str(tmp_path))
    assert "(this folder holds checkpoint_000002: pick one)" in str(e.value)
    assert ".damaged" not in str(e.value)


def test_check_without_run_modules_checks_the_checkpoint_side_only(tmp_path):
    ckpt = _checkpoint(tmp_path, {"p0": _scaler_state(16.0)})
    check_warm_start(AmpSettings(warm_start={"from": str(ckpt), "modules": {"new": "p0"}}))
    with pytest.raises(ValueError, match="'nope' is not in it"):
        check_warm_start(AmpSettings(warm_start={"from": str(ckpt), "modules": {"n": "nope"}}))
    check_warm_start(AmpSettings())  # nothing to check


def test_apply_seeds_scale_and_tracker_not_counters_and_logs_each_module(tmp_path, caplog):
    ckpt = _checkpoint(tmp_path, {"p0": _scaler_state(512.0, 5)})
    scalers = {
        mid: PolicyScaler(AmpSettings(growth_interval=100), "cpu", scaling=True)
        for mid in ("a", "b")
    }
    warm = WarmStart(path=str(ckpt), modules=(("a", "p0"),))
    caplog.set_level(logging.INFO, logger="rllib_amp")
    apply_warm_start(scalers, warm)
    a, b = scalers["a"], scalers["b"]
    assert (a.get_scale(), a.growth_tracker, a.optimizer_steps_lifetime) == (512.0, 5, 0)
    assert (b.get_scale(), b.growth_tracker) == (65536.0, 0)  # not in the map: fresh
    events = [(r.amp_event, r.amp_fields) for r in caplog.records if hasattr(r, "amp_event")]
    assert events == [
        (
            "warm_start",
            {
                "module_id": "a",
                "from_module": "p0",
                "scale": 512.0,
                "growth_tracker": 5,
                "path": str(ckpt),
            },
        )
    ]


def test_apply_to_a_shared_scale_takes_the_smallest_seed(tmp_path):
    ckpt = _checkpoint(tmp_path, {"p0": _scaler_state(2.0**14, 1), "p1": _scaler_state(2.0**6)})
    a = PolicyScaler(AmpSettings(shared_scaler=True), "cpu", scaling=True)
    b = PolicyScaler(AmpSettings(shared_scaler=True), "cpu", scaling=True, share_scale_with=a)
    apply_warm_start({"p0": a, "p1": b}, WarmStart(path=str(ckpt)))
    assert a.get_scale() == b.get_scale() == 2.0**6


def test_apply_without_loss_scaling_reads_nothing_and_warns(tmp_path, caplog):
    warm = WarmStart(path=str(tmp_path / "not-even-there"))
    caplog.set_level(logging.INFO, logger="rllib_amp")
    bf16 = {"p0": PolicyScaler(AmpSettings(), "cpu", scaling=False)}
    apply_warm_start(bf16, warm)
    apply_warm_start({}, warm)  # float32: no scalers at all
    events = [(r.levelname, r.amp_event) for r in caplog.records if hasattr(r, "amp_event")]
    assert events == [("WARNING", "warm_start_ignored")] * 2
