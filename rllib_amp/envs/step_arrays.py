"""The arrays a batched ``sample()`` call keeps: one entry per vector step while it samples
(``Steps``), stacked along a leading step axis when it builds the episodes (``Arrays``), and
the few conversions between them and RLlib's buffers.

Example:
    >>> steps = Steps()
    >>> z = np.zeros(2)
    >>> steps.add(np.zeros((2, 4, 84, 84), np.uint8), z, {}, z, z > 0, z > 0, {}, z > 0)
    >>> Arrays(steps).actions.shape
    (1, 2)
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from ray.rllib.utils.numpy import convert_to_numpy
from ray.rllib.utils.spaces.space_utils import batch as batch_items


class Steps:
    """What one batched ``sample()`` call saw, one entry per vector step."""

    def __init__(self) -> None:
        self.obs: list[np.ndarray] = []  # (N, stack, 84, 84) uint8 after each step
        self.actions: list[np.ndarray] = []  # (N,)
        self.extras: dict[str, list[np.ndarray]] = {}  # key -> (N, ...) per step
        self.rewards: list[np.ndarray] = []
        self.terminated: list[np.ndarray] = []
        self.truncated: list[np.ndarray] = []
        self.infos: list[dict[str, np.ndarray]] = []
        self.restarted: list[np.ndarray] = []  # (N,) bool: this step was an autoreset
        self.times: list[float] = []

    def add(
        self,
        obs: np.ndarray,
        actions: np.ndarray,
        extras: dict[str, np.ndarray],
        rewards: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
        infos: dict[str, np.ndarray],
        restarted: np.ndarray,
    ) -> None:
        self.obs.append(obs)
        self.actions.append(actions)
        for key, value in extras.items():
            self.extras.setdefault(key, []).append(value)
        self.rewards.append(rewards)
        self.terminated.append(terminated)
        self.truncated.append(truncated)
        self.infos.append(infos)
        self.restarted.append(restarted)
        self.times.append(time.perf_counter())


class Arrays:
    """A ``Steps`` stacked: every per-step array gains a leading step axis (S, N, ...)."""

    def __init__(self, steps: Steps) -> None:
        self.obs = steps.obs
        self.actions = np.stack(steps.actions)
        self.extras = {k: np.stack(v) for k, v in steps.extras.items()}
        self.rewards = np.stack(steps.rewards).astype(np.float32, copy=False)
        self.terminated = np.stack(steps.terminated)
        self.truncated = np.stack(steps.truncated)
        keys = [k for k in steps.infos[0] if not k.startswith("_")] if steps.infos else []
        self.info_keys = keys
        self.infos = {k: np.stack([info[k] for info in steps.infos]) for k in keys}
        self.restarted = np.stack(steps.restarted)
        self.times = steps.times

    def info_dicts(self, rows: Sequence[int] | np.ndarray, env: int) -> list[dict[str, Any]]:
        """The per-step info dicts of ``env`` at steps ``rows``, as gymnasium's DictInfoToList."""
        columns = [self.infos[k][rows, env] for k in self.info_keys]
        return [dict(zip(self.info_keys, values, strict=True)) for values in zip(*columns)]


def to_numpy(out: dict[str, Any]) -> dict[str, Any]:
    """RLlib's TensorToNumpy (``convert_to_numpy``: int64 -> int32, float64 -> float32) for a
    flat dict of batched tensors, without its tree walk; anything else goes through it.

    Example:
        >>> to_numpy({"a": torch.tensor([1, 2]), "b": torch.ones(2, dtype=torch.float64)})
        {'a': array([1, 2], dtype=int32), 'b': array([1., 1.], dtype=float32)}
    """
    arrays: dict[str, Any] = {}
    for key, value in out.items():
        if not isinstance(value, torch.Tensor) or value.dim() == 0:
            return convert_to_numpy(out)  # type: ignore[return-value]
        array = value.detach().cpu().numpy()
        if np.issubdtype(array.dtype, np.floating):
            array = array.astype(np.float32, copy=False)
        elif np.issubdtype(array.dtype, int):
            array = array.astype(np.int32, copy=False)
        arrays[key] = array
    return arrays


def buffer_items(buffer: InfiniteLookbackBuffer) -> Any:
    """All of a buffer's data (lookback included) as one array, or None when empty."""
    data = buffer.data
    if isinstance(data, list):
        return batch_items(data) if data else None
    return data if len(data) else None


def join_arrays(old: Any, new: np.ndarray) -> np.ndarray:
    """``new`` after ``old`` (None: nothing yet) along the first axis."""
    return new if old is None else np.concatenate([np.asarray(old), new])
