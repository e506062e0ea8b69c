"""GPU checks: skipped without CUDA. Run them with tests/gpu/run_gpu_checks.sh."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_auto_precision_matches_the_gpu():
    from rllib_amp import AmpSettings
    from rllib_amp.precision import resolve

    p = resolve(AmpSettings(), "cuda:0")
    major, _ = torch.cuda.get_device_capability(0)
    if major >= 8:
        assert p.dtype == torch.bfloat16 and not p.use_scaler
    elif major == 7:
        assert p.dtype == torch.float16 and p.use_scaler


@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_learner_update_on_gpu_is_finite_and_steps(dtype):
    import os
    import pickle
    import tempfile

    from rllib_amp import bench

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "PPO.pkl")
        bench.collect_data("PPO", "cuda", path)
        with open(path, "rb") as f:
            data = pickle.load(f)
    variant = "amp-fp16" if dtype == "float16" else "amp-bf16"
    lrn = bench.build_learner("PPO", "full", variant, "cuda", data["spaces"])
    assert str(lrn._device).startswith("cuda")
    bench.update_fn("PPO", lrn, data["episodes"])()
    scaler = lrn.amp_scalers["default_policy"]
    assert scaler.optimizer_steps_lifetime > 0
    for p in lrn.module["default_policy"].parameters():
        assert torch.isfinite(p).all()


def test_high_preset_memory_and_speed_targets_on_gpu():
    """Issue target: >= 2x learner throughput and >= 35% less peak memory on `high`."""
    import os
    import pickle
    import tempfile

    from rllib_amp import bench

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "PPO.pkl")
        bench.collect_data("PPO", "cuda", path)
        mem = bench.bench_memory("PPO", "high", ["fp32", "amp-auto"], "cuda", path)
        with open(path, "rb") as f:
            data = pickle.load(f)
        thr = bench.bench_throughput("PPO", "high", ["fp32", "amp-auto"], "cuda", data, reps=3)
    print("memory", mem, "throughput", {k: sorted(v) for k, v in thr.items()})
    assert mem["amp-auto"] <= 0.65 * mem["fp32"]
    med = {k: sorted(v)[len(v) // 2] for k, v in thr.items()}
    assert med["amp-auto"] >= 2.0 * med["fp32"]
