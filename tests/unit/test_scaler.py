import copy

import pytest
import torch
from torch import nn

from rllib_amp import AmpSettings
from rllib_amp.scaler import PolicyScaler


def _setup(seed=0):
    torch.manual_seed(seed)
    net = nn.Linear(4, 1)
    opt = torch.optim.Adam(net.parameters(), lr=0.1)
    return net, opt


def _step(scaler, net, opt, loss_fn):
    opt.zero_grad(set_to_none=True)
    loss = loss_fn(net)
    scaler.scale(loss).backward()
    scaler.unscale_([opt])
    return scaler.step([opt])


def _finite_loss(net):
    return net(torch.ones(2, 4)).pow(2).mean()


def _inf_loss(net):
    return net(torch.ones(2, 4)).mean() * float("inf")


@pytest.mark.parametrize("scaling", [True, False])
def test_overflow_skips_step_leaves_state_untouched_and_counts(scaling):
    s = AmpSettings(init_scale=1024.0, backoff_factor=0.25, growth_interval=3)
    scaler = PolicyScaler(s, "cpu", scaling=scaling)
    net, opt = _setup()
    assert _step(scaler, net, opt, _finite_loss) is False  # builds Adam state
    weights = copy.deepcopy(net.state_dict())
    opt_state = copy.deepcopy(opt.state_dict())

    assert _step(scaler, net, opt, _inf_loss) is True
    for k, v in net.state_dict().items():
        assert torch.equal(v, weights[k])
    after = opt.state_dict()
    for pid, st in opt_state["state"].items():
        for k, v in st.items():
            assert torch.equal(after["state"][pid][k], v), k
    assert scaler.skipped_steps_lifetime == 1
    assert scaler.optimizer_steps_lifetime == 2
    assert scaler.pop_window() == (2, 1)
    assert scaler.pop_window() == (0, 0)
    assert scaler.get_scale() == (1024.0 * 0.25 if scaling else 1.0)


def test_scale_grows_after_growth_interval_clean_steps():
    scaler = PolicyScaler(AmpSettings(init_scale=8.0, growth_interval=3), "cpu", scaling=True)
    net, opt = _setup()
    for i in range(3):
        assert scaler.get_scale() == 8.0, i
        _step(scaler, net, opt, _finite_loss)
    assert scaler.get_scale() == 16.0
    assert scaler.growth_tracker == 0


def test_gradients_are_true_scale_after_unscale():
    net, opt = _setup()
    ref = copy.deepcopy(net)
    ref(torch.ones(2, 4)).pow(2).mean().backward()
    scaler = PolicyScaler(AmpSettings(init_scale=4096.0), "cpu", scaling=True)
    loss = _finite_loss(net)
    scaler.scale(loss).backward()
    assert torch.allclose(net.weight.grad, ref.weight.grad * 4096.0)
    scaler.unscale_([opt])
    assert torch.allclose(net.weight.grad, ref.weight.grad)


def test_multiple_optimizers_step_together_or_not_at_all():
    torch.manual_seed(0)
    a, b = nn.Linear(4, 1), nn.Linear(4, 1)
    oa, ob = torch.optim.SGD(a.parameters(), lr=0.1), torch.optim.SGD(b.parameters(), lr=0.1)
    scaler = PolicyScaler(AmpSettings(init_scale=2.0), "cpu", scaling=True)
    wa, wb = a.weight.detach().clone(), b.weight.detach().clone()
    x = torch.ones(1, 4)
    loss = a(x).sum() + b(x).sum() * float("inf")  # only b overflows
    scaler.scale(loss).backward()
    scaler.unscale_([oa, ob])
    assert scaler.step([oa, ob]) is True
    assert torch.equal(a.weight, wa) and torch.equal(b.weight, wb)
    assert scaler.get_scale() == 1.0  # update() ran once: one backoff, not two


def test_state_round_trip_continues_scale_and_tracker():
    s = AmpSettings(init_scale=64.0, growth_interval=5)
    scaler = PolicyScaler(s, "cpu", scaling=True)
    net, opt = _setup()
    _step(scaler, net, opt, _inf_loss)
    _step(scaler, net, opt, _finite_loss)
    _step(scaler, net, opt, _finite_loss)
    state = scaler.state_dict()
    fresh = PolicyScaler(s, "cpu", scaling=True)
    fresh.load_state_dict(copy.deepcopy(state))
    assert fresh.get_scale() == scaler.get_scale() == 32.0
    assert fresh.growth_tracker == scaler.growth_tracker == 2
    assert fresh.skipped_steps_lifetime == 1 and fresh.optimizer_steps_lifetime == 3
    # Same future: three more clean steps grow both scales at the same step.
    net2, opt2 = _setup()
    for _ in range(3):
        _step(scaler, net, opt, _finite_loss)
        _step(fresh, net2, opt2, _finite_loss)
        assert fresh.get_scale() == scaler.get_scale()
    assert fresh.get_scale() == 64.0


def test_load_rejects_foreign_state():
    scaler = PolicyScaler(AmpSettings(), "cpu", scaling=True)
    with pytest.raises(ValueError, match="rllib-amp"):
        scaler.load_state_dict({"scale": 2.0})


def test_bf16_state_restores_counters_only():
    src = PolicyScaler(AmpSettings(), "cpu", scaling=False)
    net, opt = _setup()
    _step(src, net, opt, _inf_loss)
    dst = PolicyScaler(AmpSettings(init_scale=8.0), "cpu", scaling=True)
    dst.load_state_dict(src.state_dict())
    assert dst.skipped_steps_lifetime == 1
    assert dst.get_scale() == 8.0


@pytest.mark.parametrize("scaling", [True, False])
def test_step_without_unscale_takes_gradients_as_true_scale(scaling):
    """Gradients given from outside (no scaled backward): checked, stepped, scale kept."""
    scaler = PolicyScaler(AmpSettings(init_scale=8.0, growth_interval=1), "cpu", scaling=scaling)
    net, opt = _setup()
    before = net.weight.detach().clone()
    net.weight.grad = torch.ones_like(net.weight)
    net.bias.grad = torch.ones_like(net.bias)
    assert scaler.step([opt]) is False
    # Adam's first step moves each weight by lr against the gradient's sign, unscaled.
    assert torch.allclose(net.weight, before - 0.1)
    assert scaler.get_scale() == (8.0 if scaling else 1.0)  # no growth: nothing was scaled

    net.weight.grad[0, 0] = float("nan")
    weights = net.weight.detach().clone()
    assert scaler.step([opt]) is True
    assert torch.equal(net.weight, weights)
    assert (scaler.optimizer_steps_lifetime, scaler.skipped_steps_lifetime) == (2, 1)
    assert scaler.get_scale() == (8.0 if scaling else 1.0)  # no backoff either


def test_unscale_twice_for_one_step_is_refused():
    scaler = PolicyScaler(AmpSettings(), "cpu", scaling=True)
    net, opt = _setup()
    scaler.scale(_finite_loss(net)).backward()
    scaler.unscale_([opt])
    with pytest.raises(RuntimeError, match="already called for this step"):
        scaler.unscale_([opt])


def test_discarded_unscale_still_updates_the_scale_once():
    """New gradients replace an unscaled step that never came: the overflow it saw counts."""
    scaler = PolicyScaler(AmpSettings(init_scale=64.0), "cpu", scaling=True)
    net, opt = _setup()
    scaler.scale(_inf_loss(net)).backward()
    scaler.unscale_([opt])
    scaler.discard_pending()
    assert scaler.get_scale() == 32.0 and scaler.optimizer_steps_lifetime == 0
    assert _step(scaler, net, opt, _finite_loss) is False  # the next step works normally
