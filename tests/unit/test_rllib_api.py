"""The RLlib internals rllib-amp overrides still exist with the signatures we rely on.

A Ray upgrade that renames or reshapes any of these must fail here, loudly, instead of
silently training without AMP.
"""

from __future__ import annotations

import inspect

import pytest
import ray
from ray.rllib.algorithms.appo.torch.appo_torch_learner import APPOTorchLearner
from ray.rllib.algorithms.dqn.torch.dqn_torch_learner import DQNTorchLearner
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.connectors.learner import general_advantage_estimation
from ray.rllib.core.learner.learner import Learner
from ray.rllib.core.learner.torch.torch_learner import TorchLearner

from rllib_amp.learner import AmpLearnerMixin

P = inspect.Parameter

# method -> the parameters (name, kind) our override passes through, in order.
EXPECTED = {
    "build": [],
    "_uncompiled_update": [("batch", P.POSITIONAL_OR_KEYWORD)],
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
    "_compute_off_policyness": [("batch", P.POSITIONAL_OR_KEYWORD)],
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


def test_every_mixin_override_is_listed_here():
    overridden = {
        n for n, v in vars(AmpLearnerMixin).items() if callable(v) and hasattr(TorchLearner, n)
    }
    assert overridden <= set(EXPECTED), overridden - set(EXPECTED)


def test_torch_update_step_order_is_what_the_mixin_mirrors():
    src = inspect.getsource(TorchLearner._uncompiled_update)
    order = [
        "_compute_off_policyness(",
        "forward_train(",
        "compute_losses(",
        "compute_gradients(",
        "no_sync()",
        "postprocess_gradients(",
        "apply_gradients(",
    ]
    positions = [src.find(token) for token in order]
    assert -1 not in positions, dict(zip(order, positions))
    assert positions == sorted(positions)


def test_stock_apply_gradients_still_has_the_defects_we_work_around():
    src = inspect.getsource(TorchLearner.apply_gradients)
    assert "nan_to_num" in src  # hides overflow from a scaler (we never call it)
    assert "_lr_scheduler_classes" in src  # we build lr schedulers the same way
    assert "unscale_" not in inspect.getsource(TorchLearner)  # RLlib never unscales


def test_learner_internals_we_read_are_set_where_we_expect():
    init_src = inspect.getsource(Learner.__init__) + inspect.getsource(TorchLearner.__init__)
    for attr in (
        "_optimizer_parameters",
        "_params",
        "_module_optimizers",
        "_lr_scheduler_classes",
        "_lr_schedulers",
    ):
        assert f"self.{attr}" in init_src, attr
    assert "self._device" in inspect.getsource(TorchLearner.build)


def test_gae_connector_calls_compute_values_on_each_module():
    src = inspect.getsource(general_advantage_estimation)
    assert "module.compute_values(" in src
    assert "convert_to_numpy(module_vf_preds)" in src
