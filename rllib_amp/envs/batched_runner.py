"""The batched sampler: an EnvRunner that keeps ALE's observations as one array per step.

RLlib's ``SingleAgentEnvRunner`` splits every vector step into per-env items and stacks them
again for the next forward pass, which on ALE's native vector env costs more than the env and
the network together. ``BatchedAleEnvRunner`` runs the module once per step on the whole uint8
array, samples with RLlib's ``GetActions``, and builds RLlib's episodes (the same, across
calls: tests/integration/envs/test_batched_runner.py) and metric keys (less the per-piece
connector timers) only at the end of ``sample()``.

``configure_env`` picks it for ``ALE/*`` ids on the native path unless ``env_config.sampler``
is ``rllib``. What it cannot reproduce (custom connectors, episode callbacks, a stateful
module, another env) and ``sample(num_episodes=...)`` run RLlib's own sampling (one log line
says why). One difference: when a failed env step recreates the env, RLlib keeps the episodes
that ended earlier in that ``sample()`` call; this starts it over.

Example:
    >>> from ray.rllib.algorithms.ppo import PPOConfig
    >>> from rllib_amp.envs.configure import configure_env
    >>> cfg = PPOConfig()
    >>> configure_env(cfg, "ALE/Pong-v5", None)
    >>> cfg.env_runner_cls.__name__
    'BatchedAleEnvRunner'
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, cast

import gymnasium as gym
import numpy as np
import torch
from ray.rllib.callbacks.callbacks import RLlibCallback
from ray.rllib.connectors.module_to_env import GetActions
from ray.rllib.core.columns import Columns
from ray.rllib.env.env_runner import NUM_ENV_STEP_FAILURES_LIFETIME
from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner
from ray.rllib.env.single_agent_episode import SingleAgentEpisode
from ray.rllib.env.utils.infinite_lookback_buffer import InfiniteLookbackBuffer
from ray.rllib.utils import force_list
from ray.rllib.utils.metrics import (
    CONNECTOR_PIPELINE_TIMER,
    ENV_STEP_TIMER,
    ENV_TO_MODULE_CONNECTOR,
    ENV_TO_MODULE_SUM_EPISODES_LENGTH_IN,
    ENV_TO_MODULE_SUM_EPISODES_LENGTH_OUT,
    MODULE_TO_ENV_CONNECTOR,
    RLMODULE_INFERENCE_TIMER,
    WEIGHTS_SEQ_NO,
)
from ray.rllib.utils.numpy import convert_to_numpy
from ray.rllib.utils.spaces.space_utils import batch as batch_items

from rllib_amp.learner.env_runner import AmpEnvRunnerMixin
from rllib_amp.settings import AMP_CONFIG_KEY

logger = logging.getLogger(__name__)

# The rewards buffer's space in RLlib's episodes (single_agent_episode._REWARDS_BOX_SPACE).
_REWARDS_SPACE = gym.spaces.Box(-np.inf, np.inf, (), np.float32)
_GET_ACTIONS = GetActions()  # stateless: one instance serves every step
_EPISODE_CALLBACKS = ("on_episode_created", "on_episode_start", "on_episode_step", "on_episode_end")


class Step(NamedTuple):
    """One vector step, one row per env (N rows): its inputs, then ALE's ``step`` results."""

    actions: np.ndarray
    extras: dict[str, np.ndarray]  # the module's extra outputs, key -> (N, ...)
    restarted: np.ndarray  # bool: this step was an autoreset
    time: float  # time.perf_counter() after the step
    obs: np.ndarray  # (N, stack, 84, 84) uint8 after the step
    rewards: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray
    infos: dict[str, np.ndarray]


class Arrays:
    """The ``Step``s of one ``sample()`` call stacked: each array gains a leading step axis.

    Example:
        >>> z = np.zeros(2)
        >>> step = Step(z, {}, z > 0, 0.0, np.zeros((2, 4, 84, 84), np.uint8), z, z > 0, z > 0, {})
        >>> Arrays([step]).actions.shape
        (1, 2)
    """

    def __init__(self, steps: Sequence[Step]) -> None:
        self.obs = [s.obs for s in steps]
        self.actions = np.stack([s.actions for s in steps])
        self.extras = {k: np.stack([s.extras[k] for s in steps]) for k in steps[0].extras}
        self.rewards = np.stack([s.rewards for s in steps]).astype(np.float32, copy=False)
        self.terminated = np.stack([s.terminated for s in steps])
        self.truncated = np.stack([s.truncated for s in steps])
        self.info_keys = [k for k in steps[0].infos if not k.startswith("_")]
        self.infos = {k: np.stack([s.infos[k] for s in steps]) for k in self.info_keys}
        self.restarted = np.stack([s.restarted for s in steps])
        self.times = [s.time for s in steps]

    def info_dicts(self, rows: Sequence[int] | np.ndarray, env: int) -> list[dict[str, Any]]:
        """The per-step info dicts of ``env`` at steps ``rows``, as gymnasium's DictInfoToList."""
        columns = [self.infos[k][rows, env] for k in self.info_keys]
        return [dict(zip(self.info_keys, values, strict=True)) for values in zip(*columns)]


def buffer_items(buffer: InfiniteLookbackBuffer | None) -> Any:
    """All of a buffer's data (lookback included) as one array, or None when empty."""
    if buffer is None:
        return None
    data = buffer.data
    if isinstance(data, list):
        return batch_items(data) if data else None
    return data if len(data) else None


def join_arrays(buffer: InfiniteLookbackBuffer | None, new: np.ndarray) -> np.ndarray:
    """``new`` after all of ``buffer``'s data along the first axis."""
    old = buffer_items(buffer)
    return new if old is None else np.concatenate([np.asarray(old), new])


def unsupported_reason(runner: SingleAgentEnvRunner) -> str | None:
    """Why ``runner`` cannot sample batched (None: it can); checked once per EnvRunner.

    Example:
        >>> unsupported_reason(type("R", (), {"env": None})())
        'the EnvRunner has no env'
    """
    from rllib_amp.envs.atari import AleVectorEnv

    env = getattr(runner, "env", None)
    if env is None:
        return "the EnvRunner has no env"
    if not isinstance(getattr(env, "env", None), AleVectorEnv):
        return f"the env is {type(env.unwrapped).__name__}, not ALE's native vector env"
    if not isinstance(env.single_action_space, gym.spaces.Discrete):
        return f"the action space is {env.single_action_space}, not Discrete"
    config = runner.config  # type: ignore[attr-defined]
    if config._env_to_module_connector is not None:
        return "the config adds env-to-module connectors"
    if config._module_to_env_connector is not None:
        return "the config adds module-to-env connectors"
    if not (
        config.add_default_connectors_to_env_to_module_pipeline
        and config.add_default_connectors_to_module_to_env_pipeline
    ):
        return "the config turns RLlib's default connectors off"
    for name in _EPISODE_CALLBACKS:
        if getattr(config, f"callbacks_{name}", None):
            return f"the config sets callbacks_{name}"
    for cls in force_list(config.callbacks_class):
        for name in _EPISODE_CALLBACKS if isinstance(cls, type) else ():
            if getattr(cls, name, None) is not getattr(RLlibCallback, name):
                return f"the callbacks class {cls.__name__} overrides {name}"
    module = runner.module  # type: ignore[attr-defined]
    if module is None:
        return "the EnvRunner has no RLModule"
    if module.is_stateful():
        return "the RLModule is stateful (RNN)"
    return None


class BatchedAleEnvRunner(AmpEnvRunnerMixin, SingleAgentEnvRunner):
    """RLlib's SingleAgentEnvRunner that samples ALE's native vector env as whole arrays;
    forward passes in the AMP inference precision under ``with_amp``, else in float32."""

    def __init__(self, *, config: Any, **kwargs: Any):
        self._batched_obs: np.ndarray | None = None
        super().__init__(config=config, **kwargs)
        self.batched_unsupported = unsupported_reason(self)
        if self.batched_unsupported:
            logger.info(
                "rllib_amp: the batched sampler falls back to RLlib's sampling: %s",
                self.batched_unsupported,
            )

    def make_module(self) -> None:
        if AMP_CONFIG_KEY in (self.config.learner_config_dict or {}):
            super().make_module()
        else:  # stock RLlib: no autocast inference
            SingleAgentEnvRunner.make_module(self)

    def make_env(self) -> None:
        super().make_env()
        self._batched_obs = None

    def _sample(  # type: ignore[override]
        self, *, num_timesteps: int | None = None, **kwargs: Any
    ) -> list[SingleAgentEpisode]:
        if num_timesteps is None or self.batched_unsupported:
            self._batched_obs = None  # RLlib's loop owns the envs now: reset before ours
            return super()._sample(num_timesteps=num_timesteps, **kwargs)
        kwargs.pop("num_episodes", None)  # None: RLlib's sample() passes one or the other
        return self._sample_batched(num_timesteps, **kwargs)

    def _sample_batched(
        self, num_timesteps: int, *, explore: bool, random_actions: bool, force_reset: bool
    ) -> list[SingleAgentEpisode]:
        if force_reset or self._needs_initial_reset or self._batched_obs is None:
            # RLlib's own reset (seeding, new episodes, callbacks); the obs kept as one array.
            self._reset_envs_and_episodes(explore)
            self._cached_to_module = None
            obs = np.stack([e.get_observations(-1) for e in cast(Any, self._ongoing_episodes)])
            self._batched_obs = np.ascontiguousarray(np.moveaxis(obs, -1, 1))
        env: Any = self.env
        ale = env.unwrapped
        episodes: list[Any] = self._ongoing_episodes
        module = self.module
        runners = self.config.num_env_runners or 1
        num_envs = self.num_envs
        steps: list[Step] = []
        extras: dict[str, np.ndarray]
        # An env whose episode ended at the previous step autoresets at this one: ALE ignores
        # its action and returns the first observation of the next episode.
        restarting = np.array([not e.is_reset for e in episodes])
        lengths = np.array([len(e) for e in episodes])
        ts = 0
        while ts < num_timesteps:
            obs = self._batched_obs
            assert obs is not None
            if random_actions:
                actions, extras = env.action_space.sample(), {}
            else:
                actions, extras = self._actions(module, obs, explore, ts, runners)
            try:
                with self.metrics.log_time(ENV_STEP_TIMER):
                    result = ale.step(actions)
            except Exception as e:
                self._step_failed(e)
                # As RLlib: a new env, new episodes; the steps of this call are dropped.
                return self._sample_batched(
                    num_timesteps, explore=explore, random_actions=random_actions, force_reset=True
                )
            step = Step(actions, extras, restarting, time.perf_counter(), *result)
            steps.append(step)
            ts += int(num_envs - restarting.sum())
            lengths = np.where(restarting, 0, lengths + 1)
            self._batched_obs = step.obs
            restarting = (step.terminated | step.truncated) & ~restarting
        if steps:
            self._log_env_steps(metric=self._metrics_num_try_env_step, num_steps=len(steps))
        total = int(lengths.sum())
        self.metrics.log_value(ENV_TO_MODULE_SUM_EPISODES_LENGTH_IN, total)
        self.metrics.log_value(ENV_TO_MODULE_SUM_EPISODES_LENGTH_OUT, total)
        return self._finish(steps, num_timesteps=ts)

    def _actions(
        self, module: Any, obs: np.ndarray, explore: bool, ts: int, runners: int
    ) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """One forward pass on all envs, then RLlib's GetActions and TensorToNumpy."""
        episodes: list[Any] = self._ongoing_episodes
        with self.metrics.log_time((ENV_TO_MODULE_CONNECTOR, CONNECTOR_PIPELINE_TIMER)):
            # Channels-last images (the env's space) in the memory layout of RLlib's connectors:
            # the convolutions pick the same kernels, and the outputs are RLlib's to the bit.
            images = torch.from_numpy(obs).permute(0, 2, 3, 1).contiguous()
            batch = {Columns.OBS: images.to(self._device)}
        with self.metrics.log_time(RLMODULE_INFERENCE_TIMER):
            if explore:
                t = (self.num_env_steps_sampled_lifetime // runners + ts) * runners
                out = module.forward_exploration(batch, t=t)
            else:
                out = module.forward_inference(batch)
        with self.metrics.log_time((MODULE_TO_ENV_CONNECTOR, CONNECTOR_PIPELINE_TIMER)):
            out = _GET_ACTIONS(rl_module=module, batch=out, episodes=episodes, explore=explore)
            arrays = cast(dict[str, np.ndarray], convert_to_numpy(out))
            actions = arrays.pop(Columns.ACTIONS)
            arrays.pop(Columns.ACTIONS_FOR_ENV, None)
        return actions, arrays

    def _step_failed(self, error: Exception) -> None:
        """RLlib's handling of a failed env step (``EnvRunner._try_env_step``): recreates the
        env, or raises when ``restart_failed_sub_environments`` is off."""
        self.metrics.log_value(NUM_ENV_STEP_FAILURES_LIFETIME, 1, reduce="lifetime_sum")
        if self.config.restart_failed_sub_environments:
            logger.exception("rllib_amp: env step failed; recreating the env: %s", error)
            self.make_env()
            return
        raise RuntimeError(
            f"{type(self).__name__}: environment step failed and "
            "config.restart_failed_sub_environments is False"
        ) from error

    def _finish(self, steps: list[Step], *, num_timesteps: int) -> list[SingleAgentEpisode]:
        """RLlib's episodes from the step arrays: done ones, then ongoing chunks (RLlib's order)."""
        done: list[tuple[int, int, SingleAgentEpisode]] = []
        ongoing: list[SingleAgentEpisode] = []
        continuations: list[SingleAgentEpisode] = []
        arrays = Arrays(steps) if steps else None
        num_steps = len(steps)
        horizon = self.config.episode_lookback_horizon
        episodes: list[Any] = self._ongoing_episodes
        for env in range(self.num_envs):
            episode = episodes[env]
            rows = np.arange(0)
            s = 0
            while s < num_steps:
                assert arrays is not None
                if arrays.restarted[s, env]:  # the autoreset starts the new, empty episode
                    obs = np.moveaxis(arrays.obs[s][env], 0, -1)
                    episode.add_env_reset(observation=obs, infos=arrays.info_dicts([s], env)[0])
                    episode._start_time = arrays.times[s]  # type: ignore[assignment]
                    s += 1
                    continue
                ends = np.flatnonzero(
                    (arrays.terminated[s:, env] | arrays.truncated[s:, env])
                    & ~arrays.restarted[s:, env]
                )
                last = s + int(ends[0]) if len(ends) else num_steps - 1
                rows = np.arange(s, last + 1)
                episode = self._chunk(episode, arrays, rows, env)
                if episode.is_done:
                    done.append((last, env, episode))
                    self._new_episode(env, episodes)
                    episode = episodes[env]
                    rows = np.arange(0)
                s = last + 1
            continuation = episode.cut(len_lookback_buffer=horizon)
            if arrays is not None and 0 < horizon <= len(rows):
                # RLlib cuts before it stacks: the lookback keeps each action's own dtype
                # (random actions are int64, the module's int32), not the chunk's promoted one.
                continuation.actions.data = list(arrays.actions[rows[-horizon:], env])
                continuation.actions.finalized = False
            continuations.append(continuation)
            if episode.t == 0:
                continue
            episode.validate()
            if not episode.is_numpy:
                episode.to_numpy()
            self._ongoing_episodes_for_metrics[episode.id_].append(episode)
            ongoing.append(episode)
        self._ongoing_episodes = continuations  # type: ignore[assignment]
        done_episodes = [e for _, _, e in sorted(done, key=lambda d: (d[0], d[1]))]
        self._done_episodes_for_metrics.extend(done_episodes)
        self._log_env_steps(metric=self._metrics_num_env_steps_sampled, num_steps=num_timesteps)
        self._increase_sampled_metrics(num_timesteps, len(done_episodes))
        return done_episodes + ongoing

    def _chunk(
        self, base: SingleAgentEpisode, arrays: Arrays, rows: np.ndarray, env: int
    ) -> SingleAgentEpisode:
        """``base`` (reset, maybe with a lookback) plus the steps ``rows`` of ``env``, numpy."""
        lookback = base.observations.lookback
        # One copy of each frame stack, in ALE's memory order (T, stack, 84, 84); the episode
        # holds a channels-last view, the env's observation space.
        old_obs = buffer_items(base.observations)
        num_old = 0 if old_obs is None else len(old_obs)
        frames = np.empty((num_old + len(rows), *arrays.obs[0].shape[1:]), arrays.obs[0].dtype)
        if old_obs is not None:
            frames[:num_old] = np.moveaxis(old_obs, -1, 1)
        np.stack([arrays.obs[s][env] for s in rows], out=frames[num_old:])
        observations = np.moveaxis(frames, 1, -1)
        last = int(rows[-1])
        extras: dict[str, InfiniteLookbackBuffer] = {}
        new_extras = {key: values[rows, env] for key, values in arrays.extras.items()}
        new_extras[WEIGHTS_SEQ_NO] = np.full(len(rows), self._weights_seq_no, np.int64)
        for key, new in new_extras.items():
            old = base.extra_model_outputs.get(key)
            extras[key] = InfiniteLookbackBuffer(
                join_arrays(old, new), lookback=0 if old is None else old.lookback
            )
        episode = SingleAgentEpisode(
            id_=base.id_,
            observations=InfiniteLookbackBuffer(observations, lookback=lookback),
            observation_space=base.observation_space,
            infos=InfiniteLookbackBuffer(
                list(base.infos.data) + arrays.info_dicts(rows, env), lookback=base.infos.lookback
            ),
            actions=InfiniteLookbackBuffer(
                join_arrays(base.actions, arrays.actions[rows, env]), lookback=lookback
            ),
            action_space=base.action_space,
            rewards=InfiniteLookbackBuffer(
                join_arrays(base.rewards, arrays.rewards[rows, env]),
                lookback=lookback,
                space=_REWARDS_SPACE,
            ),
            terminated=bool(arrays.terminated[last, env]),
            truncated=bool(arrays.truncated[last, env]),
            extra_model_outputs=extras,
            t_started=base.t_started,
        )
        episode.custom_data.update(base.custom_data)
        episode._start_time = base._start_time or arrays.times[int(rows[0])]  # type: ignore[assignment]
        episode._last_step_time = arrays.times[last]  # type: ignore[assignment]
        return episode
