"""A trial restores its newest intact checkpoint when Tune's record names a damaged one.

Tune's experiment state is never rewritten: the trial's own restore (AmpAlgorithmMixin.restore)
walks back to the newest intact ``checkpoint_*`` folder of the trial, on a plain Tuner.restore
and after ``--resume``'s check (resume_from_intact_checkpoints) alike.
"""

from __future__ import annotations

import json
import logging
import os

import pytest

from rllib_amp.checkpoint_files import MANIFEST_FILE_NAME
from rllib_amp.checkpoints.fallback import resume_from_intact_checkpoints
from tests.integration.common import amp_config

pytestmark = pytest.mark.usefixtures("ray_local")


class _Errors(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _rows(trial):
    with open(trial / "result.json") as f:
        return [json.loads(line) for line in f if line.strip()]


def _iterations(trial):
    return [r["training_iteration"] for r in _rows(trial)]


# A real Tune trial, failed, damaged and resumed twice: 40-60 s on 2 cores. The default run
# has the override's direct test below.
@pytest.mark.slow
def test_a_trial_restores_past_a_damaged_checkpoint_tune_still_records(tmp_path):
    from ray import tune

    fail_at = tmp_path / "fail_at"  # the iteration whose result raises, while the file is there
    fail_at.write_text("3")

    seen = tmp_path / "iterations"  # every iteration the trial ran, failed ones too

    def fail(algorithm, result, **kwargs):
        with open(seen, "a") as f:
            f.write(f"{result['training_iteration']}\n")
        if fail_at.exists() and result["training_iteration"] == int(fail_at.read_text()):
            raise RuntimeError("injected failure")

    cfg = amp_config("PPO", dtype="float16").callbacks(on_train_result=fail)

    def fit(restore):
        if restore:
            tuner = tune.Tuner.restore(
                str(tmp_path / "sweep"), trainable=cfg.algo_class, resume_errored=True
            )
        else:
            tuner = tune.Tuner(
                cfg.algo_class,
                param_space=cfg,
                run_config=tune.RunConfig(
                    name="sweep",
                    storage_path=str(tmp_path),
                    stop={"training_iteration": 4},
                    checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1, num_to_keep=2),
                    failure_config=tune.FailureConfig(max_failures=0),
                    verbose=0,
                ),
            )
        return tuner.fit()[0]

    assert fit(restore=False).error is not None
    (trial,) = [p for p in (tmp_path / "sweep").iterdir() if p.is_dir()]
    assert sorted(p.name for p in trial.glob("checkpoint_*")) == [
        "checkpoint_000000",
        "checkpoint_000001",
    ]
    assert (trial / "checkpoint_000001" / MANIFEST_FILE_NAME).exists()
    damaged = trial / "checkpoint_000001" / "env_runner" / "state.pkl"
    damaged.write_bytes(damaged.read_bytes()[:3])

    # First resume: it fails again at iteration 2, before its next checkpoint, so Tune's
    # record still names the damaged checkpoint_000001 for the second resume.
    fail_at.write_text("2")
    assert fit(restore=True).error is not None
    # Restored from checkpoint_000000 (iteration 1), not from the damaged one (iteration 2).
    assert seen.read_text().split() == ["1", "2", "3", "2"]

    # Second resume, as `--resume` runs it: the damaged checkpoint is said and a copy kept
    # aside first; Tune's experiment state is left as it is.
    fail_at.unlink()
    (choice,) = resume_from_intact_checkpoints(tmp_path / "sweep")
    assert choice.intact == str(trial / "checkpoint_000000")
    assert [d.file for d in choice.damaged] == [str(damaged)]
    errors = _Errors()
    tune_logger = logging.getLogger("ray.tune")
    tune_logger.addHandler(errors)
    try:
        result = fit(restore=True)
    finally:
        tune_logger.removeHandler(errors)
    assert result.error is None and result.metrics["training_iteration"] == 4
    assert seen.read_text().split() == ["1", "2", "3", "2", "2", "3", "4"]
    assert _iterations(trial) == [1, 2, 2, 3, 4]
    # Tune's clock went on from its record (the damaged checkpoint's): not back to 0.
    seconds = [r["time_total_s"] for r in _rows(trial)]
    assert seconds == sorted(seconds)
    # Tune's own bookkeeping went on: it deleted the checkpoints past num_to_keep, the
    # damaged original among them, without an error; the copy kept aside stays.
    assert sorted(p.name for p in trial.glob("checkpoint_*")) == [
        "checkpoint_000001.damaged",
        "checkpoint_000003",
        "checkpoint_000004",
    ]
    assert (trial / "checkpoint_000001.damaged" / "env_runner" / "state.pkl").exists()
    assert errors.messages == []
    assert os.path.exists(trial / "checkpoint_000004" / MANIFEST_FILE_NAME)


def test_only_tunes_record_falls_back_a_path_from_user_code_is_restored_as_asked(tmp_path, caplog):
    from ray.train import Checkpoint
    from ray.train._internal.session import _TrainingResult

    from rllib_amp.checkpoint_files import CheckpointError
    from rllib_amp.checkpoints.fallback import KEPT_ASIDE_FILE

    algo = amp_config("PPO", dtype="float16").build_algo()
    try:
        for i in range(2):
            algo.train()
            algo.save_to_path(str(tmp_path / f"checkpoint_{i:06d}"))
        damaged = tmp_path / "checkpoint_000001" / "algorithm_state.pkl"
        damaged.write_bytes(damaged.read_bytes()[:3])
        with pytest.raises(CheckpointError):
            algo.restore(str(tmp_path / "checkpoint_000001"))
        record = _TrainingResult(
            checkpoint=Checkpoint(path=str(tmp_path / "checkpoint_000001")),
            metrics={"training_iteration": 2, "time_total_s": 99.0},
        )
        caplog.set_level(logging.WARNING, logger="rllib_amp")
        algo.restore(record)
        assert algo.iteration == 1  # checkpoint_000000's own count
        assert algo.train()["time_total_s"] > 99.0  # Tune's clock went on
        (warning,) = [r for r in caplog.records if r.name.startswith("rllib_amp")]
        assert warning.amp_fields == {
            "damaged": str(tmp_path / "checkpoint_000001"),
            "intact": str(tmp_path / "checkpoint_000000"),
        }
        # Both found damaged and kept aside by `--resume --restart-damaged`: nothing to
        # restore, the trial goes on from where it is (a fresh one: its first iteration).
        for i in range(2):
            (tmp_path / f"checkpoint_{i:06d}" / KEPT_ASIDE_FILE).write_text("kept")
        algo.restore(record)
        assert algo.iteration == 2
    finally:
        algo.stop()
