"""Environments: ALE Atari with DeepMind preprocessing, and any gymnasium id.

Example:
    >>> env_for_rllib("CartPole-v1", None)
    ('CartPole-v1', {})
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

from rllib_amp.checks import suggest

ATARI_PREFIX = "ALE/"


def is_atari(env_id: str) -> bool:
    return isinstance(env_id, str) and env_id.startswith(ATARI_PREFIX)


def _register_ale() -> None:
    import ale_py

    gym.register_envs(ale_py)


def check_env_id(env_id: str) -> None:
    """Raises ValueError naming the nearest registered id when ``env_id`` is unknown."""
    if is_atari(env_id):
        _register_ale()
    if env_id in gym.registry:
        return
    hint = suggest(env_id, gym.registry)
    raise ValueError(
        f"env: {env_id!r} is not a registered gymnasium id{hint}; use e.g. 'CartPole-v1' "
        f"or 'ALE/Pong-v5' (Atari ROMs ship with ale-py)"
    )


class AtariEnv(gym.Wrapper):
    """An ALE game with the usual DeepMind preprocessing.

    84x84 grayscale, frame skip 4 with max-pooling over the last two frames, a 4-frame
    stack, up to 30 no-op starts, episodic life, FIRE on reset where the game needs it
    (RLlib's own Atari wrappers), and rewards clipped to their sign.

    ``config``: ``{"id": "ALE/Pong-v5", ...}``; other keys go to ``gym.make`` (e.g.
    ``repeat_action_probability``). The class is what RLlib gets as ``env``, so env runners
    on any node build it by import, no registration needed.

    Example:
        >>> env = AtariEnv({"id": "ALE/Pong-v5"})  # doctest: +SKIP
        >>> env.observation_space.shape  # doctest: +SKIP
        (84, 84, 4)
    """

    def __init__(self, config: dict[str, Any] | None = None):
        from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack

        config = dict(config or {})
        env_id = config.pop("id", "ALE/Pong-v5")
        _register_ale()
        # Frame skipping is done by the wrapper (max-pooled), so the ALE itself skips none.
        kwargs = {"frameskip": 1, "repeat_action_probability": 0.0, **config}
        env = gym.make(env_id, **kwargs)
        env = wrap_atari_for_new_api_stack(env, dim=84, frameskip=4, framestack=4)
        env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(float(r))))
        super().__init__(env)


def configure_env(config: Any, env_id: str, env_config: dict[str, Any] | None) -> None:
    """Sets ``config`` (an AlgorithmConfig) to sample ``env_id``; the one place that does.

    Example:
        >>> from ray.rllib.algorithms.ppo import PPOConfig
        >>> cfg = PPOConfig()
        >>> configure_env(cfg, "CartPole-v1", {})
        >>> cfg.env
        'CartPole-v1'
    """
    env, kwargs = env_for_rllib(env_id, env_config)
    config.environment(env=env, env_config=kwargs)


def env_for_rllib(env_id: str, env_config: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    """What to pass to ``AlgorithmConfig.environment(env=..., env_config=...)``."""
    env_config = dict(env_config or {})
    if is_atari(env_id):
        return AtariEnv, {"id": env_id, **env_config}
    return env_id, env_config
