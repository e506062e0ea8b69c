"""The learner's "keeps skipping optimizer steps" WARNING, logged in a trial's own process, is
repeated in the summary the CLI user sees (tests/unit/sweep/test_summary.py has both
halves without a sweep)."""

from __future__ import annotations

import subprocess

import pyarrow.parquet as pq
import pytest

# Every float16 step overflows at this scale, so every update skips all its steps (the scale
# halves per skipped step, from 1e38 down to where float16 gradients fit: ~110 steps).
STORM = """
algorithm: PPO
env: CartPole-v1
model: {fcnet_hiddens: [16]}
amp: {dtype: float16, skip_warning_updates: 1}
training: {train_batch_size_per_learner: 200, minibatch_size: 100, num_epochs: 1}
resources: {num_env_runners: 0}
search:
  amp.init_scale: {grid: [1.0e+38]}
stop: {training_iteration: 1}
seed: 0
"""


@pytest.mark.slow  # a real one-iteration sweep (about 15-25 s)
@pytest.mark.usefixtures("ray_local")
def test_the_summary_repeats_a_trials_skipping_steps_warning(tmp_path, session_sweep):
    config = tmp_path / "storm.yaml"
    config.write_text(STORM)
    out = subprocess.run(session_sweep(config, tmp_path, "storm"), capture_output=True,
                         text=True, timeout=300)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    lines = [line for line in out.stdout.splitlines() if line.startswith("WARNING trial ")]
    assert len(lines) == 1, out.stdout[-3000:]
    assert "kept skipping optimizer steps" in lines[0] and "from iteration 1" in lines[0]
    assert "Advice: lower init_scale (now 1e+38)" in lines[0], lines[0]
    (row,) = pq.read_table(str(tmp_path / "storm" / "results.parquet")).to_pylist()
    assert row["skip_warnings"] == 1 and row["skip_advice"].startswith("lower init_scale")
