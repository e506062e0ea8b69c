"""APPO's V-trace bootstraps again where a rollout fragment ends (an RLlib 2.60 defect).

RLlib appends one step to every episode chunk (``AddOneTsToEpisodesAndTruncate``) so that the
loss can read V(s_T) where the chunk was cut, and masks that step out of the loss: its
discount is 0 and its reward 0. V-trace still counts it as a step the behaviour policy took:
its TD error is rho * (0 - V(s_T)), so its target is about 0 instead of V(s_T). The chunk's
steps in the same row of the loss's time-major layout as that step (about half of a chunk of
51 in rows of 50) then get targets and advantages cut off at the fragment's end, as if the
episode had terminated there.

The fix gives the added step an importance weight of 0 (rho = c = 0): a behaviour log-prob of
+inf there. Its TD error is then 0 and its target V(s_T), the bootstrap the step was added
for. Every loss term masks the step already, so nothing else changes. The +inf meets only
``exp`` and clips in RLlib's loss. No gradient reaches it there, because the old policy's
network is RLlib's target network, built without gradients (a module whose target network
trains would get nan). docs/update-step.md has the numbers.

Example:
    >>> import torch
    >>> from ray.rllib.core.columns import Columns
    >>> batch = {Columns.ACTION_LOGP: torch.tensor([-1.8, -1.7, -1.8]),
    ...          Columns.LOSS_MASK: torch.tensor([True, True, False])}
    >>> bootstrap_without_weight(batch)[Columns.ACTION_LOGP].isinf().tolist()
    [False, False, True]
"""

from __future__ import annotations

from typing import Any

import torch
from ray.rllib.core.columns import Columns


def bootstrap_without_weight(batch: dict[str, Any]) -> dict[str, Any]:
    """``batch`` with +inf behaviour log-probs at the loss-masked (bootstrap) steps; a new
    dict, the caller's untouched. A batch without a loss mask is returned as it is."""
    mask = batch.get(Columns.LOSS_MASK)
    if mask is None:
        return batch
    logp = batch[Columns.ACTION_LOGP]
    return {**batch, Columns.ACTION_LOGP: torch.where(mask.bool(), logp, torch.inf)}
