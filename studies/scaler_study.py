"""``python -m studies.scaler_study``: the scaler across runs and tasks, measured.

Two questions, float16 with tiny PPO nets on CartPole, learners driven directly (no Ray):

(a) warm start: skipped optimizer steps in a run's first updates when its scaler starts fresh
    at ``init_scale=65536``, against a warm start from a finished run's checkpoint;
(b) per-task scalers: two modules whose gradients differ by orders of magnitude, trained in
    one learner with a scaler each, against one shared scaler (``shared_scaler``).

Gradient magnitude is set by a per-module loss factor (``LossFactorLearner``). Adam's update
does not depend on a constant factor on the loss, so in float32 the factor changes nothing:
whatever differs between the rows is float16 range and the scaler. Every update is one
optimizer step (the whole batch is one minibatch, one epoch), over a few batches sampled
once and replayed, with PPO's KL loss off (its adaptive coefficient grows without bound on
replayed batches). Prints a markdown table under the machine line.

Example:
    python -m studies.scaler_study --updates 40
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner

from rllib_amp.cli import Parser, UsageError, main_wrapper

PROG = "python -m studies.scaler_study"
# learner_config_dict key: ModuleID -> the factor its loss is multiplied by.
LOSS_FACTOR_KEY = "scaler_study_loss_factor"
FRESH_INIT_SCALE = 65536.0
TWO_TASKS = ("p0", "p1")  # p1's loss is multiplied by --factor


class LossFactorLearner(PPOTorchLearner):
    """PPO whose module losses are multiplied by a constant per module: gradients as large.

    The factors are ``config.learner_config_dict[LOSS_FACTOR_KEY]`` (ModuleID -> factor).
    Records, per module and update, the fraction of gradient entries that are exactly zero
    once unscaled (``zero_fractions``): with tanh layers a float32 gradient entry is almost
    never exactly zero, so these are float16 underflows, the price of a scale too small.
    """

    zero_fractions: dict[str, list[float]]

    def postprocess_gradients(self, gradients_dict):  # type: ignore[no-untyped-def]
        # Under AmpLearnerMixin this runs after the unscale: true-scale gradients.
        import torch

        if not hasattr(self, "zero_fractions"):
            self.zero_fractions = {}
        for mid in self.module.keys():  # noqa: SIM118 - a MultiRLModule, not a dict
            module: Any = self.module[mid]
            grads = [
                gradients_dict[ref]
                for ref in (self.get_param_ref(p) for p in module.parameters())
                if gradients_dict.get(ref) is not None
            ]
            if grads and all(bool(torch.isfinite(g).all()) for g in grads):
                zeros = sum(int((g == 0).sum()) for g in grads)
                self.zero_fractions.setdefault(mid, []).append(
                    zeros / sum(g.numel() for g in grads)
                )
        return super().postprocess_gradients(gradients_dict)

    def compute_loss_for_module(self, *, module_id, config, batch, fwd_out):  # type: ignore[no-untyped-def]
        loss = super().compute_loss_for_module(
            module_id=module_id, config=config, batch=batch, fwd_out=fwd_out
        )
        factors = self.config.learner_config_dict.get(LOSS_FACTOR_KEY, {})
        return loss * float(factors.get(module_id, 1.0))


@dataclass
class Batches:
    """A learner config without AMP, sampled episode batches, and the modules' spaces."""

    config: Any
    episodes: list[Any]
    spaces: dict[str, tuple[Any, Any]]


def sample_batches(
    *, multi_agent: bool, batches: int = 3, batch_size: int = 64, seed: int = 0
) -> Batches:
    """CartPole episodes for a PPO learner (two policies p0/p1 when ``multi_agent``).

    Example:
        >>> b = sample_batches(multi_agent=False, batches=1, batch_size=32)  # doctest: +SKIP
        >>> sorted(b.spaces)  # doctest: +SKIP
        ['default_policy']
    """
    from ray.rllib.algorithms.ppo import PPOConfig

    cfg = (
        PPOConfig()
        .env_runners(num_env_runners=0)
        .training(
            train_batch_size_per_learner=batch_size,
            minibatch_size=batch_size,
            num_epochs=1,
            lr=3e-4,
            # The batches are replayed: PPO's adaptive KL coefficient would grow on them
            # without bound, and the gradients with it (not what a real run does).
            use_kl_loss=False,
        )
        .rl_module(model_config={"fcnet_hiddens": [16, 16]})
        .learners(learner_class=LossFactorLearner)
        .debugging(seed=seed)
    )
    if multi_agent:
        from ray.rllib.env.multi_agent_env_runner import MultiAgentEnvRunner
        from ray.rllib.examples.envs.classes.multi_agent import MultiAgentCartPole

        cfg.environment(MultiAgentCartPole, env_config={"num_agents": 2}).multi_agent(
            policies=set(TWO_TASKS),
            policy_mapping_fn=lambda agent_id, episode, **kw: f"p{agent_id}",
        )
        runner: Any = MultiAgentEnvRunner(config=cfg)
        spaces = {
            mid: (runner.module[mid].observation_space, runner.module[mid].action_space)
            for mid in TWO_TASKS
        }
    else:
        from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

        cfg.environment("CartPole-v1")
        runner = SingleAgentEnvRunner(config=cfg)
        env = runner.env
        spaces = {"default_policy": (env.single_observation_space, env.single_action_space)}
    episodes = [runner.sample(num_timesteps=batch_size) for _ in range(batches)]
    runner.stop()
    return Batches(cfg, episodes, spaces)


def build_learner(batches: Batches, factors: Mapping[str, float], **amp: Any) -> Any:
    """A float16 AMP learner over ``batches``'s modules, same initial weights every time."""
    import torch

    from rllib_amp import with_amp

    cfg = batches.config.copy(copy_frozen=False)
    cfg.learners(learner_config_dict={LOSS_FACTOR_KEY: dict(factors)})
    with_amp(cfg, dtype="float16", tune_cpu_malloc=False, **amp)
    torch.manual_seed(0)
    return cfg.build_learner(spaces=batches.spaces)


@dataclass
class Trace:
    """Per module: the scale after each update, and how many steps it skipped."""

    scales: dict[str, list[float]] = field(default_factory=dict)
    skipped: dict[str, int] = field(default_factory=dict)
    zero_fraction: dict[str, float] = field(default_factory=dict)

    def settled(self, module_id: str) -> tuple[float, float]:
        """(min, max) scale over the last quarter of the updates."""
        tail = self.scales[module_id][-max(1, len(self.scales[module_id]) // 4) :]
        return min(tail), max(tail)


def train(learner: Any, batches: Batches, updates: int) -> Trace:
    """``updates`` learner updates cycling over the batches; one optimizer step each."""
    trace = Trace()
    start = {mid: s.skipped_steps_lifetime for mid, s in learner.amp_scalers.items()}
    for i in range(updates):
        learner.update(
            episodes=copy.deepcopy(batches.episodes[i % len(batches.episodes)]),
            num_epochs=1,
            timesteps={"num_env_steps_sampled_lifetime": i + 1},
        )
        for mid, scaler in learner.amp_scalers.items():
            trace.scales.setdefault(mid, []).append(scaler.get_scale())
    for mid, scaler in learner.amp_scalers.items():
        trace.skipped[mid] = scaler.skipped_steps_lifetime - start[mid]
        # Over the same last quarter as the settled scale.
        fractions = getattr(learner, "zero_fractions", {}).get(mid, [])[-updates:]
        fractions = fractions[-max(1, len(fractions) // 4) :]
        trace.zero_fraction[mid] = sum(fractions) / len(fractions) if fractions else float("nan")
    return trace


@dataclass
class Row:
    question: str
    setup: str
    module: str
    skipped: int
    updates: int
    start_scale: float
    settled: tuple[float, float]
    zero_fraction: float


def fresh_vs_warm(batches: Batches, *, factor: float, updates: int, folder: str) -> list[Row]:
    """(a) One task with its loss times ``factor``: a fresh scaler against a warm start.

    A first run trains ``2 * updates`` from init_scale 65536 and saves its learner; then two
    new runs (fresh weights, same seed) train ``updates`` each: one fresh at 65536, one
    warm-started from that checkpoint.
    """
    mid = next(iter(batches.spaces))
    factors = {mid: factor}
    first = build_learner(batches, factors, init_scale=FRESH_INIT_SCALE)
    train(first, batches, 2 * updates)
    path = os.path.join(folder, f"first_run_x{factor:g}")
    first.save_to_path(path)
    rows = []
    for setup, amp in (
        ("fresh, init_scale 65536", {"init_scale": FRESH_INIT_SCALE}),
        ("warm start", {"init_scale": FRESH_INIT_SCALE, "warm_start": {"from": path}}),
    ):
        lrn = build_learner(batches, factors, **amp)
        start = lrn.amp_scalers[mid].get_scale()
        trace = train(lrn, batches, updates)
        rows.append(
            Row(
                f"(a) loss x{factor:g}",
                setup,
                mid,
                trace.skipped[mid],
                updates,
                start,
                trace.settled(mid),
                trace.zero_fraction[mid],
            )
        )
    return rows


def separate_vs_shared(batches: Batches, *, factor: float, updates: int) -> list[Row]:
    """(b) Two modules, p1's loss times ``factor``: a scaler each against one shared scaler."""
    factors = {TWO_TASKS[0]: 1.0, TWO_TASKS[1]: factor}
    rows = []
    for setup, shared in (("scaler per module", False), ("one shared scaler", True)):
        lrn = build_learner(batches, factors, init_scale=FRESH_INIT_SCALE, shared_scaler=shared)
        trace = train(lrn, batches, updates)
        for mid in TWO_TASKS:
            rows.append(
                Row(
                    f"(b) p0 x1, p1 x{factor:g}",
                    setup,
                    f"{mid} (x{factors[mid]:g})",
                    trace.skipped[mid],
                    updates,
                    FRESH_INIT_SCALE,
                    trace.settled(mid),
                    trace.zero_fraction[mid],
                )
            )
    return rows


def _scale(x: float) -> str:
    # Scales are powers of two here: 2^k reads better than 8.59e+09.
    import math

    k = math.log2(x) if x > 0 else float("nan")
    return f"2^{k:.0f}" if math.isfinite(k) and k == round(k) else f"{x:g}"


def markdown(rows: Sequence[Row], machine: str) -> str:
    """The rows as a markdown table under the machine line."""
    lines = [
        f"Scaler study: float16 autocast, PPO CartPole, MLP [16, 16], {machine}",
        "",
        "| question | setup | module | skipped steps | start scale | settled scale "
        "| zero gradients |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lo, hi = r.settled
        settled = _scale(lo) if lo == hi else f"{_scale(lo)} .. {_scale(hi)}"
        lines.append(
            f"| {r.question} | {r.setup} | {r.module} | {r.skipped} / {r.updates} | "
            f"{_scale(r.start_scale)} | {settled} | {r.zero_fraction:.2%} |"
        )
    lines.append("")
    lines.append(
        "skipped steps: optimizer steps skipped on inf/nan gradients in the updates shown "
        "(one step per update); settled scale: min .. max over the last quarter of them; "
        "zero gradients: share of the module's gradient entries that are exactly zero after "
        "unscaling (float16 underflow), mean over the same last quarter."
    )
    return "\n".join(lines)


def run_study(*, updates: int, factors: Sequence[float], two_task_factors: Sequence[float]) -> str:
    """Runs (a) for each of ``factors`` and (b) for each of ``two_task_factors``; the table.

    Example:
        >>> print(run_study(updates=4, factors=[1], two_task_factors=[1e3]))  # doctest: +SKIP
    """
    import logging

    from rllib_amp.bench.report import machine_description

    # The skip warnings are the point of (a)'s fresh runs; the table reports them.
    logging.getLogger("rllib_amp").setLevel(logging.ERROR)
    rows: list[Row] = []
    if factors:
        single = sample_batches(multi_agent=False)
        with tempfile.TemporaryDirectory(prefix="scaler_study_") as folder:
            for factor in factors:
                rows += fresh_vs_warm(single, factor=factor, updates=updates, folder=folder)
    if two_task_factors:
        two = sample_batches(multi_agent=True)
        for factor in two_task_factors:
            rows += separate_vs_shared(two, factor=factor, updates=updates)
    return markdown(rows, machine_description("cpu"))


def _positive(kind: type, flag: str, text: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        raise UsageError(f"{flag}: got {text!r}; expected a positive {kind.__name__}") from None
    if not value > 0 or value != value or value == float("inf"):
        raise UsageError(f"{flag}: got {text!r}; must be a finite number > 0")
    return value


def _factors(flag: str, text: str) -> list[float]:
    if text.strip().lower() == "none":
        return []
    return [_positive(float, flag, f.strip()) for f in text.split(",")]


def run(argv: Sequence[str] | None = None) -> int:
    parser = Parser(prog=PROG, description=__doc__.split("\n")[0] if __doc__ else None)
    parser.add_argument("--updates", default="40", help="updates per run (default 40)")
    parser.add_argument(
        "--factors",
        default="1,1000",
        help="(a): loss factors of the single task, comma-separated, or none (default 1,1000)",
    )
    parser.add_argument(
        "--two-task-factors",
        default="1000,1e6,1e9",
        help="(b): p1's loss factors (p0's is 1), comma-separated, or none (default 1000,1e6,1e9)",
    )
    args = parser.parse_args(argv)
    updates = _positive(int, "--updates", args.updates)
    factors = _factors("--factors", args.factors)
    two_task = _factors("--two-task-factors", args.two_task_factors)
    print(run_study(updates=updates, factors=factors, two_task_factors=two_task))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return main_wrapper(PROG, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
