"""Asynchronous learners (APPO, IMPALA): every update's results reach the algorithm, in time.

RLlib 2.60's ``IMPALALearner`` thread puts one reduced result per finished update into an
out-queue, and ``update()`` takes one per call. APPO trains each batch K times
(``circular_buffer_iterations_per_batch``, 2 by default), so K-1 results per call stay
behind: the queue grows without bound and every reported learner metric lags further (after
n calls, that of update ~n of ~K*n). The AMP lifetime counters read about 1/K of the truth,
and seem to double across a ``--resume`` (a restore starts an empty queue).

``collect_pending`` merges what RLlib left in the queue, oldest first, with the result RLlib
took, as the algorithm merges results arriving one after another (sums add up, counters keep
their maximum, the last item wins).

Example:
    >>> import queue
    >>> from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
    >>> def reduced(n):
    ...     m = MetricsLogger()
    ...     m.log_value("steps", n, reduce="max", window=1)
    ...     m.log_value("trained", 10, reduce="sum")
    ...     return m.reduce()
    >>> pending = queue.Queue()
    >>> for n in (2, 3):
    ...     pending.put(reduced(n))
    >>> merged = collect_pending(pending, reduced(1))
    >>> sorted((k, int(v)) for k, v in MetricsLogger.peek_results(merged).items())
    [('steps', 3), ('trained', 30)]
    >>> pending.empty()
    True
"""

from __future__ import annotations

import queue

from ray.rllib.utils.metrics.metrics_logger import MetricsLogger
from ray.rllib.utils.typing import ResultDict

# What IMPALALearner.update adds to a result besides metrics (not a Stats object).
_MODULE_STATE_KEY = "_rl_module_state_after_update"


def collect_pending(
    out_queue: queue.Queue, result: ResultDict, *, stats_cls_lookup: dict[str, type] | None = None
) -> ResultDict:
    """``result`` merged with every result still waiting in ``out_queue`` (emptied); as it is
    when nothing waits. ``stats_cls_lookup``: the config's, for custom reduce methods."""
    pending = _drain(out_queue)
    if not pending:
        return result
    extra = {k: result.pop(k) for k in (_MODULE_STATE_KEY,) if k in result}
    kwargs = {"stats_cls_lookup": stats_cls_lookup} if stats_cls_lookup is not None else {}
    # A root logger of its own, used once: RLlib 2.60's intermediate (non-root) loggers
    # cannot take sums that track a throughput, and this one's lifetime sums start at 0.
    merged = MetricsLogger(root=True, **kwargs)
    # One at a time: results in sequence, as the algorithm's own logger merges them over time
    # (several at once would be merged as parallel learners, which "item" stats refuse).
    for one in (result, *pending):
        if one:
            merged.aggregate([one])
    return {**merged.reduce(), **extra}


def discard_pending(out_queue: queue.Queue | None) -> int:
    """Drops the results waiting in ``out_queue``; returns how many. After a restore they
    describe updates of the state that was replaced."""
    return 0 if out_queue is None else len(_drain(out_queue))


def _drain(out_queue: queue.Queue) -> list:
    items = []
    while True:
        try:
            items.append(out_queue.get_nowait())
        except queue.Empty:
            return items
