"""`python -m rllib_amp.bench` answers bad input with exit 2 and one line."""

from __future__ import annotations

import pytest

from rllib_amp import bench

BAD = [
    (["--algos", "SAC"], "--algos: 'SAC' is not one of PPO,DQN"),
    (["--algos", ","], "--algos: empty list"),
    (["--models", "huge"], "--models: 'huge' is not one of mini,full,high"),
    (["--device", "tpu"], "--device: invalid choice: 'tpu'"),
    (["--reps", "0"], "--reps: got 0; must be >= 1"),
    (["--reps", "many"], "--reps: invalid int value: 'many'"),
    (["--json", "/nonexistent/dir/b.json"], "folder /nonexistent/dir does not exist"),
    (["--device", "cuda"], "--device cuda: no CUDA device is visible"),
    (["--frobnicate"], "unrecognized arguments: --frobnicate"),
]


@pytest.mark.parametrize("args, fragment", BAD, ids=[" ".join(a) for a, _ in BAD])
def test_bad_input_exits_2_with_one_line(capsys, args, fragment):
    import torch

    if args == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the flag is valid here")
    assert bench.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m rllib_amp.bench: error: "), err
    assert fragment in err, err


def test_rows_put_the_ratio_to_fp32_in_every_row():
    results = {
        "throughput": {
            "PPO full": {"fp32": [100.0, 110.0, 90.0], "amp-auto": [200.0, 210.0, 190.0]}
        },
        "memory": {"PPO full": {"fp32": 2.0 * 2**20, "amp-auto": 1.0 * 2**20}},
        "end_to_end": {"fp32": [10.0, 12.0], "amp-auto": [15.0, 13.0]},
        "parity": {"PPO": {"fp32": [100.0, 200.0], "amp-auto": [150.0, 150.0]}},
    }
    rows = bench.rows_from(results)
    ratio = {(r["figure"], r["variant"]): r["ratio_to_fp32"] for r in rows}
    assert ratio[("learner update", "amp-auto")] == pytest.approx(2.0)
    assert ratio[("peak memory of update", "amp-auto")] == pytest.approx(0.5)
    assert ratio[("end to end", "amp-auto")] == pytest.approx(14.0 / 11.0)
    assert ratio[("learning parity", "amp-auto")] == pytest.approx(1.0)
    assert all(r["ratio_to_fp32"] == 1.0 for r in rows if r["variant"] == "fp32")
    table = bench.markdown(rows, "header")
    assert table.count("\n") == len(rows) + 3 and "2.00x" in table


def test_in_child_returns_raises_and_notices_a_dead_child():
    import math
    import operator
    import os

    from rllib_amp.bench import in_child

    assert in_child(operator.add, 1, 2) == 3
    with pytest.raises(RuntimeError, match="ValueError: math domain error"):
        in_child(math.sqrt, -1.0)
    with pytest.raises(RuntimeError, match="died \\(exit code 3\\)"):
        in_child(os._exit, 3)
