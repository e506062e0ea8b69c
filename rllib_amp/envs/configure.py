"""``configure_env``, the one place that points an AlgorithmConfig at an env (any gymnasium
id; ``ALE/*`` ids on ALE's native vector env or on RLlib's Atari wrappers).

Example:
    >>> from ray.rllib.algorithms.ppo import PPOConfig
    >>> cfg = PPOConfig()
    >>> configure_env(cfg, "CartPole-v1", None)
    >>> cfg.env, cfg.env_config
    ('CartPole-v1', {})
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import gymnasium as gym
import numpy as np
from ray.rllib.core.rl_module.rl_module import RLModuleSpec

from rllib_amp.algorithms import ALGORITHMS, algorithm_for_config
from rllib_amp.checks import suggest
from rllib_amp.envs import atari
from rllib_amp.envs.batched_runner import BatchedAleEnvRunner
from rllib_amp.learner.env_runner import AmpSingleAgentEnvRunner
from rllib_amp.settings import AMP_CONFIG_KEY


def is_atari(env_id: str) -> bool:
    return isinstance(env_id, str) and env_id.startswith("ALE/")


def check_env_id(env_id: str) -> None:
    """Raises ValueError naming the nearest registered id when ``env_id`` is unknown. As in
    ``gym.make``, ``module:Name-v0`` imports ``module`` first (a user's env that registers
    itself there; every node's env runners import it too: installed or on ``PYTHONPATH``)."""
    if is_atari(env_id):
        atari.register_ale()
    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except Exception as e:  # noqa: BLE001 - any import failure is the user's module
            raise ValueError(
                f"env: {env_id!r}: its module {module!r} cannot be imported "
                f"({type(e).__name__}: {e}); install it or put its folder on PYTHONPATH"
            ) from None
        if name in gym.registry:
            return
        raise ValueError(
            f"env: {env_id!r}: importing {module!r} registered no {name!r}"
            f"{suggest(name, gym.registry)}; call gymnasium.register({name!r}, ...) there"
        )
    if env_id in gym.registry:
        return
    raise ValueError(
        f"env: {env_id!r} is not a registered gymnasium id{suggest(env_id, gym.registry)}; use "
        "e.g. 'CartPole-v1' or 'ALE/Pong-v5' (Atari ROMs ship with ale-py)"
    )


class AtariEnv(gym.Wrapper):
    """An ALE game through RLlib's Atari wrappers (DeepMind preprocessing): the ``wrappers`` path.

    float32 observations in [-1, 1], for comparison and for ale_py options the native env
    lacks (``mode``...). ``config``: ``{"id": "ALE/Pong-v5", ...}``, other keys go to
    ``gym.make``. RLlib gets the class itself: any node builds it by import, unregistered.

    Example:
        >>> env = AtariEnv({"id": "ALE/Pong-v5"})  # doctest: +SKIP
        >>> env.observation_space.shape  # doctest: +SKIP
        (84, 84, 4)
    """

    def __init__(self, config: dict[str, Any] | None = None):
        from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack

        config = dict(config or {})
        env_id = config.pop("id", "ALE/Pong-v5")
        atari.register_ale()
        # Frame skipping is done by the wrapper (max-pooled), so the ALE itself skips none.
        kwargs = {"frameskip": 1, "repeat_action_probability": 0.0, **config}
        env = gym.make(env_id, **kwargs)
        env = wrap_atari_for_new_api_stack(env, dim=84, frameskip=4, framestack=4)
        env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(float(r))))
        super().__init__(env)


def configure_env(config: Any, env_id: str, env_config: Mapping[str, Any] | None) -> None:
    """Sets ``config`` (an AlgorithmConfig) to sample ``env_id``; the one place that does.

    For ``ALE/*`` ids ``env_config["preprocessing"]`` picks the path: ``native`` (default;
    ``atari.AleVectorEnv``, uint8 observations the RLModule converts in its forward pass,
    options ``atari.NATIVE_OPTIONS``) or ``wrappers`` (``AtariEnv`` in a SyncVectorEnv,
    float32 observations; other keys go to ``gym.make``). On the native path
    ``env_config["sampler"]`` picks ``batched`` (default; ``BatchedAleEnvRunner``) or
    ``rllib`` (RLlib's per-env loop): the same episodes either way.

    Call it before setting your own RLModuleSpec: the native path sets the module class.
    Raises ValueError naming the key and the fix for an option the chosen path cannot honour.

    Example:
        >>> from ray.rllib.algorithms.ppo import PPOConfig
        >>> cfg = PPOConfig()
        >>> configure_env(cfg, "ALE/Pong-v5", {"repeat_action_probability": 0.25})
        >>> cfg.env.__name__, cfg.gym_env_vectorize_mode
        ('AleVectorEnv', 'vector_entry_point')
    """
    env_config = dict(env_config or {})
    if not is_atari(env_id):
        config.environment(env=env_id, env_config=env_config)
        _use_batched_runner(config, False)
        return
    path = env_config.pop(atari.PREPROCESSING_KEY, atari.NATIVE)
    sampler = env_config.pop(atari.SAMPLER_KEY, atari.BATCHED if path == atari.NATIVE else None)
    if sampler is not None and sampler not in atari.SAMPLERS:
        raise ValueError(
            f"env_config.{atari.SAMPLER_KEY}: got {sampler!r}; allowed: "
            f"{' | '.join(atari.SAMPLERS)} ({atari.BATCHED}: whole arrays per step, the default; "
            f"{atari.RLLIB}: RLlib's per-env loop; a fixed value, it cannot be searched)"
        )
    if path == atari.WRAPPERS:
        if sampler == atari.BATCHED:
            raise ValueError(
                f"env_config.{atari.SAMPLER_KEY}: {atari.BATCHED} samples ALE's native vector "
                f"env only; remove it, or set env_config.{atari.PREPROCESSING_KEY}: "
                f"{atari.NATIVE} (the default for ALE/* ids)"
            )
        _use_batched_runner(config, False)
        atari.check_wrapper_options(env_config)
        env_config.pop("episodic_life", None)  # the wrappers' default, nothing to pass on
        config.environment(env=AtariEnv, env_config={"id": env_id, **env_config})
        config.env_runners(gym_env_vectorize_mode=gym.VectorizeMode.SYNC.value)
        return
    if path != atari.NATIVE:
        raise ValueError(
            f"env_config.{atari.PREPROCESSING_KEY}: got {path!r}; allowed: "
            f"{' | '.join(atari.PATHS)} (a fixed value: the two paths need different "
            f"RLModules, so it cannot be searched)"
        )
    atari.check_native_options(env_config)
    atari.ale_game(env_id)  # fails now, not in an EnvRunner, for an id without a vector env
    record = algorithm_for_config(config)
    if record is None:
        raise ValueError(
            f"env: {env_id!r} on the native Atari path needs one of rllib-amp's algorithms "
            f"({', '.join(ALGORITHMS)}), got {type(config).__name__}; set env_config."
            f"{atari.PREPROCESSING_KEY}: {atari.WRAPPERS} for RLlib's float32 wrappers"
        )
    config.environment(env=atari.AleVectorEnv, env_config={"id": env_id, **env_config})
    config.env_runners(gym_env_vectorize_mode=gym.VectorizeMode.VECTOR_ENTRY_POINT.value)
    config.rl_module(rl_module_spec=RLModuleSpec(module_class=record.uint8_module))
    _use_batched_runner(config, sampler == atari.BATCHED)


def _use_batched_runner(config: Any, batched: bool) -> None:
    # Sets the batched EnvRunner, or takes it back; another EnvRunner the user set stays.
    # ``with_amp`` keeps the batched runner, which applies the AMP inference precision itself.
    current = config.env_runner_cls
    if batched and not config.is_multi_agent:
        if current in (None, AmpSingleAgentEnvRunner):
            config.env_runners(env_runner_cls=BatchedAleEnvRunner)
    elif current is BatchedAleEnvRunner:
        amp = AMP_CONFIG_KEY in (config.learner_config_dict or {})
        config.env_runners(env_runner_cls=AmpSingleAgentEnvRunner if amp else None)
