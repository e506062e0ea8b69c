"""The command line starts light: ``--help`` and the refusals that need no Ray import neither
torch nor RLlib. The seconds are printed at the end of every test run (``start_seconds``, a
section of the terminal summary: tests/conftest.py); the bound asserted is loose because a
shared test machine may be busy: speed is shown by the number, not the test."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

HEAVY = ("torch", "ray.rllib", "ray.tune")
# Far above the measured figure (README: under 1.5 s idle on 2 cores): fails only when an
# import of torch or RLlib creeps back in on a machine that is not overloaded.
GENEROUS_S = 10.0


def loaded_after(statement: str) -> list[str]:
    probe = f"import sys\n{statement}\nprint(*[m for m in {HEAVY!r} if m in sys.modules])"
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.split()


@pytest.mark.parametrize(
    "statement",
    [
        "import rllib_amp.tune",
        "import rllib_amp",
        "import rllib_amp.bench",
        "from rllib_amp.sweep.main import build_parser; build_parser()",
    ],
)
def test_importing_the_command_loads_neither_torch_nor_rllib(statement):
    assert loaded_after(statement) == []


def test_the_package_root_still_exports_its_names():
    """The lazy root hands out the same objects as their modules, and lists them."""
    code = (
        "import rllib_amp\n"
        "from rllib_amp import (with_amp, AmpSettings, AmpLearnerMixin, AmpPPOTorchLearner,\n"
        "    AmpDQNTorchLearner, AmpAPPOTorchLearner, amp_learner_class)\n"
        "from rllib_amp.api import with_amp as w\n"
        "from rllib_amp.algorithms import AmpPPOTorchLearner as P\n"
        "assert with_amp is w and AmpPPOTorchLearner is P\n"
        "assert set(rllib_amp.__all__) <= set(dir(rllib_amp)), dir(rllib_amp)\n"
        "print(rllib_amp.__version__)\n"
        "try:\n    rllib_amp.nothing_here\nexcept AttributeError as e:\n    print(e)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines() == [
        "0.1.0",
        "module 'rllib_amp' has no attribute 'nothing_here'",
    ]


def timed(args: list[str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "rllib_amp.tune", *args],
                          capture_output=True, text=True, timeout=120)  # fmt: skip
    return time.monotonic() - start, proc


def test_help_and_refusals_that_need_no_ray_start_fast(tmp_path, tiny_file, record_property):
    (tmp_path / "taken").mkdir()
    (tmp_path / "taken" / "tuner.pkl").write_bytes(b"x")
    cases = {
        "--help": (["--help"], 0),
        "bad flag": (["--bogus"], 2),
        "existing --name": (["--config", tiny_file(tmp_path), "--storage-path", str(tmp_path),
                             "--name", "taken"], 2),
    }  # fmt: skip
    for label, (args, expected) in cases.items():
        seconds, proc = timed(args)
        record_property("start_seconds", (f"python -m rllib_amp.tune {label}", seconds))
        assert proc.returncode == expected, proc.stderr
        if expected == 2:
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
        assert seconds < GENEROUS_S


# Exit-2 answers about the experiment file that need no RLlib: file -> YAML -> keys ->
# section types -> algorithm name, and the --set values.
BAD_FILES = {
    "missing file": None,
    "YAML syntax error": "algorithm: PPO\nenv: [CartPole-v1\n",
    "unknown top-level key": "algoritm: PPO\nenv: CartPole-v1\n",
    "section of the wrong type": "algorithm: PPO\nenv: CartPole-v1\nstop: 5\n",
    "unknown algorithm": "algorithm: PPOX\nenv: CartPole-v1\nstop: {training_iteration: 1}\n",
    "malformed --set": "algorithm: PPO\nenv: CartPole-v1\nstop: {training_iteration: 1}\n",
}


@pytest.mark.parametrize("label", list(BAD_FILES))
def test_a_bad_experiment_file_is_refused_before_rllib_loads(tmp_path, label, record_property):
    """Runs the command's ``main`` in a fresh interpreter, then reads its ``sys.modules``: the
    answer came, as one line and exit 2, without importing torch or RLlib."""
    path = tmp_path / "exp.yaml"
    if BAD_FILES[label] is not None:
        path.write_text(BAD_FILES[label])
    argv = ["--config", str(path), *(["--set", "stop"] if label == "malformed --set" else [])]
    probe = (
        "import sys\n"
        "from rllib_amp.sweep.main import main\n"
        f"rc = main({argv!r})\n"
        f"print(rc, *[m for m in {HEAVY!r} if m in sys.modules])\n"
    )
    start = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          timeout=120)  # fmt: skip
    seconds = time.monotonic() - start
    record_property("start_seconds", (f"python -m rllib_amp.tune, {label}", seconds))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["2"], (proc.stdout, proc.stderr)  # exit 2, nothing heavy
    assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert seconds < GENEROUS_S
