"""Optional Tune loggers: Weights & Biases (``--wandb-project``), never a hard dependency.

TensorBoard needs nothing here: Tune writes event files into each trial's folder whenever
``tensorboardX`` is installed (``tensorboard --logdir STORAGE_PATH/NAME``).

Example:
    >>> wandb_callbacks(None)
    []
"""

from __future__ import annotations

import importlib.util
from typing import Any

from rllib_amp.cli import UsageError


def wandb_project(name: str) -> str:
    """argparse ``type`` of ``--wandb-project``: refuses the flag at once without wandb.

    Example:
        >>> wandb_project("")  # doctest: +SKIP
        Traceback (most recent call last):
        UsageError: --wandb-project: ...
    """
    if not name.strip():
        raise UsageError("--wandb-project: got an empty name; give the W&B project name")
    if importlib.util.find_spec("wandb") is None:
        raise UsageError(
            f"--wandb-project {name}: wandb is not installed; pip install wandb "
            "(or pip install 'rllib-amp[wandb]'), or drop the flag"
        )
    return name


def wandb_callbacks(project: str | None) -> list[Any]:
    """[Tune's WandbLoggerCallback for ``project``], or [] without a project."""
    if not project:
        return []
    from ray.air.integrations.wandb import WandbLoggerCallback

    return [WandbLoggerCallback(project=project)]
