import logging

import pytest
import torch
from torch import nn

from rllib_amp import AmpSettings
from rllib_amp.learner import precision
from rllib_amp.learner.precision import add_float32_islands, resolve, to_float32


@pytest.mark.parametrize(
    "cap, dtype, scaler",
    [
        ((9, 0), torch.bfloat16, False),  # Hopper
        ((8, 0), torch.bfloat16, False),  # Ampere
        ((7, 5), torch.float16, True),  # Turing
        ((7, 0), torch.float16, True),  # Volta
        ((6, 1), torch.float32, False),  # Pascal: no tensor cores
    ],
)
def test_auto_on_fake_cuda_capabilities(cap, dtype, scaler):
    p = resolve(AmpSettings(), "cuda", cuda_capability=cap)
    assert p.dtype == dtype
    assert p.use_scaler is scaler
    assert p.device_type == "cuda"
    assert f"{cap[0]}.{cap[1]}" in p.reason


def test_auto_on_cpu_follows_native_bf16():
    assert resolve(AmpSettings(), "cpu", cpu_bf16=True).dtype == torch.bfloat16
    p = resolve(AmpSettings(), "cpu", cpu_bf16=False)
    assert p.dtype == torch.float32 and not p.enabled


def test_enabled_true_forces_a_16_bit_dtype_even_without_fast_hardware():
    assert resolve(AmpSettings(enabled=True), "cpu", cpu_bf16=False).dtype == torch.bfloat16
    p = resolve(AmpSettings(enabled=True), "cuda", cuda_capability=(6, 1))
    assert p.dtype == torch.float16 and p.use_scaler


def test_explicit_dtype_wins_and_disabled_is_float32():
    p = resolve(AmpSettings(dtype="float16"), "cpu", cpu_bf16=True)
    assert p.dtype == torch.float16 and p.use_scaler
    p = resolve(AmpSettings(dtype="bfloat16"), "cuda", cuda_capability=(9, 0))
    assert p.dtype == torch.bfloat16 and not p.use_scaler
    p = resolve(AmpSettings(enabled=False, dtype="float16"), "cuda", cuda_capability=(9, 0))
    assert p.dtype == torch.float32 and not p.use_scaler


def test_unsupported_device():
    assert not resolve(AmpSettings(), "meta").enabled
    with pytest.raises(ValueError, match="amp.enabled"):
        resolve(AmpSettings(enabled=True), "meta")


def test_autocast_context_lowers_matmul_only_when_enabled():
    lin = nn.Linear(8, 8)
    x = torch.randn(2, 8)
    with resolve(AmpSettings(dtype="bfloat16"), "cpu").autocast():
        assert lin(x).dtype == torch.bfloat16
    with resolve(AmpSettings(enabled=False), "cpu").autocast():
        assert lin(x).dtype == torch.float32


@pytest.mark.parametrize("norm", [nn.BatchNorm1d(8), nn.LayerNorm(8), nn.GroupNorm(2, 8)])
def test_norm_layers_run_in_float32_islands(norm):
    model = nn.Sequential(nn.Linear(8, 8), norm, nn.Linear(8, 2))
    keys_before = list(model.state_dict())
    seen = []
    norm.register_forward_hook(lambda m, i, o: seen.append((i[0].dtype, o.dtype)))
    assert add_float32_islands(model) == 1
    assert add_float32_islands(model) == 0  # idempotent
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = model(torch.randn(4, 8))
    assert seen == [(torch.float32, torch.float32)]
    assert out.dtype == torch.bfloat16  # the next Linear is back in low precision
    assert list(model.state_dict()) == keys_before  # checkpoints unchanged


def test_to_float32_casts_nested_16_bit_tensors_only():
    tree = {
        "a": torch.ones(2, dtype=torch.bfloat16),
        "b": [torch.ones(1, dtype=torch.float16), torch.ones(1, dtype=torch.int64)],
        "c": (torch.ones(1, dtype=torch.float64), "text"),
    }
    out = to_float32(tree)
    assert out["a"].dtype == torch.float32
    assert out["b"][0].dtype == torch.float32
    assert out["b"][1].dtype == torch.int64
    assert out["c"][0].dtype == torch.float64 and out["c"][1] == "text"


def test_describe_names_dtype_and_reason():
    for p in (
        resolve(AmpSettings(), "cuda", cuda_capability=(7, 5)),
        resolve(AmpSettings(enabled=False), "cpu"),
    ):
        text = p.describe()
        assert p.name in text and p.reason in text


def test_inference_precision_auto_depends_on_device_and_batch():
    from rllib_amp.learner.precision import CPU_BF16_MIN_INFERENCE_BATCH, resolve_inference

    s = AmpSettings()
    assert not resolve_inference(s, "cpu", batch=4, cpu_bf16=True).enabled
    big = resolve_inference(s, "cpu", batch=CPU_BF16_MIN_INFERENCE_BATCH, cpu_bf16=True)
    assert big.dtype == torch.bfloat16 and not big.use_scaler
    assert resolve_inference(s, "cuda", batch=1, cuda_capability=(9, 0)).dtype == torch.bfloat16
    assert resolve_inference(s, "cuda", batch=1, cuda_capability=(7, 5)).dtype == torch.float16
    assert not resolve_inference(AmpSettings(enabled=False), "cuda", cuda_capability=(9, 0)).enabled
    forced = resolve_inference(AmpSettings(inference_dtype="bfloat16"), "cpu", batch=1)
    assert forced.dtype == torch.bfloat16
    fp32 = AmpSettings.from_dict({"inference_dtype": "fp32"})  # alias, as in YAML
    assert not resolve_inference(fp32, "cpu", batch=64, cpu_bf16=True).enabled


def test_cpu_inference_auto_is_decided_by_the_timing_where_there_is_one():
    from rllib_amp.learner.precision import resolve_inference

    s = AmpSettings()

    def timing(fp32_ms, bf16_ms, calls):
        def measure():
            calls.append(1)
            return fp32_ms, bf16_ms

        return measure

    calls: list[int] = []
    slower = resolve_inference(s, "cpu", batch=64, cpu_bf16=True, timing=timing(4.0, 9.0, calls))
    assert not slower.enabled and "float32 4.00 ms, bfloat16 9.00 ms" in slower.reason
    tie = resolve_inference(s, "cpu", batch=64, cpu_bf16=True, timing=timing(1.0, 0.96, calls))
    assert not tie.enabled  # within 5%: float32
    faster = resolve_inference(s, "cpu", batch=1, cpu_bf16=True, timing=timing(2.0, 1.0, calls))
    assert faster.dtype == torch.bfloat16 and "per forward pass of 1 on this CPU" in faster.reason
    assert len(calls) == 3
    # None from the timing: the batch rule decides.
    unmeasured = resolve_inference(s, "cpu", batch=16, cpu_bf16=True, timing=lambda: None)
    assert unmeasured.dtype == torch.bfloat16 and "native bfloat16" in unmeasured.reason
    # Never timed where the answer does not depend on it.
    never = timing(1.0, 1.0, calls := [])
    assert not resolve_inference(s, "cpu", batch=64, cpu_bf16=False, timing=never).enabled
    gpu = resolve_inference(s, "cuda", batch=64, cuda_capability=(9, 0), timing=never)
    assert gpu.dtype == torch.bfloat16
    explicit = AmpSettings(inference_dtype="bfloat16")
    assert resolve_inference(explicit, "cpu", cpu_bf16=True, timing=never).enabled
    assert calls == []


def test_time_forward_times_both_precisions_interleaved():
    from rllib_amp.learner.precision import time_forward

    seen: list[tuple[bool, bool]] = []

    def forward():
        seen.append((torch.is_autocast_enabled("cpu"), torch.is_inference_mode_enabled()))

    fp32_ms, bf16_ms = time_forward(forward, reps=3, calls=2)
    assert fp32_ms >= 0 and bf16_ms >= 0
    assert seen.count((True, True)) == seen.count((False, True)) == 8  # (3 + warm-up) x 2
    assert len(seen) == 16 and seen[:2] == [(True, True)] * 2  # round 0: bfloat16 first
    assert not torch.is_autocast_enabled("cpu")


# -- the CPU's native bfloat16: torch's private probes, and /proc/cpuinfo when they vanish --
AMX_CPUINFO = "model name : Xeon\nflags : avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
NO_BF16_CPUINFO = "model name : EPYC\nflags : avx2 fma\n"


def test_torch_still_has_the_cpu_bf16_probes():
    """Pin: "auto" on a CPU asks these private torch functions first."""
    for name in precision.TORCH_BF16_PROBES:
        probe = getattr(torch.cpu, name)
        assert isinstance(probe(), bool), name


@pytest.mark.parametrize(
    "text, flags",
    [(AMX_CPUINFO, ("avx512_bf16", "amx_bf16", "amx_tile")), (NO_BF16_CPUINFO, ()), ("", ())],
)
def test_bf16_cpu_flags_lists_only_what_the_cpu_has(text, flags):
    assert precision.bf16_cpu_flags(text) == flags


def _fallback_records(caplog):
    return [r for r in caplog.records if getattr(r, "rllib_amp_fallback", None) == "cpu_bf16_probe"]


@pytest.mark.parametrize(
    "text, dtype", [(AMX_CPUINFO, torch.bfloat16), (NO_BF16_CPUINFO, torch.float32)]
)
def test_auto_falls_back_to_cpuinfo_without_torch_probes_and_warns_once(
    monkeypatch, caplog, text, dtype
):
    monkeypatch.delattr(torch.cpu, "_is_amx_tile_supported")
    monkeypatch.setattr(precision, "_probe_fallback_warned", False)
    monkeypatch.setattr(precision, "read_cpuinfo", lambda: text)
    with caplog.at_level(logging.WARNING, logger=precision.__name__):
        for _ in range(3):
            assert resolve(AmpSettings(), "cpu").dtype == dtype
    (record,) = _fallback_records(caplog)
    assert record.levelno == logging.WARNING
    assert record.missing == ("_is_amx_tile_supported",)


def test_a_probe_that_raises_counts_as_gone(monkeypatch, caplog):
    def broken() -> bool:
        raise RuntimeError("cpuinfo unavailable")

    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", broken)
    monkeypatch.setattr(precision, "_probe_fallback_warned", False)
    monkeypatch.setattr(precision, "read_cpuinfo", lambda: AMX_CPUINFO)
    with caplog.at_level(logging.WARNING, logger=precision.__name__):
        assert precision.cpu_has_native_bf16() is True
        assert precision.cpu_has_native_bf16() is True
    (record,) = _fallback_records(caplog)
    assert record.missing == precision.TORCH_BF16_PROBES


def test_probes_present_means_no_fallback_warning(monkeypatch, caplog):
    monkeypatch.setattr(precision, "_probe_fallback_warned", False)
    monkeypatch.setattr(precision, "read_cpuinfo", lambda: "")  # torch answers, not cpuinfo
    with caplog.at_level(logging.WARNING, logger=precision.__name__):
        assert precision.cpu_has_native_bf16() == bool(
            torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()
        )
    assert not _fallback_records(caplog)
