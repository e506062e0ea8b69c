"""EnvRunners whose forward passes (action computation) run under autocast.

``with_amp`` sets these as the config's ``env_runner_cls`` (unless you set your own), in
``AmpSettings.inference_dtype``: "auto" is the hardware's fast 16-bit type on a GPU; on a CPU
with native bfloat16, bfloat16 only where a short timing of the module's own forward pass at
the EnvRunner's batch size, when the runner starts, shows it faster than float32. Outputs
are cast back to float32 before RLlib's connectors sample actions and compute log-probs.

Example:
    >>> from ray.rllib.algorithms.ppo import PPOConfig
    >>> from rllib_amp import with_amp
    >>> with_amp(PPOConfig()).env_runner_cls.__name__
    'AmpSingleAgentEnvRunner'
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.core.columns import Columns
from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

from rllib_amp.learner.precision import (
    InferenceTiming,
    Precision,
    resolve_inference,
    time_forward,
    to_float32,
)
from rllib_amp.log_events import event
from rllib_amp.settings import settings_from_config

logger = logging.getLogger(__name__)

# RLModule's hooks behind forward_exploration / forward_inference (pinned in
# tests/unit/test_rllib_api.py).
_FORWARDS = ("_forward_exploration", "_forward_inference")
_warned_missing: set[tuple[str, str]] = set()


def autocast_forwards(module: object, precision: Precision) -> None:
    """Wraps a module's exploration/inference forward passes in autocast (instance-level); one
    without RLlib's hook keeps that pass in float32, with one WARNING per module class.

    Example:
        >>> import torch
        >>> from rllib_amp.learner.precision import resolve
        >>> from rllib_amp.settings import AmpSettings
        >>> class M:
        ...     def _forward_exploration(self, batch):
        ...         return torch.ones(1) @ torch.ones(1, 1)
        ...     _forward_inference = _forward_exploration
        >>> m = M()
        >>> autocast_forwards(m, resolve(AmpSettings(dtype="bfloat16"), "cpu"))
        >>> m._forward_exploration({}).dtype
        torch.float32
    """
    if not precision.enabled:
        return
    for name in _FORWARDS:
        original = getattr(module, name, None)
        if original is None:
            key = (type(module).__qualname__, name)
            if key not in _warned_missing:
                _warned_missing.add(key)
                logger.warning(
                    "rllib_amp: %s has no %s, so that forward pass runs in float32 on the "
                    "EnvRunners (RLlib's RLModule hook is gone or renamed: check the rllib-amp "
                    "version against Ray's)",
                    *key,
                    extra=event("inference_autocast_skipped", module_class=key[0], method=name),
                )
            continue
        if getattr(original, "_rllib_amp", False):
            continue

        def forward(
            batch: dict[str, object], _original: Callable[..., object] = original, **kwargs: object
        ) -> object:
            with precision.autocast():
                return to_float32(_original(batch, **kwargs))

        forward._rllib_amp = True  # type: ignore[attr-defined]
        setattr(module, name, forward)


# The one gymnasium id RLlib's EnvRunners register an env class or creator under (each
# make_env registers it again; pinned in tests/integration/learner/test_env_runner.py).
_RLLIB_SCRATCH_ENV_IDS = ("rllib-single-agent-env-v0", "rllib-multi-agent-env-v0")


def forget_rllib_env_ids() -> None:
    """Drops what RLlib's EnvRunners registered under their fixed gymnasium ids (the earlier
    runner's, already made into its envs); call it before building another (stock) EnvRunner
    in the same process, or gymnasium warns "Overriding environment ... already in registry".
    """
    for env_id in _RLLIB_SCRATCH_ENV_IDS:
        gym.registry.pop(env_id, None)


def inference_timing(module: Any, batch: int) -> InferenceTiming:
    """For ``resolve_inference``: times ``module.forward_inference`` on ``batch`` observations
    drawn from its Box observation space; None where it cannot (another space, a stateful
    module, a forward pass that fails on the drawn batch: the batch rule then decides)."""

    def timing() -> tuple[float, float] | None:
        space = getattr(module, "observation_space", None)
        if not isinstance(space, gym.spaces.Box) or module.is_stateful():
            return None
        draw = copy.deepcopy(space)  # its own random state: the env's space keeps its draws
        draw.seed(0)
        batch_ = {Columns.OBS: torch.from_numpy(np.stack([draw.sample() for _ in range(batch)]))}
        try:
            return time_forward(lambda: module.forward_inference(batch_))
        except Exception as e:  # noqa: BLE001 - a module this cannot feed
            logger.debug("rllib_amp: no inference timing (%s: %s)", type(e).__name__, e)
            return None

    return timing


class AmpEnvRunnerMixin:
    """Puts every RLModule of an EnvRunner under the configured inference precision."""

    amp_inference_precision: Precision | None = None

    def make_env(self) -> None:
        forget_rllib_env_ids()  # a second runner in the process: no "Overriding environment"
        super().make_env()  # type: ignore[misc]

    def make_module(self) -> None:
        super().make_module()  # type: ignore[misc]
        runner: Any = self  # a mixin: the EnvRunner's attributes are not declared here
        if runner.module is None:
            return
        settings = settings_from_config(runner.config)
        device = getattr(self, "_device", None) or "cpu"
        batch = int(getattr(runner.config, "num_envs_per_env_runner", 1) or 1)
        multi = hasattr(runner.module, "values")
        timing = None if multi else inference_timing(runner.module, batch)
        precision = resolve_inference(settings, device, batch=batch, timing=timing)
        self.amp_inference_precision = precision
        for module in runner.module.values() if multi else [runner.module]:
            autocast_forwards(module, precision)
        logger.info("rllib_amp: env runner inference in %s", precision.describe())

    def sample(self, *args: Any, **kwargs: Any) -> Any:
        # One autocast region around the whole call: torch caches each weight's 16-bit copy
        # until the outermost region exits, so the weights are cast once per sample() instead
        # of once per step (the forward passes' own regions nest inside it; the connectors'
        # numpy and distribution ops are the same under it).
        precision = self.amp_inference_precision
        with precision.autocast() if precision is not None else contextlib.nullcontext():
            return super().sample(*args, **kwargs)  # type: ignore[misc]


class AmpSingleAgentEnvRunner(AmpEnvRunnerMixin, SingleAgentEnvRunner):
    """RLlib's SingleAgentEnvRunner with autocast inference."""


class AmpMultiAgentEnvRunner(AmpEnvRunnerMixin, MultiAgentEnvRunner):
    """RLlib's MultiAgentEnvRunner with autocast inference."""
