"""The sweep's recommended AMP settings, from fake summary rows (no Ray)."""

from __future__ import annotations

from pathlib import Path

import yaml

from rllib_amp import experiment as E
from rllib_amp.settings import AmpSettings
from rllib_amp.sweep.recommend import FILE, recommend, write

M = "env_runners/episode_return_mean"
ROWS = [
    {"trial_id": "bad", "status": "ERROR", M: None, "grad_scale": None},
    {
        "trial_id": "b",
        "status": "DONE",
        M: 400.0,
        "grad_scale": 4096.0,
        "skipped_steps": 5,
        "amp.init_scale": 65536.0,
        "amp.growth_interval": 10,
    },
    {
        "trial_id": "c",
        "status": "DONE",
        M: 100.0,
        "grad_scale": 512.0,
        "skipped_steps": 9,
        "amp.init_scale": 1024.0,
        "amp.growth_interval": 2000,
    },
]


def test_the_block_is_the_best_trials_settings_starting_at_its_final_scale(tmp_path):
    rec = recommend(ROWS, metric=M, base={"dtype": "float16", "backoff_factor": 0.25})
    assert rec is not None
    loaded = yaml.safe_load(rec.to_yaml())
    settings = AmpSettings.from_dict(loaded["amp"])
    assert settings.init_scale == 4096.0 and settings.growth_interval == 10
    assert settings.dtype == "float16" and settings.backoff_factor == 0.25
    assert "4096" in rec.reason and "b" in rec.reason and "5" in rec.reason
    # Usable again: merged into an experiment file, and as --set flags.
    exp = E.load(
        "tune_configs/cartpole_ppo_amp.yaml",
        overrides=[*rec.as_set_flags().replace("--set ", "").split(), "search=null"],
    )
    assert exp.get("amp.init_scale") == 4096.0
    path = write(rec, str(tmp_path))
    assert path.endswith(FILE) and yaml.safe_load(Path(path).read_text())["amp"] == rec.amp


def test_pbt_mutated_settings_of_the_best_trial_win():
    rec = recommend(
        ROWS, metric=M, base={"dtype": "float16"}, configs={"b": {"growth_interval": 100}}
    )
    assert rec is not None and rec.amp["growth_interval"] == 100


def test_a_bfloat16_best_trial_needs_no_scaler():
    rows = [{"trial_id": "x", "status": "DONE", M: 1.0, "grad_scale": 1.0, "skipped_steps": 0}]
    rec = recommend(rows, metric=M, base={"dtype": "bfloat16"})
    assert rec is not None and "init_scale" not in rec.amp and "no scaler" in rec.reason
    AmpSettings.from_dict(yaml.safe_load(rec.to_yaml())["amp"])


def test_no_finished_trial_no_recommendation():
    assert recommend(ROWS[:1], metric=M, base={}) is None
