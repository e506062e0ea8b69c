"""Precision resolution and autocast helpers (pure torch, no Ray): ``resolve`` turns
AmpSettings plus the hardware into a ``Precision``: float32 (autocast off), bfloat16 autocast
(no loss scaling) or float16 autocast with a GradScaler.

Example:
    >>> import torch
    >>> from rllib_amp.settings import AmpSettings
    >>> p = resolve(AmpSettings(enabled=False), torch.device("cpu"))
    >>> p.dtype, p.use_scaler
    (torch.float32, False)
"""

from __future__ import annotations

import contextlib
import logging
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from rllib_amp.settings import AmpSettings

logger = logging.getLogger(__name__)

# Layers whose statistics lose too much in 16 bits: they run in float32 inside autocast.
NORM_LAYER_TYPES: tuple[type[nn.Module], ...] = (
    nn.modules.batchnorm._BatchNorm,
    nn.LayerNorm,
    nn.GroupNorm,
    nn.modules.instancenorm._InstanceNorm,
)

T = TypeVar("T")


@dataclass(frozen=True)
class Precision:
    """What a learner trains in (float32 means autocast off), on which ``torch.autocast``
    device type, whether losses are scaled (float16), and one sentence saying why."""

    dtype: torch.dtype
    device_type: str
    use_scaler: bool
    reason: str

    @property
    def enabled(self) -> bool:
        return self.dtype != torch.float32

    @property
    def name(self) -> str:
        return str(self.dtype).removeprefix("torch.")  # float32, float16 or bfloat16

    def describe(self) -> str:
        if not self.enabled:
            return f"float32 (autocast off): {self.reason}"
        scaler = "GradScaler on" if self.use_scaler else "no loss scaling"
        return f"{self.name} autocast on {self.device_type} ({scaler}): {self.reason}"

    def autocast(self) -> contextlib.AbstractContextManager[None]:
        """The autocast context for forward + loss; a no-op for float32."""
        if not self.enabled:
            return contextlib.nullcontext()
        return torch.autocast(device_type=self.device_type, dtype=self.dtype)


# /proc/cpuinfo flags of native bfloat16 matmuls: AVX512-BF16 (e.g. AMD Zen 4, Intel Cooper
# Lake) and AMX (Intel Sapphire Rapids on; amx_bf16 needs amx_tile).
BF16_CPU_FLAGS = ("avx512_bf16", "amx_bf16", "amx_tile")
# torch's own probes (private API, pinned in tests/unit/learner/test_precision.py).
TORCH_BF16_PROBES = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
_probe_fallback_warned = False


def bf16_cpu_flags(cpuinfo: str) -> tuple[str, ...]:
    """Which of ``BF16_CPU_FLAGS`` the first ``flags`` line of a /proc/cpuinfo text lists.

    Example:
        >>> bf16_cpu_flags("flags : fpu avx512f avx512_bf16")
        ('avx512_bf16',)
    """
    for line in cpuinfo.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() == "flags":
            present = set(value.split())
            return tuple(flag for flag in BF16_CPU_FLAGS if flag in present)
    return ()


def read_cpuinfo() -> str:
    """The text of /proc/cpuinfo; empty where there is none (not Linux)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def cpu_has_native_bf16() -> bool:
    """True when this CPU runs bfloat16 matmuls natively (AVX512-BF16 or AMX): torch's probes,
    or where they are gone (private), /proc/cpuinfo with one WARNING per process.

    Example:
        >>> isinstance(cpu_has_native_bf16(), bool)
        True
    """
    probes = [getattr(torch.cpu, name, None) for name in TORCH_BF16_PROBES]
    missing = tuple(name for name, probe in zip(TORCH_BF16_PROBES, probes) if not callable(probe))
    if not missing:
        try:
            return any(bool(probe()) for probe in probes)  # type: ignore[misc]
        except Exception:  # a probe that cannot answer is as good as gone
            missing = TORCH_BF16_PROBES
    flags = bf16_cpu_flags(read_cpuinfo())
    global _probe_fallback_warned
    if not _probe_fallback_warned:
        _probe_fallback_warned = True
        logger.warning(
            "rllib_amp: torch %s has no working %s; precision 'auto' on CPU decides from "
            "/proc/cpuinfo instead (native bfloat16 flags: %s). Set amp.dtype to skip the probe.",
            torch.__version__,
            " / ".join(f"torch.cpu.{name}" for name in missing),
            ", ".join(flags) or "none, so float32",
            extra={"rllib_amp_fallback": "cpu_bf16_probe", "missing": missing},
        )
    return bool(flags)


def resolve(
    settings: AmpSettings,
    device: torch.device | str,
    *,
    cuda_capability: tuple[int, int] | None = None,
    cpu_bf16: bool | None = None,
) -> Precision:
    """Chooses the training precision for ``device``.

    ``cuda_capability`` and ``cpu_bf16`` override the hardware probes (tests fake them).

    Rules (``enabled="auto"``, ``dtype="auto"``): CUDA capability >= 8.0 -> bfloat16;
    7.x -> float16 + GradScaler; older -> float32. CPU with native bfloat16 -> bfloat16,
    else float32. An explicit dtype wins; ``enabled=False`` is always float32.

    Example:
        >>> resolve(AmpSettings(), "cuda", cuda_capability=(7, 5)).use_scaler
        True
    """
    device = torch.device(device)
    kind = device.type

    def chosen(dtype: torch.dtype, reason: str) -> Precision:
        return Precision(dtype, kind, dtype == torch.float16, reason)  # float16 needs a scaler

    if settings.enabled is False:
        return chosen(torch.float32, "AMP disabled by settings (enabled=false)")
    if kind not in ("cpu", "cuda"):
        if settings.enabled is True or settings.dtype != "auto":
            raise ValueError(
                f"amp.enabled: mixed precision is supported on cpu and cuda, not on "
                f"device {str(device)!r}; set amp.enabled to false or 'auto'"
            )
        return chosen(torch.float32, f"no AMP support for device {kind!r}")

    if settings.dtype == "float16":
        return chosen(torch.float16, "dtype float16 requested explicitly")
    if settings.dtype == "bfloat16":
        if kind == "cuda":
            cap = cuda_capability or torch.cuda.get_device_capability(device)
            if cap < (8, 0) and cuda_capability is None and not torch.cuda.is_bf16_supported():
                raise ValueError(
                    f"amp.dtype: bfloat16 is not supported on this GPU (compute capability "
                    f"{cap[0]}.{cap[1]}); use dtype 'float16' or 'auto'"
                )
        return chosen(torch.bfloat16, "dtype bfloat16 requested explicitly")

    # dtype == "auto"
    forced = settings.enabled is True
    if kind == "cuda":
        cap = cuda_capability or torch.cuda.get_device_capability(device)
        cap_s = f"CUDA compute capability {cap[0]}.{cap[1]}"
        if cap >= (8, 0):
            return chosen(torch.bfloat16, f"{cap_s} >= 8.0 has bfloat16")
        if cap >= (7, 0):
            return chosen(torch.float16, f"{cap_s} has float16 tensor cores")
        if forced:
            return chosen(torch.float16, f"{cap_s} < 7.0 but enabled=true: float16, likely slow")
        return chosen(torch.float32, f"{cap_s} < 7.0 has no fast 16-bit math")
    has_bf16 = cpu_has_native_bf16() if cpu_bf16 is None else cpu_bf16
    if has_bf16:
        flags = bf16_cpu_flags(read_cpuinfo()) if cpu_bf16 is None else ()
        shown = f" ({', '.join(flags)})" if flags else ""
        return chosen(torch.bfloat16, f"CPU has native bfloat16{shown}")
    if forced:
        return chosen(torch.bfloat16, "CPU lacks native bfloat16 but enabled=true: emulated, slow")
    return chosen(torch.float32, "CPU has no native bfloat16")


# Below this many observations per forward pass, CPU inference is faster in float32: the
# casts cost more than bfloat16 saves (the measurement: docs/performance.md, "Figures behind
# the code's thresholds"). Where the EnvRunner can time its own module, the timing decides.
CPU_BF16_MIN_INFERENCE_BATCH = 16
# bfloat16 inference must beat float32 by this factor in the startup timing to be chosen: a
# tie keeps float32 (AMP never slower).
CPU_BF16_MIN_SPEEDUP = 1.05
# Forward-pass times in ms: (float32, bfloat16 autocast), measured on the module itself; None
# where it cannot be measured.
InferenceTiming = Callable[[], "tuple[float, float] | None"]


def time_forward(
    forward: Callable[[], object], *, reps: int = 5, calls: int = 3
) -> tuple[float, float]:
    """(float32 ms, bfloat16-autocast ms) per ``forward()`` call on this CPU: medians of
    ``reps`` interleaved rounds of ``calls`` calls each, after one warm-up round, without
    autograd. The bfloat16 rounds share one autocast region, as ``sample()`` does (the weights
    are cast once, not per call).

    Example:
        >>> lin, x = nn.Linear(8, 8), torch.ones(4, 8)
        >>> fp32_ms, bf16_ms = time_forward(lambda: lin(x), reps=1, calls=1)
        >>> fp32_ms > 0 and bf16_ms > 0
        True
    """
    times: dict[bool, list[float]] = {False: [], True: []}
    with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16):
        for round_ in range(reps + 1):
            for bf16 in (round_ % 2 == 0, round_ % 2 == 1):
                with torch.autocast("cpu", enabled=bf16):
                    start = time.perf_counter()
                    for _ in range(calls):
                        forward()
                    if round_:  # round 0 warms both up
                        times[bf16].append((time.perf_counter() - start) / calls * 1e3)
    return statistics.median(times[False]), statistics.median(times[True])


def resolve_inference(
    settings: AmpSettings,
    device: torch.device | str,
    *,
    batch: int = 1,
    timing: InferenceTiming | None = None,
    cuda_capability: tuple[int, int] | None = None,
    cpu_bf16: bool | None = None,
) -> Precision:
    """The precision of EnvRunner forward passes (action computation; no loss scaling).

    Args:
        settings: The AMP settings; ``inference_dtype`` "auto" lets the hardware decide.
        device: Where the forward passes run.
        batch: How many observations one forward pass sees (envs per EnvRunner).
        timing: On a CPU with native bfloat16, "auto" calls it once and picks bfloat16 only
            when it is at least ``CPU_BF16_MIN_SPEEDUP`` times faster than float32 (CPUs with
            the same flags differ: docs/benchmark.md). Without it, or when it returns None,
            the batch rule decides.
        cuda_capability: Overrides the GPU probe (tests fake it).
        cpu_bf16: Overrides the CPU's native-bfloat16 probe (tests fake it).

    Example:
        >>> resolve_inference(AmpSettings(inference_dtype="float32"), "cpu").enabled
        False
        >>> resolve_inference(AmpSettings(), "cpu", batch=16, cpu_bf16=True,
        ...                   timing=lambda: (4.0, 9.0)).reason
        'inference auto: float32 4.00 ms, bfloat16 9.00 ms per forward pass of 16 on this CPU'
    """
    kind = torch.device(device).type
    choice = settings.inference_dtype
    if settings.enabled is False or choice == "float32" or kind not in ("cpu", "cuda"):
        return Precision(torch.float32, kind, False, f"inference_dtype={choice}, AMP setting")
    if choice != "auto":
        dtype = torch.float16 if choice == "float16" else torch.bfloat16
        return Precision(dtype, kind, False, f"inference_dtype {choice} requested explicitly")
    # The same hardware rule as training, but never forced onto slow hardware.
    p = resolve(
        AmpSettings(enabled="auto"), device, cuda_capability=cuda_capability, cpu_bf16=cpu_bf16
    )
    if kind == "cpu" and p.enabled:  # bfloat16 by the flags: does it pay at this batch?
        if (measured := timing() if timing is not None else None) is not None:
            fp32_ms, bf16_ms = measured
            faster = bf16_ms * CPU_BF16_MIN_SPEEDUP <= fp32_ms
            times = f"float32 {fp32_ms:.2f} ms, bfloat16 {bf16_ms:.2f} ms per forward pass"
            dtype = torch.bfloat16 if faster else torch.float32
            return Precision(dtype, kind, False, f"inference auto: {times} of {batch} on this CPU")
        if batch < CPU_BF16_MIN_INFERENCE_BATCH:
            why = f"{batch} observation(s) are faster in float32"
            pays = f"bfloat16 pays from {CPU_BF16_MIN_INFERENCE_BATCH}"
            return Precision(
                torch.float32, kind, False, f"inference auto: CPU forward passes of {why} ({pays})"
            )
    return Precision(p.dtype, kind, False, f"inference auto: {p.reason}")


def _float32_inputs(module: nn.Module, args: tuple[object, ...]) -> tuple[object, ...]:
    # A module-level function (not a lambda) so modules stay picklable.
    return tuple(a.float() if torch.is_tensor(a) and a.is_floating_point() else a for a in args)


FLOAT32_ISLAND_ATTR = "_rllib_amp_float32_island"


def add_float32_islands(module: nn.Module) -> int:
    """Makes every normalisation layer under ``module`` run in float32 inside autocast; returns
    how many it hooked (idempotent). Autocast lowers only matmul-like ops, so a norm layer fed
    float32 (a forward pre-hook casts its input) computes its statistics in float32; the
    parameters and state_dict keys, hence checkpoints, stay as they are.

    Example:
        >>> m = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4))
        >>> add_float32_islands(m)
        1
    """
    count = 0
    for layer in module.modules():
        if isinstance(layer, NORM_LAYER_TYPES) and not getattr(layer, FLOAT32_ISLAND_ATTR, False):
            layer.register_forward_pre_hook(_float32_inputs)
            setattr(layer, FLOAT32_ISLAND_ATTR, True)
            count += 1
    return count


def to_float32(tree: T) -> T:
    """``tree`` (nested dicts, lists, tuples) with every 16-bit floating tensor cast to float32:
    loss maths run in float32, and numpy (no bfloat16) never meets a bfloat16 tensor."""
    if torch.is_tensor(tree):
        low = tree.dtype in (torch.float16, torch.bfloat16)
        return tree.float() if low else tree  # type: ignore[return-value]
    if isinstance(tree, dict):
        return {k: to_float32(v) for k, v in tree.items()}  # type: ignore[return-value]
    if isinstance(tree, (list, tuple)) and not hasattr(tree, "_fields"):
        return type(tree)(to_float32(v) for v in tree)
    return tree
