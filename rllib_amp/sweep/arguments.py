"""The flags of ``python -m rllib_amp.tune`` (``docs/cli.md``), and the checks on them that
need nothing but the flags: each a UsageError naming the flag and the fix.

Example:
    >>> args = build_parser().parse_args(["--num-samples", "3", "--dry-run"])
    >>> args.num_samples, args.dry_run, args.max_trials
    (3, True, 1000)
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rllib_amp import fs as files
from rllib_amp.cli import Parser, UsageError
from rllib_amp.sweep import loggers
from rllib_amp.sweep import resume as sweep_resume
from rllib_amp.sweep import storage as sweep_storage

PROG = "python -m rllib_amp.tune"
DEFAULT_CONFIG = "tune_configs/cartpole_ppo_amp.yaml"
# A sweep larger than this is more likely a typo (num_samples: 10000 x a grid) than a plan.
DEFAULT_MAX_TRIALS = 1000


def say(line: str) -> None:
    """One line of the command's own on stderr, after its name."""
    print(f"{PROG}: {line}", file=sys.stderr, flush=True)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog=PROG,
        description="Sweep the GradScaler's init_scale / growth_interval and the batch size "
        "of an rllib-amp experiment with Ray Tune.",
    )
    p.add_argument("--config", help=f"experiment YAML (default: {DEFAULT_CONFIG})")
    p.add_argument(
        "--address",
        help="Ray cluster: 'auto', host:port or ray://host:port (default: a local Ray "
        "started in this process)",
    )
    p.add_argument("--num-samples", type=int, help="samples per grid point")
    p.add_argument(
        "--storage-path",
        help="where experiments go: a local path, a shared mount or a URI such as "
        "s3://bucket/experiments (default: the file's storage_path, else "
        f"${sweep_storage.STORAGE_ENV}, else {sweep_storage.DEFAULT_STORAGE})",
    )
    p.add_argument(
        "--name",
        help="experiment name, a folder name under STORAGE_PATH: letters, digits, '.', '_', "
        "'-', '+', '=' (default: the file's name and the start time, e.g. "
        "cartpole_ppo_amp_2026-12-01_16-20-03; with --resume: the newest such run)",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override a key of the file, dotted (amp.init_scale=1024); repeatable",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the interrupted experiment NAME (default: the newest run of the file) "
        "in STORAGE_PATH: finished trials are kept, unfinished ones continue from their "
        "newest intact checkpoint",
    )
    p.add_argument(
        "--accept-changes",
        action="store_true",
        help="with --resume: resume even though the experiment (file or --set values) differs "
        f"from the {sweep_resume.EXPERIMENT_FILE} stored at the first start; the changes take "
        "no effect (Tune restores the trials, the search and the stop rule as first started)",
    )
    p.add_argument(
        "--restart-damaged",
        action="store_true",
        help="with --resume: a trial with no intact checkpoint left runs again from its first "
        "iteration (its damaged checkpoints are kept as checkpoint_NNNNNN.damaged) instead "
        "of ending the resume with exit 2",
    )
    p.add_argument(
        "--max-trials",
        type=int,
        default=DEFAULT_MAX_TRIALS,
        metavar="N",
        help=f"refuse sweeps of more than N trials (grid size x num_samples; default "
        f"{DEFAULT_MAX_TRIALS})",
    )
    p.add_argument(
        "--fit-to-machine",
        action="store_true",
        help="scale each trial's resources (GPUs, learners, env runners) down to what the "
        "local Ray has, instead of exiting when they do not fit",
    )
    p.add_argument(
        "--wandb-project",
        type=loggers.wandb_project,
        help="also log every trial to this Weights & Biases project (needs pip install wandb)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the resolved config and search space only"
    )
    return p


def find_config(path: str | None) -> str:
    """The experiment file: as given, or the default next to the package or in the cwd."""
    if path is not None:
        try:
            return files.local_path(path)
        except ValueError as e:
            raise UsageError(f"--config: {e}") from None
    for base in (Path.cwd(), Path(__file__).resolve().parent.parent.parent):
        candidate = base / DEFAULT_CONFIG
        if candidate.is_file():
            return str(candidate)
    raise UsageError(
        f"--config: no {DEFAULT_CONFIG} in the current folder or beside the package; "
        f"pass --config PATH"
    )


def check_flags(args: argparse.Namespace) -> None:
    """The flags' own rules: ranges, flags that need another, a name that is taken."""
    for flag, value in (("--num-samples", args.num_samples), ("--max-trials", args.max_trials)):
        if value is not None and value < 1:
            raise UsageError(f"{flag}: got {value}; must be >= 1")
    for flag in ("--accept-changes", "--restart-damaged"):
        if getattr(args, flag[2:].replace("-", "_")) and not args.resume:
            raise UsageError(f"{flag}: only applies with --resume; drop it or add --resume")
    if args.fit_to_machine and args.address:
        raise UsageError(
            "--fit-to-machine: scales trials to the local Ray this command starts; drop "
            "--address, or size the file's resources section for the cluster"
        )
    if args.name is not None:
        sweep_resume.check_name(args.name)
        if args.storage_path is not None and not args.resume:
            # The flag wins over the file's storage_path: known before RLlib loads.
            sweep_resume.refuse_taken(sweep_storage.resolve(args.storage_path, None), args.name)
