"""The RLlib internals rllib-amp builds on still exist and behave the way we rely on.

A Ray upgrade that renames, reshapes or rewrites any of these must fail here, loudly,
instead of silently training without AMP (or with a stale copy of RLlib's logic).
"""

from __future__ import annotations

import ast
import hashlib
import inspect
import logging
import textwrap

import gymnasium as gym
import numpy as np
import pytest
import ray
import torch
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.algorithms.appo.torch.appo_torch_learner import APPOTorchLearner
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.core.learner.torch.torch_learner import TorchLearner
from ray.rllib.utils.minibatch_utils import MiniBatchCyclicIterator

from rllib_amp.algorithms import ALGORITHMS
from rllib_amp.learner import env_runner as inference
from rllib_amp.learner.mixin import AmpLearnerMixin
from rllib_amp.learner.precision import resolve
from rllib_amp.settings import AmpSettings

P = inspect.Parameter
OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACT = gym.spaces.Discrete(2)

# method -> the parameters (name, kind) our override passes through, in order.
EXPECTED = {
    "build": [],
    "_uncompiled_update": [("batch", P.POSITIONAL_OR_KEYWORD)],
    "compute_losses": [("fwd_out", P.KEYWORD_ONLY), ("batch", P.KEYWORD_ONLY)],
    "compute_loss_for_module": [
        ("module_id", P.KEYWORD_ONLY),
        ("config", P.KEYWORD_ONLY),
        ("batch", P.KEYWORD_ONLY),
        ("fwd_out", P.KEYWORD_ONLY),
    ],
    "compute_gradients": [("loss_per_module", P.POSITIONAL_OR_KEYWORD)],
    "postprocess_gradients": [("gradients_dict", P.POSITIONAL_OR_KEYWORD)],
    "apply_gradients": [("gradients_dict", P.POSITIONAL_OR_KEYWORD)],
    "_make_batch_if_necessary": [("training_data", P.POSITIONAL_OR_KEYWORD)],
    "_create_iterator_if_necessary": [
        ("training_data", P.KEYWORD_ONLY),
        ("num_total_minibatches", P.KEYWORD_ONLY),
        ("num_epochs", P.KEYWORD_ONLY),
        ("minibatch_size", P.KEYWORD_ONLY),
        ("shuffle_batch_per_epoch", P.KEYWORD_ONLY),
    ],
    "after_gradient_based_update": [("timesteps", P.KEYWORD_ONLY)],
    "get_state": [
        ("components", P.POSITIONAL_OR_KEYWORD),
        ("not_components", P.KEYWORD_ONLY),
    ],
    "set_state": [("state", P.POSITIONAL_OR_KEYWORD)],
    "restore_from_path": [
        ("path", P.POSITIONAL_OR_KEYWORD),
        ("component", P.KEYWORD_ONLY),
        ("filesystem", P.KEYWORD_ONLY),
    ],
    "add_module": [
        ("module_id", P.KEYWORD_ONLY),
        ("module_spec", P.KEYWORD_ONLY),
        ("config_overrides", P.KEYWORD_ONLY),
        ("new_should_module_be_updated", P.KEYWORD_ONLY),
    ],
    "remove_module": [("module_id", P.POSITIONAL_OR_KEYWORD)],
    # Called, not overridden:
    "get_optimizers_for_module": [("module_id", P.POSITIONAL_OR_KEYWORD)],
    "get_optimizer": [
        ("module_id", P.POSITIONAL_OR_KEYWORD),
        ("optimizer_name", P.POSITIONAL_OR_KEYWORD),
    ],
    "_check_component": [
        ("name", P.POSITIONAL_OR_KEYWORD),
        ("components", P.POSITIONAL_OR_KEYWORD),
        ("not_components", P.POSITIONAL_OR_KEYWORD),
    ],
}

# RLlib bodies that rllib-amp repeats part of, by a hash of their syntax tree (comments and
# formatting do not count). A new hash means RLlib changed the body: re-read it, carry the
# change into ours, then update the hash.
COPIED = {
    # The lazy lr-scheduler setup: AmpLearnerMixin._amp_build_lr_schedulers.
    (TorchLearner, "apply_gradients"): "92dcfa02eb0b8bef",
    # Mirrored step for step by GatherMiniBatchIterator.__iter__ / gather_minibatches.
    (MiniBatchCyclicIterator, "__iter__"): "8ab2751b47f86d38",
    (MiniBatchCyclicIterator, "__init__"): "d734f638dca2c12c",
}


def _tree_hash(fn) -> str:
    node = ast.parse(textwrap.dedent(inspect.getsource(fn))).body[0]
    return hashlib.sha256(ast.dump(node).encode()).hexdigest()[:16]


def _stock_ppo_learner(**training):
    cfg = PPOConfig().rl_module(model_config={"fcnet_hiddens": [8]}).debugging(seed=0)
    return cfg.training(**training).build_learner(spaces={"default_policy": (OBS, ACT)})


def test_ray_version_is_the_pinned_minor():
    assert ray.__version__.startswith("2.60."), ray.__version__


@pytest.mark.parametrize("name", sorted(EXPECTED))
@pytest.mark.parametrize("cls", [PPOTorchLearner, DQNTorchLearner, APPOTorchLearner])
def test_overridden_methods_keep_their_signatures(cls, name):
    method = getattr(cls, name, None)
    assert callable(method), f"{cls.__name__}.{name} is gone"
    # **kwargs are only passed through (empty), so whether RLlib takes them does not matter.
    params = [
        (p.name, p.kind)
        for p in list(inspect.signature(method).parameters.values())[1:]
        # Ray adds _ray_trace_ctx to a class's methods once it has run as an actor.
        if p.kind is not P.VAR_KEYWORD and p.name != "_ray_trace_ctx"
    ]
    assert params == EXPECTED[name], f"{cls.__name__}.{name}{inspect.signature(method)}"


# Overrides that pass every argument through as *args / **kwargs: each learner's own signature.
PASSED_THROUGH = {"update"}


def test_every_mixin_override_is_listed_here():
    overridden = {
        n for n, v in vars(AmpLearnerMixin).items() if callable(v) and hasattr(TorchLearner, n)
    }
    assert overridden <= set(EXPECTED) | PASSED_THROUGH, overridden - set(EXPECTED)


@pytest.mark.parametrize(
    ("cls", "name"), sorted(COPIED, key=str), ids=lambda x: getattr(x, "__name__", x)
)
def test_rllib_bodies_we_repeat_are_unchanged(cls, name):
    assert _tree_hash(getattr(cls, name)) == COPIED[(cls, name)], (
        f"RLlib's {cls.__name__}.{name} changed: re-read it and carry the change into "
        f"rllib-amp (see the comment above COPIED), then update its hash"
    )


def test_stock_apply_gradients_turns_inf_into_a_step():
    """The defect we fix: RLlib's nan_to_num makes an overflow a finite, garbage step."""
    lrn = _stock_ppo_learner()
    params = list(lrn.module["default_policy"].parameters())
    grads = {p: torch.zeros_like(p) for p in params}
    grads[params[0]][0] = float("inf")
    lrn.apply_gradients(grads)
    assert params[0].grad[0].eq(torch.finfo(torch.float32).max).all()  # inf made finite
    (opt,) = [o for _, o in lrn.get_optimizers_for_module("default_policy")]
    assert int(opt.state[params[0]]["step"]) == 1  # ...and stepped on


def test_learner_internals_we_read_exist_after_build():
    from ray.rllib.core import ALL_MODULES

    lrn = _stock_ppo_learner()
    (opt,) = [o for _, o in lrn.get_optimizers_for_module("default_policy")]
    params = list(lrn.module["default_policy"].parameters())
    assert all(lrn._params[p] is p for p in params)  # torch param refs are the params
    assert list(lrn._module_optimizers) == ["default_policy"]
    # Every optimizer RLlib's compute_gradients zeroes is reached by module id (the
    # mixin's _amp_module_optimizers(ALL_MODULES)).
    assert list(lrn._optimizer_parameters) == [opt]
    assert lrn.get_optimizers_for_module(ALL_MODULES) == []
    assert lrn._lr_scheduler_classes is None and lrn._lr_schedulers == {}


def test_value_pass_calls_each_modules_compute_values():
    """GAE runs through module.compute_values, where value_pass casts to float32."""
    from tests.integration.common import ppo_episodes

    cfg, episodes, spaces = ppo_episodes(32, hiddens=8)
    lrn = cfg.build_learner(spaces=spaces)
    module = lrn.module["default_policy"]
    calls = []
    original = module.compute_values

    def spy(*args, **kwargs):
        calls.append(1)
        return original(*args, **kwargs)

    module.compute_values = spy  # what value_pass does: an instance attribute
    lrn.update(episodes=episodes, timesteps={"num_env_steps_sampled_lifetime": 1})
    assert calls


def test_rllib_grad_scaler_setting_exists_and_defaults_to_none():
    assert AlgorithmConfig()._torch_grad_scaler_class is None
    cfg = AlgorithmConfig().experimental(_torch_grad_scaler_class=torch.amp.GradScaler)
    assert cfg._torch_grad_scaler_class is torch.amp.GradScaler


@pytest.mark.parametrize("algo", sorted(ALGORITHMS))
@pytest.mark.parametrize("hook", ["_forward_exploration", "_forward_inference"])
def test_forward_hooks_we_autocast_are_what_forward_calls(algo, hook):
    cfg = ALGORITHMS[algo].config_class().rl_module(model_config={"fcnet_hiddens": [8]})
    module = cfg.get_rl_module_spec(spaces={"default_policy": (OBS, ACT)}).build()
    assert callable(getattr(type(module), hook, None)), f"{type(module).__name__}.{hook} is gone"
    calls = []
    original = getattr(module, hook)

    def spy(batch, **kwargs):
        calls.append(1)
        return original(batch, **kwargs)

    setattr(module, hook, spy)  # what autocast_forwards does: an instance attribute
    kwargs = {"t": 0} if hook == "_forward_exploration" else {}  # DQN's epsilon schedule
    getattr(module, hook.lstrip("_"))({"obs": torch.zeros(2, 4)}, **kwargs)
    assert calls == [1]


def test_missing_forward_hooks_warn_once_per_class(monkeypatch, caplog):
    monkeypatch.setattr(inference, "_warned_missing", set())

    class NoHooks:
        pass

    caplog.set_level(logging.WARNING, logger="rllib_amp")
    precision = resolve(AmpSettings(dtype="bfloat16"), "cpu")
    for _ in range(2):
        inference.autocast_forwards(NoHooks(), precision)
    records = [r for r in caplog.records if getattr(r, "amp_event", None)]
    assert [(r.levelname, r.amp_event, r.amp_fields["method"]) for r in records] == [
        ("WARNING", "inference_autocast_skipped", "_forward_exploration"),
        ("WARNING", "inference_autocast_skipped", "_forward_inference"),
    ]
    assert {r.amp_fields["module_class"] for r in records} == {NoHooks.__qualname__}
