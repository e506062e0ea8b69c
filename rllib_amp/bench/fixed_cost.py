"""The learner's fixed cost per minibatch: a PPO update with almost no arithmetic.

CartPole-v1, an MLP of one hidden layer of 8 units, batch 4096, minibatch 256: what a step
costs beyond the network is Python, RLlib's bookkeeping and (with rllib-amp) the scaler's. A
GPU pays that on every minibatch whatever the network: it bounds rllib-amp's speed-up there.

The figure is ms per minibatch step, from two updates on the same batch that differ only in
their epochs: what both pay once (the learner connector's GAE pass, set-up, metrics reduce)
cancels, leaving the per-minibatch loop (gather, forward, loss, backward, unscale, clip, step,
metrics). The steps are counted from the learner (``StepCounter``): PPO's learner connector
adds one timestep per episode (``AddOneTsToEpisodesAndTruncate``), so RLlib's cyclic iterator
takes more than batch / minibatch steps an epoch.

Example:
    >>> FIXED_COST.label()
    'PPO CartPole-v1, MLP [8], batch 4096, minibatch 256'
"""

from __future__ import annotations

import gc
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, NamedTuple, TypedDict

from rllib_amp.bench.figures import WARMUP_ROUNDS, interleaved_reps
from rllib_amp.bench.workloads import (
    LR,
    algo_config,
    on_cuda,
    sample_batch,
    seeded_learner,
    update_fn,
)

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
    from ray.rllib.core.learner.learner import Learner
    from ray.rllib.utils.typing import EpisodeType
    from torch.utils.hooks import RemovableHandle


class FixedCostWorkload(NamedTuple):
    """The tiny-network PPO update of the fixed-cost row."""

    env: str  # a vector-observation env: the network's arithmetic must be negligible
    hiddens: tuple[int, ...]  # the MLP's hidden layers
    batch: int  # train batch per learner
    minibatch: int
    epochs: tuple[int, int]  # the two epoch counts whose updates are differenced

    def label(self) -> str:
        net = "x".join(str(h) for h in self.hiddens)
        return f"PPO {self.env}, MLP [{net}], batch {self.batch}, minibatch {self.minibatch}"


FIXED_COST = FixedCostWorkload("CartPole-v1", (8,), 4096, 256, (1, 5))


class FixedCostRecord(TypedDict):
    """One repetition: seconds and counted minibatch steps of the short and the long update,
    and ``per_step_s``: their difference in seconds over their difference in steps."""

    short_s: float
    short_steps: int
    long_s: float
    long_steps: int
    per_step_s: float


def fixed_cost_config(
    variant: str, epochs: int, work: FixedCostWorkload = FIXED_COST
) -> AlgorithmConfig:
    """The RLlib config of one variant (``workloads.VARIANTS_CPU`` / ``_GPU``) of the row.

    Example:
        >>> fixed_cost_config("amp-auto", 1).model_config["fcnet_hiddens"]
        [8]
    """
    training = {"lr": LR, "train_batch_size_per_learner": work.batch}
    training.update(minibatch_size=work.minibatch, num_epochs=epochs)
    cfg = algo_config("PPO", "mini", variant, "cpu", env=work.env, training=training)
    return cfg.rl_module(model_config={**cfg.model_config, "fcnet_hiddens": list(work.hiddens)})


class StepCounter:
    """The minibatch steps a learner has taken, as the learner itself counts them.

    With rllib-amp, each module's scaler counts its optimizer steps, skipped ones (an
    inf/nan under float16) included: the most of any module. Without, a post-step hook on
    each of the learner's optimizers counts its ``step()`` calls: the most of any optimizer
    (a module's optimizers step together, once per minibatch). Read it before and after an
    update, outside the timed part.
    """

    def __init__(self, learner: Learner) -> None:
        self._scalers = dict(getattr(learner, "amp_scalers", {}) or {})
        self._calls: dict[int, int] = {}
        self._handles: list[RemovableHandle] = []
        if not self._scalers:
            for mid, _ in learner.module.items():
                for _, opt in learner.get_optimizers_for_module(mid):
                    self._calls[id(opt)] = 0
                    self._handles.append(opt.register_step_post_hook(self._count))

    def _count(self, optimizer: object, *_: object) -> None:
        self._calls[id(optimizer)] += 1

    def __call__(self) -> int:
        if self._scalers:
            return max(s.optimizer_steps_lifetime for s in self._scalers.values())
        return max(self._calls.values(), default=0)

    def remove(self) -> None:
        """Takes the hooks off the optimizers."""
        for h in self._handles:
            h.remove()
        self._handles.clear()


def timed_update(
    learner: Learner,
    episodes: list[EpisodeType],
    epochs: int,
    work: FixedCostWorkload,
    steps: StepCounter,
) -> tuple[float, int]:
    """(seconds, minibatch steps) of one ``Learner.update`` over ``epochs`` (``update_fn``;
    ``steps`` is read before and after, outside the timed part).

    On a GPU, wall time; on a CPU, the CPU time of this thread (the update runs on one torch
    thread): on cores shared with other jobs, wall time would also count the time the
    update waited for a core. Python's garbage collector is off while it runs.
    """
    clock = time.perf_counter if on_cuda(learner) else time.thread_time
    run = update_fn(learner, episodes, work.minibatch, epochs, clock)
    # As timeit does: a collection of the older generations, triggered by whatever allocated
    # last, would land in one update (and made a 1-epoch update slower than a 5-epoch one).
    gc.collect()
    before = steps()
    gc.disable()
    try:
        seconds = run()
    finally:
        gc.enable()
    return seconds, steps() - before


def bench_fixed_cost(
    variants: Sequence[str], device: str, reps: int, work: FixedCostWorkload = FIXED_COST
) -> dict[str, list[FixedCostRecord]]:
    """One ``FixedCostRecord`` per variant and repetition, variants interleaved in one process
    after warm-up rounds (``timed_update`` says which clock).

    Example:
        >>> bench_fixed_cost(("fp32", "amp-auto"), "cpu", reps=5)  # doctest: +SKIP
        {'fp32': [{'short_s': 0.05, 'short_steps': 17, 'long_s': 0.17, 'long_steps': 85,
                   'per_step_s': 0.0018}, ...], 'amp-auto': [...]}
    """
    batch = sample_batch(fixed_cost_config("fp32", 1, work), work.batch)
    episodes, spaces = batch["episodes"], batch["spaces"]
    gpus = 1 if device == "cuda" else 0
    learners = {
        v: seeded_learner(fixed_cost_config(v, 1, work).learners(num_gpus_per_learner=gpus), spaces)
        for v in variants
    }
    counters = {v: StepCounter(lrn) for v, lrn in learners.items()}
    short, long = work.epochs
    for _ in range(WARMUP_ROUNDS):
        for v in variants:
            timed_update(learners[v], episodes, long, work, counters[v])

    def record(v: str) -> FixedCostRecord:
        t_short, n_short = timed_update(learners[v], episodes, short, work, counters[v])
        t_long, n_long = timed_update(learners[v], episodes, long, work, counters[v])
        if n_long <= n_short:
            raise RuntimeError(
                f"fixed cost, {v}: the {long}-epoch update took {n_long} optimizer steps, "
                f"the {short}-epoch one {n_short}; nothing to difference"
            )
        return {
            "short_s": t_short,
            "short_steps": n_short,
            "long_s": t_long,
            "long_steps": n_long,
            "per_step_s": (t_long - t_short) / (n_long - n_short),
        }

    out = interleaved_reps(variants, reps, record)
    for c in counters.values():
        c.remove()
    return out


def per_step_seconds(records: Sequence[FixedCostRecord | float]) -> list[float]:
    """Seconds per minibatch step of each repetition; a bare number is taken as that (the
    JSON of runs before the raw records were kept).

    Example:
        >>> per_step_seconds([0.002, {"per_step_s": 0.003}])
        [0.002, 0.003]
    """
    return [float(r) if isinstance(r, (int, float)) else float(r["per_step_s"]) for r in records]


def fixed_cost_cell(
    variants: Sequence[str], device: str, reps: int
) -> dict[str, list[FixedCostRecord]]:
    """``bench_fixed_cost`` for ``in_child``, on one torch thread: the row measures the
    per-step overhead, not arithmetic, and on shared cores a second thread only adds waits at
    each op's thread barrier."""
    import torch

    torch.set_num_threads(1)
    return bench_fixed_cost(variants, device, reps)
