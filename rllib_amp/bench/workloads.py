"""What the benchmark trains: variants, workloads, the RLlib config of one cell, its batch.

The benchmarked algorithms are a subset of rllib_amp.algorithms: each ``Workload`` names a
registry entry (checked when this module is imported) and says how its learner update is fed.

Example:
    >>> WORKLOADS["PPO"].training("cpu")["train_batch_size_per_learner"]
    1024
"""

from __future__ import annotations

import contextlib
import copy
import functools
import pickle
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias, TypedDict, TypeVar

from rllib_amp.algorithms import ALGORITHMS, algorithm
from rllib_amp.envs.atari import NATIVE, PREPROCESSING_KEY, WRAPPERS

if TYPE_CHECKING:
    import gymnasium as gym
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.rllib.core.learner.learner import Learner
    from ray.rllib.env.env_runner import EnvRunner
    from ray.rllib.utils.typing import EpisodeType

# Module id -> (observation space, action space), as ``AlgorithmConfig.build_learner`` takes.
Spaces: TypeAlias = "dict[str, tuple[gym.Space, gym.Space]]"


class Batch(TypedDict):
    """One fixed training batch (``sample_batch``), as ``collect_data`` pickles it."""

    episodes: list[EpisodeType]
    spaces: Spaces


VARIANTS_CPU = ("fp32", "rllib-scaler", "amp-auto")
VARIANTS_GPU = ("fp32", "rllib-scaler", "amp-auto", "amp-fp16", "amp-bf16")
# rllib-amp variant -> AmpSettings.dtype
AMP_DTYPES = {"amp-auto": "auto", "amp-fp16": "float16", "amp-bf16": "bfloat16"}
MODELS = ("mini", "full", "high")


class PathVariant(NamedTuple):
    """A variant of the Atari-path figures: a ``VARIANTS_*`` entry on one Atari path."""

    variant: str
    preprocessing: str


# The Atari-path figures' variants. "fp32 wrappers" is stock RLlib as it ships (float32 model,
# RLlib's Python Atari wrappers, float32 observations): the reference of their ratios.
# "fp32 native" isolates what the env path and uint8 buy; "amp native" is all of rllib-amp;
# "amp wrappers" is AMP on float32 observations, the AMP figure before the native path.
STOCK = "fp32 wrappers"
PATH_VARIANTS: dict[str, PathVariant] = {
    STOCK: PathVariant("fp32", WRAPPERS),
    "amp wrappers": PathVariant("amp-auto", WRAPPERS),
    "fp32 native": PathVariant("fp32", NATIVE),
    "amp native": PathVariant("amp-auto", NATIVE),
}
ENV_ID = "ALE/Pong-v5"
LR = 1e-4


class Workload(NamedTuple):
    """One benchmarked algorithm and the batch its timed learner update trains on."""

    algorithm: str  # a name in rllib_amp.algorithms.ALGORITHMS
    batch: Mapping[str, int]  # train batch per learner, per device ("cpu", "cuda")
    minibatch: int | None  # SGD minibatch size; None: one step on the whole batch
    epochs: int  # passes over the batch per update
    on_policy: bool  # sampled by the policy, or drawn from a replay buffer of random actions

    def training(self, device: str) -> dict[str, object]:
        """``AlgorithmConfig.training`` keywords of this workload on ``device``."""
        out: dict[str, object] = {"train_batch_size_per_learner": self.batch[device], "lr": LR}
        if self.minibatch is not None:
            out.update(minibatch_size=self.minibatch, num_epochs=self.epochs)
        return out


class ParityRun(NamedTuple):
    """One learning-parity run: CartPole, a fixed env-step budget, RLlib-tuned settings."""

    algorithm: str
    env_steps: int
    training: Mapping[str, object]


Entry = TypeVar("Entry", Workload, ParityRun)


def _by_name(items: tuple[Entry, ...]) -> dict[str, Entry]:
    for item in items:
        # algorithm() raises a ValueError naming the registry's algorithms.
        record = algorithm(item.algorithm)
        if record.name != item.algorithm:
            raise ValueError(f"bench: spell {item.algorithm!r} as in {list(ALGORITHMS)}")
        # The registry says whose learner splits batches into minibatches.
        splits = record.minibatches
        if isinstance(item, Workload) and (item.minibatch is not None) != splits:
            raise ValueError(
                f"bench: {item.algorithm} workload minibatch={item.minibatch!r}: {item.algorithm}'s"
                f" learner {'splits' if splits else 'does not split'} batches into minibatches "
                f"(rllib_amp.algorithms); give {'a minibatch size' if splits else 'minibatch=None'}"
            )
    return {item.algorithm: item for item in items}


# PPO: batch 1024 on a CPU, 4096 on a GPU (the size the GPU memory target is set at).
WORKLOADS: dict[str, Workload] = _by_name(
    (
        Workload("PPO", {"cpu": 1024, "cuda": 4096}, minibatch=256, epochs=2, on_policy=True),
        Workload("DQN", {"cpu": 256, "cuda": 256}, minibatch=None, epochs=1, on_policy=False),
    )
)
# The second write-up's claim "AMP lets the DQN batch grow from 32 to 64 or 128": the DQN
# update (Nature CNN, image input) at each, float32 and AMP.
DQN_BATCHES = (32, 64, 128)
DQN_BATCH_VARIANTS = ("fp32", "amp-auto")
PARITY_ENV_ID = "CartPole-v1"
PARITY_MODEL = "mini"  # fcnet [64, 64], tanh
PARITY: dict[str, ParityRun] = _by_name(
    (
        ParityRun(
            "PPO", 40_000, {"lr": 3e-4, "train_batch_size_per_learner": 1000, "minibatch_size": 250}
        ),
        ParityRun(
            "DQN",
            10_000,
            {
                "lr": 5e-4,
                "train_batch_size_per_learner": 32,
                "num_steps_sampled_before_learning_starts": 1000,
                "target_network_update_freq": 500,
                "n_step": 3,
            },
        ),
    )
)


def algo_config(
    algo: str,
    model: str,
    variant: str,
    device: str,
    *,
    env: str = ENV_ID,
    training: Mapping[str, object] | None = None,
    seed: int | None = None,
    tune_malloc: bool = True,
    preprocessing: str | None = None,
) -> AlgorithmConfig:
    """The RLlib config of one benchmark cell.

    ``training`` defaults to the algorithm's ``WORKLOADS`` entry. No seed by default: RLlib's
    ``debugging(seed=...)`` turns on ``torch.use_deterministic_algorithms`` on a CPU,
    process-wide, which also fills every new tensor (about 12% of a bf16 PPO update); the
    speed figures measure normal training. ``tune_malloc=False`` keeps glibc's allocator
    defaults in the AMP variants (the memory figure: a heap that keeps freed blocks would hide
    the update's peak). ``preprocessing`` picks an Atari env's path (``atari.NATIVE``, the
    default, or ``atari.WRAPPERS``: RLlib's float32 wrappers and its stock RLModule).

    Example:
        >>> cfg = algo_config("PPO", "mini", "amp-auto", "cpu", env="CartPole-v1")
        >>> cfg.minibatch_size
        256
    """
    import torch

    from rllib_amp import with_amp
    from rllib_amp.envs import configure as envs
    from rllib_amp.envs import models

    cfg = algorithm(algo).config_class()
    envs.configure_env(
        cfg, env, {} if preprocessing is None else {PREPROCESSING_KEY: preprocessing}
    )
    cfg.env_runners(num_env_runners=0)
    cfg.rl_module(model_config=models.model_config(model, image=envs.is_atari(env)))
    cfg.learners(num_gpus_per_learner=1 if device == "cuda" else 0)
    # RLlib's keywords, each typed in its signature: the workloads' values are checked there.
    kw: dict[str, Any] = dict(WORKLOADS[algo].training(device) if training is None else training)
    cfg.training(**kw)
    if seed is not None:
        cfg.debugging(seed=seed)
    if variant == "rllib-scaler":
        # RLlib calls the class with no arguments: a partial is how a device gets in.
        scaler_cls: Any = functools.partial(torch.amp.GradScaler, device)
        cfg.experimental(_torch_grad_scaler_class=scaler_cls)
    elif variant in AMP_DTYPES:
        with_amp(cfg, dtype=AMP_DTYPES[variant], tune_cpu_malloc=tune_malloc)
    return cfg


@contextlib.contextmanager
def stock_env_runner(cfg: AlgorithmConfig, cls: type[EnvRunner] | None = None) -> Iterator[Any]:
    """A local EnvRunner of ``cfg`` (``cls``, default RLlib's SingleAgentEnvRunner), stopped
    at the end."""
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    from rllib_amp.learner.env_runner import forget_rllib_env_ids

    forget_rllib_env_ids()  # a stock runner after another in this process: no gymnasium warning
    runner = (cls or SingleAgentEnvRunner)(config=cfg)
    try:
        yield runner
    finally:
        runner.stop()


def sample_batch(cfg: AlgorithmConfig, env_steps: int, *, on_policy: bool = True) -> Batch:
    """A batch of ``env_steps`` env steps from a seeded local EnvRunner of ``cfg``: sampled by
    the policy (``on_policy``), or drawn from a replay buffer filled with random actions."""
    import torch
    from ray.rllib.utils.replay_buffers.episode_replay_buffer import EpisodeReplayBuffer

    cfg.debugging(seed=0)
    deterministic = torch.are_deterministic_algorithms_enabled()
    with stock_env_runner(cfg) as runner:
        # The seeded runner switched torch's deterministic mode on for the whole process.
        torch.use_deterministic_algorithms(deterministic)
        env = runner.env
        spaces = {"default_policy": (env.single_observation_space, env.single_action_space)}
        episodes: list[EpisodeType]
        if on_policy:
            episodes = list(runner.sample(num_timesteps=env_steps, random_actions=False))
        else:
            buffer = EpisodeReplayBuffer(capacity=10 * env_steps)
            buffer.add(runner.sample(num_timesteps=2 * env_steps, random_actions=True))
            episodes = buffer.sample(  # type: ignore[assignment]
                num_items=env_steps, n_step=1, gamma=0.99, sample_episodes=True
            )
    return {"episodes": episodes, "spaces": spaces}


def collect_data(
    algo: str,
    device: str,
    path: str,
    preprocessing: str | None = None,
    batch_size: int | None = None,
) -> None:
    """Pickles to ``path`` one fixed training batch (``sample_batch``) from Pong, on the Atari
    path ``preprocessing``, of ``batch_size`` env steps (default: the workload's)."""
    work = WORKLOADS[algo]
    cfg = algo_config(algo, "mini", "fp32", device, preprocessing=preprocessing)
    batch = sample_batch(cfg, batch_size or work.batch[device], on_policy=work.on_policy)
    with open(path, "wb") as f:
        pickle.dump(batch, f)


def seeded_learner(cfg: AlgorithmConfig, spaces: Spaces) -> Learner:
    """The learner of ``cfg``, with the same initial weights for every variant."""
    import torch

    torch.manual_seed(0)
    return cfg.build_learner(spaces=spaces)


def build_learner(
    algo: str, model: str, variant: str, device: str, spaces: Spaces, **config: Any
) -> Learner:
    """The learner of one cell (``seeded_learner``); ``config``: ``algo_config``'s keywords."""
    return seeded_learner(algo_config(algo, model, variant, device, **config), spaces)


def on_cuda(learner: Learner) -> bool:
    return str(learner.device).startswith("cuda")


def update_fn(
    learner: Learner,
    episodes: list[EpisodeType],
    minibatch: int | None,
    epochs: int,
    clock: Callable[[], float] = time.perf_counter,
) -> Callable[[], float]:
    """One timed learner update (seconds on ``clock``) on a fresh copy of the batch (the copy
    is not timed)."""
    import torch

    sync = torch.cuda.synchronize if on_cuda(learner) else lambda: None

    def run() -> float:
        eps = copy.deepcopy(episodes)
        sync()
        t = clock()
        learner.update(
            episodes=eps,
            timesteps={"num_env_steps_sampled_lifetime": 10_000},
            minibatch_size=minibatch,
            num_epochs=epochs,
            shuffle_batch_per_epoch=minibatch is not None,
        )
        sync()
        return clock() - t

    return run
