"""The Pong learning-evidence command: curves, summary, verdicts, outputs, bad input."""

from __future__ import annotations

import math
import os

import pyarrow.parquet as pq
import pytest
import yaml

from rllib_amp.bench import pong_learning as P

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# (env steps, seconds, return): AMP twice as fast per step and a little better.
CURVES = {
    (P.STOCK, 0): [(1e5, 100.0, math.nan), (2e5, 200.0, -20.0), (3e5, 300.0, -17.0)],
    (P.STOCK, 1): [(1e5, 110.0, -21.0), (2e5, 220.0, -19.0), (3e5, 330.0, -15.0)],
    (P.AMP, 0): [(1e5, 50.0, -21.0), (2e5, 100.0, -16.0), (3e5, 150.0, -14.0)],
    (P.AMP, 1): [(1e5, 55.0, -20.0), (2e5, 110.0, -18.0), (3e5, 165.0, -15.5)],
}


def test_the_settings_are_the_pong_experiments():
    with open(os.path.join(ROOT, "tune_configs", "pong_ppo_amp.yaml"), encoding="utf-8") as f:
        assert yaml.safe_load(f)["training"] == P.TRAINING


def test_summary_final_returns_spread_speed_and_time_to_stocks_final_return():
    s = P.summarize(CURVES)
    assert list(s) == [P.STOCK, P.AMP]
    assert s[P.STOCK]["finals"] == [-17.0, -15.0] and s[P.STOCK]["final"] == -16.0
    assert s[P.STOCK]["spread"] == 1.0
    assert s[P.AMP]["final"] == -14.75
    assert s[P.AMP]["env_steps_per_s"] == pytest.approx((2000 + 3e5 / 165) / 2)
    # Stock's mean final return is -16: AMP seed 0 reaches it at 100 s, seed 1 at 165 s.
    assert s[P.AMP]["time_to_stock_final"] == [100.0, 165.0]
    assert s[P.STOCK]["time_to_stock_final"] == [None, 330.0]
    assert P.verdicts(s) == {"no worse than stock": True, "sooner in wall-clock time": True}
    table = P.table(s, 300_000)
    assert "| rllib-amp (amp native) | -14.8 +- 0.8 (-14.0, -15.5) |" in table


def test_verdicts_fail_when_amp_learns_worse_or_never_gets_there():
    worse = {**CURVES, (P.AMP, 0): [(1e5, 50.0, -21.0), (3e5, 150.0, -21.0)]}
    worse[(P.AMP, 1)] = [(1e5, 55.0, -21.0), (3e5, 165.0, -20.0)]
    assert P.verdicts(P.summarize(worse)) == {
        "no worse than stock": False,
        "sooner in wall-clock time": False,
    }


def test_outputs_are_a_parquet_of_every_point_and_a_png(tmp_path):
    pytest.importorskip("matplotlib")
    written = P.write_outputs(CURVES, str(tmp_path / "out"))
    rows = pq.read_table(written[0]).to_pylist()
    assert len(rows) == 12 and {r["path"] for r in rows} == {P.STOCK, P.AMP}
    assert rows[0].keys() == {"path", "seed", "env_steps", "seconds", "return"}
    with open(written[1], "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["--steps", "0"], "--steps: got 0; must be >= 1"),
        (["--seeds", "a,b"], "--seeds: got 'a,b'; give integers"),
        (["--seeds", ","], "--seeds: got no seed"),
        (["--batch", "1"], "--batch: got 1; must be >= 2"),
        (["--stepz", "5"], "unrecognized arguments: --stepz 5"),
    ],
)
def test_bad_input_exits_2_with_one_line(capsys, args, fragment):
    assert P.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and fragment in err and err.startswith(P.PROG)


@pytest.mark.slow  # two Pong runs in fresh processes: about a minute on 2 cores
def test_a_tiny_run_trains_both_paths_and_writes_its_outputs(tmp_path, capsys):
    out = tmp_path / "pong"
    rc = P.main(["--steps", "256", "--seeds", "0", "--batch", "128", "--device", "cpu",
                 "--out", str(out)])  # fmt: skip
    text = capsys.readouterr().out
    assert rc == 0, text
    rows = pq.read_table(str(out / "curves.parquet")).to_pylist()
    assert {r["path"] for r in rows} == {P.STOCK, P.AMP}
    assert all(r["env_steps"] >= 128 for r in rows)
    assert "| stock (fp32 wrappers) |" in text and "no worse than stock:" in text
