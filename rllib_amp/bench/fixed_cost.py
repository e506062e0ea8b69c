"""The learner's fixed cost per minibatch: a PPO update with almost no arithmetic.

CartPole-v1 with an MLP of one hidden layer of 8 units, train batch 4096, minibatch 256: what
an update step costs beyond the network is Python, RLlib's bookkeeping and (with rllib-amp)
the scaler's. A GPU pays that on every minibatch whatever the network, so it is what bounds
rllib-amp's speed-up on a fast device.

The figure is ms per minibatch step, from the difference of two updates on the same batch
that differ only in their number of epochs: the learner connector's pass (GAE), the update's
set-up and its metrics reduce are paid once by both and cancel, so what is left is the
per-minibatch loop (minibatch gather, forward, loss, backward, unscale, clip, step, and the
per-minibatch metrics).

Example:
    >>> FIXED_COST.minibatch_steps(FIXED_COST.epochs[1]) - FIXED_COST.minibatch_steps(1)
    64
"""

from __future__ import annotations

import copy
import gc
import time
from collections.abc import Sequence
from typing import Any, NamedTuple

from rllib_amp.bench.figures import WARMUP_ROUNDS, interleaved
from rllib_amp.bench.workloads import LR, algo_config


class FixedCostWorkload(NamedTuple):
    """The tiny-network PPO update of the fixed-cost row.

    Attributes:
        env: A vector-observation env (the network's arithmetic must be negligible).
        hiddens: The MLP's hidden layers.
        batch: Train batch per learner.
        minibatch: SGD minibatch size.
        epochs: The two epoch counts whose updates are differenced.
    """

    env: str
    hiddens: tuple[int, ...]
    batch: int
    minibatch: int
    epochs: tuple[int, int]

    def minibatch_steps(self, epochs: int) -> int:
        """Optimizer steps of one update over ``epochs`` passes (RLlib's cyclic iterator)."""
        return epochs * -(-self.batch // self.minibatch)

    def label(self) -> str:
        net = "x".join(str(h) for h in self.hiddens)
        return f"PPO {self.env}, MLP [{net}], batch {self.batch}, minibatch {self.minibatch}"


FIXED_COST = FixedCostWorkload("CartPole-v1", (8,), 4096, 256, (1, 5))


def fixed_cost_config(variant: str, epochs: int, work: FixedCostWorkload = FIXED_COST) -> Any:
    """The RLlib config of one variant (``workloads.VARIANTS_CPU`` / ``_GPU``) of the row.

    Example:
        >>> fixed_cost_config("amp-auto", 1).model_config["fcnet_hiddens"]
        [8]
    """
    cfg = algo_config(
        "PPO",
        "mini",
        variant,
        "cpu",
        env=work.env,
        training={
            "lr": LR,
            "train_batch_size_per_learner": work.batch,
            "minibatch_size": work.minibatch,
            "num_epochs": epochs,
        },
    )
    cfg.rl_module(model_config={**cfg.model_config, "fcnet_hiddens": list(work.hiddens)})
    return cfg


def sample_batch(work: FixedCostWorkload = FIXED_COST) -> tuple[Any, Any]:
    """(episodes, spaces): one train batch of ``work.batch`` env steps from the env."""
    import torch
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    cfg = fixed_cost_config("fp32", 1, work)
    cfg.debugging(seed=0)
    deterministic = torch.are_deterministic_algorithms_enabled()
    runner = SingleAgentEnvRunner(config=cfg)
    torch.use_deterministic_algorithms(deterministic)  # the seed switched it on
    try:
        assert runner.env is not None
        spaces = {
            "default_policy": (runner.env.single_observation_space, runner.env.single_action_space)
        }
        episodes = runner.sample(num_timesteps=work.batch, random_actions=False)
    finally:
        runner.stop()
    return episodes, spaces


def build_fixed_cost_learner(
    variant: str, device: str, spaces: Any, work: FixedCostWorkload = FIXED_COST
) -> Any:
    """The learner of one variant, with the same initial weights for every variant."""
    import torch

    torch.manual_seed(0)
    cfg = fixed_cost_config(variant, 1, work)
    cfg.learners(num_gpus_per_learner=1 if device == "cuda" else 0)
    return cfg.build_learner(spaces=spaces)


def timed_update(learner: Any, episodes: Any, epochs: int, work: FixedCostWorkload) -> float:
    """Seconds of one ``Learner.update`` over ``epochs`` (the batch copy is not timed).

    On a GPU, wall time; on a CPU, the CPU time of this thread (the update runs on one torch
    thread): on cores shared with other jobs, wall time would also count the time the
    update waited for a core. Python's garbage collector is off while it runs.
    """
    import torch

    eps = copy.deepcopy(episodes)
    cuda = torch.cuda.is_available() and str(getattr(learner, "_device", "")).startswith("cuda")
    clock = time.perf_counter if cuda else time.thread_time
    if cuda:
        torch.cuda.synchronize()
    # As timeit does: a collection of the older generations, triggered by whatever allocated
    # last, would land in one update (seen: a 1-epoch update 126 ms slower than a 5-epoch one).
    gc.collect()
    gc.disable()
    try:
        t = clock()
        learner.update(
            episodes=eps,
            timesteps={"num_env_steps_sampled_lifetime": 10_000},
            minibatch_size=work.minibatch,
            num_epochs=epochs,
            shuffle_batch_per_epoch=True,
        )
        if cuda:
            torch.cuda.synchronize()
        return clock() - t
    finally:
        gc.enable()


def bench_fixed_cost(
    variants: Sequence[str], device: str, reps: int, work: FixedCostWorkload = FIXED_COST
) -> dict[str, list[float]]:
    """Seconds per minibatch step, per variant: one value per repetition, each the
    difference of a long and a short update divided by their difference in steps, variants
    interleaved in one process after warm-up rounds (``timed_update`` says which clock).

    Example:
        >>> bench_fixed_cost(("fp32", "amp-auto"), "cpu", reps=5)  # doctest: +SKIP
        {'fp32': [0.0021, ...], 'amp-auto': [0.0019, ...]}
    """
    episodes, spaces = sample_batch(work)
    learners = {v: build_fixed_cost_learner(v, device, spaces, work) for v in variants}
    short, long = work.epochs
    steps = work.minibatch_steps(long) - work.minibatch_steps(short)
    for _ in range(WARMUP_ROUNDS):
        for v in variants:
            timed_update(learners[v], episodes, long, work)
    out: dict[str, list[float]] = {v: [] for v in variants}
    for rep in range(reps):
        for v in interleaved(variants, rep):
            t_short = timed_update(learners[v], episodes, short, work)
            t_long = timed_update(learners[v], episodes, long, work)
            out[v].append((t_long - t_short) / steps)
    return out


def fixed_cost_cell(variants: Sequence[str], device: str, reps: int) -> dict[str, list[float]]:
    """``bench_fixed_cost`` for ``in_child``, on one torch thread: the row measures the
    per-step overhead, not arithmetic, and on shared cores a second thread only adds waits at
    each op's thread barrier."""
    import torch

    torch.set_num_threads(1)
    return bench_fixed_cost(variants, device, reps)
