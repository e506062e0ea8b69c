"""verify_checkpoint / write_manifest on checkpoint folders laid out like RLlib's (no Ray)."""

from __future__ import annotations

import json
import logging
import os
import pickle

import numpy as np
import pytest
import torch

from rllib_amp.checkpoint_files import (
    MANIFEST_FILE_NAME,
    CheckpointError,
    rllib_restore_files,
    verify_checkpoint,
    write_manifest,
)

WEIGHTS = "learner_group/learner/rl_module/default_policy/module_state.pkl"
LEARNER = "learner_group/learner/state.pkl"
ENV_RUNNER = "env_runner/state.pkl"


def _dump(path, obj):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(obj, f)


def _checkpoint(root, *, manifest=True):
    """The files an Algorithm checkpoint has, with small contents of the same kinds."""
    rng = np.random.default_rng(0)
    _dump(
        root / WEIGHTS,
        {"pi.weight": rng.standard_normal((16, 4), dtype=np.float32), "pi.bias": np.zeros(16)},
    )
    _dump(
        root / LEARNER,
        {
            "optimizer": {
                "default_policy_default_optimizer": {
                    "state": {
                        "state": {0: {"step": 3.0, "exp_avg": np.ones(4, dtype=np.float32)}},
                        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999)}],
                    }
                }
            },
            # Metrics may hold nan (an EMA before its first value): not checked.
            "metrics_logger": {"stats": {"timer": {"value": float("nan")}}},
            "amp_scalers": {"default_policy": {"torch": {"scale": 1024.0}}},
        },
    )
    _dump(root / ENV_RUNNER, {"num_env_steps_sampled_lifetime": 128})
    _dump(root / "algorithm_state.pkl", {"training_iteration": 2})
    (root / "rllib_checkpoint.json").write_text(json.dumps({"checkpoint_version": "2.1"}))
    if manifest:
        write_manifest(root)
    return root


def _rewrite(path, change):
    with open(path, "rb") as f:
        obj = pickle.load(f)
    change(obj)
    _dump(path, obj)


def test_intact_checkpoint_is_read_whole_against_its_manifest(tmp_path):
    ck = _checkpoint(tmp_path)
    manifest = json.loads((ck / MANIFEST_FILE_NAME).read_text())
    on_disk = {
        os.path.relpath(os.path.join(d, n), ck).replace(os.sep, "/")
        for d, _, names in os.walk(ck)
        for n in names
    }
    assert set(manifest["files"]) == on_disk - {MANIFEST_FILE_NAME}
    got = verify_checkpoint(ck)
    assert got is not None and got.files == 5 and got.manifest == str(ck / MANIFEST_FILE_NAME)


@pytest.mark.parametrize("damage", ["truncate", "garbage"])
@pytest.mark.parametrize("manifest", [True, False])
@pytest.mark.parametrize("name", [WEIGHTS, LEARNER, ENV_RUNNER, "algorithm_state.pkl"])
def test_truncated_or_overwritten_file_is_named(tmp_path, name, manifest, damage):
    ck = _checkpoint(tmp_path, manifest=manifest)
    target = ck / name
    data = target.read_bytes()
    target.write_bytes(data[: len(data) // 2] if damage == "truncate" else b"\x00" * len(data))
    with pytest.raises(CheckpointError) as e:
        verify_checkpoint(ck)
    assert e.value.path == str(target)


def test_damaged_rllib_checkpoint_json_is_named(tmp_path):
    ck = _checkpoint(tmp_path, manifest=False)
    (ck / "rllib_checkpoint.json").write_text('{"checkpoint_version": "2.')
    with pytest.raises(CheckpointError) as e:
        verify_checkpoint(ck)
    assert e.value.path == str(ck / "rllib_checkpoint.json")


def _flip_a_weight_byte(path):
    """Flips one mantissa bit inside the pi.weight array's bytes; the file still parses."""
    data = bytearray(path.read_bytes())
    with open(path, "rb") as f:
        weight = pickle.load(f)["pi.weight"]
    at = bytes(data).index(weight.tobytes())
    data[at + 1] ^= 0x01
    path.write_bytes(bytes(data))
    with open(path, "rb") as f:
        changed = pickle.load(f)["pi.weight"]
    assert np.isfinite(changed).all() and not np.array_equal(changed, weight)


def test_flipped_byte_that_still_parses_is_caught_by_the_manifest(tmp_path):
    ck = _checkpoint(tmp_path)
    target = ck / WEIGHTS
    _flip_a_weight_byte(target)  # it still parses, and is finite...
    with pytest.raises(CheckpointError, match="sha256") as e:  # ...but it is not what was saved
        verify_checkpoint(ck)
    assert e.value.path == str(target)


def test_file_listed_in_the_manifest_but_missing_is_named(tmp_path):
    ck = _checkpoint(tmp_path)
    os.remove(ck / ENV_RUNNER)
    with pytest.raises(CheckpointError, match="missing") as e:
        verify_checkpoint(ck)
    assert e.value.path == str(ck / ENV_RUNNER)


def test_damaged_manifest_is_named(tmp_path):
    ck = _checkpoint(tmp_path)
    (ck / MANIFEST_FILE_NAME).write_text('{"files": ')
    with pytest.raises(CheckpointError) as e:
        verify_checkpoint(ck)
    assert e.value.path == str(ck / MANIFEST_FILE_NAME)


def _set_nan_weight(state):
    state["pi.weight"][3, 1] = np.nan


def _set_inf_adam_state(state):
    opt = state["optimizer"]["default_policy_default_optimizer"]["state"]["state"][0]
    opt["exp_avg"][0] = np.inf


def _set_nan_torch_weight(state):
    state["pi.bias"] = torch.full((16,), float("nan"))


@pytest.mark.parametrize(
    "name, change",
    [
        (WEIGHTS, _set_nan_weight),
        (WEIGHTS, _set_nan_torch_weight),
        (LEARNER, _set_inf_adam_state),
    ],
)
def test_nonfinite_weights_or_optimizer_state_are_refused_even_with_a_consistent_manifest(
    tmp_path, name, change
):
    """What a run that diverged writes: the manifest agrees with the file, the values are bad."""
    ck = _checkpoint(tmp_path)
    _rewrite(ck / name, change)
    write_manifest(ck)
    with pytest.raises(CheckpointError, match="non-finite") as e:
        verify_checkpoint(ck)
    assert e.value.path == str(ck / name)


def test_without_manifest_the_files_are_still_checked_and_one_info_line_says_so(tmp_path, caplog):
    ck = _checkpoint(tmp_path, manifest=False)
    caplog.set_level(logging.INFO, logger="rllib_amp")
    got = verify_checkpoint(ck)
    assert got is not None and got.manifest is None and got.files == 5
    events = [(r.levelname, r.amp_event) for r in caplog.records if hasattr(r, "amp_event")]
    assert events == [("INFO", "no_manifest")]
    caplog.clear()
    verify_checkpoint(ck, announce_missing_manifest=False)
    assert not [r for r in caplog.records if hasattr(r, "amp_event")]
    _rewrite(ck / WEIGHTS, _set_nan_weight)
    with pytest.raises(CheckpointError, match="non-finite"):
        verify_checkpoint(ck)


def test_a_component_folder_is_checked_against_the_algorithm_manifest(tmp_path):
    """Restoring one component (a learner, one module) uses the manifest above it."""
    ck = _checkpoint(tmp_path)
    learner = ck / "learner_group" / "learner"
    module = learner / "rl_module" / "default_policy"
    got = verify_checkpoint(learner)
    assert got is not None and got.manifest == str(ck / MANIFEST_FILE_NAME) and got.files == 2
    _flip_a_weight_byte(ck / WEIGHTS)
    for folder in (learner, module):
        with pytest.raises(CheckpointError, match="sha256") as e:
            verify_checkpoint(folder)
        assert e.value.path == str(ck / WEIGHTS)
    # The env runner is not part of the learner: its restore is not blocked by the weights.
    assert verify_checkpoint(ck / "env_runner") is not None


def test_checkpoint_error_survives_pickling_with_its_path():
    e = pickle.loads(pickle.dumps(CheckpointError("bad", path="/x/state.pkl")))
    assert isinstance(e, CheckpointError) and e.path == "/x/state.pkl" and str(e) == "bad"


def test_no_folder_is_left_to_rllib(tmp_path):
    assert verify_checkpoint(tmp_path / "nothing_here") is None


# A pickle naming a class from a module this process cannot import.
_MISSING_CLASS_PICKLE = b"cno_such_module_for_rllib_amp_tests\nThing\n."


def test_class_file_naming_a_missing_class_is_no_damage(tmp_path):
    """RLlib's restore never reads class_and_ctor_args.pkl; from_checkpoint falls back past it."""
    ck = _checkpoint(tmp_path, manifest=False)
    (ck / "env_runner" / "class_and_ctor_args.pkl").write_bytes(_MISSING_CLASS_PICKLE)
    write_manifest(ck)
    assert verify_checkpoint(ck) is not None


def test_state_file_naming_a_missing_class_is_refused_before_load(tmp_path):
    ck = _checkpoint(tmp_path, manifest=False)
    (ck / ENV_RUNNER).write_bytes(_MISSING_CLASS_PICKLE)
    write_manifest(ck)
    with pytest.raises(CheckpointError, match="cannot be loaded here") as e:
        verify_checkpoint(ck)
    assert e.value.path == str(ck / ENV_RUNNER)


# -- before anything is read: links, missing state files, unlisted files --------------------
def test_a_link_out_of_the_checkpoint_is_refused_without_following_it(tmp_path):
    ck = _checkpoint(tmp_path / "ck")
    outside = tmp_path / "system"
    outside.mkdir()
    (outside / "state.pkl").write_bytes(b"garbage")  # named instead, if the link were followed
    link = ck / "env_runner" / "extra"
    os.symlink(outside, link)
    with pytest.raises(CheckpointError, match="symbolic link") as e:
        verify_checkpoint(ck)
    assert e.value.path == str(link) and str(outside) in str(e.value)


def test_a_dangling_link_is_refused_and_a_link_inside_is_fine(tmp_path):
    ck = _checkpoint(tmp_path / "ck", manifest=False)
    os.symlink(ck / "env_runner", ck / "same_runner")  # stays inside: read like any folder
    assert verify_checkpoint(ck) is not None
    os.symlink(tmp_path / "gone", ck / "dangling")
    with pytest.raises(CheckpointError, match="does not exist") as e:
        verify_checkpoint(ck)
    assert e.value.path == str(ck / "dangling")


def test_a_checkpoint_reached_through_a_link_is_read(tmp_path):
    ck = _checkpoint(tmp_path / "ck")
    os.symlink(ck, tmp_path / "latest")
    got = verify_checkpoint(tmp_path / "latest")
    assert got is not None and got.files == 5


def _mark_components(root):
    """RLlib's component files next to each state file, as save_to_path writes them."""
    for rel in (WEIGHTS, LEARNER, ENV_RUNNER):
        folder = (root / rel).parent
        stem = os.path.splitext(os.path.basename(rel))[0]
        (folder / "metadata.json").write_text(json.dumps({"state_file": stem}))
        _dump(folder / "class_and_ctor_args.pkl", {"class": "X"})


@pytest.mark.parametrize("name", [WEIGHTS, LEARNER, ENV_RUNNER])
def test_without_manifest_a_component_missing_its_state_file_is_refused(tmp_path, name):
    ck = _checkpoint(tmp_path, manifest=False)
    _mark_components(ck)
    assert verify_checkpoint(ck) is not None
    os.remove(ck / name)
    with pytest.raises(CheckpointError, match="RLlib's restore reads it") as e:
        verify_checkpoint(ck)
    assert e.value.path == str(ck / name)
    # A warm start reads the learner's state alone: the other components do not matter.
    if name != LEARNER:
        assert verify_checkpoint(ck, for_rllib=False) is not None


def test_required_files_must_be_there(tmp_path):
    ck = _checkpoint(tmp_path, manifest=False)
    assert verify_checkpoint(ck, required=["algorithm_state.pkl", ENV_RUNNER]) is not None
    os.remove(ck / "algorithm_state.pkl")
    with pytest.raises(CheckpointError, match="missing") as e:
        verify_checkpoint(ck, required=["algorithm_state.pkl"])
    assert e.value.path == str(ck / "algorithm_state.pkl")


@pytest.mark.parametrize(
    "rel",
    [
        "env_runner/state.msgpack",
        "learner_group/state.pkl",
        "class_and_ctor_args.pkl",
        "x/module_state.pkl",
    ],
)
def test_a_file_rllib_reads_but_the_manifest_does_not_list_is_refused(tmp_path, rel):
    ck = _checkpoint(tmp_path)
    _dump(ck / rel, {"added": "after the save"})
    with pytest.raises(CheckpointError, match="not listed in the manifest") as e:
        verify_checkpoint(ck)
    assert e.value.path == str(ck / rel)


def test_other_unlisted_files_get_one_warning(tmp_path, caplog):
    ck = _checkpoint(tmp_path)
    (ck / "notes.txt").write_text("mine")
    (ck / "env_runner" / "plot.png").write_bytes(b"\x89PNG")
    caplog.set_level(logging.INFO, logger="rllib_amp")
    assert verify_checkpoint(ck) is not None
    (warning,) = [r for r in caplog.records if getattr(r, "amp_event", "") == "unlisted_files"]
    assert warning.levelname == "WARNING"
    assert warning.amp_fields["files"] == [str(ck / "env_runner/plot.png"), str(ck / "notes.txt")]


# -- the loss scale ------------------------------------------------------------------------
def test_the_scale_key_is_the_one_the_learner_saves_under():
    from rllib_amp.checkpoint_files import _AMP_STATE_KEY
    from rllib_amp.scaling.state import AMP_STATE_KEY

    assert _AMP_STATE_KEY == AMP_STATE_KEY


@pytest.mark.parametrize("scale", [float("inf"), float("nan"), 0.0, -1.0])
def test_an_unusable_scale_is_refused_even_with_a_consistent_manifest(tmp_path, scale):
    ck = _checkpoint(tmp_path)

    def set_scale(state):
        state["amp_scalers"]["default_policy"]["torch"]["scale"] = scale

    _rewrite(ck / LEARNER, set_scale)
    write_manifest(ck)  # the sha256 matches: only the value tells
    with pytest.raises(CheckpointError, match="scale" if scale <= 0 else "non-finite") as e:
        verify_checkpoint(ck)
    assert e.value.path == str(ck / LEARNER)
    assert "amp_scalers/default_policy/torch/scale" in str(e.value)


# -- which files RLlib's restore reads -----------------------------------------------------
class _Component:
    """A Checkpointable's shape: named components and a state file name."""

    def __init__(self, state_file="state", **components):
        self.STATE_FILE_NAME = state_file
        self._components = components

    def get_checkpointable_components(self):
        return list(self._components.items())


def test_rllib_restore_files_follow_the_component_folders_present(tmp_path):
    ck = _checkpoint(tmp_path, manifest=False)
    module = _Component("module_state")
    algo = _Component(
        "algorithm_state",
        learner_group=_Component(
            learner=_Component(rl_module=_Component("module_state", default_policy=module))
        ),
        env_runner=_Component(env_to_module_connector=_Component()),
        eval_env_runner=_Component(),  # no folder: RLlib skips it
    )
    (ck / "learner_group/learner/rl_module/module_state.msgpack").write_bytes(b"\x80")
    assert rllib_restore_files(algo, ck) == [
        WEIGHTS,
        "learner_group/learner/rl_module/module_state.msgpack",  # msgpack first, as RLlib
        LEARNER,
        "learner_group/state.pkl",  # missing here: verify_checkpoint names it
        ENV_RUNNER,
        "algorithm_state.pkl",
    ]


# -- untrusted files: nothing is unpickled before the manifest holds --------------------------
class _Planted:
    """A pickle that, once unpickled, writes a file: what an attacker's pickle could do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_an_unlisted_pickle_is_never_unpickled(tmp_path, caplog):
    ck = _checkpoint(tmp_path)
    marker = tmp_path / "ran"
    with open(ck / "extra.pkl", "wb") as f:  # not read by RLlib, not in the manifest
        pickle.dump(_Planted(marker), f)
    caplog.set_level(logging.INFO, logger="rllib_amp")
    assert verify_checkpoint(ck) is not None
    assert not marker.exists()
    (warning,) = [r for r in caplog.records if getattr(r, "amp_event", "") == "unlisted_files"]
    assert warning.amp_fields["files"] == [str(ck / "extra.pkl")]


def test_every_file_is_checked_against_the_manifest_before_any_is_unpickled(tmp_path):
    ck = _checkpoint(tmp_path)
    marker = tmp_path / "ran"
    listed = sorted(p for p in ck.rglob("*.pkl"))
    # The first pickle in reading order is replaced by a planted one and the manifest made to
    # match it (a consistent manifest is no signature); a later file is damaged.
    _dump(listed[0], _Planted(marker))
    write_manifest(ck)
    with open(listed[-1], "ab") as f:
        f.write(b"tail")
    with pytest.raises(CheckpointError, match="manifest"):
        verify_checkpoint(ck)
    assert not marker.exists()
