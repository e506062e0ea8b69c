"""``python -m rllib_amp.params``: the preset table, whole, with nothing printed inside it."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def test_the_table_is_printed_whole_after_whatever_rllib_logs():
    # One stream, unbuffered: the order a terminal shows. RLlib logs a DeprecationWarning of its
    # own the first time it builds an RLModule; it must not land between the table's lines.
    done = subprocess.run(
        [sys.executable, "-u", "-m", "rllib_amp.params", "--algorithms", "PPO"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout
    lines = done.stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("preset"))
    table = lines[start:]
    assert len(table) == 7, done.stdout  # the header, 3 presets x 2 inputs
    assert all(line.split()[0] in ("preset", "mini", "full", "high") for line in table), table
