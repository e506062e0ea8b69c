"""Results to rows, a markdown table, JSON, parquet and a PNG; the machine line.

Example:
    >>> rows = rows_from({"end_to_end": {"fp32": [10.0], "amp-auto": [15.0]}})
    >>> [round(r["ratio_to_fp32"], 2) for r in rows]
    [1.0, 1.5]
"""

from __future__ import annotations

import json
import math
import operator
import os
import platform
import re
import statistics
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypedDict

from rllib_amp.bench.atari_figures import NATIVE_AMP, RAW_ALE
from rllib_amp.bench.figures import E2E_ENVS_PER_RUNNER
from rllib_amp.bench.fixed_cost import FIXED_COST, FixedCostRecord, per_step_seconds
from rllib_amp.bench.workloads import STOCK
from rllib_amp.cli import UsageError
from rllib_amp.learner.precision import BF16_CPU_FLAGS, bf16_cpu_flags, read_cpuinfo

# What ``--out`` receives.
PARQUET_NAME = "results.parquet"
PLOT_NAME = "ratios.png"

# variant -> the figure's repetitions
PerVariant = dict[str, list[float]]


class Results(TypedDict, total=False):
    """What a run measured, per figure (the JSON file's ``raw``); keys as in ``workloads``."""

    throughput: dict[str, PerVariant]  # samples/s
    memory: dict[str, dict[str, float]]  # bytes
    fixed_cost: Mapping[str, Sequence[FixedCostRecord | float]]
    end_to_end: PerVariant  # env steps/s
    sampling: PerVariant  # env steps/s per Atari path
    end_to_end_paths: dict[str, PerVariant]  # algorithm -> env steps/s
    end_to_end_learner: dict[str, PerVariant]  # algorithm -> learner seconds per env step
    replay_bytes: dict[str, dict[str, float]]
    memory_paths: dict[str, dict[str, float]]  # bytes
    parity: dict[str, PerVariant]  # algorithm -> return per seed
    dqn_batches: dict[str, dict[str, dict[str, Any]]]  # batch -> update_ms / memory per variant


class Row(TypedDict, total=False):
    """One (figure, workload, variant) of the table; ``low``/``high`` only with a spread."""

    figure: str
    workload: str
    variant: str
    value: float
    unit: str
    ratio_to_fp32: float
    better_is: str
    reference: str
    low: float
    high: float
    of_raw_ale: float  # env steps/s rows: the share of ALE's own speed in the same run


class TargetRow(TypedDict):
    target: str
    ratio: float
    required: str
    met: bool | None


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
    found = re.search(r"^\s*model name\s*:(.*)$", cpuinfo, re.MULTILINE)
    model = (found and found[1].strip()) or platform.processor() or platform.machine()
    flags = bf16_cpu_flags(cpuinfo)
    shown = ", ".join(flags) if flags else f"no {'/'.join(BF16_CPU_FLAGS)}"
    return f"{model}, {cores} cores ({shown})"


def machine_description(device: str) -> str:
    """What the figures were measured on: the GPU, or the CPU and its bfloat16 flags."""
    import torch

    cuda = device == "cuda"
    what = torch.cuda.get_device_name(0) if cuda else describe_cpu(read_cpuinfo(), os.cpu_count())
    return f"{what}, torch {torch.__version__}"


# -- rows and the table -----------------------------------------------------------------------
def _medians(per: Mapping[str, Sequence[float]]) -> dict[str, float]:
    return {v: _median(x) for v, x in per.items()}


def _mib(per: Mapping[str, float]) -> dict[str, float]:
    return {v: x / 2**20 for v, x in per.items()}


# The units in which higher is better (lower is, in the others).
_HIGHER_IS_BETTER = ("samples/s", "env steps/s", "return")


def rows_from(results: Results) -> list[Row]:
    """Flat rows: one per (figure, workload, variant), with the ratio to the figure's stock
    RLlib float32 variant (``reference``: ``fp32``, or ``fp32 wrappers`` in the Atari-path
    figures, ``wrappers`` in the sampling one)."""
    rows: list[Row] = []

    def add(
        figure: str, work: str, unit: str, per: Mapping[str, float], ref: str = "fp32"
    ) -> list[Row]:
        added: list[Row] = [
            {
                "figure": figure,
                "workload": work,
                "variant": v,
                "value": value,
                "unit": unit,
                "ratio_to_fp32": value / per[ref] if per.get(ref) else math.nan,
                "better_is": "higher" if unit in _HIGHER_IS_BETTER else "lower",
                "reference": ref,
            }
            for v, value in per.items()
        ]
        rows.extend(added)
        return added

    steps = "env steps/s"
    for key, per in results.get("throughput", {}).items():
        add("learner update", key, "samples/s", _medians(per))
    for key, mem in results.get("memory", {}).items():
        add("peak memory of update", key, "MiB", _mib(mem))
    if results.get("fixed_cost"):
        ms = {v: [1000 * t for t in per_step_seconds(r)] for v, r in results["fixed_cost"].items()}
        workload = f"{FIXED_COST.label()}, 1 thread"
        for row in add("fixed cost per minibatch step", workload, "ms", _medians(ms)):
            if ms[row["variant"]]:
                row["low"], row["high"] = min(ms[row["variant"]]), max(ms[row["variant"]])
    if results.get("end_to_end"):
        add("end to end", "PPO ALE/Pong-v5 full", steps, _medians(results["end_to_end"]))
    if results.get("sampling"):
        workload = f"ALE/Pong-v5, {E2E_ENVS_PER_RUNNER} envs, inference included"
        add("sampling, one EnvRunner", workload, steps, _medians(results["sampling"]), "wrappers")
    for algo, per in results.get("end_to_end_paths", {}).items():
        add("end to end, Atari paths", f"{algo} ALE/Pong-v5 full", steps, _medians(per), STOCK)
    for part in ("all", "observations") if "replay_bytes" in results else ():
        replay = {v: x[part] for v, x in results["replay_bytes"].items()}
        add("DQN replay bytes per transition", f"ALE/Pong-v5, {part}", "bytes", replay, STOCK)
    for size, cell in results.get("dqn_batches", {}).items():
        workload = f"DQN full (Nature CNN), batch {size}"
        add("DQN update time by batch", workload, "ms", _medians(cell["update_ms"]))
        add("DQN update peak memory by batch", workload, "MiB", _mib(cell["memory"]))
    for key, mem in results.get("memory_paths", {}).items():
        add("peak memory of update, Atari paths", key, "MiB", _mib(mem), STOCK)
    for algo, per in results.get("parity", {}).items():
        seeds = len(next(iter(per.values())))
        workload = f"{algo} CartPole-v1 return (mean of {seeds} seeds)"
        add("learning parity", workload, "return", {v: statistics.fmean(x) for v, x in per.items()})
    raw = _median(results.get("sampling", {}).get(RAW_ALE, []))
    for row in rows if math.isfinite(raw) else ():
        if row["unit"] == steps:
            row["of_raw_ale"] = row["value"] / raw
    return rows


def markdown_table(head: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    """A markdown table: a header row, then ``rows``."""
    lines = [f"| {' | '.join(head)} |", "|" + "---|" * len(head)]
    return "\n".join([*lines, *(f"| {' | '.join(r)} |" for r in rows)])


def _shown(x: float, spec: str, suffix: str = "") -> str:
    return f"{x:{spec}}{suffix}" if math.isfinite(x) else "-"


def _value(r: Row) -> str:
    """A row's value with its unit and spread, in the unit's digits."""
    spec = ",.2f" if r["unit"] == "ms" else ",.1f"
    shown = _shown(r["value"], spec, f" {r['unit']}")
    if "low" in r and shown != "-":
        shown += f" ({r['low']:{spec}}-{r['high']:{spec}})"
    return shown


def markdown(rows: Sequence[Row], header: str) -> str:
    """The rows as a markdown table under ``header``."""
    head = ("figure", "workload", "variant", "value", "x stock fp32", "of raw ALE")
    cells = [
        (
            r["figure"],
            r["workload"],
            r["variant"],
            _value(r),
            _shown(r["ratio_to_fp32"], ".2f", "x"),
            _shown(100 * r.get("of_raw_ale", math.nan), ".0f", "%"),
        )
        for r in rows
    ]
    return f"{header}\n\n{markdown_table(head, cells)}"


# -- targets ----------------------------------------------------------------------------------
_OPS = {">=": operator.ge, ">": operator.gt, "<=": operator.le, "<": operator.lt}


class Target(NamedTuple):
    """One of the Atari path's targets: ``numerator / denominator`` (two figures of one run,
    each a "/"-separated path of keys into ``Results``; a list of repetitions counts as its
    median) must be ``op`` (one of ``_OPS``) ``bound``."""

    numerator: str
    denominator: str
    op: str
    bound: float
    # "<=" only (checked below): also met while the numerator's median is at most the
    # denominator's upper quartile, where this run's repetitions cannot tell the two apart.
    within_spread: bool = False


def _values(results: Results, path: str) -> list[float]:
    x: Any = results
    for key in path.split("/"):
        x = x[key]
    # Repetitions (the fixed cost's as records), or one figure.
    return per_step_seconds(x) if isinstance(x, (list, tuple)) else [float(x)]


def _figure(results: Results, path: str) -> float:
    return _median(_values(results, path))


def _upper_quartile(xs: Sequence[float]) -> float:
    xs = [x for x in xs if math.isfinite(x)]
    return statistics.quantiles(xs, n=4, method="inclusive")[2] if len(xs) > 1 else _median(xs)


# Target name -> target.
TARGETS: dict[str, Target] = {
    "sampling, native (batched sampler) / wrappers env steps/s": Target(
        "sampling/native", "sampling/wrappers", ">=", 3.0
    ),
    "sampling, native (batched sampler) / raw ALE env steps/s": Target(
        "sampling/native", f"sampling/{RAW_ALE}", ">=", 0.6
    ),
    # The same with the inference AMP users get (with_amp's "auto" inference dtype).
    "sampling, native with amp inference / raw ALE env steps/s": Target(
        f"sampling/{NATIVE_AMP}", f"sampling/{RAW_ALE}", ">=", 0.6
    ),
    "end-to-end PPO Pong, amp native / stock fp32 wrappers env steps/s": Target(
        "end_to_end_paths/PPO/amp native", f"end_to_end_paths/PPO/{STOCK}", ">=", 2.5
    ),
    "end-to-end APPO Pong, amp native / stock fp32 wrappers env steps/s": Target(
        "end_to_end_paths/APPO/amp native", f"end_to_end_paths/APPO/{STOCK}", ">=", 2.0
    ),
    # AMP never slower than float32 on the same (native) path.
    "end-to-end PPO Pong, amp native / fp32 native env steps/s": Target(
        "end_to_end_paths/PPO/amp native", "end_to_end_paths/PPO/fp32 native", ">=", 1.0
    ),
    "end-to-end APPO Pong, amp native / fp32 native env steps/s": Target(
        "end_to_end_paths/APPO/amp native", "end_to_end_paths/APPO/fp32 native", ">=", 1.0
    ),
    # Issue 33: "<= stock's within the run's spread" (a few ms, noisy on shared cores).
    "fixed cost per minibatch step, amp-auto / stock fp32 ms": Target(
        "fixed_cost/amp-auto", "fixed_cost/fp32", "<=", 1.0, within_spread=True
    ),
    "DQN replay bytes per transition, uint8 / float32": Target(
        "replay_bytes/fp32 native/all", f"replay_bytes/{STOCK}/all", "<=", 1 / 3.5
    ),
    # "Today's AMP figure": AMP's update on float32 observations, as before the native
    # path, measured in the same run rather than copied from an older one.
    "PPO update peak memory, amp native / amp wrappers": Target(
        "memory_paths/PPO full/amp native", "memory_paths/PPO full/amp wrappers", "<", 1.0
    ),
}


def targets(results: Results) -> list[TargetRow]:
    """Each of ``TARGETS`` with its ratio measured in ``results`` and met / not met.

    Example:
        >>> [t["met"] for t in targets({"sampling": {"native": [6.0], "wrappers": [2.0]}})][:2]
        [True, None]
    """
    out: list[TargetRow] = []
    for name, (numerator, denominator, op, bound, within_spread) in TARGETS.items():
        try:
            ratio = _figure(results, numerator) / _figure(results, denominator)
        except (KeyError, TypeError, ZeroDivisionError):
            ratio = math.nan
        met = _OPS[op](ratio, bound) if math.isfinite(ratio) else None  # None: not measured
        required = f"{op} {bound:.3g}"
        if within_spread:
            required += " or within the spread (stock's upper quartile)"
            if met is False:
                upper = _upper_quartile(_values(results, denominator))
                met = _figure(results, numerator) <= upper
        out.append({"target": name, "ratio": ratio, "required": required, "met": met})
    return out


def markdown_targets(rows: Sequence[TargetRow]) -> str:
    """The target rows as a markdown table; a target met only by its spread says so."""
    met = {True: "met", False: "NOT MET", None: "not measured"}

    def said(t: TargetRow) -> str:
        target = TARGETS.get(t["target"])
        if t["met"] and target and not _OPS[target.op](t["ratio"], target.bound):
            return "met within the spread (NOT MET by the medians)"
        return met[t["met"]]

    cells = [(t["target"], _shown(t["ratio"], ".3f"), t["required"], said(t)) for t in rows]
    return markdown_table(("target", "measured ratio", "required", "met"), cells)


# -- end-to-end bounds -------------------------------------------------------------------------
class BoundRow(TypedDict):
    algo: str
    path: str
    learner_ms: float  # the learner's milliseconds per env step, measured end to end
    measured: float  # env steps/s
    at_raw: float  # env steps/s if sampling ran at raw ALE's speed, inference free
    at_target: float  # ... at the sampling target's share of it
    stock: float  # the stock row's env steps/s
    required: float  # the end-to-end target's ratio to stock


def end_to_end_bounds(results: Results) -> list[BoundRow]:
    """What the learner's measured time leaves room for: each end-to-end path's env steps/s
    if sampling, inference included, ran at raw ALE's speed (``at_raw``) or at the sampling
    target's share of it (``at_target``), with sampling and learning in turns as in the run.

    Example:
        >>> r = end_to_end_bounds({"sampling": {"raw ALE": [4000.0]},
        ...     "end_to_end_paths": {"PPO": {"fp32 wrappers": [400.0], "amp native": [800.0]}},
        ...     "end_to_end_learner": {"PPO": {"amp native": [0.00075]}}})
        >>> round(r[0]["at_raw"]), round(r[0]["at_target"]), r[0]["required"]
        (1000, 857, 2.5)
    """
    raw = _median(results.get("sampling", {}).get(RAW_ALE, []))
    share = TARGETS["sampling, native (batched sampler) / raw ALE env steps/s"].bound
    out: list[BoundRow] = []
    for algo, per in results.get("end_to_end_learner", {}).items():
        rates = results.get("end_to_end_paths", {}).get(algo, {})
        target = next((t for t in TARGETS.values() if t.numerator.startswith(
            f"end_to_end_paths/{algo}/") and t.denominator.endswith(STOCK)), None)  # fmt: skip
        for path, learner in per.items():
            s = _median(learner)
            if path == STOCK or not math.isfinite(raw) or not s > 0:
                continue
            out.append({
                "algo": algo, "path": path, "learner_ms": 1000 * s,
                "measured": _median(rates.get(path, [])),
                "at_raw": 1 / (1 / raw + s), "at_target": 1 / (1 / (share * raw) + s),
                "stock": _median(rates.get(STOCK, [])),
                "required": target.bound if target else math.nan,
            })  # fmt: skip
    return out


def _reachable(r: BoundRow) -> str:
    needed = r["required"] * r["stock"]
    if not math.isfinite(needed):
        return "-"
    return "yes" if r["at_raw"] >= needed else "no: the learner alone rules it out"


def markdown_bounds(rows: Sequence[BoundRow]) -> str:
    """The bounds as a markdown table, each env steps/s with its ratio to stock."""
    share = TARGETS["sampling, native (batched sampler) / raw ALE env steps/s"].bound

    def rate(x: float, stock: float) -> str:
        return f"{_shown(x, ',.0f')} ({_shown(x / stock, '.2f', 'x')})"

    head = (
        "end to end", "learner ms per env step", "measured env steps/s",
        "if sampling ran at raw ALE's speed", f"at {share:.0%} of it", "target x stock",
        "target reachable",
    )  # fmt: skip
    cells = [
        (
            f"{r['algo']} {r['path']}",
            _shown(r["learner_ms"], ".3f"),
            rate(r["measured"], r["stock"]),
            rate(r["at_raw"], r["stock"]),
            rate(r["at_target"], r["stock"]),
            _shown(r["required"], ".3g", "x"),
            _reachable(r),
        )
        for r in rows
    ]
    return markdown_table(head, cells)


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


def _strict(x: Any) -> Any:
    """``x`` with each non-finite float (a figure not measured) as None: JSON has no NaN."""
    if isinstance(x, Mapping):
        return {k: _strict(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_strict(v) for v in x]
    if hasattr(x, "item") and not isinstance(x, (str, bytes)):  # numpy numbers
        x = x.item()
    return None if isinstance(x, float) and not math.isfinite(x) else x


def write_json(path: str, doc: object) -> None:
    """``doc`` as indented, strict JSON into ``path``: numpy numbers as numbers, a figure not
    measured (NaN) as null."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(_strict(doc), f, indent=1, allow_nan=False)


def write_partial(results: Results, json_path: str) -> None:
    """The figures measured so far as ``{"partial": true, "raw": ...}``, replaced atomically;
    the finished run's ``write_outputs`` overwrites it."""
    write_json(f"{json_path}.tmp", {"partial": True, "raw": results})
    os.replace(f"{json_path}.tmp", json_path)


def write_outputs(
    rows: list[Row],
    results: Results,
    json_path: str | None,
    out_dir: str | None,
    header: str = "",
) -> None:
    """Writes the JSON file and the ``--out`` folder's parquet table and ratio plot. Both keep
    ``header`` (the run's date, machine line and length), so a figure read from a file alone
    still says where it was measured."""
    if json_path:
        write_json(json_path, {
            "header": header, "rows": rows, "targets": targets(results),
            "bounds": end_to_end_bounds(results), "raw": results,
        })  # fmt: skip
    if not out_dir:
        return
    import pyarrow as pa
    import pyarrow.parquet as pq

    os.makedirs(out_dir, exist_ok=True)
    # Every row's keys (only the env-steps/s rows have ``of_raw_ale``), not the first row's.
    keys = list(dict.fromkeys(k for r in rows for k in r))
    table = pa.Table.from_pylist([{k: r.get(k) for k in keys} for r in rows])
    table = table.replace_schema_metadata({"header": header})
    pq.write_table(table, os.path.join(out_dir, PARQUET_NAME))
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
