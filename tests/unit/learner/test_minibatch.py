"""GatherMiniBatchIterator yields RLlib's MiniBatchCyclicIterator's minibatches exactly."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
from ray.rllib.utils.minibatch_utils import MiniBatchCyclicIterator

from rllib_amp.learner.minibatch import GatherMiniBatchIterator, gather_minibatches


def _module_batch(n: int, seed: int, *, numpy_leaves: bool = False, ngu: float | None = 3):
    g = torch.Generator().manual_seed(seed)
    data = {
        "obs": torch.rand(n, 6, 5, generator=g),
        "actions": torch.randint(0, 4, (n,), generator=g),
        "nested": {"a": torch.rand(n, 2, generator=g), "b": torch.arange(n)},
        "np_col": np.arange(n, dtype=np.float32) * 0.5,
    }
    if numpy_leaves:
        data = {k: v.numpy() if isinstance(v, torch.Tensor) else v for k, v in data.items()}
    return SampleBatch(data, _num_grad_updates=ngu)


def _run(ours, batch, seed, **kwargs):
    np.random.seed(seed)
    iterator = MiniBatchCyclicIterator(copy.deepcopy(batch), **kwargs)
    if ours:  # built the way the learner builds it: from RLlib's own iterator
        iterator = gather_minibatches(iterator)
        assert isinstance(iterator, GatherMiniBatchIterator)
    out = list(iterator)
    return out, np.random.get_state()[1].copy()


def _assert_same_leaves(a, b):
    assert type(a) is type(b)
    if isinstance(a, dict):
        assert list(a) == list(b)
        for k in a:
            _assert_same_leaves(a[k], b[k])
    elif isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    else:
        np.testing.assert_array_equal(a, b)
        assert a.dtype == b.dtype


CASES = {
    # PPO's shape: the learner connector adds one row per episode, so 1024 + a few.
    "ppo-like 1028/256 x2": dict(sizes={"p": 1028}, minibatch_size=256, num_epochs=2),
    "exact multiple 1024/256 x2": dict(sizes={"p": 1024}, minibatch_size=256, num_epochs=2),
    "minibatch larger than batch": dict(sizes={"p": 37}, minibatch_size=100, num_epochs=3),
    "no shuffle": dict(sizes={"p": 50}, minibatch_size=16, num_epochs=2, shuffle=False),
    "two modules, lopsided": dict(sizes={"p0": 70, "p1": 23}, minibatch_size=16, num_epochs=2),
    "num_total_minibatches": dict(
        sizes={"p0": 40, "p1": 9}, minibatch_size=8, num_epochs=1, num_total_minibatches=11
    ),
    "numpy leaves": dict(sizes={"p": 61}, minibatch_size=20, num_epochs=3, numpy_leaves=True),
    "num_grad_updates unset": dict(sizes={"p": 45}, minibatch_size=10, num_epochs=2, ngu=None),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_same_minibatches_as_rllib(name):
    case = dict(CASES[name])
    sizes = case.pop("sizes")
    numpy_leaves = case.pop("numpy_leaves", False)
    ngu = case.pop("ngu", 3)
    shuffle = case.pop("shuffle", True)
    batch = MultiAgentBatch(
        {
            mid: _module_batch(n, i, numpy_leaves=numpy_leaves, ngu=ngu)
            for i, (mid, n) in enumerate(sizes.items())
        },
        env_steps=max(sizes.values()),
    )
    assert GatherMiniBatchIterator.supports(batch)
    kwargs = dict(case, shuffle_batch_per_epoch=shuffle)
    ours, our_rng = _run(True, batch, 7, **kwargs)
    theirs, their_rng = _run(False, batch, 7, **kwargs)

    assert len(ours) == len(theirs) > 1
    for mine, ref in zip(ours, theirs):
        assert type(mine) is MultiAgentBatch and mine.env_steps() == ref.env_steps()
        assert list(mine.policy_batches) == list(ref.policy_batches)
        for mid, ref_mb in ref.policy_batches.items():
            my_mb = mine.policy_batches[mid]
            assert type(my_mb) is SampleBatch
            assert (my_mb.count, my_mb.time_major, my_mb.zero_padded, my_mb.max_seq_len) == (
                ref_mb.count,
                ref_mb.time_major,
                ref_mb.zero_padded,
                ref_mb.max_seq_len,
            )
            assert my_mb.num_grad_updates == ref_mb.num_grad_updates
            assert my_mb.get(SampleBatch.SEQ_LENS) is None and ref_mb.get("seq_lens") is None
            _assert_same_leaves(dict(my_mb), dict(ref_mb))
    # The same numpy draws were made, so the rest of the training run is unaffected.
    np.testing.assert_array_equal(our_rng, their_rng)
    # Unshuffled, the rows run 0, 1, ..., n-1, 0, 1, ...; shuffled, they must not.
    mid, n = next(iter(sizes.items()))
    rows = np.concatenate([np.asarray(mb.policy_batches[mid]["np_col"]) * 2 for mb in ours])
    assert np.array_equal(rows, np.arange(len(rows)) % n) is not shuffle


def test_does_not_touch_the_train_batch():
    batch = MultiAgentBatch({"p": _module_batch(30, 0)}, 30)
    before = batch.policy_batches["p"]["obs"].clone()
    list(GatherMiniBatchIterator(batch, minibatch_size=8, num_epochs=3))
    assert torch.equal(batch.policy_batches["p"]["obs"], before)


@pytest.mark.parametrize(
    "make",
    [
        lambda: SampleBatch({"obs": torch.zeros(6), "seq_lens": torch.tensor([3, 3])}),
        lambda: SampleBatch({"obs": torch.zeros(4), "infos": [{}, {}, {}, {}]}),
        lambda: SampleBatch({"obs": torch.zeros(4), "other": np.zeros(3)}),
        lambda: SampleBatch({"obs": torch.zeros(4), "other": "abcd"}),
        lambda: SampleBatch({"obs": torch.zeros(4), "scalar": torch.tensor(1.0)}),
    ],
    ids=["seq_lens", "infos", "short column", "non-array leaf", "0-d tensor"],
)
def test_unsupported_batches_are_left_to_rllib(make):
    assert not GatherMiniBatchIterator.supports(MultiAgentBatch({"p": make()}, 4))


def test_empty_module_batch_is_an_error_not_a_hang():
    batch = MultiAgentBatch({"p": SampleBatch({"obs": torch.zeros(0)})}, 0)
    with pytest.raises(ValueError, match="module_id p is empty"):
        next(iter(GatherMiniBatchIterator(batch, minibatch_size=4, num_epochs=1)))
