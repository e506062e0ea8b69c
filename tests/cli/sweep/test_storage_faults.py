"""`python -m rllib_amp.tune` when the storage fails: a remote that is down or never answers
before the first trial (one line, exit 2, bounded time, Ctrl-C works), and a disk that fills
up mid-run (one line naming it and the --resume command; the resume loses nothing).

Every remote is on 127.0.0.1: a closed port, or a listener that accepts and never answers.
The full disk is a tmpfs of a few MB in a mount namespace of its own; the session's Ray
writes to it through ``/proc/<pid>/root`` of a process inside that namespace.
"""

from __future__ import annotations

import glob
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from rllib_amp import fs
from rllib_amp.checkpoint_files import MANIFEST_FILE_NAME, CheckpointError, verify_checkpoint
from tests.cluster.s3 import ENV, closed_port, silent_listener

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__))))
PROG = "python -m rllib_amp.tune: error: "
# Short remote timeouts for these tests; bounds below are generous multiples of them.
TIMEOUT_S = 3
WARM = """
algorithm: PPO
env: CartPole-v1
model: {{fcnet_hiddens: [16]}}
amp: {{dtype: float16, warm_start: {{from: "{source}"}}}}
training: {{train_batch_size_per_learner: 200, minibatch_size: 100, num_epochs: 1}}
resources: {{num_env_runners: 0}}
stop: {{training_iteration: 1}}
"""


def _env(**extra: str) -> dict[str, str]:
    """The CLI's environment: dummy AWS keys and no cloud metadata lookups (EC2's and GCE's
    metadata servers would be off this machine), short remote timeouts."""
    env = dict(os.environ, **ENV, PYTHONPATH=ROOT)
    env["RLLIB_AMP_REMOTE_TIMEOUT_S"] = str(TIMEOUT_S)
    env["GCE_METADATA_HOST"] = env["GCE_METADATA_ROOT"] = f"127.0.0.1:{closed_port()}"
    env.pop("GOOGLE_APPLICATION_CREDENTIALS", None)
    env.update(extra)
    return env


def _cli(*args: str, wrap: tuple[str, ...] = ()) -> subprocess.Popen:
    return subprocess.Popen(
        [*wrap, sys.executable, "-m", "rllib_amp.tune", *args],
        cwd=ROOT,
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _no_network() -> tuple[str, ...]:
    """A prefix that runs a command in a network namespace with only its own loopback up, or
    () where the OS refuses one: a gs:// client that looks past its endpoint finds nothing."""
    probe = ["unshare", "-n", "sh", "-c", "ip link set lo up"]
    try:
        ok = subprocess.run(probe, capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        ok = False
    return ("unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "sh") if ok else ()


def _one_error_line(proc: subprocess.Popen, started: float, label: str) -> str:
    out, err = proc.communicate(timeout=300)
    took = time.monotonic() - started
    assert proc.returncode == 2, f"{label}: exit {proc.returncode}\n{out[-2000:]}{err[-3000:]}"
    assert "Traceback" not in err, f"{label}: {err[-3000:]}"
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith(PROG), f"{label}: {err[-3000:]}"
    # Bounded: imports and one remote timeout, far from the minutes it took before.
    assert took < 150, f"{label}: {took:.0f} s"
    return lines[0]


def _unreachable(tmp_path, labels: tuple[str, ...]) -> None:
    """Runs the CLI for each case at once, then reads each answer: one line, exit 2, bounded
    time. Cases: warm-start sources (s3 closed and silent, gs, hdfs) and resume storage (s3
    closed and silent)."""
    refused = closed_port()
    with silent_listener() as (silent, accepted):
        s3 = {
            "closed": f"s3://b/run/ck?endpoint_override=127.0.0.1:{refused}&scheme=http",
            "silent": f"s3://b/run/ck?endpoint_override=127.0.0.1:{silent}&scheme=http",
        }
        warm = {
            "warm s3 closed": s3["closed"],
            "warm s3 silent": s3["silent"],
            "warm gs": f"gs://b/run/ck?endpoint_override=127.0.0.1:{refused}&scheme=http",
            "warm hdfs": f"hdfs://127.0.0.1:{refused}/run/ck",
        }
        tiny = tmp_path / "tiny.yaml"
        tiny.write_text(textwrap.dedent(FULL_DISK))
        cases = {}
        for label in labels:
            if label in warm:
                config = tmp_path / f"{label.replace(' ', '_')}.yaml"
                config.write_text(textwrap.dedent(WARM.format(source=warm[label])))
                wrap = _no_network() if label == "warm gs" else ()
                # --dry-run: Ray never starts even if the check let it through.
                proc = _cli("--config", str(config), "--dry-run", wrap=wrap)
                cases[label] = (warm[label], proc)
            else:
                storage = s3[label.rsplit(" ", 1)[1]].replace("/ck?", "?")
                proc = _cli("--config", str(tiny), "--storage-path", storage, "--name", "x",
                            "--resume")  # fmt: skip
                cases[label] = (storage, proc)
        started = time.monotonic()
        lines = {label: _one_error_line(p, started, label) for label, (_, p) in cases.items()}
        if any("silent" in label for label in labels):
            assert accepted.is_set()  # the silent cases did reach the listener
    for label, line in lines.items():
        where = cases[label][0]
        if label.startswith("warm"):
            assert "amp.warm_start.from: cannot read " in line and repr(where) in line, line
            assert "drop warm_start" in line, line
        else:
            assert f"--storage-path: cannot reach {where} (" in line, line
        if "silent" in label:
            assert f"no answer from {where} within {TIMEOUT_S} s" in line, line
        if "s3 closed" in label:
            assert "Could not connect" in line, line


def test_unreachable_remotes_before_any_trial_are_one_line_and_exit_2(tmp_path):
    # One of each kind: a source that never answers, gs:// (which hung), a resume whose
    # storage refuses connections.
    _unreachable(tmp_path, ("warm s3 silent", "warm gs", "resume s3 closed"))


@pytest.mark.slow  # three more CLI starts, each loading RLlib: 30-60 s on 2 shared cores
def test_more_unreachable_remotes_before_any_trial_are_one_line_and_exit_2(tmp_path):
    _unreachable(tmp_path, ("warm s3 closed", "warm hdfs", "resume s3 silent"))


# SIGTERM (cli.Interrupted) exits 143, never the 130 of Ctrl-C: 10-15 s each (--dry-run).
CTRL_C_TIMEOUT_S = 9


@pytest.mark.parametrize(
    "signum",
    [signal.SIGINT, pytest.param(signal.SIGTERM, marks=pytest.mark.slow)],  # 15 s each
    ids=["SIGINT", "SIGTERM"],
)
def test_ctrl_c_while_a_remote_never_answers_is_exit_130(tmp_path, signum):
    """Ctrl-C is 130; SIGTERM 143 (as main_wrapper says). The signal takes effect when
    pyarrow's call gives up on its own timeouts: within one remote timeout."""
    with silent_listener() as (port, accepted):
        source = f"s3://b/run/ck?endpoint_override=127.0.0.1:{port}&scheme=http"
        config = tmp_path / "warm.yaml"
        config.write_text(textwrap.dedent(WARM.format(source=source)))
        env = _env(RLLIB_AMP_REMOTE_TIMEOUT_S=str(CTRL_C_TIMEOUT_S))
        proc = subprocess.Popen(
            [sys.executable, "-m", "rllib_amp.tune", "--config", str(config), "--dry-run"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert accepted.wait(timeout=240), proc.poll()
        time.sleep(0.5)  # inside the wait now
        sent = time.monotonic()
        proc.send_signal(signum)
        out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signum, out[-2000:] + err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    # At most one remote timeout (and the S3 client's backoff between its tries).
    assert time.monotonic() - sent < CTRL_C_TIMEOUT_S + 20


# -- a disk that fills up mid-run --------------------------------------------------------------
FULL_DISK = """
algorithm: PPO
env: CartPole-v1
model: {fcnet_hiddens: [16]}
amp: {dtype: float16}
training: {train_batch_size_per_learner: 200, minibatch_size: 100, num_epochs: 1}
resources: {num_env_runners: 0}
tune: {max_concurrent_trials: 1, max_failures: 0}
stop: {training_iteration: 12}
checkpoint: {frequency: 1, num_to_keep: 2}
seed: 0
"""


@pytest.fixture
def private_tmpfs(tmp_path):
    """A 8 MB tmpfs in a mount namespace of its own, held by a sleeping process: yields the
    folder as every process sees it (``/proc/<pid>/root/...``). Skips where the OS refuses."""
    folder = tmp_path / "disk"
    folder.mkdir()
    script = 'mount -t tmpfs -o size=8M none "$1" && echo mounted && exec sleep 3600'
    try:
        holder = subprocess.Popen(
            ["unshare", "-m", "--propagation", "private", "sh", "-c", script, "sh", str(folder)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    except OSError as e:
        pytest.skip(f"no private mount namespace here: {e}")
    assert holder.stdout is not None
    if holder.stdout.readline().strip() != "mounted":
        holder.wait(timeout=30)
        pytest.skip(f"no private tmpfs here: {holder.stderr.read().strip()}")
    try:
        yield f"/proc/{holder.pid}/root{folder}"
    finally:
        holder.kill()
        holder.wait(timeout=30)


def _fill(disk: str) -> str:
    """Writes a file into ``disk`` until it is full; returns its path."""
    filler = os.path.join(disk, "filler")
    with open(filler, "wb", buffering=0) as f:  # unbuffered: nothing left to fail at close
        try:
            while True:
                f.write(b"\0" * 4096)
        except OSError as e:
            assert e.errno == 28, e
    return filler


def _intact(checkpoint: str) -> bool:
    try:
        verify_checkpoint(checkpoint, announce_missing_manifest=False)
    except CheckpointError:
        return False
    return os.path.isfile(os.path.join(checkpoint, MANIFEST_FILE_NAME))


def _sweep_with_rows_stored(tmp_path, storage, name, session_sweep, trial_results):
    """Starts the FULL_DISK sweep into ``storage``/``name`` and returns its process once Tune
    has copied two result rows there (it copies result.json with the experiment state)."""
    config = tmp_path / f"{name}.yaml"
    config.write_text(textwrap.dedent(FULL_DISK))
    cmd = session_sweep(config, storage, name)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    pattern = os.path.join(storage, name, "*", "result.json")
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        found = glob.glob(pattern)
        if found and len(trial_results(found[0])) >= 2:
            break
        time.sleep(0.05)
    return proc


# About 26 s. In the default run: a full disk during a checkpoint copy named once
# (unit/sweep/test_storage.py), the one line it ends with (unit/sweep/test_summary.py), and a
# sweep whose storage fails before any trial (above).
@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_full_disk_mid_run_is_one_line_and_resume_loses_nothing(
    private_tmpfs, tmp_path, session_sweep, trial_results
):
    # Once rows are in the storage, the disk fills up, long before the last of 12 iterations.
    proc = _sweep_with_rows_stored(tmp_path, private_tmpfs, "full", session_sweep, trial_results)
    filler = _fill(private_tmpfs)
    out, err = proc.communicate(timeout=600)

    # 1. One line at the end names the full disk, the path and the --resume command.
    assert proc.returncode == 1, out[-3000:] + err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("python -m rllib_amp.tune: the storage at "), err[-3000:]
    assert f"{private_tmpfs}/full is full (ENOSPC)" in last and "No space left" in last, last
    resume = last.split("continue with: ", 1)[1]
    assert resume.endswith("--resume") and private_tmpfs in resume, last
    assert err.count("is full (ENOSPC)") == 1
    # Named once by this command; Tune's own records of it are one line each (there were
    # 6-7 tracebacks, about 200 lines, before the last line).
    assert "Traceback" not in err, err[-5000:]
    print(f"full disk: {len(err.splitlines())} stderr lines")
    (trial,) = glob.glob(os.path.join(private_tmpfs, "full", "*", ""))
    rows_before = trial_results(os.path.join(trial, "result.json"))
    assert rows_before and rows_before[-1]["training_iteration"] < 12
    before = sorted(glob.glob(os.path.join(trial, "checkpoint_*")))
    whole = [c for c in before if _intact(c)]  # every one Tune finished, still whole
    assert whole, before
    with open(glob.glob(os.path.join(private_tmpfs, "full", "experiment_state-*.json"))[0]) as f:
        json.load(f)  # whole, not cut off mid-write

    # 2. Space freed: the printed command resumes and finishes, nothing lost.
    os.remove(filler)
    words = shlex.split(resume)
    assert words[:3] == ["python", "-m", "rllib_amp.tune"], resume
    resumed = subprocess.run(
        [sys.executable, *words[1:]], capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    rows = trial_results(os.path.join(trial, "result.json"))
    assert rows[: len(rows_before)] == rows_before  # every row written before the fault
    assert rows[-1]["training_iteration"] == 12 and rows[-1]["done"]
    # The trial went on from a whole checkpoint (the newest Tune had recorded), never from a
    # cut-off one: those are kept aside, and every checkpoint left under its own name is whole.
    restored = next(r for r in rows[len(rows_before) :] if r["iterations_since_restore"] == 1)
    source = f"checkpoint_{restored['training_iteration'] - 2:06d}"  # index 0: iteration 1
    assert source in [os.path.basename(c) for c in whole], (source, before)
    for checkpoint in glob.glob(os.path.join(trial, "checkpoint_*")):
        assert checkpoint.endswith(".damaged") or _intact(checkpoint), checkpoint
    cut = [c for c in before if c not in whole]
    for checkpoint in cut:
        assert os.path.isdir(checkpoint + ".damaged"), checkpoint
    shutil.rmtree(os.path.join(private_tmpfs, "full"))  # the tmpfs goes with its holder


def _remount(tmpfs: str, mode: str) -> None:
    """Remounts ``private_tmpfs``'s folder ``ro`` or ``rw`` inside its holder's namespace."""
    pid, folder = tmpfs.removeprefix("/proc/").split("/root", 1)
    subprocess.run(["nsenter", "-t", pid, "-m", "mount", "-o", f"remount,{mode}", folder],
                   check=True, capture_output=True, timeout=30)  # fmt: skip


# About 30 s: the full-disk test's run with the storage turned read-only instead.
@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_read_only_storage_mid_run_is_one_line_and_resume_loses_nothing(
    private_tmpfs, tmp_path, session_sweep, trial_results
):
    proc = _sweep_with_rows_stored(tmp_path, private_tmpfs, "ro", session_sweep, trial_results)
    _remount(private_tmpfs, "ro")
    try:
        out, err = proc.communicate(timeout=600)
    finally:
        _remount(private_tmpfs, "rw")
    assert proc.returncode == 1, out[-3000:] + err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("python -m rllib_amp.tune: the storage at "), err[-3000:]
    assert f"{private_tmpfs}/ro is read-only (EROFS)" in last, last
    assert err.count("is read-only (EROFS)") == 1 and "Traceback" not in err, err[-5000:]
    print(f"read-only storage: {len(err.splitlines())} stderr lines")
    (trial,) = glob.glob(os.path.join(private_tmpfs, "ro", "*", ""))
    rows_before = trial_results(os.path.join(trial, "result.json"))
    assert rows_before and rows_before[-1]["training_iteration"] < 12
    # Writable again: the printed command resumes and finishes, nothing lost.
    words = shlex.split(last.split("continue with: ", 1)[1])
    resumed = subprocess.run(
        [sys.executable, *words[1:]], capture_output=True, text=True, timeout=600
    )
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    rows = trial_results(os.path.join(trial, "result.json"))
    assert rows[: len(rows_before)] == rows_before
    assert rows[-1]["training_iteration"] == 12 and rows[-1]["done"]
    shutil.rmtree(os.path.join(private_tmpfs, "ro"))


@pytest.mark.slow  # a local Ray of its own (the trials need moto's credentials): 60-100 s
def test_s3_endpoint_dying_under_the_trials_is_one_line_with_the_resume_command(tmp_path):
    from tests.cluster.s3 import moto_s3

    config = tmp_path / "die.yaml"
    config.write_text(textwrap.dedent(FULL_DISK).replace("iteration: 12", "iteration: 60"))
    with moto_s3() as s3:
        storage = s3.uri("exp")
        proc = subprocess.Popen(
            [sys.executable, "-m", "rllib_amp.tune", "--config", str(config),
             "--storage-path", storage, "--name", "die"],
            # A timeout for a loaded machine: moto answers, only slowly at times.
            cwd=ROOT, env=_env(RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0",
                               RLLIB_AMP_REMOTE_TIMEOUT_S="30"),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        deadline = time.time() + 400
        while time.time() < deadline and proc.poll() is None:
            saved = [p for p in s3.list("exp/die") if p.endswith("/algorithm_state.pkl")]
            if len(saved) >= 2:
                break
            time.sleep(0.5)
        assert proc.poll() is None, proc.communicate()[1][-3000:]
    # moto's server is gone: every later request is refused.
    out, err = proc.communicate(timeout=600)
    assert proc.returncode == 1, out[-2000:] + err[-3000:]
    last = err.strip().splitlines()[-1]
    where = fs.join(storage, "die")
    assert last.startswith(f"python -m rllib_amp.tune: the storage at {where} "), last
    assert "continue with: " in last and last.endswith("--resume"), last
    assert err.count("continue with: ") == 1
    assert "Traceback" not in err.split("Trials did not complete")[-1], err[-3000:]
