"""Results an asynchronous learner left queued are merged in order; the RLlib code that
leaves them there is pinned, so a Ray upgrade that changes it is looked at again."""

from __future__ import annotations

import ast
import hashlib
import inspect
import queue
import textwrap

from ray.rllib.algorithms.appo import APPOConfig
from ray.rllib.algorithms.impala.impala_learner import IMPALALearner, _LearnerThread
from ray.rllib.utils.metrics.metrics_logger import MetricsLogger

from rllib_amp.learner import async_results as A


def _reduced(step: int, *, trained: int = 10, scale: float | None = None) -> dict:
    """One update's reduced learner metrics, as RLlib's learner thread queues them."""
    m = MetricsLogger()
    m.log_value(("p0", "amp_optimizer_steps_lifetime"), step, reduce="max", window=1)
    m.log_value(("p0", "trained_lifetime"), trained, reduce="lifetime_sum", with_throughput=True)
    m.log_value(("p0", "trained"), trained, reduce="sum", with_throughput=True)
    m.log_value(("p0", "loss"), float(step), window=1)
    if scale is not None:
        m.log_value(("p0", "scale"), scale, reduce="item")
    return m.reduce()


def _values(result: dict) -> dict:
    return {k: float(v) for k, v in MetricsLogger.peek_results(result)["p0"].items()}


def test_pending_results_merge_in_order_with_the_one_taken():
    pending: queue.Queue = queue.Queue()
    for step in (2, 3, 4):
        pending.put(_reduced(step, scale=float(step)))
    taken = {**_reduced(1, scale=1.0), A._MODULE_STATE_KEY: "weights"}
    merged = A.collect_pending(pending, taken)
    assert pending.empty()
    assert merged[A._MODULE_STATE_KEY] == "weights"  # passed on untouched
    assert _values(merged) == {
        "amp_optimizer_steps_lifetime": 4.0,  # the newest count, not the oldest
        "trained_lifetime": 40.0,  # every update's steps, none left behind
        "trained": 40.0,
        "loss": 2.5,  # a mean over the merged updates
        "scale": 4.0,  # the last item
    }


def test_nothing_pending_leaves_the_result_as_rllib_returned_it():
    taken = _reduced(1)
    assert A.collect_pending(queue.Queue(), taken) is taken


def test_an_empty_take_still_collects_what_is_pending():
    pending: queue.Queue = queue.Queue()
    pending.put(_reduced(5))
    assert _values(A.collect_pending(pending, {}))["amp_optimizer_steps_lifetime"] == 5.0


def test_discard_pending_empties_the_queue():
    pending: queue.Queue = queue.Queue()
    for step in (1, 2):
        pending.put(_reduced(step))
    assert A.discard_pending(pending) == 2 and pending.empty()
    assert A.discard_pending(None) == 0


def _tree_hash(fn) -> str:
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    return hashlib.sha256(ast.dump(node).encode()).hexdigest()[:16]


def test_rllib_still_takes_one_result_per_update_from_k_updates():
    """What collect_pending makes up for. If a Ray upgrade changes these bodies, check
    whether IMPALALearner.update still leaves results queued; update the hashes after."""
    assert APPOConfig().use_circular_buffer
    assert APPOConfig().circular_buffer_iterations_per_batch > 1  # K updates per batch
    assert _tree_hash(IMPALALearner.update) == "1d6d2b4ab403dab0"
    assert _tree_hash(_LearnerThread.step) == "ce570eaf3ed72c96"
    source = inspect.getsource(IMPALALearner.update)
    assert "self._learner_thread_out_queue.get(" in source
    assert f'"{A._MODULE_STATE_KEY}"' in source
