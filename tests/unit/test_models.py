"""Model presets, the BatchNorm option and the parameter-count CLI."""

from __future__ import annotations

import pytest
import torch
from ray.rllib.algorithms.ppo import PPOConfig

from rllib_amp import models, params
from rllib_amp.algorithms import algorithm


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
    dqn = algorithm("DQN")
    with_bn = models.count_parameters(dqn.config_class, "mini", module_class=module_cls)
    assert with_bn > models.count_parameters(dqn.config_class, "mini")


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
