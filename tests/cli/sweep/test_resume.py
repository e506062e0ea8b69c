"""Reruns of the same command: each run gets the file's name and its start time, both runs
are kept, ``--resume`` alone continues the newest, an explicit ``--name`` in use is refused."""

from __future__ import annotations

import datetime
import json
import os
import pwd
import re
import subprocess
import sys
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest

from rllib_amp.cli import UsageError
from rllib_amp.sweep import main as cli
from rllib_amp.sweep import resume as R

PROG = "python -m rllib_amp.tune: error: "
STAMPED = re.compile(r"tiny_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d(_\d+)?")


def frozen_clock(monkeypatch, when: datetime.datetime) -> None:
    """Every start reads the same second: what two commands started at once see."""

    class Frozen(datetime.datetime):
        @classmethod
        def now(cls, tz=None):  # type: ignore[override]
            return when

    monkeypatch.setattr(R, "datetime", SimpleNamespace(datetime=Frozen))


def make_run(storage, name: str, restorable: bool = True) -> None:
    folder = storage / name
    folder.mkdir(parents=True)
    # Tuner.can_restore looks for exactly this file.
    (folder / ("tuner.pkl" if restorable else "trial.log")).write_bytes(b"x")


def test_two_starts_in_the_same_second_get_two_folders(tmp_path, monkeypatch):
    frozen_clock(monkeypatch, datetime.datetime(2026, 12, 1, 16, 20, 3))
    first = R.new_run_name("tiny", str(tmp_path))
    second = R.new_run_name("tiny", str(tmp_path))
    assert first == "tiny_2026-12-01_16-20-03"
    assert second == "tiny_2026-12-01_16-20-03_2"
    assert sorted(os.listdir(tmp_path)) == [first, second]  # claimed, so a third differs too
    R.release(str(tmp_path), first)  # left empty: a run that failed before Tune wrote
    assert os.listdir(tmp_path) == [second]
    (tmp_path / second / "tuner.pkl").write_bytes(b"x")
    R.release(str(tmp_path), second)  # holds a run: kept
    assert os.listdir(tmp_path) == [second]


def test_newest_run_is_the_latest_start_with_contents(tmp_path):
    for name in ("tiny", "tiny_2026-12-01_16-20-03_10", "tiny_2026-12-01_16-20-03_2",
                 "tiny_2026-11-30_23-59-59", "tiny_extra_2026-12-31_00-00-00"):  # fmt: skip
        make_run(tmp_path, name)
    (tmp_path / "tiny_2026-12-02_00-00-00").mkdir()  # claimed by a start that then failed
    (tmp_path / "tiny_2026-12-03_00-00-00").write_text("a file, not a run")
    assert R.runs_of("tiny", str(tmp_path)) == [
        "tiny",  # named before names carried a time: the oldest
        "tiny_2026-11-30_23-59-59",
        "tiny_2026-12-01_16-20-03_2",
        "tiny_2026-12-01_16-20-03_10",
        "tiny_2026-12-02_00-00-00",
    ]
    assert R.newest_run("tiny", str(tmp_path)) == "tiny_2026-12-01_16-20-03_10"
    assert R.newest_run("other", str(tmp_path)) is None


def test_resume_without_name_continues_the_newest_run(tmp_path, capsys):
    make_run(tmp_path, "tiny_2026-11-30_10-00-00")
    make_run(tmp_path, "tiny_2026-12-01_10-00-00")
    name = R.choose_name("tiny", str(tmp_path), name=None, resume=True)
    assert name == "tiny_2026-12-01_10-00-00"
    assert (
        "continuing the newest run of 'tiny': tiny_2026-12-01_10-00-00" in capsys.readouterr().out
    )
    # An explicit --name still picks the run it names.
    assert R.choose_name("tiny", str(tmp_path), name="tiny_2026-11-30_10-00-00", resume=True) == (
        "tiny_2026-11-30_10-00-00"
    )
    # A new start never reuses a name.
    assert R.choose_name("tiny", str(tmp_path), name=None, resume=False) is None


def test_resume_without_name_and_no_run_exits_2_naming_the_fix(tmp_path):
    make_run(tmp_path, "tiny_2026-11-30_10-00-00", restorable=False)
    with pytest.raises(UsageError, match="--resume: no experiment of 'tiny' to continue at .*"
                       "tiny_2026-11-30_10-00-00; pass the --name and --storage-path"):  # fmt: skip
        R.choose_name("tiny", str(tmp_path), name=None, resume=True)
    with pytest.raises(UsageError, match=r"no folder tiny_<time>"):
        R.choose_name("tiny", str(tmp_path / "empty"), name=None, resume=True)


def test_an_explicit_name_in_use_is_refused_before_ray_loads(tmp_path, tiny_file):
    """In a fresh process: exit 2, one line naming --resume, another --name and the default,
    the run left as it was, and neither RLlib nor torch imported to say so."""
    make_run(tmp_path, "mine")
    probe = (
        "import sys\nfrom rllib_amp.sweep.main import main\n"
        f"rc = main(['--config', {tiny_file(tmp_path)!r}, '--storage-path', {str(tmp_path)!r},"
        " '--name', 'mine'])\n"
        "print(rc, 'torch' in sys.modules, 'ray.rllib' in sys.modules)\n"
    )
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.stdout.split() == ["2", "False", "False"], proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert err.startswith(PROG + "--name: an experiment named 'mine' already exists"), err
    assert "--resume" in err and "another --name" in err and "default name" in err
    assert len(err.splitlines()) == 1
    assert os.listdir(tmp_path / "mine") == ["tuner.pkl"]


# About 12 s (two sweeps). In the default run a new run's name is locked (unit/sweep/test_lock)
# and a finished run's name rerun names its results (below).
@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_running_the_same_command_twice_keeps_both_runs(tmp_path, capsys, tiny_file):
    config = tiny_file(tmp_path, iterations=1, scales=[1024.0])  # one trial
    argv = ["--config", config, "--storage-path", str(tmp_path / "store")]
    assert cli.main(argv) == 0
    assert cli.main(argv) == 0
    runs = sorted(os.listdir(tmp_path / "store"))
    assert len(runs) == 2 and all(STAMPED.fullmatch(r) for r in runs), runs
    for run in runs:
        table = pq.read_table(str(tmp_path / "store" / run / "results.parquet")).to_pylist()
        assert [r["status"] for r in table] == ["DONE"]
    capsys.readouterr()
    # Both finished: a --resume says so and where the newest one's results are, runs nothing.
    newest = tmp_path / "store" / runs[-1]
    before = {f: os.path.getmtime(newest / f) for f in os.listdir(newest)}
    assert cli.main([*argv, "--resume"]) == 0
    assert capsys.readouterr().out == (
        f"--resume: experiment {runs[-1]!r} at {newest} has finished (its one trial); nothing "
        f"to continue. Its results: {newest / 'results.parquet'}\n"
    )
    assert {f: os.path.getmtime(newest / f) for f in os.listdir(newest)} == before


# -- the tests' own home ---------------------------------------------------------------------
def test_tests_run_in_a_home_of_their_own(test_home):
    from ray.train.constants import DEFAULT_STORAGE_PATH

    real = pwd.getpwuid(os.getuid()).pw_dir
    assert os.path.expanduser("~") == test_home != real
    assert os.path.join(test_home, "ray_results") == DEFAULT_STORAGE_PATH  # Tune's default
    proc = subprocess.run(
        [sys.executable, "-c", "import os; print(os.path.expanduser('~'))"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert proc.stdout.strip() == test_home  # and the CLI tests' subprocesses inherit it


def make_finished_run(storage, name: str, statuses=("TERMINATED", "TERMINATED"), results=True):
    """A run folder as Tune and the summary leave it: tuner.pkl, the newest experiment state
    recording each trial's status (an older one still saying RUNNING), results.parquet."""
    make_run(storage, name)
    folder = storage / name

    def state(status_of):
        trials = [[json.dumps({"trial_id": str(i), "status": status_of(s)}), "{}"]
                  for i, s in enumerate(statuses)]  # fmt: skip
        return json.dumps({"trial_data": trials, "runner_data": {}, "stats": {}})

    (folder / "experiment_state-2026-12-01_10-00-00.json").write_text(state(lambda s: "RUNNING"))
    (folder / "experiment_state-2026-12-01_10-00-09.json").write_text(state(lambda s: s))
    if results:
        (folder / "results.parquet").write_bytes(b"PAR1")
    return folder


def snapshot(folder):
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_rerunning_the_name_of_a_finished_run_names_its_results(
    tmp_path, capsys, tiny_file, ray_must_not_start
):
    folder = make_finished_run(tmp_path / "store", "done")
    before = snapshot(folder)
    rc = cli.main(["--config", tiny_file(tmp_path), "--storage-path", str(tmp_path / "store"),
                   "--name", "done"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err == (
        f"{PROG}--name: experiment 'done' at {folder} has already finished (all 2 trials); its "
        f"results are in {folder / 'results.parquet'}. Start a new run with another --name (or "
        f"none: the default name carries the start time)\n"
    )
    assert snapshot(folder) == before


@pytest.mark.parametrize("explicit", [True, False])
def test_resume_of_a_finished_run_says_where_its_results_are(
    tmp_path, capsys, tiny_file, ray_must_not_start, explicit
):
    name = "tiny_2026-12-01_10-00-00"
    folder = make_finished_run(tmp_path / "store", name)
    before = snapshot(folder)
    argv = ["--config", tiny_file(tmp_path), "--storage-path", str(tmp_path / "store")]
    rc = cli.main([*argv, *(["--name", name] if explicit else []), "--resume"])
    out, err = capsys.readouterr()
    assert (rc, err) == (0, "")
    assert out == (
        f"--resume: experiment {name!r} at {folder} has finished (all 2 trials); nothing to "
        f"continue. Its results: {folder / 'results.parquet'}\n"
    )
    assert snapshot(folder) == before  # no lock, no fallback backup, nothing rewritten


@pytest.mark.parametrize(
    ("statuses", "results"),
    [
        (("TERMINATED", "PENDING"), True),  # a trial to continue
        (("TERMINATED", "ERROR"), True),  # --resume retries errored trials
        (("TERMINATED", "PAUSED"), True),
        (("TERMINATED", "TERMINATED"), False),  # stopped before its summary: --resume writes it
    ],
)
def test_a_run_with_something_left_to_do_is_still_resumed(tmp_path, statuses, results):
    make_finished_run(tmp_path, "run", statuses=statuses, results=results)
    assert R.finished(str(tmp_path / "run")) is None
    assert R.choose_name("tiny", str(tmp_path), name="run", resume=True) == "run"
    with pytest.raises(UsageError, match="already exists at .*; continue it with --resume"):
        R.refuse_taken(str(tmp_path), "run")
