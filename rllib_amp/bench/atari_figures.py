"""The Atari-path figures: what ALE's native vector env and uint8 observations buy over
RLlib's Python Atari wrappers (float32 observations), in the same run as the AMP figures
(``figures``): sampling (beside ALE's vector env alone, ``raw ALE``), end to end, DQN replay
bytes per transition, learner peak memory. ``report.targets`` turns them into ratios.

Example:
    >>> bench_sampling(2, measure=lambda path, *a: 3.0 if path == "native" else 1.0)
    {'wrappers': [1.0, 1.0], 'native': [3.0, 3.0], 'native, amp inference': [1.0, 1.0], \
'raw ALE': [1.0, 1.0]}
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rllib_amp.bench.figures import (
    E2E_ENVS_PER_RUNNER,
    WARMUP_ROUNDS,
    interleaved_reps,
    memory_one,
    train_interleaved,
)
from rllib_amp.bench.harness import in_child
from rllib_amp.bench.workloads import LR, PATH_VARIANTS, WORKLOADS, algo_config, stock_env_runner
from rllib_amp.envs.atari import NATIVE, WRAPPERS

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

# ALE's vector env alone (no network, no RLlib): the limit the other rows are fractions of.
RAW_ALE = "raw ALE"
# The native path as ``with_amp`` ships it: the EnvRunner's ``inference_dtype`` "auto".
NATIVE_AMP = "native, amp inference"


# -- sampling ---------------------------------------------------------------------------------
def bench_sampling(
    reps: int,
    *,
    num_envs: int = E2E_ENVS_PER_RUNNER,
    env_steps: int = 4096,
    model: str = "full",
    measure: Callable[..., float] | None = None,
) -> dict[str, list[float]]:
    """Env steps/s per path (``wrappers``, ``native`` with float32 inference, ``native, amp
    inference`` with ``with_amp``'s "auto" inference dtype, ``raw ALE``), ``reps`` each,
    interleaved.

    ``measure(path, num_envs, env_steps, model)`` defaults to ``sampling.sampling_one`` (the
    raw ALE row: ``sampling.raw_ale_one``) in a fresh child process: one path's env threads and
    heap never share a process with the other's.
    """
    from rllib_amp.bench.sampling import raw_ale_one, sampling_amp_inference, sampling_one

    def run(path: str) -> float:
        if measure is not None:
            return measure(path, num_envs, env_steps, model)
        if path == RAW_ALE:
            return in_child(raw_ale_one, num_envs, env_steps)[0]
        if path == NATIVE_AMP:
            return in_child(sampling_amp_inference, num_envs, env_steps, model)[0]
        return in_child(sampling_one, path, num_envs, env_steps, model)[0]

    return interleaved_reps((WRAPPERS, NATIVE, NATIVE_AMP, RAW_ALE), reps, run)


# -- end to end -------------------------------------------------------------------------------
def path_configs(
    algo: str,
    labels: Sequence[str],
    device: str,
    *,
    model: str = "full",
    num_envs: int = E2E_ENVS_PER_RUNNER,
    training: Mapping[str, object] | None = None,
) -> dict[str, AlgorithmConfig]:
    """The training config of each ``PATH_VARIANTS`` label, one local EnvRunner each."""
    if training is None and algo == "APPO":
        # RLlib's own default batch is 500 per learner; the same 1024 as PPO's CPU workload
        # keeps the two rows comparable.
        training = {"train_batch_size_per_learner": 1024, "lr": LR}
    out = {}
    for label in labels:
        pv = PATH_VARIANTS[label]
        cfg = algo_config(
            algo, model, pv.variant, device, training=training, preprocessing=pv.preprocessing
        )
        # APPO defaults to one remote learner of one CPU: several of them side by side do not
        # fit a 2-core machine's Ray (the third waits forever), and a remote one would add
        # Ray's transfers that PPO's and DQN's rows do not have. The local learner, as theirs.
        out[label] = cfg.env_runners(num_envs_per_env_runner=num_envs).learners(num_learners=0)
    return out


def bench_end_to_end_paths(
    algo: str,
    labels: Sequence[str],
    device: str,
    iterations: int,
    *,
    warmup: int = WARMUP_ROUNDS,
    **config: Any,
) -> tuple[dict[str, list[float]], dict[str, list[float]]]:
    """Env steps/s of ``algo``'s training iterations on Pong per label, interleaved, and the
    learner's seconds per env step in them (``figures.train_interleaved``); ``config``:
    ``path_configs``'s keywords."""
    return train_interleaved(path_configs(algo, labels, device, **config), iterations, warmup)


# -- replay bytes -----------------------------------------------------------------------------
def numpy_bytes(obj: object) -> int:
    """Bytes of the numpy arrays ``obj`` holds: through episodes, RLlib's lookback buffers,
    dicts, lists and tuples; each array counted once.

    Example:
        >>> import numpy as np
        >>> a = np.zeros(10, np.uint8)
        >>> numpy_bytes({"x": [a, a], "y": np.zeros(2, np.float32)})
        18
    """
    import numpy as np

    seen: set[int] = set()
    total = 0
    stack = [obj]
    while stack:
        item = stack.pop()
        if id(item) in seen:
            continue
        seen.add(id(item))
        if isinstance(item, np.ndarray):
            total += item.nbytes
        elif isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, (list, tuple)):
            stack.extend(item)
        elif type(item).__module__.startswith("ray.rllib"):
            # RLlib's episodes keep their fields in __slots__, its lookback buffers in __dict__.
            stack.extend(getattr(item, "__dict__", {}).values())
            for cls in type(item).__mro__:
                slots = cls.__dict__.get("__slots__", ())
                for name in (slots,) if isinstance(slots, str) else slots:
                    if hasattr(item, name) and name != "__dict__":
                        stack.append(getattr(item, name))
    return total


def replay_bytes_one(
    preprocessing: str, transitions: int, num_envs: int = E2E_ENVS_PER_RUNNER
) -> dict[str, float]:
    """Numpy bytes per stored transition, ``all`` and ``observations`` alone, that the DQN
    config's replay buffer holds after ``transitions`` random-action env steps on the Atari
    path ``preprocessing``."""
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.utils import replay_buffers

    cfg = algo_config("DQN", "mini", "fp32", "cpu", preprocessing=preprocessing)
    assert isinstance(cfg, DQNConfig)
    cfg.env_runners(num_envs_per_env_runner=num_envs)
    settings: dict[str, Any] = dict(cfg.replay_buffer_config)  # RLlib's keywords
    cls = settings.pop("type")
    if isinstance(cls, str):
        cls = getattr(replay_buffers, cls)
    settings["capacity"] = max(int(settings.get("capacity", 0)), 2 * transitions)
    buffer = cls(**settings)
    with stock_env_runner(cfg) as runner:
        buffer.add(runner.sample(num_timesteps=transitions, random_actions=True))
    stored = buffer.get_num_timesteps()
    episodes = list(buffer.episodes)
    obs = [getattr(e, "observations", None) for e in episodes]
    return {
        "all": numpy_bytes(episodes) / stored,
        "observations": numpy_bytes(obs) / stored,
        "transitions": float(stored),
    }


def bench_replay_bytes(transitions: int) -> dict[str, dict[str, float]]:
    """``replay_bytes_one`` per path (``fp32 wrappers``: float32, ``fp32 native``: uint8),
    each in a fresh child process."""
    return {
        label: in_child(replay_bytes_one, PATH_VARIANTS[label].preprocessing, transitions)
        for label in ("fp32 wrappers", "fp32 native")
    }


# -- learner memory ---------------------------------------------------------------------------
def bench_memory_paths(
    algo: str, model: str, labels: Sequence[str], device: str, data_paths: Mapping[str, str]
) -> dict[str, float]:
    """Peak bytes of one ``algo`` update per label, each in a fresh child process.

    ``data_paths``: Atari path -> the batch sampled on it (``workloads.collect_data``).
    """
    if algo not in WORKLOADS:
        raise ValueError(f"bench: algo {algo!r} has no workload; allowed: {list(WORKLOADS)}")
    out = {}
    for label in labels:
        pv = PATH_VARIANTS[label]
        args = (algo, model, pv.variant, device, data_paths[pv.preprocessing], pv.preprocessing)
        out[label] = float(in_child(memory_one, *args))
    return out
