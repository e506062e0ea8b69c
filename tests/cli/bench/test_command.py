"""`python -m rllib_amp.bench`: bad input and unwritable outputs give exit 2 and one line
before anything is measured; the workloads come from the algorithm registry; the report's
rows, table and machine line; the child-process harness."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rllib_amp.algorithms import ALGORITHMS
from rllib_amp.bench import command, harness, report, workloads

PROG = "python -m rllib_amp.bench: error: "
# The checkout under test, for CLI subprocesses (not an installed copy of the package).
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(command.__file__))))


class Measured(Exception):
    """Raised by the stand-in for the first measurement: the checks let the run through."""


@pytest.fixture
def no_measuring(monkeypatch):
    """Makes the first measuring step raise Measured, so a test sees how far a run got."""

    def measure(*args, **kwargs):
        raise Measured

    monkeypatch.setattr(command, "collect_data", measure)
    monkeypatch.setattr(command, "in_child", measure)


def _exits_2_naming(capsys, args, *fragments):
    assert command.main(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(PROG), err
    for fragment in fragments:
        assert fragment in err, err


BAD = [
    (["--algos", "SAC"], "--algos", "SAC"),
    (["--algos", "APPO"], "--algos", "APPO"),  # in the registry, but not benchmarked
    (["--algos", ","], "--algos"),
    (["--models", "huge"], "--models", "huge"),
    (["--device", "tpu"], "--device", "tpu"),
    (["--reps", "0"], "--reps", "0"),
    (["--reps", "many"], "--reps", "many"),
    (["--json", "/nonexistent/dir/b.json"], "--json", "/nonexistent/dir"),
    (["--device", "cuda"], "--device cuda"),
    (["--frobnicate"], "--frobnicate"),
]


@pytest.mark.parametrize("case", BAD, ids=[" ".join(c[0]) for c in BAD])
def test_bad_input_exits_2_with_one_line(capsys, no_measuring, case):
    import torch

    args, *fragments = case
    if args == ["--device", "cuda"] and torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the flag is valid here")
    _exits_2_naming(capsys, args, *fragments)


def test_algos_are_the_registry_names_with_a_workload(no_measuring):
    assert set(workloads.WORKLOADS) <= set(ALGORITHMS)
    assert set(workloads.PARITY) <= set(ALGORITHMS)
    assert command.build_parser().parse_args(["--algos", "dqn,PPO"]).algos == ["DQN", "PPO"]
    with pytest.raises(ValueError, match="SAC"):
        workloads._by_name((workloads.ParityRun("SAC", 1, {}),))
    with pytest.raises(ValueError, match="ppo"):  # the registry's spelling, or the lookups miss
        workloads._by_name((workloads.ParityRun("ppo", 1, {}),))


# -- outputs are checked before anything is measured ------------------------------------------
def test_unusable_output_paths_exit_2_before_measuring(tmp_path, capsys, no_measuring):
    a_file = tmp_path / "a_file"
    a_file.write_text("keep me")
    taken = tmp_path / "taken"
    (taken / report.PARQUET_NAME).mkdir(parents=True)
    cases = [
        (["--out", str(a_file)], "--out", str(a_file)),  # a file where a folder is expected
        (["--out", str(a_file / "sub")], "--out", str(a_file)),
        (["--out", str(taken)], "--out", report.PARQUET_NAME),
        (["--json", str(tmp_path)], "--json", str(tmp_path)),  # a folder where a file is
        (["--json", str(a_file / "b.json")], "--json", str(a_file)),
        (["--json", str(tmp_path / "x"), "--out", str(tmp_path / "x")], "--out", "--json"),
    ]
    for args, *fragments in cases:
        _exits_2_naming(capsys, args, *fragments)
    assert a_file.read_text() == "keep me"


def test_read_only_folder_exits_2_before_measuring(tmp_path, capsys, no_measuring):
    if os.geteuid() == 0:
        pytest.skip("root writes through permission bits: see the read-only mount test")
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o555)
    try:
        _exits_2_naming(capsys, ["--out", str(ro / "results")], "--out", str(ro))
        _exits_2_naming(capsys, ["--json", str(ro / "b.json")], "--json", str(ro))
    finally:
        ro.chmod(0o755)


def test_read_only_mount_exits_2_before_measuring(tmp_path):
    """A truly read-only folder (a read-only tmpfs in a private mount namespace)."""
    if os.geteuid() != 0:
        pytest.skip("mounting needs root: the chmod test covers non-root users")
    ro = tmp_path / "ro"
    ro.mkdir()
    flags = [("--out", str(ro / "results")), ("--json", str(ro / "b.json"))]
    calls = "; ".join(f"print(command.main({list(pair)!r}))" for pair in flags)
    script = (
        f"mount -t tmpfs -o ro none {ro} || exit 99; "
        f'exec "{sys.executable}" -c "from rllib_amp.bench import command; {calls}"'
    )
    proc = subprocess.run(
        ["unshare", "-m", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": REPO},
    )
    if proc.returncode == 99:
        pytest.skip(f"this OS refuses a private read-only mount: {proc.stderr.strip()}")
    assert proc.returncode == 0 and proc.stdout.split() == ["2", "2"], proc
    lines = proc.stderr.splitlines()
    assert len(lines) == len(flags), proc.stderr
    for line, (flag, _) in zip(lines, flags):
        assert line.startswith(PROG) and flag in line and str(ro) in line, line


def test_writable_outputs_pass_the_check_and_leave_no_trace(tmp_path, no_measuring):
    (tmp_path / "old.json").write_text("previous run")
    args = ["--json", str(tmp_path / "old.json"), "--out", str(tmp_path / "new" / "folder")]
    with pytest.raises(Measured):
        command.main(args)
    assert sorted(os.listdir(tmp_path)) == ["old.json"]
    assert (tmp_path / "old.json").read_text() == "previous run"


# -- report -----------------------------------------------------------------------------------
def test_rows_put_the_ratio_to_fp32_in_every_row():
    results = {
        "throughput": {
            "PPO full": {"fp32": [100.0, 110.0, 90.0], "amp-auto": [200.0, 210.0, 190.0]}
        },
        "memory": {"PPO full": {"fp32": 2.0 * 2**20, "amp-auto": 1.0 * 2**20}},
        "end_to_end": {"fp32": [10.0, 12.0], "amp-auto": [15.0, 13.0]},
        "parity": {"PPO": {"fp32": [100.0, 200.0], "amp-auto": [150.0, 150.0]}},
    }
    rows = report.rows_from(results)
    ratio = {(r["figure"], r["variant"]): r["ratio_to_fp32"] for r in rows}
    assert ratio[("learner update", "amp-auto")] == pytest.approx(2.0)
    assert ratio[("peak memory of update", "amp-auto")] == pytest.approx(0.5)
    assert ratio[("end to end", "amp-auto")] == pytest.approx(14.0 / 11.0)
    assert ratio[("learning parity", "amp-auto")] == pytest.approx(1.0)
    assert all(r["ratio_to_fp32"] == 1.0 for r in rows if r["variant"] == "fp32")
    table = report.markdown(rows, "header")
    assert table.count("\n") == len(rows) + 3 and "2.00x" in table


INTEL_SPR = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu vme sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni amx_bf16 avx512_fp16 \
amx_tile amx_int8
"""
AMD_ZEN4 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 9654 96-Core Processor
flags\t\t: fpu vme sse2 avx2 avx512f avx512bw avx512_bf16 avx512_vnni
"""
AMD_ZEN3 = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7763 64-Core Processor
flags\t\t: fpu vme sse2 avx2 fma
"""


@pytest.mark.parametrize(
    "text, model, present, absent",
    [
        (INTEL_SPR, "Intel(R) Xeon(R) Platinum 8480+", ["avx512_bf16", "amx_bf16", "amx_tile"], []),
        (AMD_ZEN4, "AMD EPYC 9654 96-Core Processor", ["avx512_bf16"], ["amx"]),
        (AMD_ZEN3, "AMD EPYC 7763 64-Core Processor", [], ["amx_bf16,", "(avx512_bf16"]),
    ],
    ids=["intel-amx", "amd-epyc-avx512bf16", "amd-epyc-no-bf16"],
)
def test_machine_line_names_the_cpu_and_only_the_flags_it_has(text, model, present, absent):
    line = report.describe_cpu(text, 8)
    assert line.startswith(f"{model}, 8 cores ("), line
    flags = line[line.rindex("(") + 1 : line.rindex(")")]
    listed = [] if flags.startswith("no ") else flags.split(", ")
    assert listed == present, line
    for fragment in absent:
        assert fragment not in line, line


def test_machine_line_of_this_machine_matches_its_cpuinfo():
    from rllib_amp.learner.precision import bf16_cpu_flags, read_cpuinfo

    line = report.machine_description("cpu")
    for flag in bf16_cpu_flags(read_cpuinfo()):
        assert flag in line


# -- harness ----------------------------------------------------------------------------------
def test_in_child_raises_and_notices_a_dead_child():
    import math

    with pytest.raises(RuntimeError, match="ValueError: math domain error"):
        harness.in_child(math.sqrt, -1.0)
    with pytest.raises(RuntimeError, match="died \\(exit code 3\\)"):
        harness.in_child(os._exit, 3)


_PARENT = """
import sys, time
from rllib_amp.bench import harness
from rllib_amp.cli import main_wrapper

def run(argv):
    print("started", flush=True)
    harness.in_child(time.sleep, 600.0)
    return 0

sys.exit(main_wrapper("parent", run, None))
"""


def _parent_with_a_sleeping_child() -> subprocess.Popen:
    """``_PARENT`` started, once its child is up and sleeping."""
    import time

    parent = subprocess.Popen(
        [sys.executable, "-c", _PARENT], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert parent.stdout is not None and parent.stdout.readline() == "started\n"
        time.sleep(3)
    except BaseException:
        parent.kill()
        raise
    return parent


def _signal_and_wait(parent, signum: int, *, timeout: float) -> tuple[str, float]:
    """(the parent's stderr, seconds from ``signum`` to its exit)."""
    import time

    start = time.monotonic()
    parent.send_signal(signum)
    _, err = parent.communicate(timeout=timeout)
    return err, time.monotonic() - start


def test_a_sigterm_to_the_parent_alone_ends_its_child_too():
    # ``kill PID`` or a scheduler signals the parent only; without passing it on, the parent
    # waited 60 s for a child that ran on, then killed it (SIGKILL: no cleanup).
    import signal

    parent = _parent_with_a_sleeping_child()
    try:
        err, took = _signal_and_wait(parent, signal.SIGTERM, timeout=120)
    finally:
        parent.kill()
    assert parent.returncode == 128 + signal.SIGTERM, err
    assert "parent: stopped by SIGTERM" in err
    assert took < 30, f"the parent took {took:.0f} s: its child ran on"


def test_a_second_signal_while_the_parent_waits_for_its_child_ends_both():
    # ``kill -INT PID`` reaches the parent alone, which then gives its child (that a Ctrl-C
    # would have reached too) 60 s to finish. A SIGTERM in those 60 s skipped the kill: the
    # parent then waited at exit for a child that trained on, for hours.
    import signal
    import time

    parent = _parent_with_a_sleeping_child()
    child = 0
    try:
        (child,) = _spawned_children(parent.pid)
        parent.send_signal(signal.SIGINT)
        time.sleep(2)  # the parent is in its 60 s wait
        assert _alive(child)
        err, took = _signal_and_wait(parent, signal.SIGTERM, timeout=90)
    finally:
        parent.kill()
        if child and _alive(child):
            os.kill(child, signal.SIGKILL)  # not left sleeping when the test fails
    assert took < 30, f"the parent took {took:.0f} s: it waited for its child"
    assert parent.returncode == 128 + signal.SIGTERM, err
    assert not _alive(child)


def _spawned_children(pid: int) -> list[int]:
    """The pids of ``pid``'s children that multiprocessing spawned to run a function (not its
    resource tracker)."""
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        pids = [int(p) for p in f.read().split()]
    return [p for p in pids if b"--multiprocessing-fork" in _cmdline(p)]


def _cmdline(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read()
    except FileNotFoundError:
        return b""


def _alive(pid: int) -> bool:
    """Running and not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _build_learner_and_list_warnings(variant: str) -> tuple[list[tuple[str, str, int]], set]:
    """In a child: builds a bench learner; returns (logger, file, line) of Ray's WARNINGs
    and the keys of Ray's once-only messages this process has shown."""
    import logging

    import gymnasium as gym
    import numpy as np

    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logging.getLogger("ray").addHandler(Keep(logging.WARNING))
    obs = gym.spaces.Box(0, 255, (84, 84, 4), np.uint8)
    spaces = {"default_policy": (obs, gym.spaces.Discrete(6))}
    workloads.build_learner("PPO", "mini", variant, "cpu", spaces)
    return [(r.name, r.pathname, r.lineno) for r in records], harness.shown_once_keys()


@pytest.mark.slow  # slow (11 s)
def test_rllib_deprecation_notices_appear_once_per_run_not_once_per_child():
    """RLlib 2.60 logs its RLModuleConfig deprecation notice from inside RLModule.__init__
    for every module (ray-project/ray#51630), once per process: the bench's children share
    what the run has shown, so the second child (and the parent) repeat nothing."""
    first, first_keys = harness.in_child(_build_learner_and_list_warnings, "fp32")
    second, _ = harness.in_child(_build_learner_and_list_warnings, "amp-auto")
    deprecations = [r for r in first + second if r[0] == "ray._common.deprecation"]
    assert len(deprecations) == len(set(deprecations)) <= 1, deprecations
    assert not [r for r in second if r[0] == "ray._common.deprecation"], second
    assert not set(first) & set(second), (first, second)
    assert first_keys <= harness.shown_once_keys()  # the parent will not repeat them either


def test_ray_log_once_registry_is_a_set_the_harness_can_share():
    """Pin: ray.util.debug keeps the keys log_once has seen in a module-level set."""
    from ray.util import debug

    key = "rllib_amp pin key"
    assert isinstance(debug._logged, set)
    harness.adopt_once_keys({key})
    assert debug.log_once(key) is False
    debug.reset_log_once(key)
    assert debug.log_once(key) is True


# -- configs ----------------------------------------------------------------------------------
def test_parity_configs_come_from_algo_config(monkeypatch):
    from rllib_amp.algorithms import algorithm
    from rllib_amp.bench import figures

    seen = []

    def record(*args, **kwargs):
        seen.append((args, kwargs))
        raise Measured

    monkeypatch.setattr(figures, "algo_config", record)
    with pytest.raises(Measured):
        figures.bench_parity(("amp-auto",), (3,))
    ((args, kwargs),) = seen
    cfg = workloads.algo_config(*args, **kwargs)
    assert cfg.env == "CartPole-v1" and cfg.seed == 3 and cfg.num_env_runners == 0
    assert cfg.lr == 3e-4 and cfg.train_batch_size_per_learner == 1000
    assert cfg.minibatch_size == 250 and cfg.model_config["fcnet_hiddens"] == [64, 64]
    assert cfg.learner_class is algorithm("PPO").amp_learner


def test_a_run_stopped_part_way_keeps_the_figures_measured_so_far(tmp_path, monkeypatch):
    """Each figure is in --json as soon as it is measured: a run killed by a time limit (the
    GPU check's) keeps what it had, marked partial; a finished run replaces it."""
    cells = iter([{"fp32": [10.0], "amp-auto": [20.0]}])

    def one_cell_then_stop(fn, *args):
        try:
            return next(cells)
        except StopIteration:
            raise Measured from None

    monkeypatch.setattr(command, "collect_data", lambda *a, **k: None)
    monkeypatch.setattr(command, "in_child", one_cell_then_stop)
    monkeypatch.setattr(command.figures, "bench_memory", lambda *a: {"fp32": 2.0, "amp-auto": 1.0})
    out = tmp_path / "bench.json"
    with pytest.raises(Measured):
        command.run(["--quick", "--device", "cpu", "--algos", "PPO", "--json", str(out)])
    saved = json.loads(out.read_text())
    assert saved["partial"] is True
    assert saved["raw"]["throughput"] == {"PPO full": {"fp32": [10.0], "amp-auto": [20.0]}}
    assert saved["raw"]["memory"] == {"PPO full": {"fp32": 2.0, "amp-auto": 1.0}}
    assert not list(tmp_path.glob("*.tmp"))


def test_dqn_batches_give_update_time_and_memory_per_batch_and_variant(monkeypatch):
    """The write-up's "AMP lets the DQN batch grow from 32 to 64 or 128": per batch, the
    update's ms (from samples/s of a batch of that many env steps) and peak memory, float32
    and AMP; the data is sampled at each batch size."""
    sampled = []
    monkeypatch.setattr(command, "collect_data", lambda *a, batch_size: sampled.append(batch_size))
    monkeypatch.setattr(
        command, "in_child", lambda fn, algo, model, variants, *a: {v: [3200.0] for v in variants}
    )
    monkeypatch.setattr(
        command.figures, "bench_memory", lambda *a: {"fp32": 4.0 * 2**20, "amp-auto": 2**20}
    )
    out = command.dqn_batches("cpu", reps=1)
    assert sampled == [32, 64, 128] == [int(k) for k in out]
    assert out["64"]["update_ms"] == {"fp32": [20.0], "amp-auto": [20.0]}  # 64 / 3200 s
    rows = report.rows_from({"dqn_batches": out})
    times = [r for r in rows if r["figure"] == "DQN update time by batch"]
    assert [(r["workload"].split(", ")[-1], r["variant"], r["value"]) for r in times[:2]] == [
        ("batch 32", "fp32", 10.0), ("batch 32", "amp-auto", 10.0),
    ]  # fmt: skip
    mem = [r for r in rows if r["figure"] == "DQN update peak memory by batch"]
    assert len(mem) == 6 and mem[1]["ratio_to_fp32"] == 0.25 and mem[1]["unit"] == "MiB"


@pytest.mark.parametrize("user_value", [None, "ACTIVE"])
def test_the_measuring_children_get_the_sweeps_openmp_policy_unless_set(
    monkeypatch, capsys, user_value
):
    # As `python -m rllib_amp.tune` gives its local Ray (sweep.ray_address.LOCAL_RAY_ENV): the
    # children inherit it when they start; the calling process's environment is as it was.
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    if user_value:
        monkeypatch.setenv("OMP_WAIT_POLICY", user_value)
    seen = []

    def measure(*args, **kwargs):
        seen.append(os.environ.get("OMP_WAIT_POLICY"))
        raise Measured

    monkeypatch.setattr(command, "collect_data", measure)
    with pytest.raises(Measured):
        command.run(["--quick", "--device", "cpu", "--algos", "PPO"])
    assert seen == [user_value or "PASSIVE"]
    assert os.environ.get("OMP_WAIT_POLICY") == user_value
    # A run that measured nothing still prints its header, which names the policy.
    monkeypatch.setattr(command, "_measure", lambda *args: None)
    assert command.run(["--quick", "--device", "cpu", "--algos", "PPO"]) == 0
    header = capsys.readouterr().out.splitlines()[0]
    assert f"; OMP_WAIT_POLICY {user_value or 'PASSIVE'};" in header, header
