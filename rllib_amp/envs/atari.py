"""Atari on ALE's own vector env: C++ preprocessing and threads, uint8 observations.

``AleVectorEnv`` is what RLlib builds for an ``ALE/*`` id by default (``configure_env`` sets
``gym_env_vectorize_mode="vector_entry_point"``), with the DeepMind preprocessing of RLlib's
Atari wrappers (``configure.AtariEnv``): 84x84 grayscale, frame skip 4 max-pooled over the
last two frames, a 4-frame stack, up to 30 no-ops and FIRE at a game start, rewards clipped
to [-1, 1], each life an episode. Observations stay uint8, (84, 84, stack) like the wrappers'
(newest frame last); the RLModule converts them in its forward pass (``with_uint8_images``).

Differences from the wrappers, all inside one game: after a life is lost the game goes on
without a FIRE press, and the frame stack carries over from the previous life; the ALE's own
grayscale and area resize stand in for OpenCV's (same method, not bit-identical).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any, NamedTuple

import gymnasium as gym
import numpy as np

from rllib_amp.checks import is_number, is_search_space, suggest

# env_config key choosing the Atari path, and its values.
PREPROCESSING_KEY = "preprocessing"
NATIVE = "native"
WRAPPERS = "wrappers"
PATHS: tuple[str, ...] = (NATIVE, WRAPPERS)
# env_config key choosing how an EnvRunner samples the native env, and its values: RLlib's own
# per-env loop, or whole arrays per step (rllib_amp.envs.batched_runner; the default).
SAMPLER_KEY = "sampler"
BATCHED = "batched"
RLLIB = "rllib"
SAMPLERS: tuple[str, ...] = (BATCHED, RLLIB)
IMAGE_SIZE = 84  # the DeepMind preprocessing's frame height and width

_BOOL = "true or false"
_FRACTION = "a number in [0, 1]"
_COUNT = "an integer >= 0"
_POSITIVE = "an integer >= 1"


class Option(NamedTuple):
    """One env_config key of the native path: its default and what values it takes."""

    default: Any
    allowed: str
    help: str


# The env_config keys the native path honours. Names follow ale_py's AtariVectorEnv where the
# meaning is the same; episodic_life and noop_max keep the DeepMind wrappers' meaning.
NATIVE_OPTIONS: dict[str, Option] = {
    "episodic_life": Option(
        True, _BOOL, "each life is an episode (termination on a life loss; the game goes on)"
    ),
    "repeat_action_probability": Option(0.0, _FRACTION, "sticky actions (0.25 in ALE v5)"),
    "noop_max": Option(30, _COUNT, "at most this many no-op agent steps at a game start"),
    "frameskip": Option(4, _POSITIVE, "ALE frames per agent step (max-pooled over the last 2)"),
    "stack_num": Option(4, _POSITIVE, "frames stacked into one observation"),
    "reward_clipping": Option(True, _BOOL, "clip rewards to [-1, 1]"),
    "use_fire_reset": Option(True, _BOOL, "press FIRE at a game start, in games that have it"),
    "max_num_frames_per_episode": Option(108_000, _POSITIVE, "truncate a game after this"),
    "full_action_space": Option(False, _BOOL, "all 18 actions instead of the game's minimal set"),
    "num_threads": Option(None, f"{_POSITIVE} or null", "null: the EnvRunner's CPUs"),
}

# Keys that only RLlib's wrappers honour (gym.make options of ale_py's single env).
_WRAPPER_ONLY = (
    "mode",
    "difficulty",
    "obs_type",
    "render_mode",
    "sound_obs",
    "continuous",
    "continuous_action_threshold",
)
# Native keys the wrappers path also takes (gym.make options), and what it cannot change.
_WRAPPERS_TAKE = ("repeat_action_probability", "full_action_space", "max_num_frames_per_episode")


def _value_ok(key: str, value: Any) -> bool:
    allowed = NATIVE_OPTIONS[key].allowed
    if allowed == _BOOL:
        return isinstance(value, bool)
    if allowed == _FRACTION:
        return is_number(value) and 0.0 <= value <= 1.0
    if key == "num_threads" and value is None:
        return True
    is_int = isinstance(value, int) and not isinstance(value, bool)
    return is_int and value >= (0 if allowed == _COUNT else 1)


def check_native_options(env_config: Mapping[str, Any]) -> None:
    """Raises ValueError naming the key and the fix for an option the native env can't honour
    (Tune samplers pass: their values are checked when the env is built).

    Example:
        >>> check_native_options({"episodic_life": False, "repeat_action_probability": 0.25})
        >>> check_native_options({"mode": 2})
        Traceback (most recent call last):
        ...
        ValueError: env_config.mode: ALE's native vector env cannot honour 'mode' ...
    """
    for key, value in env_config.items():
        if key in NATIVE_OPTIONS:
            if not is_search_space(value) and not _value_ok(key, value):
                raise ValueError(
                    f"env_config.{key}: got {value!r}; expected {NATIVE_OPTIONS[key].allowed} "
                    f"({NATIVE_OPTIONS[key].help})"
                )
            continue
        allowed = ", ".join(NATIVE_OPTIONS)
        if key in _WRAPPER_ONLY:
            raise ValueError(
                f"env_config.{key}: ALE's native vector env cannot honour {key!r} (an option of "
                f"ale_py's single env); set env_config.{PREPROCESSING_KEY}: {WRAPPERS} to run "
                f"RLlib's Atari wrappers instead, or remove it. Native options: {allowed}"
            )
        raise ValueError(
            f"env_config.{key}: not an option of the native Atari env"
            f"{suggest(key, [*NATIVE_OPTIONS, PREPROCESSING_KEY, SAMPLER_KEY])}; allowed: "
            f"{allowed}, {PREPROCESSING_KEY} ({' | '.join(PATHS)}), {SAMPLER_KEY} "
            f"({' | '.join(SAMPLERS)}). For other ale_py options set "
            f"env_config.{PREPROCESSING_KEY}: {WRAPPERS}"
        )


def check_wrapper_options(env_config: Mapping[str, Any]) -> None:
    """Raises ValueError for a native-path option that RLlib's Atari wrappers cannot change.

    Example:
        >>> check_wrapper_options({"repeat_action_probability": 0.25, "mode": 2})
        >>> check_wrapper_options({"noop_max": 10})
        Traceback (most recent call last):
        ...
        ValueError: env_config.noop_max: RLlib's Atari wrappers cannot change 'noop_max' ...
    """
    for key, value in env_config.items():
        if key not in NATIVE_OPTIONS or key in _WRAPPERS_TAKE:
            continue  # a gym.make option, passed on as before
        if value == NATIVE_OPTIONS[key].default:
            continue  # what the wrappers do anyway
        raise ValueError(
            f"env_config.{key}: RLlib's Atari wrappers cannot change {key!r} (they always use "
            f"{NATIVE_OPTIONS[key].default!r}); remove it, or set env_config."
            f"{PREPROCESSING_KEY}: {NATIVE} (the default for ALE/* ids)"
        )


def register_ale() -> None:
    """Registers ale_py's ``ALE/*`` ids with gymnasium."""
    import ale_py

    gym.register_envs(ale_py)


def ale_game(env_id: str) -> str:
    """The ROM name ale_py's vector env takes for a registered ``ALE/*`` id.

    Example:
        >>> ale_game("ALE/SpaceInvaders-v5")
        'space_invaders'
    """
    register_ale()
    try:
        spec = gym.spec(env_id)
    except gym.error.Error as e:
        raise ValueError(f"env: {env_id!r} is not a registered ALE id ({e})") from None
    if spec.vector_entry_point is None or "game" not in spec.kwargs:
        raise ValueError(
            f"env: {env_id!r} has no ALE vector env (only ALE/*-v5 ids do); use e.g. "
            f"'ALE/Pong-v5', or set env_config.{PREPROCESSING_KEY}: {WRAPPERS}"
        )
    return str(spec.kwargs["game"])


def default_num_threads(num_envs: int) -> int:
    """ALE threads for ``num_envs`` envs: the CPUs Ray assigned this EnvRunner (on a driver,
    the cores this process may run on); at most one per env, at least one.

    Example:
        >>> default_num_threads(1)
        1
    """
    import ray

    cpus = None
    # get_runtime_context() would start Ray in a plain process: ask only inside a worker.
    if ray.is_initialized() and ray.get_runtime_context().worker.mode == ray.WORKER_MODE:
        cpus = ray.get_runtime_context().get_assigned_resources().get("CPU")
    if not cpus:
        cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else 1
    return max(1, min(int(num_envs), int(cpus)))


def native_kwargs(env_config: Mapping[str, Any], num_envs: int) -> dict[str, Any]:
    """Keyword arguments of ``ale_py.vector_env.AtariVectorEnv`` for a native env_config.

    Example:
        >>> kw = native_kwargs({"noop_max": 30}, num_envs=16)
        >>> kw["noop_max"], kw["life_loss_info"], kw["episodic_life"]
        (120, True, False)
    """
    check_native_options(env_config)
    o = {key: env_config.get(key, opt.default) for key, opt in NATIVE_OPTIONS.items()}
    return {
        **o,
        "num_threads": o["num_threads"] or default_num_threads(num_envs),
        "repeat_action_probability": float(o["repeat_action_probability"]),
        "img_height": IMAGE_SIZE,
        "img_width": IMAGE_SIZE,
        "grayscale": True,
        "maxpool": True,
        # ALE counts no-ops in frames; the DeepMind wrappers (and this key) in agent steps.
        "noop_max": int(o["noop_max"]) * int(o["frameskip"]),
        # ALE's own episodic_life resets the whole game at every life loss, so a policy would
        # never see a later life. life_loss_info is DeepMind's: terminate, the game goes on.
        "episodic_life": False,
        "life_loss_info": o["episodic_life"],
    }


class AleVectorEnv(gym.vector.VectorWrapper):
    """ale_py's ``AtariVectorEnv`` as RLlib's vector env for an ``ALE/*`` id.

    ``config``: ``{"id": "ALE/Pong-v5", "num_envs": 16, <NATIVE_OPTIONS keys>}`` (RLlib adds
    ``num_envs``). Observations: uint8 (num_envs, 84, 84, stack), a channels-last view of
    ALE's buffer (no copy); rewards: float32.

    Example:
        >>> env = AleVectorEnv({"id": "ALE/Pong-v5", "num_envs": 2})  # doctest: +SKIP
        >>> env.reset(seed=0)[0].shape  # doctest: +SKIP
        (2, 84, 84, 4)
    """

    def __init__(self, config: Mapping[str, Any] | None = None):
        from ale_py.vector_env import AtariVectorEnv

        config = dict(config or {})
        env_id = config.pop("id", "ALE/Pong-v5")
        num_envs = int(config.pop("num_envs", 1))
        path = config.pop(PREPROCESSING_KEY, NATIVE)
        if path != NATIVE:
            raise ValueError(
                f"env_config.{PREPROCESSING_KEY}: AleVectorEnv is the {NATIVE!r} path, got "
                f"{path!r}; use rllib_amp.envs.configure.configure_env to pick the env class"
            )
        self.ale_kwargs = native_kwargs(config, num_envs)
        super().__init__(AtariVectorEnv(ale_game(env_id), num_envs, **self.ale_kwargs))
        shape = (IMAGE_SIZE, IMAGE_SIZE, self.ale_kwargs["stack_num"])
        self.single_observation_space = gym.spaces.Box(0, 255, shape, np.uint8)
        self.observation_space = gym.vector.utils.batch_space(
            self.single_observation_space, self.num_envs
        )

    def reset(  # seed: an int, or one per env (ale_py takes an array)
        self, *, seed: Any = None, options: dict[str, Any] | None = None
    ) -> tuple[Any, dict[str, Any]]:
        obs, info = self.env.reset(seed=seed, options=options)
        return np.moveaxis(obs, 1, -1), info

    def step(self, actions: Any) -> tuple[Any, ...]:
        obs, rewards, terminated, truncated, info = self.env.step(np.asarray(actions))
        return np.moveaxis(obs, 1, -1), rewards.astype(np.float32), terminated, truncated, info
