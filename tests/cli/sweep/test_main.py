"""`python -m rllib_amp.tune` end to end, its resume, and its answers to bad input."""

from __future__ import annotations

import glob
import math
import os
import re
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest
import yaml

from rllib_amp.sweep import arguments
from rllib_amp.sweep import main as cli

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def test_dry_run_prints_config_and_space_and_runs_nothing(tmp_path, capsys, tiny_file):
    rc = cli.main(["--config", tiny_file(tmp_path), "--dry-run", "--storage-path", str(tmp_path)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "algorithm: PPO" in out and "amp.init_scale: {'grid': [1024.0, 65536.0]}" in out
    assert "# trials: 2" in out
    assert not os.path.exists(tmp_path / "tiny")


def test_default_config_is_found_and_valid(capsys, test_home):
    """Also after the default job ran (twice, and once before names carried a time): the
    default storage is ~/ray_results, here the tests' own home, never the user's."""
    results = os.path.join(test_home, "ray_results")
    for run in ("cartpole_ppo_amp", "cartpole_ppo_amp_2026-12-01_16-20-03"):
        os.makedirs(os.path.join(results, run), exist_ok=True)
        with open(os.path.join(results, run, "tuner.pkl"), "wb") as f:
            f.write(b"a run of the default job")
    assert cli.main(["--dry-run"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert re.search(r"-> .*/ray_results/cartpole_ppo_amp_\d{4}-\d\d-\d\d_[\d-]+$", first)
    assert first.split("-> ")[1].startswith(results)


BAD_ARGS = [
    (["--bogus"], "unrecognized arguments: --bogus"),
    (["--num-samples", "x"], "--num-samples: invalid int value: 'x'"),
    (["--num-samples", "0"], "--num-samples: got 0; must be >= 1"),
    (["--config", "/nonexistent.yaml"], "/nonexistent.yaml: no such file"),
    (["--set", "amp.init_scale"], "expected KEY=VALUE"),
    (["--set", "amp.init_scale=-3"], "amp.init_scale: got -3.0; must be > 0"),
    (["--set", "amp.dtype=fp8"], "amp.dtype: got 'fp8'"),
    (["--set", "trainig.lr=0.1"], "unknown key 'trainig' (did you mean 'training'?)"),
    (["--set", "training.minibatch_size=1000"], "training.minibatch_size: 1000 is larger"),
    (["--resume", "--name", "never-ran"], "--resume: no experiment at"),
    (["--storage-path", ""], "--storage-path: got an empty location"),
    (["--storage-path", "bogus://bucket/x"], "--storage-path: pyarrow cannot open"),
    (["--set", "storage_path=3"], "storage_path: got 3; expected a local path"),
    (["--fit-to-machine", "--address", "127.0.0.1:1"], "--fit-to-machine: scales trials"),
]


@pytest.mark.parametrize("args, fragment", BAD_ARGS, ids=[" ".join(a) for a, _ in BAD_ARGS])
def test_bad_flags_exit_2_with_one_line(tmp_path, capsys, args, fragment, tiny_file):
    rc = cli.main(["--config", tiny_file(tmp_path), "--storage-path", str(tmp_path), *args])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.count("\n") == 1 and err.startswith("python -m rllib_amp.tune: error: "), err
    assert fragment in err, err
    assert "Traceback" not in err


def test_bad_flags_in_a_real_process_exit_2_without_traceback(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "rllib_amp.tune", "--set", "amp.backoff_factor=2"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert (
        proc.stderr.strip().splitlines() == [proc.stderr.strip()]
        and "amp.backoff_factor: got 2.0; must be in (0, 1)" in proc.stderr
    )


@pytest.mark.usefixtures("ray_local")
def test_sweep_end_to_end_writes_summary_and_parquet(tmp_path, capsys, tiny_file):
    rc = cli.main(
        ["--config", tiny_file(tmp_path), "--storage-path", str(tmp_path), "--name", "e2e"]
    )
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    # Tune's progress table carries the AMP columns.
    assert "grad scale" in out and "skip frac" in out and "env steps/s" in out
    # The summary: every trial, with its parameters and final AMP state, best first.
    summary = out[out.index("Trials of e2e") :]
    assert "final grad scale" in summary and "init_scale" in summary
    assert "Best trial checkpoint: " + str(tmp_path) in summary
    table = pq.read_table(str(tmp_path / "e2e" / "results.parquet")).to_pylist()
    assert len(table) == 2
    assert {r["amp.init_scale"] for r in table} == {1024.0, 65536.0}
    for r in table:
        assert r["status"] == "DONE" and r["training_iteration"] == 2
        assert r["amp.growth_interval"] in (5, 2000)
        assert r["training.train_batch_size_per_learner"] in (100, 200)
        assert r["grad_scale"] >= 1.0 and 0.0 <= r["skip_fraction"] <= 1.0
        assert r["env_steps_per_s"] > 0 and os.path.isdir(r["checkpoint"])
    returns = [r["env_runners/episode_return_mean"] for r in table]
    assert returns == sorted(returns, reverse=True)
    recommended = yaml.safe_load((tmp_path / "e2e" / "recommended_amp.yaml").read_text())
    # One seed per setting: the best trial's setting, at the scale it settled at.
    assert recommended["amp"]["init_scale"] == table[0]["settled_scale"]


# slow (25 s): the default run resumes interrupted sweeps in test_signals, test_ray_death and
# test_storage_faults.
@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_resume_finishes_an_interrupted_sweep_without_rerunning_finished_trials(
    tmp_path, tiny_file, trial_results, session_sweep
):
    config = tiny_file(tmp_path, iterations=12)
    cmd = session_sweep(config, tmp_path, "resume")
    log = open(tmp_path / "first.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    pattern = str(tmp_path / "resume" / "*" / "result.json")
    deadline = time.time() + 300
    done, running = [], []
    while time.time() < deadline:
        files = {f: trial_results(f) for f in glob.glob(pattern)}
        done = [f for f, rs in files.items() if rs and rs[-1].get("done")]
        # At least 3 results: two checkpoints saved (checkpoint frequency 1, keep 2).
        running = [f for f, rs in files.items() if len(rs) >= 3 and not rs[-1].get("done")]
        if done and running:
            break
        time.sleep(0.1)
    assert done and running, "could not catch the sweep mid-way"
    proc.send_signal(signal.SIGINT)  # what Ctrl-C does
    assert proc.wait(timeout=120) == 130  # interrupted: exit 130, the summary, a --resume hint
    log.close()
    assert "--resume" in (tmp_path / "first.log").read_text()
    finished = {f: len(trial_results(f)) for f in done}
    kept = {c for f in done for c in glob.glob(os.path.join(os.path.dirname(f), "checkpoint_*"))}
    assert kept, "finished trials have no checkpoint"
    # The interrupted trial's latest checkpoint is damaged (a save cut short): --resume
    # falls back to the one before it.
    saved = sorted(glob.glob(os.path.join(os.path.dirname(running[0]), "checkpoint_*")))
    assert len(saved) >= 2, saved  # num_to_keep=2; Tune may not have pruned an older one yet
    older, latest = saved[-2:]
    biggest = max(
        (os.path.join(d, f) for d, _, fs in os.walk(latest) for f in fs), key=os.path.getsize
    )
    with open(biggest, "r+b") as f:
        f.truncate(os.path.getsize(biggest) // 2)

    out = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    warning = [line for line in out.stderr.splitlines() if line.startswith("WARNING")]
    assert any(older in line and latest in line for line in warning), out.stderr[-3000:]
    assert os.path.isdir(latest + ".damaged")  # kept aside, not deleted
    for f, n in finished.items():
        assert len(trial_results(f)) == n, f"finished trial {f} ran again"
    for c in kept:  # no checkpoint of a finished trial was lost
        assert os.path.isdir(c), c
    table = pq.read_table(str(tmp_path / "resume" / "results.parquet")).to_pylist()
    assert len(table) == 2 and all(r["status"] == "DONE" for r in table)
    # The interrupted trial continued from its checkpoint with its scaler state: the AMP
    # step counter kept counting instead of restarting from zero.
    rs = trial_results(running[0])
    assert any(r["iterations_since_restore"] < r["training_iteration"] for r in rs)
    steps = [r["learners"]["default_policy"]["amp_optimizer_steps_lifetime"] for r in rs]
    iters = [r["training_iteration"] for r in rs]
    after_restore = [
        s for r, s in zip(rs, steps) if r["iterations_since_restore"] < r["training_iteration"]
    ]
    before = [
        s for r, s in zip(rs, steps) if r["iterations_since_restore"] == r["training_iteration"]
    ]
    assert min(after_restore) > min(before), (iters, steps)
    assert rs[-1]["training_iteration"] == 12


# -- storage --------------------------------------------------------------------------------
def test_storage_flag_wins_over_the_file_which_wins_over_the_environment(
    tmp_path, capsys, monkeypatch, tiny_file
):
    config = tmp_path / "tiny.yaml"
    tiny_file(tmp_path)  # writes config
    plain = config.read_text()
    config.write_text(plain + f"storage_path: {tmp_path / 'from_file'}\n")
    monkeypatch.setenv("RLLIB_AMP_STORAGE", str(tmp_path / "from_env"))

    def target(*args: str) -> str:
        assert cli.main(["--config", str(config), "--dry-run", *args]) == 0
        return capsys.readouterr().out.splitlines()[0]

    flag = str(tmp_path / "from_flag")
    assert str(tmp_path / "from_flag" / "tiny") in target("--storage-path", flag)
    assert str(tmp_path / "from_file" / "tiny") in target()
    config.write_text(plain)
    assert str(tmp_path / "from_env" / "tiny") in target()
    uri = "s3://bucket/exp?endpoint_override=127.0.0.1:9&scheme=http"
    assert re.search(
        r"s3://bucket/exp/tiny_[\d_-]+\?endpoint_override=127.0.0.1:9&scheme=http",
        target("--storage-path", uri),
    )


def test_unwritable_storage_exits_2_and_keeps_what_is_there(tmp_path, capsys, tiny_file):
    precious = tmp_path / "results.parquet"
    precious.write_bytes(b"earlier results")
    rc = cli.main(["--config", tiny_file(tmp_path), "--storage-path", str(precious / "x")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "--storage-path: cannot write to" in err, err
    assert precious.read_bytes() == b"earlier results"


def test_resume_from_a_uri_without_an_experiment_exits_2(tmp_path, capsys, tiny_file):
    from tests.cluster.s3 import moto_s3

    with moto_s3() as s3:
        uri = s3.uri("experiments")
        rc = cli.main(["--config", tiny_file(tmp_path), "--storage-path", uri, "--resume"])
        err = capsys.readouterr().err
        assert rc == 2 and err.count("\n") == 1, err
        assert f"--resume: no experiment of 'tiny' to continue at {uri} " in err
        assert s3.list("experiments") == []  # nothing written


# -- resources ------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "sets, needs",
    [
        (["resources.num_env_runners=512"], "needs 513 CPUs"),
        (["resources.num_learners=1", "resources.num_gpus_per_learner=64"], "and 64 GPUs"),
    ],
)
def test_infeasible_trial_on_a_local_ray_exits_2_within_30_s(tmp_path, sets, needs, tiny_file):
    store = tmp_path / "store"
    cmd = [sys.executable, "-m", "rllib_amp.tune", "--config", tiny_file(tmp_path),
           "--storage-path", str(store)]  # fmt: skip
    for item in sets:
        cmd += ["--set", item]
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    start = time.monotonic()
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
    elapsed = time.monotonic() - start
    assert proc.returncode == 2, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("python -m rllib_amp.tune: error: resources:")
    assert needs in lines[0] and "would wait forever" in lines[0]
    has = re.search(r"Ray has (\d+) CPUs", lines[0])
    assert has, lines[0]
    # The advice is concrete: overrides that fit this machine.
    fix = dict(re.findall(r"--set (\S+)=(\S+)", lines[0]))
    assert fix and "--fit-to-machine" in lines[0]
    if "resources.num_env_runners" in fix:
        assert int(fix["resources.num_env_runners"]) == int(has.group(1)) - 1
    assert elapsed < 30, elapsed
    assert not store.exists()  # nothing written


@pytest.mark.usefixtures("ray_local")
def test_on_a_cluster_address_a_trial_that_does_not_fit_yet_waits(
    tmp_path, tiny_file, session_sweep
):
    """With --address the CLI does not judge resources: an autoscaler may add the nodes, so
    a trial that does not fit now is PENDING, not an error."""

    cmd = session_sweep(tiny_file(tmp_path), tmp_path, "pending",
                        "--set", "resources.num_env_runners=64")  # fmt: skip
    log = open(tmp_path / "out.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        if "PENDING" in (tmp_path / "out.log").read_text():
            break
        time.sleep(0.5)
    assert proc.poll() is None, (tmp_path / "out.log").read_text()[-3000:]
    assert "PENDING" in (tmp_path / "out.log").read_text()
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=120) == 130  # interrupted, not bad input
    log.close()


@pytest.mark.usefixtures("ray_local")
def test_infeasible_gpu_request_on_the_in_process_ray_exits_2(tmp_path, capsys, tiny_file):
    rc = cli.main(["--config", tiny_file(tmp_path), "--storage-path", str(tmp_path / "s"),
                   "--set", "resources.num_gpus_per_learner=1"])  # fmt: skip
    err = capsys.readouterr().err
    assert rc == 2 and "needs 1 CPU and 1 GPU" in err and "0 GPUs" in err, err
    assert "--set resources.num_gpus_per_learner=0" in err


@pytest.mark.usefixtures("ray_local")
def test_fit_to_machine_runs_what_would_not_fit(tmp_path, capsys, tiny_file):
    rc = cli.main(["--config", tiny_file(tmp_path, scales=[1024.0]), "--storage-path",
                   str(tmp_path), "--name", "fit", "--fit-to-machine",
                   "--set", "resources.num_gpus_per_learner=1",
                   "--set", "stop.training_iteration=1"])  # fmt: skip
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    assert "--fit-to-machine: this machine's Ray has" in out
    assert "running with --set resources.num_gpus_per_learner=0" in out
    table = pq.read_table(str(tmp_path / "fit" / "results.parquet")).to_pylist()
    assert [(r["status"], r["training_iteration"]) for r in table] == [("DONE", 1)]


@pytest.mark.slow  # Pong on 2 cores; the scaled-down config is in tests/unit/test_resources.py
def test_fit_to_machine_runs_pong_ppo_on_this_machine(tmp_path):
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)
    proc = subprocess.run(
        [sys.executable, "-m", "rllib_amp.tune", "--config", "tune_configs/pong_ppo_amp.yaml",
         "--fit-to-machine", "--set", "stop.training_iteration=1", "--num-samples", "1",
         "--storage-path", str(tmp_path), "--name", "pong"],
        capture_output=True, text=True, timeout=1200, env=env, cwd=ROOT,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "--fit-to-machine: this machine's Ray has" in proc.stdout
    table = pq.read_table(str(tmp_path / "pong" / "results.parquet")).to_pylist()
    assert len(table) == 2
    assert all(r["status"] == "DONE" and r["training_iteration"] == 1 for r in table)


@pytest.mark.usefixtures("ray_local")
def test_an_iteration_in_which_no_episode_ended_reports_nan_not_a_crash(tmp_path, capsys):
    """MountainCar's episodes last 200 steps, so a 100-step iteration ends none; RLlib then
    leaves env_runners/episode_return_mean out, and Tune would end the sweep (as it did on
    Pong's first iteration)."""
    config = tmp_path / "long_episodes.yaml"
    config.write_text(
        "algorithm: PPO\nenv: MountainCar-v0\nmodel: {fcnet_hiddens: [8]}\n"
        "training: {train_batch_size_per_learner: 100, minibatch_size: 50, num_epochs: 1}\n"
        "resources: {num_env_runners: 0}\nstop: {training_iteration: 1}\n"
    )
    rc = cli.main(["--config", str(config), "--storage-path", str(tmp_path), "--name", "long"])
    out = capsys.readouterr().out
    assert rc == 0, out[-3000:]
    (row,) = pq.read_table(str(tmp_path / "long" / "results.parquet")).to_pylist()
    assert row["status"] == "DONE" and row["training_iteration"] == 1
    assert math.isnan(row["env_runners/episode_return_mean"])


@pytest.mark.slow  # the default job as a new user runs it: a few minutes on 2 cores
def test_default_job_answers_per_setting_within_five_minutes(tmp_path):
    """``python -m rllib_amp.tune`` with no arguments but the storage: 2 settings x 3 seeds,
    each trial until it learns CartPole (return >= 450) or spends the step budget, Ray's start
    included in 5 minutes; the per-setting summary (intervals, ties, the finding),
    groups.parquet, sweep.png and a recommendation that follows the tie rule."""
    import matplotlib.image

    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "rllib_amp.tune", "--storage-path", str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env={k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"},
    )  # fmt: skip
    elapsed = time.monotonic() - start
    out = proc.stdout
    assert proc.returncode == 0, (out + proc.stderr)[-3000:]
    assert elapsed < 300, f"the default job took {elapsed:.0f} s"
    (exp_dir,) = glob.glob(str(tmp_path / "cartpole_ppo_amp*"))
    rows = pq.read_table(os.path.join(exp_dir, "results.parquet")).to_pylist()
    assert len(rows) == 6 and all(r["status"] == "DONE" for r in rows)
    settings = {}
    for r in rows:
        learned = r["env_runners/episode_return_mean"] >= 450
        assert learned == (r["env_steps_to_450"] is not None)
        assert learned or r["env_steps"] >= 40_000  # else the budget ran out
        assert r["base_seed"] == 0
        settings.setdefault(r["amp.growth_interval"], []).append(r["seed"])
    # Every setting ran seeds 0, 1 and 2: independent repeats, not one run three times.
    assert len(settings) == 2 and all(sorted(s) == [0, 1, 2] for s in settings.values())
    assert sum(r["env_steps_to_450"] is not None for r in rows) >= 4
    groups = pq.read_table(os.path.join(exp_dir, "groups.parquet")).to_pylist()
    assert [g["rank"] for g in groups] == [1, 2] and groups[0]["tied"]
    for g in groups:
        assert g["n_seeds"] == 3 and sorted(g["seeds"]) == [0, 1, 2]
        if g["seeds_reached_target"] >= 2:
            assert g["env_steps_to_target_ci_lo"] <= g["env_steps_to_target_mean"]
    means = [g["env_steps_to_target_mean"] for g in groups]
    assert means == sorted(means)  # ranked by the mean steps to 450
    # The recommendation: a tied setting with the fewest skipped steps among the tied ones,
    # starting at its settled scale.
    with open(os.path.join(exp_dir, "recommended_amp.yaml"), encoding="utf-8") as f:
        amp = yaml.safe_load(f)["amp"]
    tied = [g for g in groups if g["tied"]]
    chosen = [g for g in tied if g["amp.growth_interval"] == amp["growth_interval"]
              and g["settled_scale"] == amp["init_scale"]]  # fmt: skip
    assert chosen, (amp, tied)
    assert chosen[0]["skipped_steps_mean"] == min(g["skipped_steps_mean"] for g in tied)
    with open(os.path.join(exp_dir, "sweep.png"), "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"
    assert matplotlib.image.imread(os.path.join(exp_dir, "sweep.png")).ndim == 3
    assert "Settings, best first by the mean env steps to the target" in out
    assert "[95% CI]" in out and "best" in out and "Found: " in out
    assert f"Figure: {exp_dir}" in out and f"Groups: {exp_dir}" in out


# -- quiet output ---------------------------------------------------------------------------
@pytest.mark.slow  # slow (13 s)
@pytest.mark.usefixtures("ray_local")
def test_default_job_prints_no_snapshot_warnings(tmp_path, session_sweep):
    """The default experiment's checkpoint cadence, on two of its trials (both at once, as in
    the default job): Tune's progress table and the summary, no repeated WARNING blocks."""
    import yaml

    with open(os.path.join(ROOT, arguments.DEFAULT_CONFIG), encoding="utf-8") as f:
        default = yaml.safe_load(f)
    default["search"] = {"amp.growth_interval": {"grid": [10, 2000]}}
    default["training"]["train_batch_size_per_learner"] = 500  # the default's smaller batch
    default["stop"] = {"training_iteration": 10}  # two checkpoints each, not until learned
    default["tune"]["num_samples"] = 1  # one seed each: two trials
    config = tmp_path / "default_two_trials.yaml"
    config.write_text(yaml.safe_dump(default))
    proc = subprocess.run(
        session_sweep(config, tmp_path, "quiet"),
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode == 0, output[-3000:]
    assert "== Status ==" in output and "Trials of quiet" in output
    assert "snapshotting has been triggered" not in output
