"""APPO's V-trace bootstraps where a rollout fragment ends (rllib_amp.learner.vtrace).

The batch is laid out as RLlib's APPO learner builds it: episode chunks one after another, each
with the step ``AddOneTsToEpisodesAndTruncate`` appends (loss mask off, reward 0), and the
discounts ``gamma * (1 - terminated) * loss_mask`` of RLlib's loss, fed to RLlib's own
``vtrace_torch``.
"""

from __future__ import annotations

import pytest
import torch
from ray.rllib.algorithms.impala.torch.vtrace_torch_v2 import make_time_major, vtrace_torch
from ray.rllib.core.columns import Columns

from rllib_amp.learner.vtrace import bootstrap_without_weight

GAMMA = 0.99


def _chunks(*lengths: int, terminated_last: bool = False, seed: int = 0) -> dict:
    """Chunks of ``lengths`` real steps, each followed by its bootstrap step (the values,
    log-probs and rewards random, off-policy), as flat columns."""
    g = torch.Generator().manual_seed(seed)
    mask, term = [], []
    for i, n in enumerate(lengths):
        mask += [True] * n + [False]
        last = terminated_last and i == len(lengths) - 1
        term += [False] * (n - 1) + [last, False]
    size = len(mask)
    return {
        Columns.LOSS_MASK: torch.tensor(mask),
        Columns.TERMINATEDS: torch.tensor(term),
        Columns.REWARDS: torch.where(torch.tensor(mask), torch.randn(size, generator=g), 0.0),
        Columns.ACTION_LOGP: -torch.rand(size, generator=g) - 1.0,
        "target_logp": -torch.rand(size, generator=g) - 1.0,
        "values": torch.randn(size, generator=g),
    }


def _rllib_vtrace(batch: dict, t: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(value targets, advantages) of the real steps as RLlib's APPO loss computes them: the
    flat batch in rows of ``t`` consecutive steps (``make_time_major``, zero-padded; default
    one row), each row's last step bootstrapped from the next row's first value."""
    mask = batch[Columns.LOSS_MASK]
    n = len(mask)

    def tm(x):
        return make_time_major(x.float(), trajectory_len=t or n)

    values = tm(batch["values"])
    vs, adv = vtrace_torch(
        target_action_log_probs=tm(batch["target_logp"]),
        behaviour_action_log_probs=tm(batch[Columns.ACTION_LOGP]),
        discounts=tm((1.0 - batch[Columns.TERMINATEDS].float()) * GAMMA * mask.float()),
        rewards=tm(batch[Columns.REWARDS]),
        values=values,
        bootstrap_values=torch.cat([values[0][1:], values[0][:1]]),
        clip_pg_rho_threshold=1.0,
        clip_rho_threshold=1.0,
    )

    def real(x):
        return x.transpose(0, 1).reshape(-1)[:n][mask]

    return real(vs), real(adv)


def _each_chunk_alone(batch: dict) -> tuple[torch.Tensor, torch.Tensor]:
    """V-trace over each chunk by itself, bootstrapped from the value of its appended step:
    the definition (IMPALA, eq. 1) the fixed batch must match."""
    vs_all, adv_all = [], []
    ends = (~batch[Columns.LOSS_MASK]).nonzero().flatten().tolist()
    start = 0
    for end in ends:
        s = slice(start, end)
        discounts = (1.0 - batch[Columns.TERMINATEDS][s].float()) * GAMMA
        vs, adv = vtrace_torch(
            target_action_log_probs=batch["target_logp"][s, None],
            behaviour_action_log_probs=batch[Columns.ACTION_LOGP][s, None],
            discounts=discounts[:, None],
            rewards=batch[Columns.REWARDS][s, None],
            values=batch["values"][s, None],
            bootstrap_values=batch["values"][end : end + 1],
            clip_pg_rho_threshold=1.0,
            clip_rho_threshold=1.0,
        )
        vs_all.append(vs[:, 0])
        adv_all.append(adv[:, 0])
        start = end + 1
    return torch.cat(vs_all), torch.cat(adv_all)


def test_rllib_cuts_the_return_where_a_fragment_ends():
    """The defect, pinned: when RLlib fixes it, this fails and the fix can go.
    On-policy, rewards 0, every value 1: the targets should be gamma^k, RLlib's are 0."""
    batch = _chunks(4)
    batch[Columns.REWARDS] = torch.zeros(5)
    batch["values"] = torch.ones(5)
    batch["target_logp"] = batch[Columns.ACTION_LOGP].clone()
    vs, adv = _rllib_vtrace(batch)
    assert vs.tolist() == [0.0] * 4
    assert adv.tolist() == [-1.0] * 4
    fixed_vs, fixed_adv = _rllib_vtrace(bootstrap_without_weight(batch))
    want = [GAMMA**4, GAMMA**3, GAMMA**2, GAMMA]
    assert fixed_vs.tolist() == pytest.approx(want, abs=1e-6)
    assert fixed_adv.tolist() == pytest.approx([w - 1.0 for w in want], abs=1e-6)


@pytest.mark.parametrize("lengths", [(5,), (3, 6), (1, 4, 2)])
@pytest.mark.parametrize("seed", [0, 1])
def test_fixed_targets_equal_v_trace_over_each_chunk_alone(lengths, seed):
    batch = _chunks(*lengths, seed=seed)
    want_vs, want_adv = _each_chunk_alone(batch)
    vs, adv = _rllib_vtrace(bootstrap_without_weight(batch))
    torch.testing.assert_close(vs, want_vs)
    torch.testing.assert_close(adv, want_adv)
    # ...and without the fix they differ: the check has teeth.
    assert not torch.allclose(_rllib_vtrace(batch)[0], want_vs)


def test_a_terminated_chunk_is_unchanged_by_the_fix():
    batch = _chunks(4, terminated_last=True)
    for got, want in zip(_rllib_vtrace(bootstrap_without_weight(batch)), _rllib_vtrace(batch)):
        torch.testing.assert_close(got, want)


def test_the_callers_batch_is_untouched_and_a_batch_without_a_mask_passes_through():
    batch = _chunks(3)
    before = batch[Columns.ACTION_LOGP].clone()
    fixed = bootstrap_without_weight(batch)
    assert fixed is not batch
    torch.testing.assert_close(batch[Columns.ACTION_LOGP], before)
    assert fixed[Columns.ACTION_LOGP][-1] == torch.inf
    plain = {Columns.ACTION_LOGP: before}
    assert bootstrap_without_weight(plain) is plain


def _returns_to_row_or_chunk_end(batch: dict, t: int) -> torch.Tensor:
    """On-policy, V-trace's target is the return up to the end of the step's row or of its
    chunk, whichever comes first, bootstrapped from the next step's value."""
    mask, r, v = batch[Columns.LOSS_MASK], batch[Columns.REWARDS], batch["values"]
    out = []
    for i in torch.nonzero(mask).flatten().tolist():
        ret, k, j = 0.0, 0, i
        while True:
            ret += GAMMA**k * r[j].item()
            if (j + 1) % t == 0 or not mask[j + 1]:
                break
            j, k = j + 1, k + 1
        out.append(ret + GAMMA ** (k + 1) * v[j + 1].item())
    return torch.tensor(out)


def test_in_rllibs_row_layout_the_fix_bootstraps_the_steps_that_share_a_row_with_a_chunk_end():
    """RLlib's rows (here 5 steps) do not line up with the chunks (5 real steps + 1): the
    steps in the same row before a chunk's appended step are the ones RLlib cuts off."""
    batch = _chunks(5, 5, 5, seed=3)
    batch["target_logp"] = batch[Columns.ACTION_LOGP].clone()  # on-policy
    want = _returns_to_row_or_chunk_end(batch, 5)
    torch.testing.assert_close(_rllib_vtrace(bootstrap_without_weight(batch), 5)[0], want)
    cut = (_rllib_vtrace(batch, 5)[0] - want).abs() > 1e-6
    # Chunk k's appended step sits at place k of its row: k real steps before it are cut.
    assert cut.tolist() == [False] * 5 + [False] * 4 + [True] + [False] * 3 + [True] * 2
