"""Optional Tune loggers: Weights & Biases (``--wandb-project``), never a hard dependency.

TensorBoard needs nothing here: Tune writes event files into each trial's folder whenever
``tensorboardX`` is installed (``tensorboard --logdir STORAGE_PATH/NAME``).

Example:
    >>> wandb_callbacks(None)
    []
"""

from __future__ import annotations

import importlib.util
import os
from typing import TYPE_CHECKING, Any

from rllib_amp.cli import UsageError

if TYPE_CHECKING:
    from ray.tune import Callback


def wandb_project(name: str) -> str:
    """argparse ``type`` of ``--wandb-project``: refuses the flag at once without wandb.

    Example:
        >>> wandb_project("")
        Traceback (most recent call last):
        rllib_amp.cli.UsageError: --wandb-project: got an empty name; ...
    """
    if not name.strip():
        raise UsageError("--wandb-project: got an empty name; give the W&B project name")
    if importlib.util.find_spec("wandb") is None:
        raise UsageError(
            f"--wandb-project {name}: wandb is not installed; pip install wandb "
            "(or pip install 'rllib-amp[wandb]'), or drop the flag"
        )
    return name


def wandb_callbacks(project: str | None) -> list[Callback]:
    """[Tune's WandbLoggerCallback for ``project``], or [] without a project.

    Tune logs from a Ray actor, which sees the environment of the Ray that runs it, not this
    command's (Tune forwards WANDB_API_KEY only): ``WANDB_MODE=offline`` or ``WANDB_DIR`` set
    in the shell would be ignored on a Ray started earlier (``ray start``, a cluster). They
    are passed to ``wandb.init`` as arguments instead.
    """
    if not project:
        return []
    from ray.air.integrations.wandb import WandbLoggerCallback

    init_args = {"WANDB_MODE": "mode", "WANDB_DIR": "dir"}  # the variables wandb itself reads
    kwargs: dict[str, Any] = {a: os.environ[v] for v, a in init_args.items() if os.environ.get(v)}
    return [WandbLoggerCallback(project=project, **kwargs)]
