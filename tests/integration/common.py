"""Tiny CartPole configs and helpers shared by the integration tests."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from ray.rllib.algorithms.appo import APPOConfig
from ray.rllib.algorithms.dqn import DQNConfig
from ray.rllib.algorithms.ppo import PPOConfig

from rllib_amp import with_amp
from rllib_amp.learner.mixin import AmpLearnerMixin

TINY = {"fcnet_hiddens": [16, 16]}


def tiny_config(algo: str, *, seed: int = 0):
    """A stock RLlib config small enough for a CPU test (no AMP applied)."""
    if algo == "PPO":
        cfg = PPOConfig().training(
            train_batch_size_per_learner=128, minibatch_size=64, num_epochs=2
        )
        cfg.env_runners(num_env_runners=0)
    elif algo == "DQN":
        cfg = DQNConfig().training(
            train_batch_size_per_learner=32, num_steps_sampled_before_learning_starts=32
        )
        cfg.env_runners(num_env_runners=0, rollout_fragment_length=32)
    elif algo == "APPO":
        cfg = APPOConfig().training(train_batch_size_per_learner=64)
        cfg.env_runners(num_env_runners=1, rollout_fragment_length=32)
        cfg.reporting(min_time_s_per_iteration=0.5)
        cfg.learners(num_learners=0)  # local learner, so tests can look inside it
    else:
        raise ValueError(algo)
    return cfg.environment("CartPole-v1").rl_module(model_config=dict(TINY)).debugging(seed=seed)


def ppo_episodes(batch: int = 64, *, hiddens: int = 16, lr: float = 1e-3):
    """(PPO config, CartPole episodes of ``batch`` steps, spaces) for driving a learner directly.

    The config trains on the whole batch as one minibatch, once: one optimizer step per update.
    """
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    cfg = (
        PPOConfig()
        .environment("CartPole-v1")
        .env_runners(num_env_runners=0)
        .training(train_batch_size_per_learner=batch, num_epochs=1, minibatch_size=batch, lr=lr)
        .rl_module(model_config={"fcnet_hiddens": [hiddens]})
        .debugging(seed=0)
    )
    runner = SingleAgentEnvRunner(config=cfg)
    episodes = runner.sample(num_timesteps=batch)
    env = runner.env
    runner.stop()
    return (
        cfg,
        episodes,
        {"default_policy": (env.single_observation_space, env.single_action_space)},
    )


def amp_config(algo: str, *, seed: int = 0, **amp):
    return with_amp(tiny_config(algo, seed=seed), **amp)


def learner(algo_obj) -> AmpLearnerMixin:
    """The local learner (num_learners=0) of an Algorithm."""
    return algo_obj.learner_group._learner


def train_until_learned(algo_obj, iterations: int = 1, max_tries: int = 200) -> dict:
    """Trains until ``iterations`` results carry learner metrics (APPO is asynchronous)."""
    got, result = 0, {}
    for _ in range(max_tries):
        result = algo_obj.train()
        # A module entry alone is not enough: APPO's asynchronous learner can report a module
        # whose window holds no update yet (its counters read nan).
        if any(
            _trained(stats)
            for module_id, stats in result.get("learners", {}).items()
            if module_id != "__all_modules__"
        ):
            got += 1
            if got >= iterations:
                return result
    raise AssertionError(f"no learner results after {max_tries} iterations")


def _trained(stats: Any) -> bool:
    steps = stats.get("num_module_steps_trained") if isinstance(stats, dict) else None
    try:
        value = float(steps)  # numpy scalars too
    except (TypeError, ValueError):
        return False
    return math.isfinite(value) and value > 0


def weights(algo_obj, module_id: str = "default_policy") -> dict[str, np.ndarray]:
    module = learner(algo_obj).module[module_id]
    return {k: v.detach().cpu().clone().numpy() for k, v in module.state_dict().items()}


def all_finite(ws: dict[str, np.ndarray]) -> bool:
    return all(np.isfinite(v).all() for v in ws.values())


def same(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> bool:
    return a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)


def optimizer_state(algo_obj, module_id: str = "default_policy") -> list[dict]:
    out = []
    for _, opt in learner(algo_obj).get_optimizers_for_module(module_id):
        st = opt.state_dict()["state"]
        out.append(
            {
                pid: {k: (v.clone() if torch.is_tensor(v) else v) for k, v in s.items()}
                for pid, s in st.items()
            }
        )
    return out
