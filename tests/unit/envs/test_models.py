"""Model presets, the BatchNorm option and the parameter-count CLI."""

from __future__ import annotations

import pytest
import torch
from ray.rllib.algorithms.ppo import PPOConfig

from rllib_amp.algorithms import algorithm
from rllib_amp.envs import models, params


@pytest.mark.parametrize("algo", ["PPO", "DQN"])
@pytest.mark.parametrize(
    "preset, lo, hi",
    [("mini", 0.3e6, 0.7e6), ("full", 2e6, 6e6), ("high", 8e6, 12e6)],
)
def test_image_preset_sizes_are_in_their_ranges(algo, preset, lo, hi):
    n = models.count_parameters(algorithm(algo).config_class, preset, image=True)
    assert lo <= n <= hi, f"{algo} {preset}: {n:,}"


def test_vector_presets_grow_with_size():
    sizes = [models.count_parameters(PPOConfig, p, image=False) for p in models.PRESETS]
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1]


def test_batchnorm_inserted_after_every_conv():
    module_cls = algorithm("DQN").batchnorm_module
    from ray.rllib.algorithms.dqn import DQNConfig
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    cfg = DQNConfig().rl_module(
        model_config=models.model_config("mini", image=True),
        rl_module_spec=RLModuleSpec(module_class=module_cls),
    )
    import gymnasium as gym

    module = cfg.get_rl_module_spec(
        spaces={"default_policy": (models.ATARI_OBS_SPACE, gym.spaces.Discrete(6))}
    ).build()
    layers = [m for m in module.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.BatchNorm2d))]
    kinds = [type(m).__name__ for m in layers]
    assert kinds == ["Conv2d", "BatchNorm2d"] * 3
    with_bn = sum(p.numel() for name, p in module.named_parameters() if "target" not in name)
    assert with_bn > models.count_parameters(DQNConfig, "mini")


def test_params_cli_prints_every_preset(capsys):
    assert params.main(["--algorithms", "PPO"]) == 0
    out = capsys.readouterr().out
    for preset in models.PRESETS:
        assert preset in out
    assert "84x84x4" in out and "vector" in out


def test_params_cli_rejects_an_unknown_algorithm(capsys):
    assert params.main(["--algorithms", "PPOO"]) == 2
    err = capsys.readouterr().err
    assert "--algorithms" in err and "did you mean 'PPO'" in err


# -- uint8 image input (the native Atari path) ------------------------------------------------
def test_uint8_to_input_matches_the_wrappers_range_in_every_dtype():
    pixels = torch.arange(256, dtype=torch.uint8)
    expected = pixels.double() / 128.0 - 1.0  # RLlib's NormalizedImageEnv
    out = models.uint8_to_input(pixels)
    assert out.dtype == torch.float32 and torch.equal(out.double(), expected)
    for dtype in (torch.bfloat16, torch.float16):
        with torch.autocast("cpu", dtype=dtype):
            half = models.uint8_to_input(pixels)
        # Straight to the compute dtype, and exact there (steps of 1/128).
        assert half.dtype == dtype and torch.equal(half.double(), expected)
    floats = torch.rand(3)
    assert models.uint8_to_input(floats) is floats


def _module(algo: str, preset: str, module_class=None):
    import gymnasium as gym
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    record = algorithm(algo)
    cfg = record.config_class().rl_module(
        model_config=models.model_config(preset, image=True),
        rl_module_spec=RLModuleSpec(module_class=module_class or record.uint8_module),
    )
    spaces = {"default_policy": (models.ATARI_OBS_SPACE, gym.spaces.Discrete(6))}
    module = cfg.get_rl_module_spec(spaces=spaces).build()
    if hasattr(module, "make_target_networks"):
        module.make_target_networks()  # DQN's target net, APPO's old policy: deep copies
    return module


def _batch(obs: torch.Tensor) -> dict:
    from ray.rllib.core.columns import Columns

    return {Columns.OBS: obs, Columns.NEXT_OBS: obs.flip(0)}


def _outputs(module, batch: dict) -> list[torch.Tensor]:
    outs = dict(module.forward_train(batch))
    if hasattr(module, "forward_target"):
        outs.update({f"target/{k}": v for k, v in module.forward_target(batch).items()})
    return [v for _, v in sorted(outs.items()) if torch.is_tensor(v)]


@pytest.mark.parametrize("algo", ["PPO", "DQN", "APPO"])
@pytest.mark.parametrize("preset", models.PRESETS)
def test_uint8_module_sees_the_same_input_as_on_the_wrappers_path(algo, preset):
    torch.manual_seed(0)
    module = _module(algo, preset)
    pixels = torch.randint(0, 256, (2, 84, 84, 4), dtype=torch.uint8)
    with torch.no_grad():
        from_uint8 = _outputs(module, _batch(pixels))
        from_float = _outputs(module, _batch(pixels.float() / 128.0 - 1.0))
    assert len(from_uint8) >= 2
    for a, b in zip(from_uint8, from_float):
        assert torch.equal(a, b)


@pytest.mark.parametrize("algo", ["PPO", "DQN", "APPO"])
def test_under_autocast_the_first_conv_gets_the_compute_dtype(algo):
    module = _module(algo, "mini", module_class=algorithm(algo).batchnorm_module)
    convs = [m for m in module.modules() if isinstance(m, torch.nn.Conv2d)]
    norms = [m for m in module.modules() if isinstance(m, torch.nn.BatchNorm2d)]
    assert norms, "BatchNorm module without BatchNorm layers"
    seen: list[torch.dtype] = []
    for conv in convs:
        conv.register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype) and None)
    pixels = torch.randint(0, 256, (2, 84, 84, 4), dtype=torch.uint8)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        _outputs(module, _batch(pixels))
    assert seen and torch.uint8 not in seen and torch.bfloat16 in seen
