"""The learner connector's value pass (GAE for PPO) under autocast, handing out float32.

A full forward of the value net over the train batch: on CPU about a third of the learner's
time. ``compute_values``' output is cast back to float32 for the connector's numpy (no bfloat16).

Example:
    >>> import torch
    >>> from rllib_amp.learner.precision import resolve
    >>> from rllib_amp.settings import AmpSettings
    >>> class Values(torch.nn.Module):
    ...     def compute_values(self, batch):
    ...         return torch.ones(2, dtype=torch.bfloat16)
    >>> m = Values()
    >>> with value_pass(resolve(AmpSettings(dtype="bfloat16"), "cpu"), [m]):
    ...     m.compute_values({}).dtype
    torch.float32
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch

from rllib_amp.learner.precision import Precision, to_float32


@contextlib.contextmanager
def value_pass(precision: Precision, modules: Iterable[Any]) -> Iterator[None]:
    """No grad, autocast, and float32 ``compute_values`` outputs for ``modules``."""
    patched = []
    for module in modules:
        original = getattr(module, "compute_values", None)
        if original is None:
            continue

        def compute_values(
            *args: object, _original: Callable[..., object] = original, **kwargs: object
        ) -> object:
            return to_float32(_original(*args, **kwargs))

        module.compute_values = compute_values  # instance attribute shadows the method
        patched.append(module)
    try:
        with torch.no_grad(), precision.autocast():
            yield
    finally:
        for module in patched:
            del module.compute_values
