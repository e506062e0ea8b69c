"""The sweep's recommended AMP settings, from fake summary rows (no Ray)."""

from __future__ import annotations

import shlex
from pathlib import Path

import yaml

from rllib_amp import experiment as E
from rllib_amp.settings import AmpSettings
from rllib_amp.sweep.groups import group
from rllib_amp.sweep.recommend import FILE, recommend, write

M = "env_runners/episode_return_mean"


def _rows(setting, *, trial, metric, settled, skipped, seeds=3, **extra):
    return [
        {"trial_id": f"{trial}{s}", "status": "DONE", M: metric + s, "seed": s,
         "settled_scale": settled, "skipped_steps": skipped, "optimizer_steps": 100,
         **setting, **extra}
        for s in range(seeds)
    ]  # fmt: skip


ROWS = [
    {"trial_id": "bad", "status": "ERROR", M: None, "seed": 0,
     "amp.init_scale": 1.0, "amp.growth_interval": 1},
    *_rows({"amp.init_scale": 65536.0, "amp.growth_interval": 10},
           trial="b", metric=400.0, settled=4096.0, skipped=5),
    *_rows({"amp.init_scale": 1024.0, "amp.growth_interval": 2000},
           trial="c", metric=100.0, settled=512.0, skipped=9),
]  # fmt: skip
KEYS = ["amp.init_scale", "amp.growth_interval"]


def _groups(rows=ROWS):
    return group(rows, keys=KEYS, metric=M, mode="max")


def test_the_block_is_the_best_settings_starting_at_their_settled_scale(tmp_path):
    rec = recommend(_groups(), metric=M, base={"dtype": "float16", "backoff_factor": 0.25})
    assert rec is not None
    loaded = yaml.safe_load(rec.to_yaml())
    settings = AmpSettings.from_dict(loaded["amp"])
    assert settings.init_scale == 4096.0 and settings.growth_interval == 10
    assert settings.dtype == "float16" and settings.backoff_factor == 0.25
    assert "init_scale=65536, growth_interval=10" in rec.reason
    assert "401 [399, 403] over 3 seed(s), the best" in rec.reason
    assert "settled scale, 4096" in rec.reason and "5 skipped steps (5.0% of updates)" in rec.reason
    # Usable again as --set flags: on the file that searches growth_interval, they replace
    # that search entry (and say so) instead of losing to it.
    flags = shlex.split(rec.as_set_flags())
    assert flags[0::2] == ["--set"] * len(rec.amp)
    exp = E.load("tune_configs/cartpole_ppo_amp.yaml", overrides=flags[1::2])
    assert exp.get("amp.init_scale") == 4096.0 and exp.get("amp.growth_interval") == 10
    assert "amp.growth_interval" not in exp.search
    assert exp.notes == (
        "--set amp.growth_interval=10 replaces the search over amp.growth_interval (2 values)",
    )
    assert rec.replaced_searches(["amp.growth_interval", "seed"]) == ["amp.growth_interval"]
    # The file says how to apply it.
    assert f"# apply with: {rec.as_set_flags()}\n" in rec.to_yaml()
    path = write(rec, str(tmp_path))
    assert path.endswith(FILE) and yaml.safe_load(Path(path).read_text())["amp"] == rec.amp


def test_pbt_mutated_settings_of_the_chosen_settings_first_trial_win():
    rec = recommend(
        _groups(), metric=M, base={"dtype": "float16"}, configs={"b0": {"growth_interval": 100}}
    )
    assert rec is not None and rec.amp["growth_interval"] == 100


def test_a_bfloat16_setting_needs_no_scaler():
    rows = _rows({"amp.growth_interval": 10}, trial="x", metric=1.0, settled=1.0, skipped=0)
    rec = recommend(group(rows, keys=KEYS[1:], metric=M, mode="max"), metric=M,
                    base={"dtype": "bfloat16"})  # fmt: skip
    assert rec is not None and "init_scale" not in rec.amp and "no scaler" in rec.reason
    AmpSettings.from_dict(yaml.safe_load(rec.to_yaml())["amp"])


def test_no_finished_trial_no_recommendation():
    assert recommend(_groups(ROWS[:1]), metric=M, base={}) is None


def test_flags_read_back_as_the_same_values_whatever_they_hold():
    """A huge scale stays a float (``1e+38`` alone is a string to YAML), a URI with ``&`` and
    ``?`` survives the shell."""
    from rllib_amp.experiment.reading import parse_override
    from rllib_amp.sweep.recommend import Recommendation

    amp = {"dtype": "float16", "init_scale": 1e38, "warm_start": {"from": "s3://b/x?a=1&b=2"}}
    flags = shlex.split(Recommendation(amp, "why").as_set_flags())
    assert dict(parse_override(f) for f in flags[1::2]) == {f"amp.{k}": v for k, v in amp.items()}
