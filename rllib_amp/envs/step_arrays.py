"""The arrays a batched ``sample()`` call keeps: one ``Step`` per vector step while it samples,
stacked along a leading step axis when it builds the episodes (``Arrays``), and the few
conversions between them and RLlib's buffers.

Example:
    >>> z = np.zeros(2)
    >>> step = Step(z, {}, z > 0, 0.0, np.zeros((2, 4, 84, 84), np.uint8), z, z > 0, z > 0, {})
    >>> Arrays([step]).actions.shape
    (1, 2)
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from ray.rllib.utils.spaces.space_utils import batch as batch_items


class Step(NamedTuple):
    """One vector step, one row per env (N rows): its inputs, then ALE's ``step`` results."""

    actions: np.ndarray
    extras: dict[str, np.ndarray]  # the module's extra outputs, key -> (N, ...)
    restarted: np.ndarray  # bool: this step was an autoreset
    time: float  # time.perf_counter() after the step
    obs: np.ndarray  # (N, stack, 84, 84) uint8 after the step
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    infos: dict[str, np.ndarray]


class Arrays:
    """The ``Step``s of one call stacked: every per-step array gains a leading step axis."""

    def __init__(self, steps: Sequence[Step]) -> None:
        self.obs = [s.obs for s in steps]
        self.actions = np.stack([s.actions for s in steps])
        self.extras = {k: np.stack([s.extras[k] for s in steps]) for k in steps[0].extras}
        self.rewards = np.stack([s.rewards for s in steps]).astype(np.float32, copy=False)
        self.terminated = np.stack([s.terminated for s in steps])
        self.truncated = np.stack([s.truncated for s in steps])
        self.info_keys = [k for k in steps[0].infos if not k.startswith("_")]
        self.infos = {k: np.stack([s.infos[k] for s in steps]) for k in self.info_keys}
        self.restarted = np.stack([s.restarted for s in steps])
        self.times = [s.time for s in steps]

    def info_dicts(self, rows: Sequence[int] | np.ndarray, env: int) -> list[dict[str, Any]]:
        """The per-step info dicts of ``env`` at steps ``rows``, as gymnasium's DictInfoToList."""
        columns = [self.infos[k][rows, env] for k in self.info_keys]
        return [dict(zip(self.info_keys, values, strict=True)) for values in zip(*columns)]


def buffer_items(buffer: InfiniteLookbackBuffer | None) -> Any:
    """All of a buffer's data (lookback included) as one array, or None when empty."""
    if buffer is None:
        return None
    data = buffer.data
    if isinstance(data, list):
        return batch_items(data) if data else None
    return data if len(data) else None


def join_arrays(old: Any, new: np.ndarray) -> np.ndarray:
    """``new`` after ``old`` (None: nothing yet) along the first axis."""
    return new if old is None else np.concatenate([np.asarray(old), new])
