"""`python -m rllib_amp.tune` stopped by a signal: SIGTERM (what `ray job stop` and most
schedulers send) behaves like Ctrl-C, and a second signal while the experiment state is being
saved does not cut it short. Each run is then resumed to the end. Outside Tune's loop too: while
the command's modules load, and between Ray's start and Tune's loop (one line, 130 or 143, the
--resume command when there is something to resume)."""

from __future__ import annotations

import contextlib
import glob
import os
import shlex
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pyarrow.parquet as pq
import pytest


def _start(tmp_path, tiny_file, session_sweep, name):
    config = tiny_file(tmp_path, iterations=4)
    cmd = session_sweep(config, tmp_path, name)
    log = open(tmp_path / f"{name}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return cmd, proc, log


def _wait_for_a_result(tmp_path, name, trial_results, proc):
    pattern = str(tmp_path / name / "*" / "result.json")
    deadline = time.time() + 240
    while time.time() < deadline and proc.poll() is None:
        if any(trial_results(f) for f in glob.glob(pattern)):
            return
        time.sleep(0.1)
    raise AssertionError(f"no trial reported before the signal (exit {proc.poll()})")


def _resume_finishes(cmd, tmp_path, name):
    out = subprocess.run(cmd + ["--resume"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = pq.read_table(str(tmp_path / name / "results.parquet")).to_pylist()
    assert len(rows) == 2 and all(r["status"] == "DONE" for r in rows), rows


@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize(
    ("signals", "status"),
    [
        # 30-45 s each on 2 cores, so all slow: tests/cli/sweep/test_cli_errors.py has the
        # handler's logic without Ray in the default run.
        pytest.param([signal.SIGTERM], 143, marks=pytest.mark.slow),
        # The second one lands while Tune saves the experiment state.
        pytest.param([signal.SIGINT, signal.SIGINT], 130, marks=pytest.mark.slow),
        pytest.param([signal.SIGTERM, signal.SIGINT], 143, marks=pytest.mark.slow),
    ],
    ids=["sigterm", "sigint-twice", "sigterm-then-sigint"],
)
def test_a_signal_saves_the_state_prints_resume_and_resume_finishes(
    tmp_path, tiny_file, trial_results, session_sweep, signals, status
):
    name = "signalled"
    cmd, proc, log = _start(tmp_path, tiny_file, session_sweep, name)
    try:
        _wait_for_a_result(tmp_path, name, trial_results, proc)
        for i, sig in enumerate(signals):
            if i:
                time.sleep(0.3)
            proc.send_signal(sig)
        assert proc.wait(timeout=180) == status
    finally:
        if proc.poll() is None:
            proc.kill()
        log.close()
    text = (tmp_path / f"{name}.log").read_text()
    assert "Traceback" not in text, text[-3000:]
    if len(signals) > 1:
        assert "still saving the experiment state" in text, text[-3000:]
    resume = [line for line in text.splitlines() if line.rstrip().endswith("--resume")]
    assert resume and f"--name {name}" in resume[-1], text[-3000:]
    assert glob.glob(str(tmp_path / name / "experiment_state-*.json"))
    _resume_finishes(cmd, tmp_path, name)


# -- signals outside Tune's loop -------------------------------------------------------------
def _mapped(pid: int, fragment: str) -> bool:
    try:
        with open(f"/proc/{pid}/maps", encoding="utf-8") as f:
            return fragment in f.read()
    except OSError:
        return False


@pytest.mark.parametrize(
    ("sig", "line", "status"),
    [
        (signal.SIGINT, "python -m rllib_amp.tune: interrupted", 130),
        (signal.SIGTERM, "python -m rllib_amp.tune: stopped by SIGTERM", 143),
    ],
    ids=["ctrl-c", "sigterm"],
)
def test_a_signal_while_the_command_loads_is_one_line(tmp_path, tiny_file, sig, line, status):
    """Sent once pyarrow is being loaded (the command's first heavy import, a second or more
    before RLlib's): one line and 128 + the signal, not a KeyboardInterrupt traceback."""
    config = tiny_file(tmp_path, iterations=1, scales=[1024.0])
    cmd = [sys.executable, "-m", "rllib_amp.tune", "--config", config,
           "--storage-path", str(tmp_path), "--name", "early"]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while time.time() < deadline and proc.poll() is None and not _mapped(proc.pid, "libarrow"):
        time.sleep(0.005)
    proc.send_signal(sig)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == status, err[-3000:]
    assert err == line + "\n", err[-3000:]
    assert not (tmp_path / "early").exists()


def _signalled_before_tunes_loop(monkeypatch, argv, capsys):
    """Runs the command in this process with a SIGTERM sent once Ray is up and the Tuner is
    built (its files written), before Tune's loop: its exit status and its one line."""
    from rllib_amp.sweep import main as cli
    from rllib_amp.sweep import tuner as T

    def signalled_fit(self, tuner):
        os.kill(os.getpid(), signal.SIGTERM)  # handled at the next bytecode, in this thread
        time.sleep(30)
        raise AssertionError("SIGTERM did not stop the command")

    with monkeypatch.context() as patched:
        patched.setattr(T.StopOnSignals, "fit", signalled_fit)
        status = cli.main(argv)
    err = capsys.readouterr().err
    ours = [line for line in err.splitlines() if line.startswith("python -m rllib_amp.tune:")]
    assert len(ours) == 1 and "Traceback" not in err, err[-3000:]
    assert ours[0].startswith("python -m rllib_amp.tune: stopped by SIGTERM before the trials")
    return status, ours[0]


def _runs_to_the_end(command, folder):
    out = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    rows = pq.read_table(str(folder / "results.parquet")).to_pylist()
    assert [r["status"] for r in rows] == ["DONE"]


# About 13 s. In the default run a signal mid-sweep saves the state and --resume finishes
# (sigterm-then-sigint above).
@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_sigterm_between_ray_and_tunes_loop_is_143_and_nothing_is_lost(
    tmp_path, tiny_file, session_sweep, monkeypatch, capsys
):
    """Exit 143 and one line. A new run has no experiment state to resume yet: what it wrote
    goes, and the same command starts it again; a --resume run gives the --resume command,
    which still continues it."""
    config = tiny_file(tmp_path, iterations=1, scales=[1024.0])
    cmd = session_sweep(config, tmp_path, "early-term")
    status, line = _signalled_before_tunes_loop(monkeypatch, cmd[3:], capsys)
    assert status == 143
    assert line.endswith("nothing was written; run the same command to start it again"), line
    assert not (tmp_path / "early-term").exists()
    _runs_to_the_end(cmd, tmp_path / "early-term")
    # A run whose summary was never written (killed after its trials ended) is one that
    # --resume continues; a finished one with its results.parquet is not resumed at all.
    (tmp_path / "early-term" / "results.parquet").unlink()
    before = _files(tmp_path / "early-term")

    status, line = _signalled_before_tunes_loop(monkeypatch, [*cmd[3:], "--resume"], capsys)
    assert status == 143
    command = shlex.split(line.split("continue with: ", 1)[1])
    assert command[-1] == "--resume" and set(command[1:]) == {*cmd[1:], "--resume"}, command
    assert _files(tmp_path / "early-term") == before  # not a byte changed: --resume continues


def _files(folder):
    return {
        str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()
    }


def test_ray_init_keeps_the_sigterm_handler_and_its_exit_is_an_interrupt(monkeypatch):
    """``ray.init`` puts ``sys.exit(15)`` on SIGTERM (exit 15, nothing saved): start_ray
    gives the handler back, and a SIGTERM during ``ray.init`` is Interrupted(SIGTERM)."""
    import ray

    from rllib_amp.cli import Interrupted
    from rllib_amp.sweep.ray_address import start_ray

    def like_ray(*args, **kwargs):
        signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(signum))
        return SimpleNamespace(address_info={"session_dir": "/tmp/ray/session_x"})

    def signalled(*args, **kwargs):
        like_ray()
        raise SystemExit(signal.SIGTERM)

    ours = lambda signum, frame: None  # noqa: E731
    before = signal.signal(signal.SIGTERM, ours)
    try:
        monkeypatch.setattr(ray, "init", like_ray)
        assert start_ray(None, "") == "/tmp/ray/session_x"
        assert signal.getsignal(signal.SIGTERM) is ours
        monkeypatch.setattr(ray, "init", signalled)
        with pytest.raises(Interrupted) as stopped:
            start_ray("127.0.0.1:1", "--address")
        assert stopped.value.signum == signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) is ours
    finally:
        signal.signal(signal.SIGTERM, before)


# -- the terminal closing --------------------------------------------------------------------
def _run_in_a_terminal(cmd, env):
    """Starts ``cmd`` in a new session whose controlling terminal is a new pty, as a shell in
    a terminal window runs it; returns its pid and the terminal's master end."""
    import pty

    pid, master = pty.fork()
    if pid == 0:  # the child: a session leader on the pty
        try:
            os.execve(cmd[0], cmd, env)
        finally:
            os._exit(127)
    return pid, master


def _drain(master, seconds):
    """Reads the terminal for ``seconds`` (a full pty buffer would block the command)."""
    import select

    deadline = time.time() + seconds
    while time.time() < deadline:
        ready, _, _ = select.select([master], [], [], 0.2)
        if ready:
            try:
                os.read(master, 65536)
            except OSError:
                return


# About 75 s on 2 cores (a Ray of its own); the default run keeps SIGTERM's test, whose
# handler this shares.
@pytest.mark.slow
def test_the_terminal_closing_stops_the_sweep_as_sigterm_and_leaves_the_summary_in_a_file(
    tmp_path, tiny_file, trial_results, own_ray_env
):
    """The terminal window closes: the kernel sends SIGHUP to the command's process group and
    nothing it prints reaches anyone. The sweep stops as with SIGTERM (Tune saves its state),
    and the summary with the --resume command is in the experiment folder."""
    name = "hangup"
    config = tiny_file(tmp_path, iterations=30, scales=[1024.0])
    cmd = [sys.executable, "-m", "rllib_amp.tune", "--config", config,
           "--storage-path", str(tmp_path), "--name", name]  # fmt: skip
    pid, master = _run_in_a_terminal(cmd, own_ray_env)
    try:
        pattern = str(tmp_path / name / "*" / "result.json")
        deadline = time.time() + 240
        while time.time() < deadline and not any(trial_results(f) for f in glob.glob(pattern)):
            _drain(master, 0.2)
        assert glob.glob(pattern), "no trial reported before the terminal closed"
        os.close(master)  # the terminal window closes
        deadline = time.time() + 180
        while time.time() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            time.sleep(0.2)
        else:
            raise AssertionError("the command did not end after its terminal closed")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGKILL)  # what of its Ray is left
    summary_file = tmp_path / name / "summary.txt"
    summary = summary_file.read_text() if summary_file.exists() else "(no summary.txt)"
    assert os.waitstatus_to_exitcode(status) == 128 + signal.SIGHUP, summary[-3000:]
    assert "stopped by SIGHUP" in summary or "did not finish" in summary, summary
    resume = [line for line in summary.splitlines() if line.rstrip().endswith("--resume")]
    assert resume and f"--name {name}" in resume[-1], summary
    assert glob.glob(str(tmp_path / name / "experiment_state-*.json"))
