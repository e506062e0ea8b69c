"""The RLlib and Tune checkpoint internals that verified restores and the fallback rely on.

A Ray upgrade that renames a state file, reshapes save_to_path / restore_from_path, or changes
how Tune names checkpoints or records them must fail here, instead of letting a damaged
checkpoint half-load or a trial restore a damaged checkpoint.
"""

from __future__ import annotations

import inspect
import json

import pytest
from ray.rllib.algorithms.algorithm import Algorithm
from ray.rllib.algorithms.appo import APPO
from ray.rllib.algorithms.dqn import DQN
from ray.rllib.algorithms.ppo import PPO
from ray.rllib.core import COMPONENT_OPTIMIZER, COMPONENT_RL_MODULE
from ray.rllib.core.rl_module.rl_module import RLModule
from ray.rllib.utils.checkpoints import Checkpointable
from ray.train import Checkpoint, CheckpointConfig
from ray.train._internal.checkpoint_manager import _CheckpointManager
from ray.train._internal.session import _TrainingResult
from ray.train._internal.storage import StorageContext
from ray.tune.execution.tune_controller import TuneController
from ray.tune.trainable.metadata import _TrainingRunMetadata

from rllib_amp import checkpoint_files, fs
from rllib_amp.checkpoints.algorithm import AmpAlgorithmMixin

P = inspect.Parameter


def _params(method):
    return [
        (p.name, p.kind)
        for p in list(inspect.signature(method).parameters.values())[1:]
        if p.name != "_ray_trace_ctx"
    ]


@pytest.mark.parametrize("cls", [PPO, DQN, APPO])
def test_save_and_restore_keep_the_signatures_our_overrides_pass_through(cls):
    assert _params(cls.save_to_path) == [
        ("path", P.POSITIONAL_OR_KEYWORD),
        ("state", P.KEYWORD_ONLY),
        ("filesystem", P.KEYWORD_ONLY),
        ("use_msgpack", P.KEYWORD_ONLY),
    ]
    assert _params(cls.restore_from_path) == [
        ("path", P.POSITIONAL_OR_KEYWORD),
        ("args", P.VAR_POSITIONAL),
        ("kwargs", P.VAR_KEYWORD),
    ]
    assert _params(Checkpointable.restore_from_path)[:3] == [
        ("path", P.POSITIONAL_OR_KEYWORD),
        ("component", P.KEYWORD_ONLY),
        ("filesystem", P.KEYWORD_ONLY),
    ]


def test_the_algorithm_overrides_are_the_checkpoint_methods_step_and_training_step():
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.rllib.algorithms.dqn import DQN
    from ray.rllib.utils.metrics import LEARNER_RESULTS

    overridden = {
        n for n, v in vars(AmpAlgorithmMixin).items() if callable(v) and hasattr(Algorithm, n)
    }
    assert overridden == {"save_to_path", "restore_from_path", "restore", "step", "training_step"}
    # step fills the AMP metrics of a result without learner results: RLlib's returns the
    # iteration's results dict, learner results under LEARNER_RESULTS.
    assert _params(Algorithm.step) == [] and LEARNER_RESULTS == "learners"
    # training_step (a restored DQN's buffer refill) is called without arguments.
    assert _params(Algorithm.training_step) == [] and _params(DQN.training_step) == []


def test_tune_restores_a_trial_through_trainable_restore_with_its_record():
    # AmpAlgorithmMixin.restore falls back past a damaged checkpoint: Tune must call it with
    # its record of the checkpoint (a _TrainingResult whose .checkpoint has filesystem + path).
    from ray.tune import Trainable

    assert _params(Trainable.restore) == [("checkpoint_path", P.POSITIONAL_OR_KEYWORD)]
    source = inspect.getsource(TuneController._schedule_trial_restore)
    assert 'method_name = "restore"' in source
    assert "args = (checkpoint_result,)" in source
    assert {"checkpoint", "metrics"} <= set(inspect.signature(_TrainingResult).parameters)
    # Tune's records hold ray.tune.Checkpoint; the mixin checks for ray.train's, its base.
    import ray.tune

    assert issubclass(ray.tune.Checkpoint, Checkpoint)


def test_tune_cannot_delete_a_recorded_checkpoint_that_was_moved(tmp_path):
    # Why --resume copies (never moves) the damaged checkpoints Tune holds records of: when
    # num_to_keep passes a record whose folder is gone, Tune's checkpoint manager raises here,
    # outside its try, and TuneController._process_trial_save skips the rest of its
    # bookkeeping (the checkpoint index, the experiment state save).
    from ray.train._internal.storage import _delete_fs_path

    with pytest.raises(FileNotFoundError):
        _delete_fs_path(fs.resolve(str(tmp_path))[0], str(tmp_path / "checkpoint_000001"))


def test_state_file_names_and_component_keys_we_check():
    assert Algorithm.STATE_FILE_NAME == "algorithm_state"
    assert Checkpointable.STATE_FILE_NAME == "state"
    assert RLModule.STATE_FILE_NAME == checkpoint_files._MODULE_STATE_STEM
    assert set(checkpoint_files._RESTORED_STEMS) == {
        Checkpointable.STATE_FILE_NAME,
        Algorithm.STATE_FILE_NAME,
        RLModule.STATE_FILE_NAME,
    }
    assert checkpoint_files._FINITE_KEYS == (COMPONENT_RL_MODULE, COMPONENT_OPTIMIZER)


def test_tune_checkpoint_and_experiment_state_names():
    assert fs.CHECKPOINT_FOLDER.match(StorageContext._make_checkpoint_dir_name(7))
    assert TuneController.CKPT_FILE_TMPL.format("*") == fs.EXPERIMENT_STATE_GLOB


def test_tune_checkpoint_manager_records_what_the_fallback_reads(tmp_path):
    metadata = _TrainingRunMetadata()
    metadata.checkpoint_manager = _CheckpointManager(CheckpointConfig())
    result = _TrainingResult(checkpoint=Checkpoint(path=str(tmp_path)), metrics={"a": 1})
    metadata.checkpoint_manager.register_checkpoint(result)
    manager = _TrainingRunMetadata.from_json_state(
        json.loads(json.dumps(metadata.get_json_state()))
    ).checkpoint_manager
    assert manager.latest_checkpoint_result.checkpoint.path == str(tmp_path)
