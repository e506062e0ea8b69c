"""The AMP learner (``AmpLearnerMixin``): PPO, DQN and APPO train under AMP on CartPole
(metrics, weights, precision, logs), and RLlib's public Learner methods, driven one by one,
keep the scaler in the loop and return what stock's would.

The second part builds a stock PPO learner and ``amp_learner_class(PPOTorchLearner)`` with the
same weights (tiny nets, no Ray), calls ``compute_gradients`` / ``postprocess_gradients`` /
``apply_gradients`` directly, and compares with what stock ``TorchLearner`` does where
RLlib's docstrings say they should agree, in every precision. The losses are plain float32
functions of the weights, and the float16 scales are powers of two, so unscaled gradients equal
stock's exactly. (docs/update-step.md states the rules these tests pin.)
"""

from __future__ import annotations

import copy
import functools
import logging

import gymnasium as gym
import numpy as np
import pytest
import torch
from ray.rllib.algorithms.ppo import PPOConfig
from ray.rllib.algorithms.ppo.torch.ppo_torch_learner import PPOTorchLearner
from ray.rllib.utils.metrics import ALL_MODULES

from rllib_amp.algorithms import amp_learner_class
from rllib_amp.learner import metrics as M
from rllib_amp.settings import AmpSettings, store_in_config
from tests.integration.common import (
    all_finite,
    amp_config,
    learner,
    ppo_episodes,
    same,
    train_until_learned,
    weights,
)


# float16 APPO (about 10 s) is slow: float16 with its scaler trains PPO and DQN here, and APPO
# trains in bfloat16.
@pytest.mark.parametrize(
    "algo, dtype",
    [
        pytest.param(
            a, d, id=f"{d}-{a}", marks=[pytest.mark.slow] if (a, d) == ("APPO", "float16") else []
        )
        for d in ("bfloat16", "float16")
        for a in ("PPO", "DQN", "APPO")
    ],
)
@pytest.mark.usefixtures("ray_local")
def test_trains_under_amp(algo, dtype, caplog):
    caplog.set_level(logging.INFO, logger="rllib_amp")
    a = amp_config(algo, dtype=dtype).build_algo()
    try:
        lrn = learner(a)
        assert lrn.amp_precision.dtype == getattr(torch, dtype)
        assert lrn.amp_precision.use_scaler is (dtype == "float16")
        lines = [r.amp_fields for r in caplog.records if getattr(r, "amp_event", 0) == "precision"]
        assert [(f["module_id"], f["dtype"], f["scaler"]) for f in lines] == [
            ("default_policy", dtype, dtype == "float16")
        ]

        before = weights(a)
        result = train_until_learned(a, iterations=2)
        after = weights(a)
        assert all_finite(after)
        assert not same(before, after), "weights did not change"

        stats = result["learners"]["default_policy"]
        for key in M.ALL_KEYS:
            assert key in stats, key
        scaler = lrn.amp_scalers["default_policy"]
        assert stats[M.OPTIMIZER_STEPS_LIFETIME] > 0
        if algo == "APPO":
            # APPO's learner thread may have stepped on since the result was reported.
            assert stats[M.OPTIMIZER_STEPS_LIFETIME] <= scaler.optimizer_steps_lifetime
            assert stats[M.SKIPPED_STEPS_LIFETIME] <= scaler.skipped_steps_lifetime
        else:
            assert stats[M.GRAD_SCALE] == scaler.get_scale()
            assert stats[M.OPTIMIZER_STEPS_LIFETIME] == scaler.optimizer_steps_lifetime
            assert stats[M.SKIPPED_STEPS_LIFETIME] == scaler.skipped_steps_lifetime
        assert 0.0 <= stats[M.SKIP_FRACTION] <= 1.0
        if dtype == "bfloat16":
            assert stats[M.GRAD_SCALE] == 1.0
        else:
            assert stats[M.GRAD_SCALE] > 1.0
    finally:
        a.stop()


@pytest.mark.parametrize("amp", [{"enabled": False}, {"dtype": "bfloat16"}], ids=["off", "bf16"])
@pytest.mark.usefixtures("ray_local")
def test_appos_loss_gets_bootstrap_steps_without_weight(amp, monkeypatch, caplog):
    """RLlib's APPO loss sees +inf behaviour log-probs at the masked (bootstrap) steps, in
    every precision (rllib_amp.learner.vtrace), training stays finite, and the learner says
    once that its loss differs from RLlib's there."""
    caplog.set_level(logging.INFO, logger="rllib_amp")
    from ray.rllib.algorithms.appo.torch.appo_torch_learner import APPOTorchLearner
    from ray.rllib.core.columns import Columns

    seen = []
    rllib_loss = APPOTorchLearner.compute_loss_for_module

    def spy(self, *, batch, **kwargs):
        seen.append((batch[Columns.LOSS_MASK].bool(), batch[Columns.ACTION_LOGP].clone()))
        return rllib_loss(self, batch=batch, **kwargs)

    monkeypatch.setattr(APPOTorchLearner, "compute_loss_for_module", spy)
    a = amp_config("APPO", **amp).build_algo()
    try:
        train_until_learned(a, iterations=2)
        assert all_finite(weights(a))
        # The +inf is safe because no gradient reaches the old policy's log-probs: RLlib builds
        # APPO's target networks without gradients (a module that trains them would get nan).
        module = learner(a).module["default_policy"].unwrapped()
        targets = [t for _, t in module.get_target_network_pairs()]
        assert targets and not any(p.requires_grad for t in targets for p in t.parameters())
    finally:
        a.stop()
    said = [r for r in caplog.records if getattr(r, "amp_event", None) == "vtrace_bootstrap"]
    assert len(said) == 1 and "docs/update-step.md" in said[0].getMessage()
    assert seen
    for mask, logp in seen:
        assert (~mask).any(), "no bootstrap step in the batch"
        assert torch.isinf(logp[~mask]).all() and torch.isfinite(logp[mask]).all()


@pytest.mark.usefixtures("ray_local")
def test_forward_runs_in_low_precision_and_loss_in_float32():
    """The module's forward_train sees autocast; the loss inputs are float32."""
    a = amp_config("PPO", dtype="bfloat16").build_algo()
    try:
        lrn = learner(a)
        seen: dict[str, torch.dtype] = {}
        module = lrn.module["default_policy"]
        first_linear = next(m for m in module.modules() if isinstance(m, torch.nn.Linear))

        def record(m, i, o):
            seen.setdefault("linear_out", o.dtype)  # returns None: output unchanged

        first_linear.register_forward_hook(record)
        original = lrn.compute_loss_for_module

        def spy(*, module_id, config, batch, fwd_out):
            seen["loss_in"] = fwd_out["action_dist_inputs"].dtype
            loss = original(module_id=module_id, config=config, batch=batch, fwd_out=fwd_out)
            seen["loss_out"] = loss.dtype
            return loss

        lrn.compute_loss_for_module = spy
        train_until_learned(a)
        assert seen == {
            "linear_out": torch.bfloat16,
            "loss_in": torch.float32,
            "loss_out": torch.float32,
        }
    finally:
        a.stop()


@pytest.mark.usefixtures("ray_local")
def test_large_init_scale_overflows_are_skipped_and_scale_backs_off():
    """float16 with a scale of 2**100: every step overflows, none reaches the weights."""
    a = amp_config("PPO", dtype="float16", init_scale=2.0**100).build_algo()
    try:
        before = weights(a)
        result = train_until_learned(a)
        stats = result["learners"]["default_policy"]
        n = stats[M.OPTIMIZER_STEPS_LIFETIME]
        assert n > 0
        assert stats[M.SKIPPED_STEPS_LIFETIME] == n
        assert stats[M.SKIP_FRACTION] == 1.0
        assert stats[M.GRAD_SCALE] == 2.0**100 * 0.5**n
        assert same(before, weights(a))
    finally:
        a.stop()


# RLlib's public Learner methods, driven one by one, with the scaler in the loop.
#
# Each test builds a stock PPO learner and ``amp_learner_class(PPOTorchLearner)`` with the same
# weights (tiny nets, no Ray), calls ``compute_gradients`` / ``postprocess_gradients`` /
# ``apply_gradients`` directly, and compares with what stock ``TorchLearner`` does where
# RLlib's docstrings say they should agree, in every precision: every method returns what
# stock's would. The losses are plain float32 functions of the weights, and the float16 scales
# are powers of two, so unscaled gradients equal stock's exactly. (docs/update-step.md states
# the rules these tests pin.)


OBS = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
ACT = gym.spaces.Discrete(2)
DTYPES = ["bfloat16", "float16"]
ALL_DTYPES = ["float32", *DTYPES]
SCALE = 2.0**10


def _settings(dtype, **kwargs):
    if dtype == "float32":
        return AmpSettings(enabled=False, **kwargs)
    return AmpSettings(dtype=dtype, **kwargs)


def _pair(dtype, module_ids=("default_policy",), lr_schedulers=None, **training):
    """(stock learner, AMP learner) with identical weights."""
    cfg = PPOConfig().rl_module(model_config={"fcnet_hiddens": [8]}).debugging(seed=0)
    if lr_schedulers:
        cfg.experimental(_torch_lr_scheduler_classes=lr_schedulers)
    if training:
        cfg.training(**training)
    if module_ids != ("default_policy",):
        cfg.multi_agent(policies=set(module_ids), policy_mapping_fn=lambda aid, *a, **k: "p0")
    spaces = {mid: (OBS, ACT) for mid in module_ids}
    stock = cfg.copy(copy_frozen=False).learners(learner_class=PPOTorchLearner)
    stock = stock.build_learner(spaces=spaces)
    amp_cfg = cfg.copy(copy_frozen=False).learners(learner_class=amp_learner_class(PPOTorchLearner))
    store_in_config(amp_cfg, _settings(dtype, init_scale=SCALE))
    amp = amp_cfg.build_learner(spaces=spaces)
    amp.module.set_state(stock.module.get_state())
    return stock, amp


def _params(lrn, mid):
    return list(lrn.module[mid].parameters())


def _own_loss(lrn, mid, c=0.01):
    return sum((p**2).sum() for p in _params(lrn, mid)) * c


def _coupled_loss(lrn):
    """A loss over both modules that no single module's loss could express."""
    return _own_loss(lrn, "p0") * _own_loss(lrn, "p1", c=1.0)


def _named(lrn, grads):
    """Gradient dict (keyed by parameter) -> {module.param name: gradient}."""
    names = {
        id(p): f"{mid}.{n}"
        for mid, module in lrn.module.items()
        for n, p in module.named_parameters()
    }
    return {names[id(pid)]: g.detach().clone() for pid, g in grads.items() if g is not None}


def _weights(lrn):
    return {
        f"{mid}.{n}": p.detach().clone()
        for mid, module in lrn.module.items()
        for n, p in module.named_parameters()
    }


def _assert_same(a, b, *, exact=True):
    assert a.keys() == b.keys()
    for k in a:
        if exact:
            assert torch.equal(a[k], b[k]), k
        else:
            torch.testing.assert_close(a[k], b[k], msg=k)


def _set_scale(scaler, scale):
    scaler.load_state_dict({**scaler.state_dict(), "torch": {"scale": scale, "_growth_tracker": 0}})


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("keys", ["all_modules", "module_and_all_modules"])
def test_all_modules_loss_is_summed_like_stock(dtype, keys):
    stock, amp = _pair(dtype)
    mid = "default_policy"

    def losses(lrn):
        out = {ALL_MODULES: _own_loss(lrn, mid, c=0.03)}
        if keys == "module_and_all_modules":
            out[mid] = _own_loss(lrn, mid)  # stock sums every value: both count
        return out

    expected = _named(stock, stock.compute_gradients(losses(stock)))
    grads = amp.compute_gradients(losses(amp))
    _assert_same(_named(amp, grads), expected)  # true scale, not times the loss scale
    _assert_same(_named(amp, amp.postprocess_gradients(grads)), expected)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_a_loss_over_two_modules_gets_each_modules_own_scale(dtype):
    stock, amp = _pair(dtype, module_ids=("p0", "p1"))
    if dtype == "float16":
        _set_scale(amp.amp_scalers["p1"], 2.0**3)  # the two scalers disagree

    def losses(lrn):
        return {"p0": _own_loss(lrn, "p0"), ALL_MODULES: _coupled_loss(lrn)}

    expected = _named(stock, stock.compute_gradients(losses(stock)))
    _assert_same(_named(amp, amp.compute_gradients(losses(amp))), expected)
    grads = {p: p.grad for mid in ("p0", "p1") for p in _params(amp, mid)}
    _assert_same(_named(amp, amp.postprocess_gradients(grads)), expected)
    amp.apply_gradients(grads)
    stock.apply_gradients(stock.compute_gradients(losses(stock)))
    _assert_same(_weights(amp), _weights(stock), exact=False)  # fused vs stock Adam kernel


class _GradientLog:
    """A custom learner that reads the gradients between compute and postprocess."""

    seen: list

    def compute_gradients(self, loss_per_module, **kwargs):
        grads = super().compute_gradients(loss_per_module, **kwargs)
        self.seen.append({pid: g.detach().clone() for pid, g in grads.items()})
        return grads


@pytest.fixture(scope="module")
def cartpole():
    cfg, episodes, spaces = ppo_episodes(64, hiddens=8)
    # The critic's targets come from the value pass, which runs in low precision too, and
    # its loss is clipped (vf_clip_param): its gradient differs from float32's by more than
    # the forward's rounding. The policy's gradient is what this comparison is about.
    return cfg.copy(copy_frozen=False).training(vf_loss_coeff=0.0), episodes, spaces


def _logged_gradients(cartpole, dtype):
    cfg, episodes, spaces = cartpole
    cls = type("LoggingLearner", (_GradientLog, amp_learner_class(PPOTorchLearner)), {})
    cfg = cfg.copy(copy_frozen=False).learners(learner_class=cls)
    store_in_config(cfg, _settings(dtype))  # float16: the default scale, 65536
    torch.manual_seed(0)
    lrn = cfg.build_learner(spaces=spaces)
    lrn.seen = []
    lrn.update(episodes=copy.deepcopy(episodes), timesteps={"num_env_steps_sampled_lifetime": 1})
    assert len(lrn.seen) == 1
    return lrn, lrn.seen[0]


@pytest.mark.parametrize("dtype", DTYPES)
def test_update_hands_a_custom_learner_true_gradients(cartpole, dtype):
    """RLlib's update step on CartPole PPO: compute_gradients' output matches float32's."""
    _, want = _logged_gradients(cartpole, "float32")
    lrn, got = _logged_gradients(cartpole, dtype)
    if dtype == "float16":
        assert lrn.amp_scalers["default_policy"].get_scale() == 2.0**16
    assert len(got) == len(want)
    # A low-precision forward: close to float32's gradient (bfloat16 keeps 8 bits of
    # mantissa, float16 11), never 65536 times it.
    tolerance = {"float16": 0.05, "bfloat16": 0.25}[dtype]
    for g, w in zip(got.values(), want.values()):
        assert (g - w).norm() <= tolerance * w.norm() + 1e-6


@pytest.mark.parametrize("clip_by", ["value", "global_norm"])
def test_an_overflow_is_found_before_clipping_and_skips_the_step(clip_by):
    """Clipping by value turns inf into a finite number: the scaler must have seen it first."""
    _, amp = _pair("float16", grad_clip=0.01, grad_clip_by=clip_by)
    mid = "default_policy"
    amp.apply_gradients(amp.compute_gradients({mid: _own_loss(amp, mid)}))  # Adam has state
    weights = _weights(amp)
    opt_state = [copy.deepcopy(o.state_dict()) for _, o in amp.get_optimizers_for_module(mid)]
    scaler = amp.amp_scalers[mid]

    grads = amp.compute_gradients({mid: _own_loss(amp, mid, c=1e36)})  # x scale > float32 max
    assert any(not torch.isfinite(g).all() for g in grads.values())
    amp.apply_gradients(amp.postprocess_gradients(grads))

    _assert_same(_weights(amp), weights)
    for saved, (_, opt) in zip(opt_state, amp.get_optimizers_for_module(mid)):
        for pid, st in saved["state"].items():
            for k, v in st.items():
                assert torch.equal(opt.state_dict()["state"][pid][k], v), k
    assert (scaler.optimizer_steps_lifetime, scaler.skipped_steps_lifetime) == (2, 1)
    assert scaler.get_scale() == SCALE / 2  # backed off once


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_replaced_after_compute_gradients_are_checked_again(dtype, caplog):
    """A custom postprocess that returns new tensors holding nan: never stepped on."""
    _, amp = _pair(dtype)
    mid = "default_policy"
    weights = _weights(amp)
    grads = amp.compute_gradients({mid: _own_loss(amp, mid)})  # finite: unscale_ found none
    replaced = {pid: g * float("nan") for pid, g in grads.items()}
    caplog.set_level(logging.WARNING, logger="rllib_amp")
    amp.apply_gradients(replaced)
    _assert_same(_weights(amp), weights)
    scaler = amp.amp_scalers[mid]
    assert (scaler.optimizer_steps_lifetime, scaler.skipped_steps_lifetime) == (1, 1)
    assert scaler.get_scale() == (SCALE if dtype == "float16" else 1.0)  # not an overflow
    assert [r.amp_event for r in caplog.records if getattr(r, "amp_event", None)] == [
        "nonfinite_gradients"
    ]


@pytest.mark.parametrize("dtype", DTYPES)
def test_gradients_are_unscaled_once_whatever_the_caller_repeats(dtype):
    """Postprocessing twice, or computing twice before a step, never unscales twice."""
    stock, amp = _pair(dtype)
    mid = "default_policy"
    for lrn in (stock, amp):
        lrn.compute_gradients({mid: _own_loss(lrn, mid, c=5.0)})  # abandoned: no step
        grads = lrn.compute_gradients({mid: _own_loss(lrn, mid)})
        grads = lrn.postprocess_gradients(lrn.postprocess_gradients(grads))
        lrn.apply_gradients(grads)
    _assert_same(_weights(amp), _weights(stock), exact=False)
    scaler = amp.amp_scalers[mid]
    assert (scaler.optimizer_steps_lifetime, scaler.skipped_steps_lifetime) == (1, 0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_apply_gradients_on_its_own_steps_like_stock(dtype):
    stock, amp = _pair(dtype)
    mid = "default_policy"
    grads = {name: torch.full_like(p, 0.5) for name, p in stock.module[mid].named_parameters()}

    def given(lrn):
        return {p: grads[n].clone() for n, p in lrn.module[mid].named_parameters()}

    before = _weights(amp)
    stock.apply_gradients(given(stock))
    amp.apply_gradients(given(amp))
    after = _weights(amp)
    assert not torch.equal(
        after[f"{mid}.{next(iter(grads))}"], before[f"{mid}.{next(iter(grads))}"]
    )
    _assert_same(after, _weights(stock), exact=False)  # fused vs stock Adam kernel
    scaler = amp.amp_scalers[mid]
    assert (scaler.optimizer_steps_lifetime, scaler.skipped_steps_lifetime) == (1, 0)
    # No scaled backward happened: the scale has nothing to learn from this step.
    assert scaler.get_scale() == (SCALE if dtype == "float16" else 1.0)
    assert scaler.growth_tracker == 0


@pytest.mark.parametrize("dtype", DTYPES)
def test_apply_gradients_on_its_own_skips_inf_loudly(dtype, caplog):
    _, amp = _pair(dtype)
    mid = "default_policy"
    params = _params(amp, mid)
    amp.apply_gradients({p: torch.full_like(p, 0.1) for p in params})  # Adam has state now
    weights = _weights(amp)
    opt_state = [copy.deepcopy(o.state_dict()) for _, o in amp.get_optimizers_for_module(mid)]

    bad = {p: torch.full_like(p, 0.1) for p in params}
    bad[params[0]][0] = float("inf")
    caplog.set_level(logging.WARNING, logger="rllib_amp")
    amp.apply_gradients(bad)

    _assert_same(_weights(amp), weights)
    for saved, (_, opt) in zip(opt_state, amp.get_optimizers_for_module(mid)):
        for pid, st in saved["state"].items():
            for k, v in st.items():
                assert torch.equal(opt.state_dict()["state"][pid][k], v), k
    scaler = amp.amp_scalers[mid]
    assert (scaler.optimizer_steps_lifetime, scaler.skipped_steps_lifetime) == (2, 1)
    records = [r for r in caplog.records if getattr(r, "amp_event", None)]
    assert [(r.levelname, r.amp_event, r.amp_fields["module_id"]) for r in records] == [
        ("WARNING", "nonfinite_gradients", mid)
    ]


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_apply_gradients_right_after_compute_gradients_steps_like_stock(dtype):
    stock, amp = _pair(dtype)
    mid = "default_policy"
    stock.apply_gradients(stock.compute_gradients({mid: _own_loss(stock, mid)}))
    amp.apply_gradients(amp.compute_gradients({mid: _own_loss(amp, mid)}))
    _assert_same(_weights(amp), _weights(stock), exact=dtype == "float32")
    if dtype == "float32":
        return
    scaler = amp.amp_scalers[mid]
    assert (scaler.optimizer_steps_lifetime, scaler.skipped_steps_lifetime) == (1, 0)
    if dtype == "float16":
        assert scaler.get_scale() == SCALE and scaler.growth_tracker == 1  # a scaled step


@pytest.mark.parametrize("dtype", ALL_DTYPES)
@pytest.mark.parametrize("clip_by", ["global_norm", "value"])
def test_postprocess_gradients_clips_true_scale_gradients(dtype, clip_by):
    stock, amp = _pair(dtype, grad_clip=0.01, grad_clip_by=clip_by)
    mid = "default_policy"
    grads = {n: torch.full_like(p, 0.5) for n, p in stock.module[mid].named_parameters()}

    def given(lrn):
        return {p: grads[n].clone() for n, p in lrn.module[mid].named_parameters()}

    # On its own: the gradients are true-scale; clipped exactly as stock clips them.
    expected = _named(stock, stock.postprocess_gradients(given(stock)))
    _assert_same(_named(amp, amp.postprocess_gradients(given(amp))), expected)

    # After compute_gradients: already true-scale, then clipped.
    expected = _named(
        stock, stock.postprocess_gradients(stock.compute_gradients({mid: _own_loss(stock, mid)}))
    )
    got = _named(amp, amp.postprocess_gradients(amp.compute_gradients({mid: _own_loss(amp, mid)})))
    _assert_same(got, expected)


@pytest.mark.parametrize("dtype", ALL_DTYPES)
def test_torch_lr_schedulers_are_built_and_stepped_like_stock(dtype):
    """RLlib builds torch lr schedulers lazily in apply_gradients; ours repeats that part."""
    halve = functools.partial(torch.optim.lr_scheduler.StepLR, step_size=1, gamma=0.5)
    stock, amp = _pair(dtype, module_ids=("p0", "p1"), lr_schedulers=[halve])

    def lrs(lrn):
        return {
            (mid, name): opt.param_groups[0]["lr"]
            for mid in ("p0", "p1")
            for name, opt in lrn.get_optimizers_for_module(mid)
        }

    for lrn in (stock, amp):
        for _ in range(2):
            losses = {mid: _own_loss(lrn, mid) for mid in ("p0", "p1")}
            lrn.apply_gradients(lrn.compute_gradients(losses))
            lrn.after_gradient_based_update(timesteps={})
    assert {m: sorted(d) for m, d in amp._lr_schedulers.items()} == {
        m: sorted(d) for m, d in stock._lr_schedulers.items()
    }
    assert lrs(amp) == lrs(stock)
    assert set(lrs(amp).values()) == {PPOConfig().lr * 0.25}  # both modules, two halvings


@pytest.mark.parametrize("dtype", DTYPES)
def test_no_loss_means_no_gradients_and_no_step(dtype):
    stock, amp = _pair(dtype)
    assert stock.compute_gradients({}) == amp.compute_gradients({}) == {}
    weights = _weights(amp)
    amp.apply_gradients(amp.postprocess_gradients({}))
    _assert_same(_weights(amp), weights)
    assert amp.amp_scalers["default_policy"].optimizer_steps_lifetime == 0


def test_update_runs_forward_in_autocast_and_gradients_outside(monkeypatch):
    """RLlib's own update step reaches our hooks: loss in autocast, gradient work outside."""
    from ray.rllib.core.learner.learner import Learner
    from ray.rllib.core.learner.torch.torch_learner import TorchLearner

    cfg, episodes, spaces = ppo_episodes(64, hiddens=8)
    amp_cfg = cfg.copy(copy_frozen=False).learners(learner_class=amp_learner_class(PPOTorchLearner))
    store_in_config(amp_cfg, AmpSettings(dtype="bfloat16"))
    lrn = amp_cfg.build_learner(spaces=spaces)
    seen: dict[str, bool] = {}

    def record(name, method):
        def spy(*args, **kwargs):
            seen[name] = torch.is_autocast_enabled("cpu")
            return method(*args, **kwargs)

        return spy

    # Where the work happens: RLlib's own bodies, reached through our overrides' super().
    for cls, name in (
        (PPOTorchLearner, "compute_loss_for_module"),
        (TorchLearner, "compute_gradients"),
        (Learner, "postprocess_gradients"),
    ):
        monkeypatch.setattr(cls, name, record(name, getattr(cls, name)))
    for _, opt in lrn.get_optimizers_for_module("default_policy"):
        monkeypatch.setattr(opt, "step", record("optimizer.step", opt.step))
    lrn.update(episodes=episodes, timesteps={"num_env_steps_sampled_lifetime": 1})
    assert seen == {
        "compute_loss_for_module": True,
        "compute_gradients": False,
        "postprocess_gradients": False,
        "optimizer.step": False,
    }
    assert lrn.amp_scalers["default_policy"].optimizer_steps_lifetime > 0
