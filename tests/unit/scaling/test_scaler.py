import copy

import pytest
import torch
from torch import nn

from rllib_amp import AmpSettings
from rllib_amp.scaling.scaler import PolicyScaler


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


def test_recheck_skips_gradients_replaced_with_nan_after_unscale_without_backoff():
    scaler = PolicyScaler(AmpSettings(init_scale=64.0), "cpu", scaling=True)
    net, opt = _setup()
    scaler.scale(_finite_loss(net)).backward()
    scaler.unscale_([opt])  # found no inf
    net.weight.grad = torch.full_like(net.weight, float("nan"))
    weights = net.weight.detach().clone()
    assert scaler.step([opt], recheck=True) is True
    assert torch.equal(net.weight, weights)
    assert scaler.get_scale() == 64.0 and scaler.skipped_steps_lifetime == 1


def test_discarded_unscale_still_updates_the_scale_once():
    """New gradients replace an unscaled step that never came: the overflow it saw counts."""
    scaler = PolicyScaler(AmpSettings(init_scale=64.0), "cpu", scaling=True)
    net, opt = _setup()
    scaler.scale(_inf_loss(net)).backward()
    scaler.unscale_([opt])
    scaler.discard_pending()
    assert scaler.get_scale() == 32.0 and scaler.optimizer_steps_lifetime == 0
    assert _step(scaler, net, opt, _finite_loss) is False  # the next step works normally


# -- restores under PBT: what comes from the checkpoint, what from this run's settings --------
def test_restore_keeps_live_scale_and_this_runs_factors_not_init_scale():
    """A donor's state into a recipient with other settings (a PBT exploit)."""
    donor = PolicyScaler(AmpSettings(init_scale=2.0**16, growth_interval=2000), "cpu", scaling=True)
    net, opt = _setup()
    for _ in range(3):
        _step(donor, net, opt, _inf_loss)
    _step(donor, net, opt, _finite_loss)
    assert (donor.get_scale(), donor.growth_tracker) == (2.0**13, 1)

    mutated = AmpSettings(init_scale=8.0, growth_interval=2, backoff_factor=0.25)
    recipient = PolicyScaler(mutated, "cpu", scaling=True)
    recipient.load_state_dict(copy.deepcopy(donor.state_dict()))
    assert recipient.get_scale() == 2.0**13  # the donor's live scale, not init_scale 8
    assert recipient.growth_tracker == 1
    assert (recipient.optimizer_steps_lifetime, recipient.skipped_steps_lifetime) == (4, 3)
    torch_state = recipient.state_dict()["torch"]
    assert (torch_state["growth_interval"], torch_state["backoff_factor"]) == (2, 0.25)
    # ...and the recipient's own interval and backoff are what act from here on.
    net2, opt2 = _setup()
    _step(recipient, net2, opt2, _finite_loss)
    assert recipient.get_scale() == 2.0**14  # tracker 1 + 1 clean step = interval 2
    _step(recipient, net2, opt2, _inf_loss)
    assert recipient.get_scale() == 2.0**12  # backoff 0.25


def test_restored_tracker_beyond_a_shorter_interval_still_grows():
    """torch grows when the tracker *equals* the interval: a larger one is capped."""
    donor = PolicyScaler(AmpSettings(init_scale=64.0, growth_interval=100), "cpu", scaling=True)
    net, opt = _setup()
    for _ in range(7):
        _step(donor, net, opt, _finite_loss)
    assert donor.growth_tracker == 7
    recipient = PolicyScaler(AmpSettings(init_scale=64.0, growth_interval=5), "cpu", scaling=True)
    recipient.load_state_dict(donor.state_dict())
    assert recipient.growth_tracker == 4
    _step(recipient, net, opt, _finite_loss)
    assert recipient.get_scale() == 128.0


def _two_sharing(**settings):
    s = AmpSettings(**settings)
    a = PolicyScaler(s, "cpu", scaling=True)
    return a, PolicyScaler(s, "cpu", scaling=True, share_scale_with=a)


def _unscale_then_step(pairs):
    """One learner step: every module unscales, then every module steps (ScalerSet's order)."""
    for scaler, net, opt, loss_fn in pairs:
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss_fn(net)).backward()
        scaler.unscale_([opt])
    return [scaler.step([opt]) for scaler, _, opt, _ in pairs]


def test_shared_scale_backs_off_once_and_each_module_skips_only_its_own_step():
    a, b = _two_sharing(init_scale=1024.0, growth_interval=2)
    (na, oa), (nb, ob) = _setup(0), _setup(1)
    wa = na.weight.detach().clone()
    wb = nb.weight.detach().clone()
    skipped = _unscale_then_step([(a, na, oa, _finite_loss), (b, nb, ob, _inf_loss)])
    assert skipped == [False, True]
    assert not torch.equal(na.weight, wa) and torch.equal(nb.weight, wb)
    assert a.get_scale() == b.get_scale() == 512.0  # one backoff, not one per module
    assert (a.skipped_steps_lifetime, b.skipped_steps_lifetime) == (0, 1)
    assert a.shares_scale_with(b)

    # Growth needs growth_interval steps in which no sharing module overflowed.
    for _ in range(2):
        assert _unscale_then_step([(a, na, oa, _finite_loss), (b, nb, ob, _finite_loss)]) == [
            False,
            False,
        ]
    assert a.get_scale() == b.get_scale() == 1024.0
    assert a.growth_tracker == b.growth_tracker == 0


def test_separate_scalers_do_not_share():
    s = AmpSettings(init_scale=1024.0)
    a, b = PolicyScaler(s, "cpu", scaling=True), PolicyScaler(s, "cpu", scaling=True)
    (na, oa), (nb, ob) = _setup(0), _setup(1)
    _unscale_then_step([(a, na, oa, _finite_loss), (b, nb, ob, _inf_loss)])
    assert (a.get_scale(), b.get_scale()) == (1024.0, 512.0)
    assert not a.shares_scale_with(b)


def test_sharing_needs_the_same_scaling():
    a = PolicyScaler(AmpSettings(), "cpu", scaling=True)
    with pytest.raises(ValueError, match="same scaling"):
        PolicyScaler(AmpSettings(), "cpu", scaling=False, share_scale_with=a)


def test_seed_scalers_gives_a_shared_scale_the_smallest_seed():
    from rllib_amp.scaling.scaler import seed_scalers

    a, b = _two_sharing(growth_interval=10)
    c = PolicyScaler(AmpSettings(growth_interval=10), "cpu", scaling=True)
    seed_scalers({"a": a, "b": b, "c": c}, {"a": (4096.0, 2), "b": (64.0, 7), "c": (8.0, 1)})
    assert (a.get_scale(), a.growth_tracker) == (b.get_scale(), b.growth_tracker) == (64.0, 7)
    assert (c.get_scale(), c.growth_tracker) == (8.0, 1)


def test_restore_into_a_shared_scale_continues_at_the_smallest_saved_scale():
    """A checkpoint with a scaler per module, restored into a run with shared_scaler."""
    from rllib_amp.scaling.state import AMP_STATE_KEY, restore_scaler_state

    saved = {}
    for mid, scale in (("p0", 2.0**14), ("p1", 2.0**6)):
        s = PolicyScaler(AmpSettings(), "cpu", scaling=True)
        s.seed(scale, 3)
        s.skipped_steps_lifetime = 1 if mid == "p0" else 9
        s.optimizer_steps_lifetime = 20
        saved[mid] = s.state_dict()
    a, b = _two_sharing(growth_interval=50)
    restore_scaler_state({"p0": a, "p1": b}, {AMP_STATE_KEY: saved}, amp_enabled=True, full=True)
    assert a.get_scale() == b.get_scale() == 2.0**6 and a.growth_tracker == 3
    assert (a.skipped_steps_lifetime, b.skipped_steps_lifetime) == (1, 9)  # each its own


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan")])
def test_the_finite_check_finds_any_bad_value_and_leaves_the_gradients_as_they_are(bad):
    from rllib_amp.scaling.scaler import grads_are_finite

    params = [nn.Parameter(torch.zeros(3, 5)), nn.Parameter(torch.zeros(7, dtype=torch.float64))]
    opt = torch.optim.SGD(params, lr=0.1)
    for p in params:
        p.grad = torch.randn_like(p) * 1e30
    kept = [p.grad.clone() for p in params]
    assert grads_are_finite([opt])
    assert all(torch.equal(p.grad, k) for p, k in zip(params, kept, strict=True))
    params[1].grad[4] = bad  # in the second dtype group, last tensor
    assert not grads_are_finite([opt])
    params[1].grad[4] = 0.0
    params[0].grad = params[0].grad.to_sparse()
    assert grads_are_finite([opt])
    params[0].grad = torch.sparse_coo_tensor([[1], [2]], [bad], (3, 5), check_invariants=True)
    assert not grads_are_finite([opt])


def test_a_float16_step_follows_what_the_grad_scalers_unscale_recorded():
    net, opt = _setup()
    scaler = PolicyScaler(AmpSettings(init_scale=4.0), "cpu", scaling=True)
    stepped = []
    opt.step = lambda *a, **k: stepped.append(True)  # the step is a plain optimizer step
    assert not _step(scaler, net, opt, _finite_loss) and stepped == [True]
    assert _step(scaler, net, opt, _inf_loss) and stepped == [True]
    assert scaler.get_scale() == 2.0  # the GradScaler backed off once, from its own record
