"""Environments (ALE Atari with DeepMind preprocessing, any gymnasium id) and model presets.

Presets are the three sizes of the autowzry-agent project: ``mini`` (~0.5M parameters),
``full`` (the Nature CNN, a few million) and ``high`` (~10M), for image input, with MLP
equivalents for vector input. ``python -m rllib_amp.envs`` prints each preset's size.

Example:
    >>> model_config("full", image=True)["conv_filters"][0]
    [32, 8, 4, 'valid']
"""

from __future__ import annotations

import argparse
import copy
import difflib
from typing import Any

import gymnasium as gym
import numpy as np
from ray.rllib.algorithms.appo.torch.default_appo_torch_rl_module import DefaultAPPOTorchRLModule
from ray.rllib.algorithms.dqn.torch.default_dqn_torch_rl_module import DefaultDQNTorchRLModule
from ray.rllib.algorithms.ppo.torch.default_ppo_torch_rl_module import DefaultPPOTorchRLModule
from torch import nn

ATARI_PREFIX = "ALE/"

# RLlib DefaultModelConfig settings per preset. conv_filters: [out_channels, kernel, stride].
# "valid" padding as in the Nature CNN: 84 -> 20 -> 9 -> 7. One encoder shared by the policy
# and value heads (each head has its own hidden layer).
IMAGE_PRESETS: dict[str, dict[str, Any]] = {
    "mini": {  # ~0.45M parameters
        "conv_filters": [[16, 8, 4, "valid"], [32, 4, 2, "valid"], [32, 3, 1, "valid"]],
        "conv_activation": "relu",
        "head_fcnet_hiddens": [128],
        "head_fcnet_activation": "relu",
        "vf_share_layers": True,
    },
    "full": {  # Mnih et al. 2015 (the "Nature CNN"), ~3.3M parameters
        "conv_filters": [[32, 8, 4, "valid"], [64, 4, 2, "valid"], [64, 3, 1, "valid"]],
        "conv_activation": "relu",
        "head_fcnet_hiddens": [512],
        "head_fcnet_activation": "relu",
        "vf_share_layers": True,
    },
    "high": {  # ~10M parameters
        "conv_filters": [[64, 8, 4, "valid"], [128, 4, 2, "valid"], [128, 3, 1, "valid"]],
        "conv_activation": "relu",
        "head_fcnet_hiddens": [768],
        "head_fcnet_activation": "relu",
        "vf_share_layers": True,
    },
}
VECTOR_PRESETS: dict[str, dict[str, Any]] = {
    "mini": {"fcnet_hiddens": [64, 64], "fcnet_activation": "tanh"},
    "full": {"fcnet_hiddens": [256, 256], "fcnet_activation": "tanh"},
    "high": {"fcnet_hiddens": [1024, 1024, 1024], "fcnet_activation": "relu"},
}
PRESETS: tuple[str, ...] = tuple(IMAGE_PRESETS)


def is_atari(env_id: str) -> bool:
    return isinstance(env_id, str) and env_id.startswith(ATARI_PREFIX)


def _register_ale() -> None:
    import ale_py

    gym.register_envs(ale_py)


def check_env_id(env_id: str) -> None:
    """Raises ValueError naming the nearest registered id when ``env_id`` is unknown."""
    if is_atari(env_id):
        _register_ale()
    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=1, cutoff=0.6)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    raise ValueError(
        f"env: {env_id!r} is not a registered gymnasium id{hint}; use e.g. 'CartPole-v1' "
        f"or 'ALE/Pong-v5' (Atari ROMs ship with ale-py)"
    )


class AtariEnv(gym.Wrapper):
    """An ALE game with the usual DeepMind preprocessing.

    84x84 grayscale, frame skip 4 with max-pooling over the last two frames, a 4-frame
    stack, up to 30 no-op starts, episodic life, FIRE on reset where the game needs it
    (RLlib's own Atari wrappers), and rewards clipped to their sign.

    ``config``: ``{"id": "ALE/Pong-v5", ...}``; other keys go to ``gym.make`` (e.g.
    ``repeat_action_probability``). The class is what RLlib gets as ``env``, so env runners
    on any node build it by import, no registration needed.

    Example:
        >>> env = AtariEnv({"id": "ALE/Pong-v5"})  # doctest: +SKIP
        >>> env.observation_space.shape  # doctest: +SKIP
        (84, 84, 4)
    """

    def __init__(self, config: dict[str, Any] | None = None):
        from ray.rllib.env.wrappers.atari_wrappers import wrap_atari_for_new_api_stack

        config = dict(config or {})
        env_id = config.pop("id", "ALE/Pong-v5")
        _register_ale()
        # Frame skipping is done by the wrapper (max-pooled), so the ALE itself skips none.
        kwargs = {"frameskip": 1, "repeat_action_probability": 0.0, **config}
        env = gym.make(env_id, **kwargs)
        env = wrap_atari_for_new_api_stack(env, dim=84, frameskip=4, framestack=4)
        env = gym.wrappers.TransformReward(env, lambda r: float(np.sign(float(r))))
        super().__init__(env)


def env_for_rllib(env_id: str, env_config: dict[str, Any] | None) -> tuple[Any, dict[str, Any]]:
    """What to pass to ``AlgorithmConfig.environment(env=..., env_config=...)``."""
    env_config = dict(env_config or {})
    if is_atari(env_id):
        return AtariEnv, {"id": env_id, **env_config}
    return env_id, env_config


def model_config(
    preset: str, *, image: bool, overrides: dict[str, Any] | None = None
) -> dict[str, Any]:
    """RLlib ``model_config`` for a preset, with ``overrides`` applied on top."""
    table = IMAGE_PRESETS if image else VECTOR_PRESETS
    if preset not in table:
        raise ValueError(f"model.preset: unknown preset {preset!r}; allowed: {', '.join(table)}")
    out = copy.deepcopy(table[preset])
    out.update(overrides or {})
    return out


def insert_batchnorm(root: nn.Module) -> int:
    """Puts a BatchNorm2d after every Conv2d inside the Sequentials of ``root``.

    Returns how many were inserted. Used by the ``batchnorm`` model option (the DQN of the
    autowzry-agent write-up); under AMP these layers run in float32.
    """
    inserted = 0
    for parent in list(root.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, nn.Sequential):
                continue
            if not any(isinstance(layer, nn.Conv2d) for layer in child):
                continue
            layers: list[nn.Module] = []
            for layer in child:
                layers.append(layer)
                if isinstance(layer, nn.Conv2d):
                    layers.append(nn.BatchNorm2d(layer.out_channels))
                    inserted += 1
            setattr(parent, name, nn.Sequential(*layers))
    return inserted


def _batchnorm_module_class(base: type) -> type:
    class WithBatchNorm(base):  # type: ignore[valid-type,misc]
        def setup(self) -> None:
            super().setup()
            insert_batchnorm(self)

    WithBatchNorm.__name__ = WithBatchNorm.__qualname__ = f"BatchNorm{base.__name__}"
    return WithBatchNorm


# Module-level names so Ray pickles these classes by reference.
BatchNormDefaultPPOTorchRLModule = _batchnorm_module_class(DefaultPPOTorchRLModule)
BatchNormDefaultDQNTorchRLModule = _batchnorm_module_class(DefaultDQNTorchRLModule)
BatchNormDefaultAPPOTorchRLModule = _batchnorm_module_class(DefaultAPPOTorchRLModule)
_BN_CLASSES: dict[str, type] = {
    "PPO": BatchNormDefaultPPOTorchRLModule,
    "DQN": BatchNormDefaultDQNTorchRLModule,
    "APPO": BatchNormDefaultAPPOTorchRLModule,
}
for _cls in _BN_CLASSES.values():
    _cls.__module__ = __name__


def batchnorm_module_class(algorithm: str) -> type:
    """RLlib's default torch RLModule for ``algorithm`` with BatchNorm after each conv."""
    return _BN_CLASSES[algorithm]


ATARI_OBS_SPACE = gym.spaces.Box(-1.0, 1.0, (84, 84, 4), np.float32)


def count_parameters(
    algorithm: str,
    preset: str,
    *,
    image: bool = True,
    batchnorm: bool = False,
    num_actions: int = 6,
) -> int:
    """Trainable parameters of the RLModule a preset builds (target networks excluded)."""
    from ray.rllib.core.rl_module.rl_module import RLModuleSpec

    from rllib_amp.experiment import algorithm_config_class

    cfg = algorithm_config_class(algorithm)()
    obs = ATARI_OBS_SPACE if image else gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    act: gym.Space = gym.spaces.Discrete(num_actions)
    cfg.rl_module(model_config=model_config(preset, image=image))
    if batchnorm:
        cfg.rl_module(rl_module_spec=RLModuleSpec(module_class=batchnorm_module_class(algorithm)))
    module: Any = cfg.get_rl_module_spec(spaces={"default_policy": (obs, act)}).build()
    return sum(p.numel() for name, p in module.named_parameters() if "target" not in name)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rllib_amp.envs", description="Print each model preset's size."
    )
    parser.add_argument("--algorithms", default="PPO,DQN", help="comma-separated")
    args = parser.parse_args(argv)
    algos = [a.strip().upper() for a in args.algorithms.split(",") if a.strip()]
    print(f"{'preset':<8}{'input':<8}" + "".join(f"{a + ' params':>14}" for a in algos))
    for image in (True, False):
        for preset in PRESETS:
            counts = [count_parameters(a, preset, image=image) for a in algos]
            kind = "84x84x4" if image else "vector"
            print(f"{preset:<8}{kind:<8}" + "".join(f"{c:>14,}" for c in counts))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
