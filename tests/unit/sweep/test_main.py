"""A new run stopped (Ctrl-C, SIGTERM, Ray's death) while its Tuner is built, after Tune
wrote tuner.pkl and the command experiment.yaml: nothing of it stays, so the line "nothing
was written; run the same command" is true, even with --name (which refuses a name that
holds an experiment). Without Ray: ``_tune`` with Ray up and the Tuner's build stubbed."""

from __future__ import annotations

import argparse
import os
import signal
from types import SimpleNamespace

import pytest
import ray

from rllib_amp.cli import Interrupted, UsageError
from rllib_amp.sweep import lock as experiment_lock
from rllib_amp.sweep import main as sweep_main
from rllib_amp.sweep import resume as R
from rllib_amp.sweep import tuner as T

# What the watchdog's stop is in the main thread: SIGINT, with what died recorded.
RAY_DIED = "its raylet (pid 1) was killed by SIGKILL"


@pytest.fixture
def building(monkeypatch):
    """``_tune`` on a Ray that is up (nothing started), interrupted by ``stop_with`` once the
    Tuner's files are written; returns the exit status ``_stopped_before_trials`` gives."""
    monkeypatch.setattr(ray, "is_initialized", lambda: True)
    monkeypatch.setattr(
        sweep_main.sweep_storage, "check_reachable_from_nodes", lambda storage: None
    )
    from rllib_amp.sweep import grafana

    monkeypatch.setattr(grafana, "install_dashboard", lambda: None)

    def run(storage, name, stop_with, resume=False, resume_command=None, ray_dead=None):
        def build(exp, args, storage, name, spec):
            exp_dir = os.path.join(storage, name)
            os.makedirs(exp_dir, exist_ok=True)
            for written in ("tuner.pkl", R.EXPERIMENT_FILE):  # Tune's, then the command's
                with open(os.path.join(exp_dir, written), "w") as f:
                    f.write("x")
            raise stop_with

        monkeypatch.setattr(sweep_main, "_build_tuner", build)
        args = argparse.Namespace(resume=resume, name=name)
        stop = T.StopOnSignals()
        stop.resume_command = resume_command
        stop.ray_dead = ray_dead
        with experiment_lock.locks_released():
            if name is not None:
                experiment_lock.lock(storage, name, "--resume" if resume else "--name")
            with pytest.raises(type(stop_with)) as e:
                sweep_main._tune(SimpleNamespace(name="tiny"), args, storage, name, {},
                                 "127.0.0.1:1", "--address", None, stop)  # fmt: skip
        return sweep_main._stopped_before_trials(stop, e.value)

    return run


@pytest.mark.parametrize("name", ["X", None])
@pytest.mark.parametrize(
    ("stop_with", "ray_dead", "status"),
    [
        (Interrupted(signal.SIGTERM), None, 143),
        (KeyboardInterrupt(), None, 130),
        (Interrupted(signal.SIGINT), RAY_DIED, 1),  # the local Ray died
    ],
)
def test_a_new_run_stopped_while_its_tuner_is_built_leaves_nothing(
    tmp_path, capsys, building, name, stop_with, ray_dead, status
):
    assert building(str(tmp_path), name, stop_with, ray_dead=ray_dead) == status
    (line,) = capsys.readouterr().err.splitlines()
    assert "nothing was written; run the same command" in line, line
    assert ("Ray died under the sweep" in line) == bool(ray_dead), line
    assert os.listdir(tmp_path) == []  # no tuner.pkl, no experiment.yaml, no lock
    R.refuse_taken(str(tmp_path), "X")  # the same --name command is accepted again


def test_a_resumed_run_stopped_while_its_tuner_is_built_keeps_its_files(tmp_path, capsys, building):
    (tmp_path / "X").mkdir()
    (tmp_path / "X" / "experiment_state-2026.json").write_text("{}")
    status = building(str(tmp_path), "X", Interrupted(signal.SIGINT), resume=True,
                      resume_command="python -m rllib_amp.tune --name X --resume")  # fmt: skip
    assert status == 130
    assert "continue with: python -m rllib_amp.tune --name X --resume" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path / "X")) == sorted(
        ["experiment_state-2026.json", "tuner.pkl", R.EXPERIMENT_FILE]
    )
    with pytest.raises(UsageError):
        R.refuse_taken(str(tmp_path), "X")
