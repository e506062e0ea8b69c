"""The AMP settings a sweep recommends: a setting tied with the best, and the scale it settled at.

Of the settings tied with the best (``rllib_amp.sweep.groups``), the one whose scaler skipped
the fewest optimizer steps, then the one whose scale swung least; ``init_scale`` is its settled
scale. Printed at the end of the summary and written as ``recommended_amp.yaml`` beside
``results.parquet`` (docs/cli.md, "Recommended settings").

Example:
    >>> from rllib_amp.sweep.groups import group
    >>> rows = [{"trial_id": f"t{g}{s}", "amp.growth_interval": g, "seed": s, "status": "DONE",
    ...          "m": m, "skipped_steps": k, "optimizer_steps": 100, "settled_scale": 2048.0}
    ...         for g, k in [(10, 11), (2000, 0)] for s, m in [(0, 470.0), (1, 490.0)]]
    >>> found = group(rows, keys=["amp.growth_interval"], metric="m", mode="max")
    >>> rec = recommend(found, metric="m", base={"dtype": "float16"})
    >>> rec.amp["init_scale"], rec.amp["growth_interval"]
    (2048.0, 2000)
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import yaml

from rllib_amp import fs as files
from rllib_amp.settings import AMP_CONFIG_KEY, AmpSettings
from rllib_amp.sweep.groups import SINGLE_RUN, Group, interval_text, of_experiment, single_seed
from rllib_amp.sweep.summary import Row, finite, lookup
from rllib_amp.text_table import format_value

if TYPE_CHECKING:
    from ray.tune import Result

    from rllib_amp.experiment import Experiment

FILE = "recommended_amp.yaml"
# Keys always written; the others only when they differ from AmpSettings' defaults.
ALWAYS = ("dtype", "init_scale", "growth_interval", "growth_factor", "backoff_factor")
# A converged scale belongs to this run's checkpoints; a rerun starts from init_scale instead.
DROPPED = ("warm_start",)


@dataclass(frozen=True)
class Recommendation:
    """``amp``: the settings block; ``reason``: one line saying why these values."""

    amp: dict[str, object]
    reason: str

    def to_yaml(self) -> str:
        """The reason and how to apply it as comments, then the ``amp:`` block."""
        body = yaml.safe_dump({"amp": self.amp}, sort_keys=False)
        return f"# {self.reason}\n# apply with: {self.as_set_flags()}\n{body}"

    def as_set_flags(self) -> str:
        """The settings as ``--set`` flags for ``python -m rllib_amp.tune``, quoted for a POSIX
        shell. A flag on a searched key replaces that search entry (and the command says so),
        so on the experiment that produced them they run these values."""
        # One YAML line per value: ``1e38`` alone would be a string, ``1.0e+38`` is a float.
        flow = [yaml.safe_dump(v, default_flow_style=True, width=2**31) for v in self.amp.values()]
        values = (text.removesuffix("\n...\n").strip() for text in flow)
        return " ".join("--set " + shlex.quote(f"amp.{k}={v}") for k, v in zip(self.amp, values))

    def replaced_searches(self, searched: Iterable[str]) -> list[str]:
        """The keys of ``searched`` that these settings give a fixed value."""
        return [k for k in searched if k.startswith("amp.") and k[4:] in self.amp]


def choose(groups: Sequence[Group]) -> Group | None:
    """The group to recommend: among those tied with the best, the fewest skipped steps,
    then the steadiest scale, then the better rank; None without a ranked group."""
    candidates = [
        g
        for g in groups
        if g.tied and g.ranked.mean is not None and any(t.get("status") == "DONE" for t in g.trials)
    ]
    return min(
        candidates,
        key=lambda g: (
            math.inf if g.skipped_steps is None else g.skipped_steps,
            math.inf if g.scale_swing is None else g.scale_swing,
            g.rank,
        ),
        default=None,
    )


def recommend(
    groups: Sequence[Group],
    *,
    metric: str,
    base: Mapping[str, object],
    configs: Mapping[str, Mapping[str, object]] | None = None,
) -> Recommendation | None:
    """From ranked ``groups``; None without a finished setting that reported the metric.
    ``base``: the experiment's ``amp`` section; the group's searched ``amp.*`` values override
    it, and ``configs`` (trial_id -> the trial's final AMP block, as PBT may have mutated it;
    the group's first trial's is used) overrides both."""
    chosen = choose(groups)
    if chosen is None:
        return None
    merged = dict(base)
    merged.update({k[4:]: v for k, v in chosen.values.items() if k.startswith("amp.")})
    merged.update((configs or {}).get(str(chosen.trials[0].get("trial_id")), {}))
    settings = AmpSettings.from_dict(
        {k: v for k, v in merged.items() if k in AmpSettings.field_names()}
    )
    scale = finite(chosen.settled_scale)
    defaults = AmpSettings().to_dict()
    amp = {
        k: v
        for k, v in settings.to_dict().items()
        if k not in DROPPED and (k in ALWAYS or v != defaults[k])
    }
    if settings.dtype != "bfloat16" and scale is not None and scale != 1.0:
        amp["init_scale"] = scale
        scaling = (
            f"init_scale is its settled scale, {scale:g} (median over seeds of each run's median "
            "scale over its last quarter)"
        )
    else:
        amp.pop("init_scale", None)
        scaling = "it trained without loss scaling (bfloat16): no scaler is needed"
    reason = "; ".join([*_why(chosen, groups, metric), scaling])
    if single_seed(groups):
        reason = f"On a single run per setting ({SINGLE_RUN}): {reason}"
    AmpSettings.from_dict(amp)  # what is written must load again
    return Recommendation(amp, reason)


def _why(chosen: Group, groups: Sequence[Group], metric: str) -> list[str]:
    """The clauses of the reason: the chosen group's numbers, then why it beat the tied."""

    def stat(g: Group) -> str:
        if g.steps is None:
            return f"{metric} {interval_text(g.metric)}"
        reached = f"{g.reached} of {len(g.trials)} seeds reached it"
        return f"env steps to the target {interval_text(g.steps)} ({reached})"

    def skips(g: Group) -> str:
        return f"{format_value(g.skipped_steps)} skipped steps ({g.skip_percent} of updates)"

    best = groups[0]
    rank = "the best" if chosen is best else f"tied with the best ({best.label()}: {stat(best)})"
    why = [f"{chosen.label()}: {stat(chosen)} over {len(chosen.trials)} seed(s), {rank}"]
    others = [g for g in groups if g.tied and g is not chosen]
    if not others:
        return [*why, skips(chosen)]
    against = ", ".join(f"{skips(g)} for {g.label()}" for g in others)
    why.append(
        f"of the {len(others) + 1} tied settings it skipped the fewest steps: {skips(chosen)}, "
        f"against {against}"
    )
    same = [g for g in others if g.skipped_steps == chosen.skipped_steps]
    if same and chosen.scale_swing is not None:
        swings = ", ".join(format_value(g.scale_swing) for g in same)
        why.append(
            "its scale swung least over its last quarter "
            f"(log2 range {chosen.scale_swing:g}, against {swings})"
        )
    return why


def write(rec: Recommendation, exp_dir: str) -> str:
    """Into ``exp_dir`` (a path or URI); returns where."""
    location = files.join(exp_dir, FILE)
    files.write_bytes(*files.resolve(location), rec.to_yaml().encode())
    return location


def report(exp: Experiment, rows: Sequence[Row], grid: Iterable[Result], exp_dir: str) -> None:
    """Prints the recommended ``amp:`` block and the reason, and writes the file."""
    configs: dict[str, dict[str, object]] = {}  # trial_id -> its final config's AMP block
    for result in grid:
        block = lookup(result.config, ("learner_config_dict", AMP_CONFIG_KEY))
        trial_id = (result.metrics or {}).get("trial_id")
        if isinstance(block, Mapping) and trial_id is not None:
            configs[trial_id] = {k: v for k, v in block.items() if isinstance(v, (int, float, str))}
    groups = of_experiment(exp, rows)
    rec = recommend(groups, metric=exp.tune["metric"], base=exp.data["amp"], configs=configs)
    if rec is None:
        print("No recommended AMP settings: no trial finished with a metric.")
        return
    location = write(rec, exp_dir)
    replaced = rec.replaced_searches(exp.search)
    drop = f" and delete its search entries for {', '.join(replaced)}" if replaced else ""
    print(f"Recommended AMP settings ({location}): rerun this experiment with")
    print(f"  {rec.as_set_flags()}")
    print(f"or paste the block into the file{drop}:")
    print(rec.to_yaml().rstrip())
