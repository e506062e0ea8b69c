"""`python -m rllib_amp.tune` against hostile experiment files: exit 2, one line, before Ray."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

from rllib_amp.sweep import main as cli

PROG = "python -m rllib_amp.tune: error: "
GOOD = """
algorithm: PPO
env: CartPole-v1
model: {fcnet_hiddens: [8]}
amp: {dtype: float16}
training: {train_batch_size_per_learner: 64, minibatch_size: 32, num_epochs: 1}
resources: {num_env_runners: 0}
search:
  amp.init_scale: {grid: [256.0, 1024.0]}
stop: {training_iteration: 1}
seed: 0
"""
LAUGHS = 'a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n' + "".join(
    f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefgh", "bcdefghi")
)
HOSTILE = [
    # (name, file bytes, fragment of the one line)
    ("duplicate key", GOOD + "seed: 1\n", "key 'seed': first at line 11, again at line 12"),
    ("recursive alias", GOOD + "env_config: &x {a: *x}\n", "recursive alias"),
    ("billion laughs", LAUGHS, "aliases expand this document beyond"),
    ("latin-1", (GOOD + "env_config: {n: é}\n").encode("latin-1"), "is not UTF-8"),
    ("nul", GOOD.encode() + b"\0", "a NUL byte"),
    ("1e400", GOOD.replace("num_epochs: 1}", "num_epochs: 1, lr: 1e400}"), "beyond float64"),
    ("2**1024 init_scale", GOOD.replace("float16}", "float16, init_scale: " + str(2**1024) + "}"),
     "is beyond float64"),
    ("seed 2**70", GOOD.replace("seed: 0", f"seed: {2**70}"), "seed: got"),
    ("stop key never reported", GOOD.replace("training_iteration: 1", "episode_reward_mean: 1"),
     "(did you mean 'env_runners/episode_return_mean'?)"),
    ("unknown metric", GOOD + "tune: {metric: reward}\n", "tune.metric: PPO never reports"),
    ("env_config the env rejects", GOOD + "env_config: {foo: 1}\n", "env_config.foo: constructing"),
    ("entropy as text", GOOD.replace("num_epochs: 1}", "num_epochs: 1, entropy_coeff: high}"),
     "training.entropy_coeff: got 'high'"),
    ("loguniform on an int key",
     GOOD.replace("search:\n", "search:\n  training.num_epochs: {loguniform: [1, 8]}\n"),
     "use {randint: [1, 9]}"),
    ("DQN on continuous actions",
     GOOD.replace("PPO", "DQN").replace(", minibatch_size: 32, num_epochs: 1", "")
     .replace("CartPole-v1", "Pendulum-v1"), "building the RLModule failed"),
]  # fmt: skip


def write(tmp_path, data, name="hostile.yaml"):
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else textwrap.dedent(data).encode())
    return str(p)


def one_line(capsys) -> str:
    err = capsys.readouterr().err
    assert err.startswith(PROG) and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.mark.parametrize("name, data, fragment", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_dry_run_refuses_with_exit_2_and_one_line(tmp_path, capsys, name, data, fragment):
    path = write(tmp_path, data)
    rc = cli.main(["--dry-run", "--config", path, "--storage-path", str(tmp_path)])
    err = one_line(capsys)
    assert rc == 2
    assert fragment in err and path in err, err


@pytest.mark.usefixtures("ray_must_not_start")
@pytest.mark.parametrize(
    "name, data, fragment",
    [h for h in HOSTILE if h[0] in ("stop key never reported", "env_config the env rejects")],
)
def test_a_real_run_makes_the_same_checks_before_ray_starts(tmp_path, capsys, name, data, fragment):
    path = write(tmp_path, data)
    rc = cli.main(["--config", path, "--storage-path", str(tmp_path), "--name", "never"])
    assert rc == 2 and fragment in one_line(capsys)
    assert not os.path.exists(tmp_path / "never")


def test_dry_run_says_what_it_checked(tmp_path, capsys):
    rc = cli.main(["--dry-run", "--config", write(tmp_path, GOOD)])
    out = capsys.readouterr().out
    assert rc == 0
    assert "# pre-flight: 2 configs built and validated by RLlib; CartPole-v1 and its" in out


def test_non_utf8_file_in_a_real_process_exits_2_without_traceback(tmp_path):
    path = write(tmp_path, (GOOD + "env_config: {n: é}\n").encode("latin-1"))
    proc = subprocess.run(
        [sys.executable, "-m", "rllib_amp.tune", "--dry-run", "--config", path],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and "line 12: byte 0xe9 is not UTF-8" in proc.stderr
