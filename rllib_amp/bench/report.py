"""Results to rows, a markdown table, JSON, parquet and a PNG; the machine line.

Example:
    >>> rows = rows_from({"end_to_end": {"fp32": [10.0], "amp-auto": [15.0]}})
    >>> [round(r["ratio_to_fp32"], 2) for r in rows]
    [1.0, 1.5]
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import tempfile
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from rllib_amp.bench.figures import E2E_ENVS_PER_RUNNER
from rllib_amp.bench.fixed_cost import FIXED_COST, per_step_seconds
from rllib_amp.bench.workloads import STOCK
from rllib_amp.cli import UsageError
from rllib_amp.learner.precision import BF16_CPU_FLAGS, bf16_cpu_flags, read_cpuinfo

# What ``--out`` receives.
PARQUET_NAME = "results.parquet"
PLOT_NAME = "ratios.png"


def _median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else math.nan


# -- the machine line -------------------------------------------------------------------------
def describe_cpu(cpuinfo: str, cores: int | None) -> str:
    """The CPU part of the machine line, from a /proc/cpuinfo text: model, cores, and which
    native-bfloat16 flags the CPU lists.

    Example:
        >>> describe_cpu("model name : AMD EPYC 9654\\nflags : avx512f avx512_bf16\\n", 2)
        'AMD EPYC 9654, 2 cores (avx512_bf16)'
    """
    model = ""
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "model name":
            model = value.strip()
            break
    model = model or platform.processor() or platform.machine()
    flags = bf16_cpu_flags(cpuinfo)
    shown = ", ".join(flags) if flags else f"no {'/'.join(BF16_CPU_FLAGS)}"
    return f"{model}, {cores} cores ({shown})"


def machine_description(device: str) -> str:
    """What the figures were measured on: the GPU, or the CPU and its bfloat16 flags."""
    import torch

    if device == "cuda":
        return f"{torch.cuda.get_device_name(0)}, torch {torch.__version__}"
    return f"{describe_cpu(read_cpuinfo(), os.cpu_count())}, torch {torch.__version__}"


# -- rows and the table -----------------------------------------------------------------------
def rows_from(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Flat rows: one per (figure, workload, variant), with the ratio to the figure's stock
    RLlib float32 variant (``reference``: ``fp32``, or ``fp32 wrappers`` in the Atari-path
    figures, ``wrappers`` in the sampling one)."""
    rows: list[dict[str, Any]] = []

    def add(
        figure: str,
        workload: str,
        unit: str,
        per_variant: dict[str, float],
        higher: bool,
        reference: str = "fp32",
        spread: dict[str, tuple[float, float]] | None = None,
    ):
        ref = per_variant.get(reference)
        for v, value in per_variant.items():
            row = {
                "figure": figure,
                "workload": workload,
                "variant": v,
                "value": value,
                "unit": unit,
                "ratio_to_fp32": value / ref if ref else math.nan,
                "better_is": "higher" if higher else "lower",
                "reference": reference,
            }
            if spread and v in spread:
                row["low"], row["high"] = spread[v]
            rows.append(row)

    for key, per in results.get("throughput", {}).items():
        add("learner update", key, "samples/s", {v: _median(x) for v, x in per.items()}, True)
    for key, per in results.get("memory", {}).items():
        add("peak memory of update", key, "MiB", {v: x / 2**20 for v, x in per.items()}, False)
    if results.get("fixed_cost"):
        per = {v: [1000 * t for t in per_step_seconds(r)] for v, r in results["fixed_cost"].items()}
        add(
            "fixed cost per minibatch step",
            f"{FIXED_COST.label()}, 1 thread",
            "ms",
            {v: _median(ms) for v, ms in per.items()},
            False,
            spread={v: (min(ms), max(ms)) for v, ms in per.items() if ms},
        )
    if results.get("end_to_end"):
        add(
            "end to end",
            "PPO ALE/Pong-v5 full",
            "env steps/s",
            {v: _median(x) for v, x in results["end_to_end"].items()},
            True,
        )
    if results.get("sampling"):
        add(
            "sampling, one EnvRunner",
            f"ALE/Pong-v5, {E2E_ENVS_PER_RUNNER} envs, inference included",
            "env steps/s",
            {v: _median(x) for v, x in results["sampling"].items()},
            True,
            "wrappers",
        )
    for algo, per in results.get("end_to_end_paths", {}).items():
        add(
            "end to end, Atari paths",
            f"{algo} ALE/Pong-v5 full",
            "env steps/s",
            {v: _median(x) for v, x in per.items()},
            True,
            STOCK,
        )
    if results.get("replay_bytes"):
        per = results["replay_bytes"]
        for part in ("all", "observations"):
            add(
                "DQN replay bytes per transition",
                f"ALE/Pong-v5, {part}",
                "bytes",
                {v: x[part] for v, x in per.items()},
                False,
                STOCK,
            )
    for key, per in results.get("memory_paths", {}).items():
        add(
            "peak memory of update, Atari paths",
            key,
            "MiB",
            {v: x / 2**20 for v, x in per.items()},
            False,
            STOCK,
        )
    for algo, per in results.get("parity", {}).items():
        add(
            "learning parity",
            f"{algo} CartPole-v1 return (mean of {len(next(iter(per.values())))} seeds)",
            "return",
            {v: statistics.fmean(x) for v, x in per.items()},
            True,
        )
    return rows


def markdown(rows: list[dict[str, Any]], header: str) -> str:
    """The rows as a markdown table under ``header``."""
    lines = [
        header,
        "",
        "| figure | workload | variant | value | x stock fp32 |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        value = r["value"]
        digits = 2 if r["unit"] == "ms" else 1
        shown = f"{value:,.{digits}f} {r['unit']}" if math.isfinite(value) else "-"
        if "low" in r and math.isfinite(value):
            shown += f" ({r['low']:,.{digits}f}-{r['high']:,.{digits}f})"
        ratio = f"{r['ratio_to_fp32']:.2f}x" if math.isfinite(r["ratio_to_fp32"]) else "-"
        lines.append(f"| {r['figure']} | {r['workload']} | {r['variant']} | {shown} | {ratio} |")
    return "\n".join(lines)


# -- targets ----------------------------------------------------------------------------------
class Target(NamedTuple):
    """One of the Atari path's targets: ``measured`` (a ratio of two figures of one run) against
    ``bound``; ``at_most``: the ratio must be <= bound (< when ``strict``), else >=."""

    name: str
    measured: Callable[[dict[str, Any]], float]
    bound: float
    at_most: bool
    strict: bool = False

    def check(self, results: dict[str, Any]) -> dict[str, Any]:
        """The target's row: the measured ratio and whether it is met (None: not measured)."""
        try:
            ratio = float(self.measured(results))
        except (KeyError, TypeError, ZeroDivisionError):
            ratio = math.nan
        if not math.isfinite(ratio):
            met = None
        elif self.at_most:
            met = ratio < self.bound if self.strict else ratio <= self.bound
        else:
            met = ratio > self.bound if self.strict else ratio >= self.bound
        op = ("<" if self.strict else "<=") if self.at_most else (">" if self.strict else ">=")
        return {
            "target": self.name,
            "ratio": ratio,
            "required": f"{op} {self.bound:.3g}",
            "met": met,
        }


def _med_ratio(section: str, num: str, den: str, algo: str | None = None) -> Callable:
    def ratio(results: dict[str, Any]) -> float:
        per = results[section] if algo is None else results[section][algo]
        return _median(per[num]) / _median(per[den])

    return ratio


TARGETS: tuple[Target, ...] = (
    Target(
        "sampling, native (batched sampler) / wrappers env steps/s",
        _med_ratio("sampling", "native", "wrappers"),
        3.0,
        at_most=False,
    ),
    Target(
        "end-to-end PPO Pong, amp native / stock fp32 wrappers env steps/s",
        _med_ratio("end_to_end_paths", "amp native", STOCK, "PPO"),
        2.5,
        at_most=False,
    ),
    Target(
        "end-to-end APPO Pong, amp native / stock fp32 wrappers env steps/s",
        _med_ratio("end_to_end_paths", "amp native", STOCK, "APPO"),
        2.0,
        at_most=False,
    ),
    Target(
        "fixed cost per minibatch step, amp-auto / stock fp32 ms",
        lambda r: (
            _median(per_step_seconds(r["fixed_cost"]["amp-auto"]))
            / _median(per_step_seconds(r["fixed_cost"]["fp32"]))
        ),
        1.0,
        at_most=True,
    ),
    Target(
        "DQN replay bytes per transition, uint8 / float32",
        lambda r: r["replay_bytes"]["fp32 native"]["all"] / r["replay_bytes"][STOCK]["all"],
        1 / 3.5,
        at_most=True,
    ),
    Target(
        # "Today's AMP figure": AMP's update on float32 observations, as before the native
        # path, measured in the same run rather than copied from an older one.
        "PPO update peak memory, amp native / amp wrappers",
        lambda r: (
            r["memory_paths"]["PPO full"]["amp native"]
            / r["memory_paths"]["PPO full"]["amp wrappers"]
        ),
        1.0,
        at_most=True,
        strict=True,
    ),
)


def targets(results: dict[str, Any]) -> list[dict[str, Any]]:
    """Each of ``TARGETS`` with its ratio measured in ``results`` and met / not met.

    Example:
        >>> [t["met"] for t in targets({"sampling": {"native": [6.0], "wrappers": [2.0]}})][:2]
        [True, None]
    """
    return [t.check(results) for t in TARGETS]


def markdown_targets(rows: list[dict[str, Any]]) -> str:
    """The target rows as a markdown table."""
    lines = ["| target | measured ratio | required | met |", "|---|---|---|---|"]
    for t in rows:
        ratio = f"{t['ratio']:.3f}" if math.isfinite(t["ratio"]) else "-"
        met = {True: "met", False: "NOT MET", None: "not measured"}[t["met"]]
        lines.append(f"| {t['target']} | {ratio} | {t['required']} | {met} |")
    return "\n".join(lines)


# -- output files -----------------------------------------------------------------------------
def _writable_folder(flag: str, folder: str) -> None:
    # Root ignores permission bits, so only a real write answers (read-only mounts, ACLs).
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise UsageError(
            f"{flag}: cannot write into folder {folder} ({e.strerror or e}); "
            f"pass a path in a writable folder"
        ) from None


def _writable_file(flag: str, path: str) -> None:
    if os.path.isdir(path):
        raise UsageError(f"{flag}: {path} is a folder, not a file; pass a file path in it")
    parent = os.path.dirname(path)
    if not os.path.isdir(parent):
        what = "is a file" if os.path.exists(parent) else "does not exist"
        raise UsageError(f"{flag}: folder {parent} {what}; create the folder first")
    _writable_folder(flag, parent)
    if os.path.exists(path):
        try:
            with open(path, "a"):  # appends nothing: the file stays as it is until the end
                pass
        except OSError as e:
            raise UsageError(
                f"{flag}: cannot write {path} ({e.strerror or e}); pass another file"
            ) from None


def check_outputs(json_path: str | None, out_dir: str | None) -> None:
    """Raises UsageError (one line, naming the flag and the fix) when ``--json`` or ``--out``
    cannot be written; called before anything is measured, so no run is lost at the end.

    Example:
        >>> check_outputs("/proc/bench.json", None)
        Traceback (most recent call last):
        rllib_amp.cli.UsageError: --json: cannot write into folder /proc (...); pass a path in a
        writable folder
    """
    if json_path:
        _writable_file("--json", os.path.abspath(json_path))
    if not out_dir:
        return
    out = os.path.abspath(out_dir)
    if json_path and os.path.abspath(json_path) == out:
        raise UsageError(f"--out: {out} is also the --json file; give them different paths")
    if os.path.exists(out) and not os.path.isdir(out):
        raise UsageError(
            f"--out: {out} is a file, not a folder; pass a folder path "
            f"(it receives {PARQUET_NAME} and {PLOT_NAME})"
        )
    existing = out
    while not os.path.exists(existing):  # the folder is made at the end: its nearest ancestor
        existing = os.path.dirname(existing)
    if not os.path.isdir(existing):
        raise UsageError(f"--out: {existing} is a file, so {out} cannot be a folder; pass another")
    _writable_folder("--out", existing)
    for name in (PARQUET_NAME, PLOT_NAME):
        target = os.path.join(out, name)
        if os.path.isdir(target):
            raise UsageError(f"--out: {target} is a folder; remove it or pass another --out")


def write_partial(results: dict, json_path: str) -> None:
    """The figures measured so far as ``{"partial": true, "raw": ...}``, replaced atomically;
    the finished run's ``write_outputs`` overwrites it."""
    tmp = f"{json_path}.tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump({"partial": True, "raw": results}, f, indent=1, default=float)
    os.replace(tmp, json_path)


def write_outputs(
    rows: list[dict[str, Any]], results: dict, json_path: str | None, out_dir: str | None
) -> None:
    """Writes the JSON file and the ``--out`` folder's parquet table and ratio plot."""
    if json_path:
        with open(json_path, "w", encoding="utf-8") as f:
            json.dump(
                {"rows": rows, "targets": targets(results), "raw": results},
                f,
                indent=1,
                default=float,
            )
    if not out_dir:
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(out_dir, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), os.path.join(out_dir, PARQUET_NAME))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    shown = [
        r for r in rows if r["variant"] != r["reference"] and math.isfinite(r["ratio_to_fp32"])
    ]
    fig, ax = plt.subplots(figsize=(10, 0.35 * len(shown) + 1.5))
    labels = [f"{r['figure']}: {r['workload']} [{r['variant']}]" for r in shown]
    ax.barh(labels, [r["ratio_to_fp32"] for r in shown])
    ax.axvline(1.0, color="black", linewidth=0.8)
    ax.set_xlabel("ratio to stock RLlib float32 (the figure's reference variant)")
    fig.tight_layout()
    fig.savefig(os.path.join(out_dir, PLOT_NAME), dpi=120)
