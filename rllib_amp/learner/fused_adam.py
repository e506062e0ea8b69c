"""Switches RLlib's default ``torch.optim.Adam`` to PyTorch's fused kernel when AMP is on.

Same algorithm, one kernel for all parameters: a much faster step on the Nature CNN
(docs/performance.md, "Figures behind the code's thresholds"). Only a plain Adam left at the
default implementation (foreach/fused None) on float32 CPU or CUDA parameters is touched.
Loaded optimizer state carries the saving run's flags, so a restore sets them again.

Example:
    >>> import torch
    >>> opt = torch.optim.Adam(torch.nn.Linear(2, 1).parameters())
    >>> fuse_adam(opt), opt.param_groups[0]["fused"]
    (True, True)
    >>> set_adam_fusing([opt], fused=False); opt.param_groups[0]["fused"] is None
    True
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def fuse_adam(optimizer: torch.optim.Optimizer) -> bool:
    """Makes a plain, unconfigured float32 Adam fused; True when it did."""
    if type(optimizer) is not torch.optim.Adam:
        return False
    groups = optimizer.param_groups
    if any(g.get("fused") is not None or g.get("foreach") is not None for g in groups):
        return False
    params = [p for g in groups for p in g["params"]]
    if not params or any(
        p.dtype != torch.float32 or p.device.type not in ("cpu", "cuda") for p in params
    ):
        return False
    for g in groups:
        g["fused"] = True
    optimizer.defaults["fused"] = True
    return True


def set_adam_fusing(optimizers: Iterable[torch.optim.Optimizer], *, fused: bool) -> None:
    """After loading optimizer state: fused Adams for an AMP run, RLlib's default otherwise
    (the implementation left to torch)."""
    for opt in optimizers:
        if fused:
            fuse_adam(opt)
        elif type(opt) is torch.optim.Adam:
            for g in opt.param_groups:
                if g.get("fused"):
                    g["fused"] = None
            opt.defaults["fused"] = None
