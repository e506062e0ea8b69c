"""amp.warm_start and amp.shared_scaler from an experiment file: accepted when the checkpoint
holds a loss scale for the mapped modules, else exit 2 with one line before anything starts."""

from __future__ import annotations

import pickle
import textwrap

import pytest

from rllib_amp.scaling.scaler import PolicyScaler
from rllib_amp.scaling.state import AMP_STATE_KEY
from rllib_amp.settings import AmpSettings
from rllib_amp.sweep import main as cli

FILE = """\
algorithm: PPO
env: CartPole-v1
model: mini
amp:
  dtype: float16
  shared_scaler: true
  warm_start: {warm_start}
training: {{train_batch_size_per_learner: 100, minibatch_size: 50, num_epochs: 1}}
resources: {{num_env_runners: 0}}
stop: {{training_iteration: 1}}
"""


def checkpoint(tmp_path, state):
    folder = tmp_path / "ckpt" / "learner_group" / "learner"
    folder.mkdir(parents=True)
    (folder / "state.pkl").write_bytes(pickle.dumps(state))
    return str(tmp_path / "ckpt")


def scaled(tmp_path):
    scaler = PolicyScaler(AmpSettings(init_scale=512.0), "cpu", scaling=True)
    return checkpoint(tmp_path, {AMP_STATE_KEY: {"default_policy": scaler.state_dict()}})


def edited(key, value):
    def make(tmp_path):
        state = PolicyScaler(AmpSettings(init_scale=512.0), "cpu", scaling=True).state_dict()
        state["torch"][key] = value
        return checkpoint(tmp_path, {AMP_STATE_KEY: {"default_policy": state}})

    return make


def edited_state(key, value):
    """A checkpoint whose scaler state (not its torch part) has ``key`` set to ``value``."""

    def make(tmp_path):
        state = PolicyScaler(AmpSettings(init_scale=512.0), "cpu", scaling=True).state_dict()
        state[key] = value
        return checkpoint(tmp_path, {AMP_STATE_KEY: {"default_policy": state}})

    return make


def experiment(tmp_path, warm_start):
    p = tmp_path / "warm.yaml"
    p.write_text(textwrap.dedent(FILE.format(warm_start=warm_start)))
    return str(p)


def test_warm_start_and_shared_scaler_pass_schema_and_preflight(tmp_path, capsys):
    ckpt = scaled(tmp_path)
    path = experiment(tmp_path, f"{{from: {ckpt}, modules: {{default_policy: default_policy}}}}")
    assert cli.main(["--config", path, "--dry-run"]) == 0
    out = capsys.readouterr().out
    assert "shared_scaler: true" in out and ckpt in out


@pytest.mark.parametrize(
    "make, modules, fragment",
    [
        (lambda t: str(t / "missing"), None, "does not exist"),
        (lambda t: checkpoint(t, {}), None, "holds no AMP scaler state"),
        (scaled, "{default_policy: p9}", "'p9' is not in it"),
        (scaled, "{p1: default_policy}", "'p1' is not a module of this run"),
        (edited("scale", float("inf")), None, "has the saved scale inf;"),
        (edited("scale", float("nan")), None, "has the saved scale nan;"),
        (edited("scale", 0.0), None, "has the saved scale 0.0;"),
        (edited("scale", -1.0), None, "has the saved scale -1.0;"),
        (edited("scale", [512.0]), None, "has the saved scale [512.0];"),
        (edited("_growth_tracker", -3), None, "has the saved growth tracker -3;"),
        # Not a positive normal float32: 1e-300 would become 0.0 in the scaler.
        (
            edited("scale", 1e-300),
            None,
            "has the saved scale 1e-300; a loss scale is a positive normal float32",
        ),
        (edited("scale", 1e-40), None, "has the saved scale 1e-40;"),
        # A state this version cannot read is named as such, not as "trained without scaling".
        (
            edited_state("version", 99),
            None,
            "has the scaler state version 99; this rllib-amp reads version 1",
        ),
        (edited_state("version", "1"), None, "has the scaler state version '1';"),
        (
            edited_state("torch", "scale=512"),
            None,
            "has the saved GradScaler state 'scale=512', not a mapping",
        ),
        (edited_state("scaling", "yes"), None, "has the saved scaling flag 'yes';"),
    ],
)
def test_bad_warm_start_exits_2_with_one_line_and_starts_nothing(
    tmp_path, capsys, make, modules, fragment
):
    ckpt = make(tmp_path)
    spec = f"{{from: {ckpt}" + (f", modules: {modules}}}" if modules else "}")
    storage = tmp_path / "storage"
    rc = cli.main(["--config", experiment(tmp_path, spec), "--storage-path", str(storage)])
    err = capsys.readouterr().err
    assert rc == 2 and fragment in err and err.count("\n") == 1, err
    assert "amp.warm_start" in err
    if "saved" in fragment:  # the edited file is named
        assert "ckpt/learner_group/learner/state.pkl: module 'default_policy'" in err, err
    assert not storage.exists()  # nothing started, nothing written
