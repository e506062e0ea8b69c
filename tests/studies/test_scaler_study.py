"""studies/scaler_study.py: the measurement, smoke-sized, and its command's refusals."""

from __future__ import annotations

from studies.scaler_study import fresh_vs_warm, markdown, sample_batches


def test_scaler_study_smoke(tmp_path):
    batches = sample_batches(multi_agent=False, batches=1, batch_size=32)
    rows = fresh_vs_warm(batches, factor=1000.0, updates=3, folder=str(tmp_path))
    fresh, warm = rows
    assert (fresh.setup, warm.setup) == ("fresh, init_scale 65536", "warm start")
    assert fresh.start_scale == 65536.0 and warm.start_scale < 65536.0
    assert fresh.skipped == 3 and warm.skipped <= fresh.skipped
    table = markdown(rows, "test machine")
    assert table.splitlines()[0].endswith("test machine")
    assert "| (a) loss x1000 | warm start | default_policy |" in table


def test_scaler_study_cli_refuses_bad_input(capsys):
    from studies.scaler_study import main

    assert main(["--updates", "0"]) == 2
    assert main(["--two-task-factors", "1000,inf"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        "python -m studies.scaler_study: error: --updates: got '0'; must be a finite number > 0",
        "python -m studies.scaler_study: error: --two-task-factors: got 'inf'; must be "
        "a finite number > 0",
    ]
