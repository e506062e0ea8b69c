"""Model presets (mini / full / high), the BatchNorm option and uint8 image input.

Presets are the three sizes of the autowzry-agent project (``full`` is the Nature CNN), with
MLP equivalents for vector input; ``python -m rllib_amp.params`` prints their sizes.

Example:
    >>> model_config("full", image=True)["conv_filters"][0]
    [32, 8, 4, 'valid']
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from torch import nn


def _nature_cnn(narrow: int, wide: int, hidden: int) -> dict[str, object]:
    # The Nature CNN's shape at other widths: 8x8/4, 4x4/2, 3x3/1 "valid" convs (84 -> 20 -> 9
    # -> 7), one encoder shared by the policy and value heads, one hidden layer per head.
    return {
        "conv_filters": [[narrow, 8, 4, "valid"], [wide, 4, 2, "valid"], [wide, 3, 1, "valid"]],
        "conv_activation": "relu",
        "head_fcnet_hiddens": [hidden],
        "head_fcnet_activation": "relu",
        "vf_share_layers": True,
    }


# RLlib DefaultModelConfig settings per preset.
IMAGE_PRESETS: dict[str, dict[str, object]] = {
    "mini": _nature_cnn(16, 32, 128),
    "full": _nature_cnn(32, 64, 512),  # Mnih et al. 2015 (the "Nature CNN")
    "high": _nature_cnn(64, 128, 768),
}
VECTOR_PRESETS: dict[str, dict[str, object]] = {
    "mini": {"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"},
    "full": {"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh"},
    "high": {"fcnet_hiddens": [1024, 1024, 1024], "fcnet_activation": "relu"},
}
PRESETS: tuple[str, ...] = tuple(IMAGE_PRESETS)


def model_config(
    preset: str, *, image: bool, overrides: Mapping[str, object] | None = None
) -> dict[str, object]:
    """RLlib ``model_config`` for a preset, with ``overrides`` applied on top."""
    table = IMAGE_PRESETS if image else VECTOR_PRESETS
    if preset not in table:
        raise ValueError(f"model.preset: unknown preset {preset!r}; allowed: {', '.join(table)}")
    out = copy.deepcopy(table[preset])
    out.update(overrides or {})
    return out


def insert_batchnorm(root: nn.Module) -> int:
    """Puts a BatchNorm2d after every Conv2d inside the Sequentials of ``root``; returns how
    many. The ``batchnorm`` model option (the autowzry-agent DQN); AMP keeps them float32."""
    inserted = 0
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Sequential) or not any(
                isinstance(layer, nn.Conv2d) for layer in child
            ):
                continue
            layers: list[nn.Module] = []
            for layer in child:
                layers.append(layer)
                if isinstance(layer, nn.Conv2d):
                    layers.append(nn.BatchNorm2d(layer.out_channels))
                    inserted += 1
            setattr(parent, name, nn.Sequential(*layers))
    return inserted


def _after_setup(base: type, patch: Callable[[nn.Module], int], name: str) -> type:
    # ``base`` whose ``setup`` ends with ``patch(self)``. Give the result a module-level name
    # (see ``rllib_amp.algorithms``) so Ray pickles it by reference.

    class Patched(base):  # type: ignore[valid-type,misc]
        def setup(self) -> None:
            super().setup()
            patch(self)

    Patched.__name__ = Patched.__qualname__ = name
    return Patched


def with_batchnorm(base: type, *, name: str) -> type:
    """``base`` (an RLModule class), named ``name``, with a BatchNorm2d after each Conv2d of
    its encoders."""
    return _after_setup(base, insert_batchnorm, name)


def uint8_to_input(x: torch.Tensor) -> torch.Tensor:
    """uint8 pixels -> the network's input, x / 128 - 1 in [-1, 1); other dtypes pass through.

    The range of RLlib's Atari wrappers (NormalizedImageEnv): the same numbers on either Atari
    path. Under autocast straight to the autocast dtype: exact in bfloat16 and float16.

    Example:
        >>> uint8_to_input(torch.tensor([0, 128, 255], dtype=torch.uint8))
        tensor([-1.0000,  0.0000,  0.9922])
    """
    if x.dtype != torch.uint8:
        return x
    device = x.device.type
    dtype = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
    out = x.to(dtype or torch.float32)
    return out.mul_(1.0 / 128.0).sub_(1.0)


class Uint8ImageInput(nn.Sequential):
    """RLlib's ``TorchCNNEncoder.net`` (same children, same state_dict keys) that first turns
    uint8 pixels into its float input: every copy of the encoder (target, old policy) converts."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(uint8_to_input(x))


def accept_uint8_images(root: nn.Module) -> int:
    """Makes every CNN encoder inside ``root`` take uint8 observations; returns how many."""
    from ray.rllib.core.models.torch.encoder import TorchCNNEncoder

    changed = 0
    for module in list(root.modules()):
        if isinstance(module, TorchCNNEncoder) and not isinstance(module.net, Uint8ImageInput):
            module.net = Uint8ImageInput(*module.net)
            changed += 1
    return changed


def with_uint8_images(base: type) -> type:
    """``base`` (an RLModule class) whose CNN encoders take uint8 image observations.

    Observations stay uint8 in episodes, train batches and replay buffers (a quarter of
    float32's bytes); the forward pass converts them (``uint8_to_input``); floats pass through.

    Example:
        >>> from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import (
        ...     DefaultPPOTorchRLModule)
        >>> with_uint8_images(DefaultPPOTorchRLModule).__name__
        'Uint8DefaultPPOTorchRLModule'
    """
    return _after_setup(base, accept_uint8_images, f"Uint8{base.__name__}")


# The observation space of ALE's native vector env (rllib_amp.envs.atari).
ATARI_OBS_SPACE = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)


def count_parameters(config_class: type, preset: str, *, image: bool = True) -> int:
    """Trainable parameters of the RLModule a preset builds for 6 actions (target networks
    excluded).

    Example:
        >>> from ray.rllib.algorithms.ppo import PPOConfig
        >>> count_parameters(PPOConfig, "mini", image=False) > 0
        True
    """
    cfg = config_class()
    obs = ATARI_OBS_SPACE if image else gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    act: gym.Space = gym.spaces.Discrete(6)
    cfg.rl_module(model_config=model_config(preset, image=image))
    module: Any = cfg.get_rl_module_spec(spaces={"default_policy": (obs, act)}).build()
    return sum(p.numel() for name, p in module.named_parameters() if "target" not in name)
