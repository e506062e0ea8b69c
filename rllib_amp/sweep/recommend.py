"""The AMP settings a sweep recommends: the best trial's, starting at the scale it reached.

After a sweep, ``python -m rllib_amp.tune`` ends its summary with a ready ``amp:`` block and
writes it as ``recommended_amp.yaml`` beside ``results.parquet`` (any storage: local, shared
mount, ``s3://``). ``init_scale`` is the best trial's final grad scale, so a rerun starts
where the scaler converged instead of backing off from 65536 again. A bfloat16 (or float32)
best trial has no scaler: the block says so and sets no init_scale.

Example:
    >>> rows = [{"trial_id": "a", "status": "DONE", "m": 480.0, "grad_scale": 2048.0,
    ...          "skipped_steps": 3, "amp.growth_interval": 10}]
    >>> rec = recommend(rows, metric="m", base={"dtype": "float16"})
    >>> rec.amp["init_scale"], rec.amp["growth_interval"]
    (2048.0, 10)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import yaml

from rllib_amp.checks import is_number
from rllib_amp.settings import AmpSettings
from rllib_amp.sweep import storage as S

FILE = "recommended_amp.yaml"
# Keys always written; the others only when they differ from AmpSettings' defaults.
ALWAYS = ("dtype", "init_scale", "growth_interval", "growth_factor", "backoff_factor")
# A converged scale belongs to this run's checkpoints; a rerun starts from init_scale instead.
DROPPED = ("warm_start",)


@dataclass(frozen=True)
class Recommendation:
    """``amp``: the settings block; ``reason``: one line saying why these values."""

    amp: dict[str, Any]
    reason: str

    def to_yaml(self) -> str:
        """The file's text: the reason as a comment, then the ``amp:`` block."""
        body = yaml.safe_dump({"amp": self.amp}, sort_keys=False)
        return f"# {self.reason}\n{body}"

    def as_set_flags(self) -> str:
        """The same settings as ``--set`` flags for ``python -m rllib_amp.tune``."""
        return " ".join(f"--set amp.{k}={v}" for k, v in self.amp.items())


def _number(v: Any) -> float | None:
    return float(v) if is_number(v) and math.isfinite(v) else None


def recommend(
    rows: Sequence[Mapping[str, Any]],
    *,
    metric: str,
    base: Mapping[str, Any],
    configs: Mapping[Any, Mapping[str, Any]] | None = None,
    reached: tuple[float, str] | None = None,
) -> Recommendation | None:
    """The recommendation from the summary's ``rows`` (best first); None without a finished
    trial that reported the metric.

    ``base``: the experiment's ``amp`` section; a row's ``amp.*`` columns (searched values)
    override it, and ``configs`` (trial_id -> the trial's final AMP block, as PBT may have
    mutated it) overrides both. ``reached``: (threshold, the row key of the env steps to it)
    when the rows are ranked by how soon they reached the stop's target.
    """
    best = next(
        (r for r in rows if r.get("status") == "DONE" and _number(r.get(metric)) is not None),
        None,
    )
    if best is None:
        return None
    merged = dict(base)
    merged.update({k[4:]: v for k, v in best.items() if k.startswith("amp.")})
    merged.update((configs or {}).get(best.get("trial_id"), {}))
    settings = AmpSettings.from_dict(
        {k: v for k, v in merged.items() if k in AmpSettings.field_names()}
    )
    scale = _number(best.get("grad_scale"))
    skipped = best.get("skipped_steps")
    scaling = settings.dtype != "bfloat16" and scale is not None and scale != 1.0
    defaults = AmpSettings().to_dict()
    amp = {
        k: v
        for k, v in settings.to_dict().items()
        if k not in DROPPED and (k in ALWAYS or v != defaults[k])
    }
    why = f"trial {best.get('trial_id')} had the best {metric} ({_fmt(best[metric])})"
    if reached is not None and best.get(reached[1]) is not None:
        why = (
            f"trial {best.get('trial_id')} reached {metric} >= {reached[0]:g} in the fewest "
            f"env steps ({_fmt(best[reached[1]])})"
        )
    if scaling:
        assert scale is not None
        amp["init_scale"] = scale
        reason = (
            f"{why}; init_scale is the grad scale it converged to ({scale:g}) after "
            f"{_fmt(skipped)} skipped steps"
        )
    else:
        amp.pop("init_scale", None)
        reason = f"{why}; it trained without loss scaling (bfloat16): no scaler is needed"
    AmpSettings.from_dict(amp)  # what is written must load again
    return Recommendation(amp, reason)


def _fmt(v: Any) -> str:
    if isinstance(v, float) and v.is_integer() and abs(v) < 1e15:
        return f"{v:,.0f}"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, int):
        return f"{v:,}"
    return "-" if v is None else str(v)


def write(rec: Recommendation, exp_dir: str) -> str:
    """Writes ``recommended_amp.yaml`` into ``exp_dir`` (a path or URI); returns where."""
    location = S.join(exp_dir, FILE)
    S.write_bytes(location, rec.to_yaml().encode())
    return location


def amp_blocks(grid: Any, amp_key: Sequence[str]) -> dict[Any, dict[str, Any]]:
    """trial_id -> the AMP block of the trial's final config (``amp_key``: its path there)."""
    out: dict[Any, dict[str, Any]] = {}
    for result in grid:
        node: Any = result.config or {}
        for key in amp_key:
            node = node.get(key) if isinstance(node, Mapping) else None
        trial_id = (result.metrics or {}).get("trial_id")
        if isinstance(node, Mapping) and trial_id is not None:
            out[trial_id] = {k: v for k, v in node.items() if isinstance(v, (int, float, str))}
    return out


def report(exp: Any, rows: Sequence[Mapping[str, Any]], grid: Any, exp_dir: str) -> None:
    """Prints the recommended ``amp:`` block and the reason, and writes the file."""
    from rllib_amp.settings import AMP_CONFIG_KEY
    from rllib_amp.sweep import summary

    threshold = summary.target(exp)
    rec = recommend(
        rows,
        metric=exp.tune["metric"],
        base=exp.data["amp"],
        configs=amp_blocks(grid, ("learner_config_dict", AMP_CONFIG_KEY)),
        reached=None if threshold is None else (threshold, summary.target_columns(threshold)[0]),
    )
    if rec is None:
        print("No recommended AMP settings: no trial finished with a metric.")
        return
    location = write(rec, exp_dir)
    print(f"Recommended AMP settings ({location}; paste into the file, or {rec.as_set_flags()}):")
    print(rec.to_yaml().rstrip())
