"""``with_amp``: one call that makes an RLlib config of a supported algorithm
(``rllib_amp.algorithms.ALGORITHMS``) train in mixed precision.

Example:
    >>> from ray.rllib.algorithms.dqn import DQNConfig
    >>> config = with_amp(DQNConfig().environment("CartPole-v1"), init_scale=1024)
    >>> settings_from_config(config).init_scale
    1024.0
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.tune.registry import get_trainable_cls

from rllib_amp.algorithms import (
    ALGORITHMS,
    algorithm_for_config,
    amp_algorithm_class,
    amp_learner_class,
)
from rllib_amp.checks import is_search_space
from rllib_amp.learner.env_runner import AmpMultiAgentEnvRunner, AmpSingleAgentEnvRunner
from rllib_amp.scaling.scaler_set import check_no_rllib_grad_scaler
from rllib_amp.settings import (
    AMP_CONFIG_KEY,
    AmpSettings,
    settings_from_config,
    store_in_config,
)

__all__ = ["settings_from_config", "with_amp"]


def with_amp(
    config: AlgorithmConfig, settings: AmpSettings | None = None, **fields: Any
) -> AlgorithmConfig:
    """Sets ``config`` to train with rllib-amp's learner for its algorithm; returns it.

    Args:
        config: The config of an algorithm in ``rllib_amp.algorithms.ALGORITHMS``, e.g. a
            PPOConfig (new API stack, torch).
        settings: AmpSettings to use. They replace whatever AMP settings ``config`` holds.
            Without them, the settings already in ``config`` (from an earlier ``with_amp``)
            are kept, or ``AmpSettings()`` (precision "auto") if it has none.
        **fields: AmpSettings fields that override those settings (validated).

    A second call changes only what it names (a Tune sampler stored at a field stays unless
    that field is given). Like RLlib's builder methods, it changes ``config`` in place. It
    also sets the EnvRunner class (autocast inference) for single- or multi-agent, so call it
    after ``config.multi_agent(...)``, and an Algorithm class with all-or-nothing restores.

    Example:
        >>> from ray.rllib.algorithms.ppo import PPOConfig
        >>> cfg = with_amp(PPOConfig(), enabled=False)
        >>> settings_from_config(cfg).enabled
        False
        >>> settings_from_config(with_amp(with_amp(PPOConfig(), init_scale=1024))).init_scale
        1024.0
    """
    if not isinstance(config, AlgorithmConfig):
        raise TypeError(
            f"with_amp: expected an RLlib AlgorithmConfig, got {type(config).__name__}; "
            f"pass e.g. PPOConfig().environment('CartPole-v1')"
        )
    record = algorithm_for_config(config)
    if record is None:
        raise ValueError(
            f"with_amp: {type(config).__name__} is not supported; supported algorithms: "
            f"{', '.join(f'{a.name} ({a.config_class.__name__})' for a in ALGORITHMS.values())}"
        )
    if config.framework_str != "torch":
        raise ValueError(
            f"with_amp: framework is {config.framework_str!r}; mixed precision needs torch: "
            f"call config.framework('torch')"
        )
    if not config.enable_rl_module_and_learner:
        raise ValueError(
            "with_amp: the config uses RLlib's old API stack; rllib-amp extends the new "
            "stack's TorchLearner: call config.api_stack(enable_rl_module_and_learner=True, "
            "enable_env_runner_and_connector_v2=True)"
        )
    check_no_rllib_grad_scaler(config, where="with_amp")
    learner = config.learner_class
    if not (isinstance(learner, type) and issubclass(learner, record.learner)):
        name = getattr(learner, "__name__", repr(learner))
        raise ValueError(
            f"with_amp: {type(config).__name__}.learner_class is {name}, not a "
            f"{record.learner.__name__} (or subclass): {record.name} cannot train with it; "
            f"drop .learners(learner_class=...) or pass a {record.learner.__name__} subclass"
        )
    if not isinstance(settings, (AmpSettings, type(None))):
        raise TypeError(
            f"with_amp: settings must be an AmpSettings, got {type(settings).__name__}; "
            f"use AmpSettings.from_dict({settings!r}) or pass fields as keywords"
        )
    searched: dict[str, Any] = {}
    if settings is None:  # those already in config; fields holding Tune samplers stay samplers
        block = (config.learner_config_dict or {}).get(AMP_CONFIG_KEY)
        if isinstance(block, Mapping):
            searched = {k: v for k, v in block.items() if is_search_space(v)}
            block = {k: v for k, v in block.items() if k not in searched}
        settings = AmpSettings.from_dict(block, where="amp")
    if fields:
        settings = settings.replace(**fields)
        searched = {k: v for k, v in searched.items() if k not in fields}
    config.learners(learner_class=amp_learner_class(config.learner_class))
    store_in_config(config, settings, searched=searched)
    algo_class = config.algo_class
    if isinstance(algo_class, str):  # a name registered with Tune, e.g. "PPO"
        algo_class = get_trainable_cls(algo_class)
    if algo_class is not None:
        config.algo_class = amp_algorithm_class(algo_class)
    # Autocast inference on the EnvRunners, unless the user brought their own EnvRunner.
    if config.env_runner_cls in (None, AmpSingleAgentEnvRunner, AmpMultiAgentEnvRunner):
        runner = AmpMultiAgentEnvRunner if config.is_multi_agent else AmpSingleAgentEnvRunner
        config.env_runners(env_runner_cls=runner)
    return config
