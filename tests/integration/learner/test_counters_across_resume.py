"""The AMP lifetime counters a run reports continue across a resume, for every algorithm.

What a user compares is the last result before the checkpoint and the first after the
restore. The restore is Tune's: an algorithm is built, then ``restore_from_path``.
"""

from __future__ import annotations

import pickle

import pytest

from rllib_amp.algorithms import ALGORITHMS
from rllib_amp.learner import metrics as M
from tests.integration.common import amp_config, learner, train_until_learned

pytestmark = pytest.mark.usefixtures("ray_local")

COUNTERS = (M.OPTIMIZER_STEPS_LIFETIME, M.SKIPPED_STEPS_LIFETIME)
# Enough optimizer steps before APPO's save that a report lagging far behind (its learner
# thread trains each batch twice, and RLlib reported one result of two) is caught. The
# synchronous learners report exactly: any step will do.
MIN_STEPS = {"APPO": 40}
# Some steps skip (and some do not), so both counters move.
AMP = {"dtype": "float16", "init_scale": 2.0**16, "growth_interval": 2}


def _config(algo: str):
    cfg = amp_config(algo, **AMP)
    if algo == "APPO":
        # A small circular buffer: at most N*K=4 updates left once an iteration ends. The
        # learner thread is what matters; sampling in this process spares an actor's start.
        cfg.training(circular_buffer_num_batches=2, circular_buffer_iterations_per_batch=2)
        cfg.env_runners(num_env_runners=0)
    return cfg


def _in_flight(algo: str, cfg) -> int:
    """Optimizer steps an asynchronous learner may take after an iteration's results were
    taken: what waits in its buffer, and the update running. 0 for synchronous learners."""
    if algo != "APPO":
        return 0
    return cfg.circular_buffer_num_batches * cfg.circular_buffer_iterations_per_batch + 1


def _live(algo_obj) -> dict[str, int]:
    s = learner(algo_obj).amp_scalers["default_policy"]
    return {
        M.OPTIMIZER_STEPS_LIFETIME: s.optimizer_steps_lifetime,
        M.SKIPPED_STEPS_LIFETIME: s.skipped_steps_lifetime,
    }


def _reported(result) -> dict[str, int]:
    stats = result["learners"]["default_policy"]
    return {key: int(stats[key]) for key in COUNTERS}


def _saved(path) -> dict[str, int]:
    with open(path / "learner_group" / "learner" / "state.pkl", "rb") as f:
        state = pickle.load(f)["amp_scalers"]["default_policy"]
    return {
        M.OPTIMIZER_STEPS_LIFETIME: state["optimizer_steps_lifetime"],
        M.SKIPPED_STEPS_LIFETIME: state["skipped_steps_lifetime"],
    }


def _check_fresh(reported: dict[str, int], live: dict[str, int], in_flight: int, when: str):
    for key in COUNTERS:
        assert reported[key] <= live[key], (when, key, reported, live)
        assert live[key] - reported[key] <= in_flight, (when, key, reported, live, in_flight)


@pytest.mark.parametrize("algo", list(ALGORITHMS))
def test_counters_continue_from_the_saved_values(algo, tmp_path):
    cfg = _config(algo)
    in_flight = _in_flight(algo, cfg)
    a = cfg.build_algo()
    try:
        result = train_until_learned(a)
        for _ in range(200):
            live = _live(a)
            if (
                live[M.OPTIMIZER_STEPS_LIFETIME] >= MIN_STEPS.get(algo, 1)
                and live[M.SKIPPED_STEPS_LIFETIME]
            ):
                break
            result = train_until_learned(a)
        before = _reported(result)
        _check_fresh(before, _live(a), in_flight, "before the save")
        a.save_to_path(str(tmp_path))
    finally:
        a.stop()
    saved = _saved(tmp_path)
    assert saved[M.SKIPPED_STEPS_LIFETIME] > 0  # both counters are exercised
    # What the last result showed is what the checkpoint holds, give or take the updates in
    # flight (before the fix, APPO's last result showed about half of it).
    for key in COUNTERS:
        assert 0 <= saved[key] - before[key] <= in_flight, (key, before, saved)

    b = cfg.build_algo()
    try:
        b.restore_from_path(str(tmp_path))
        assert _live(b) == saved
        after = _reported(train_until_learned(b))
        live = _live(b)
    finally:
        b.stop()
    # The first result after the restore: the saved values plus this run's steps only.
    _check_fresh(after, live, in_flight, "after the restore")
    assert after[M.OPTIMIZER_STEPS_LIFETIME] > saved[M.OPTIMIZER_STEPS_LIFETIME]
    for key in COUNTERS:
        assert saved[key] <= after[key] <= live[key], (key, saved, after, live)
