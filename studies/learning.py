"""Learning evidence: resumable runs whose curves are kept as data, one ``--task`` each.

``--task cartpole-dqn``: DQN on CartPole-v1 with ``tune_configs/cartpole_dqn_amp.yaml``
(CleanRL's ``dqn.py`` recipe) along two paths, ``amp`` (the file's float16 + scaler) and
``fp32`` (the same with ``amp.enabled: false``).

``--task pong-dqn``: DQN on ALE/Pong-v5 with ``tune_configs/pong_dqn_amp.yaml`` (Tianshou's
``atari_dqn`` recipe, the write-up's agent) on one local EnvRunner of the file's 10 native envs
and a local learner: ``amp-native`` (the file, precision auto), ``fp32-native``
(``amp.enabled: false``) and ``amp-native-bn`` (the write-up's BatchNorm).

``--task pong-appo``: APPO on ALE/Pong-v5 with ``tune_configs/pong_appo_amp.yaml``'s settings
scaled to one machine (one local EnvRunner of 16 native envs, as PPO's runs, and a local
learner): ``amp-native`` (the file, precision auto), ``fp32-native``, and ``stock``: the
file's training keys on RLlib as it ships (float32, RLlib's Atari wrappers), the control that
tells rllib-amp's paths from APPO itself.

``--task pong-ppo`` (the default): PPO on ALE/Pong-v5 along three paths, each with
``tune_configs/pong_ppo_amp.yaml``'s PPO settings (CleanRL's ``ppo_atari`` recipe), the
Nature CNN ("full") and one local EnvRunner of 16 envs:

- ``stock``: RLlib as it ships: float32, RLlib's Python Atari wrappers, float32 observations;
- ``fp32-native``: ALE's native vector env and uint8 observations, float32 training;
- ``amp-native``: all of rllib-amp: the native env, uint8, AMP at precision auto.

Each run (path, seed) trains in a fresh process, one after another (never side by side: the
wall-clock axis is the point), appends a row to ``OUT/curves.parquet`` after every iteration
(a killed run keeps everything up to its last iteration) and checkpoints every
``--checkpoint-every`` iterations under ``OUT/checkpoints/``::

    python -m studies.learning --paths amp-native --seeds 0 --steps 3000000 \\
        --out pong_run
    python -m studies.learning --task cartpole-dqn --paths amp,fp32 --seeds 0,1,2 \\
        --steps 500000 --out cartpole_run
    python -m studies.learning --resume pong_run     # after a kill, same day
    python -m studies.learning --plot-only docs/pong # figure + table from parquet

``--stop-at N`` ends each run at N env steps while its lr schedule still anneals over
``--steps``: the early part of a longer run, to compare paths at a milestone (1M) of the
same schedule without training each to the end.

``--plot-only DIR`` reads every ``*.parquet`` under DIR (runs of several days add up) and
writes ``learning.png`` and ``table.md`` there.

Example:
    >>> lr_schedule(3_000_000)
    [[0, 0.00025], [3000000, 0.0]]
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import math
import os
import resource
import shutil
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rllib_amp.cli import Parser, UsageError, main_wrapper
from rllib_amp.sweep.ray_address import LOCAL_RAY_ENV
from studies.curves import (
    AMP,
    CARTPOLE_DQN,
    FP32_NATIVE,
    PONG_APPO,
    PONG_DQN,
    PONG_PPO,
    STOCK,
    TASKS,
    read_rows,
    table,
    write_report,
    write_rows,
)

PROG = "python -m studies.learning"
# Path name -> the Atari-path variant of rllib_amp.bench (workloads.PATH_VARIANTS).
PATHS = {STOCK: "fp32 wrappers", FP32_NATIVE: "fp32 native", AMP: "amp native"}
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Task trained from an experiment file -> the file.
YAMLS = {
    CARTPOLE_DQN.name: os.path.join(ROOT, "tune_configs", "cartpole_dqn_amp.yaml"),
    PONG_DQN.name: os.path.join(ROOT, "tune_configs", "pong_dqn_amp.yaml"),
    PONG_APPO.name: os.path.join(ROOT, "tune_configs", "pong_appo_amp.yaml"),
}
# Pong task -> its file's resources on one machine (the file's are a cluster's).
ONE_MACHINE = {
    PONG_DQN.name: {"resources.num_env_runners": 0, "resources.num_learners": 0},
    PONG_APPO.name: {
        "resources.num_env_runners": 0, "resources.num_learners": 0,
        "resources.num_envs_per_env_runner": 16,
    },
}  # fmt: skip
# Path name -> the overrides of the CartPole DQN file it trains with.
DQN_PATHS: dict[str, dict[str, Any]] = {
    CARTPOLE_DQN.amp: {},
    CARTPOLE_DQN.reference: {"amp.enabled": False},
}
BATCHNORM = "amp-native-bn"
# Path name -> the overrides of the Pong DQN file it trains with.
PONG_DQN_PATHS: dict[str, dict[str, Any]] = {
    PONG_DQN.amp: {},
    PONG_DQN.reference: {"amp.enabled": False},
    BATCHNORM: {"model.batchnorm": True},
}
# Path name -> the overrides of the Pong APPO file it trains with; ``stock`` takes only the
# file's training keys (build_config).
REUSE = "amp-native-2epochs"
PONG_APPO_PATHS: dict[str, dict[str, Any]] = {
    PONG_APPO.amp: {},
    PONG_APPO.reference: {"amp.enabled": False},
    STOCK: {},
    # Each batch trained twice, as RLlib's old-stack example (num_sgd_iter 2) and as a cluster's
    # learner does through the circular buffer (K=2) when it runs ahead of its EnvRunners.
    REUSE: {"training.num_epochs": 2},
}
# Task -> its paths.
TASK_PATHS: dict[str, Mapping[str, Any]] = {
    PONG_PPO.name: PATHS,
    CARTPOLE_DQN.name: DQN_PATHS,
    PONG_DQN.name: PONG_DQN_PATHS,
    PONG_APPO.name: PONG_APPO_PATHS,
}
# tune_configs/pong_ppo_amp.yaml's training section without its lr schedule (a test keeps the
# two equal); the schedule anneals LR_START linearly to 0 over the run's step budget.
TRAINING: dict[str, Any] = {
    "gamma": 0.99,
    "lambda_": 0.95,
    "clip_param": 0.1,
    "vf_clip_param": 10.0,
    "vf_loss_coeff": 0.5,
    "entropy_coeff": 0.01,
    "use_kl_loss": False,
    "kl_coeff": 0.0,
    "train_batch_size_per_learner": 1024,
    "minibatch_size": 256,
    "num_epochs": 4,
    "grad_clip": 0.5,
    "grad_clip_by": "global_norm",
}
LR_START = 2.5e-4
NUM_ENVS = 16
# One run may take this long (3M steps on 2 CPU cores: a few hours).
RUN_TIMEOUT_S = 24 * 3600.0
RETURN_KEY = "episode_return_mean"
CURVES = "curves.parquet"
RUN_FILE = "run.json"


def lr_schedule(steps: int) -> list[list[float]]:
    """RLlib's schedule form: LR_START at step 0, linearly down to 0 at ``steps``.

    Example:
        >>> lr_schedule(1000)
        [[0, 0.00025], [1000, 0.0]]
    """
    return [[0, LR_START], [int(steps), 0.0]]


def _run_name(path: str, seed: int) -> str:
    return f"{path}-seed{seed}"


# -- one run, in its own process --------------------------------------------------------------
def _checkpoint_dir(out: str, path: str, seed: int) -> str:
    return os.path.join(out, "checkpoints", _run_name(path, seed))


def last_checkpoint(out: str, path: str, seed: int) -> dict[str, Any] | None:
    """The newest complete checkpoint of a run: its folder (an absolute path), iteration, env
    steps, seconds. The marker names the folder inside the run's checkpoint folder, so a run
    started or resumed with a relative ``OUT`` (or moved) still finds it; RLlib's restore
    takes no relative path ("URI has empty scheme")."""
    root = _checkpoint_dir(out, path, seed)
    marker = os.path.join(root, "latest.json")
    if not os.path.exists(marker):
        return None
    with open(marker, encoding="utf-8") as f:
        point = json.load(f)
    point["folder"] = os.path.abspath(os.path.join(root, os.path.basename(point["folder"])))
    return dict(point)


def _save_checkpoint(algo: Any, out: str, path: str, seed: int, point: dict[str, Any]) -> None:
    """Saves into a new folder, then points ``latest.json`` at it (atomically), then drops the
    older folders: a kill at any moment leaves ``latest.json`` naming a complete checkpoint."""
    root = _checkpoint_dir(out, path, seed)
    # Absolute: RLlib's save_to_path takes a relative path for a URI ("URI has empty scheme").
    folder = os.path.abspath(os.path.join(root, f"iter_{point['iteration']:06d}"))
    algo.save_to_path(folder)
    marker = {**point, "folder": os.path.basename(folder)}
    tmp = os.path.join(root, f"latest.json.tmp-{os.getpid()}")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(marker, f)
    os.replace(tmp, os.path.join(root, "latest.json"))
    for old in glob.glob(os.path.join(root, "iter_*")):
        if os.path.abspath(old) != folder:  # root may be relative: glob answers in its form
            shutil.rmtree(old, ignore_errors=True)


def build_config(
    path: str, seed: int, steps: int, device: str, batch: int | None, task: str = PONG_PPO.name
) -> Any:
    """The algorithm config of one run of ``task``."""
    if task == PONG_APPO.name and path == STOCK:
        return _stock_appo(seed, device, batch)
    if task in YAMLS:
        from rllib_amp.experiment import load

        overrides = {**TASK_PATHS[task][path], "seed": seed}
        if task in ONE_MACHINE:
            overrides.update(ONE_MACHINE[task])
            overrides["resources.num_gpus_per_learner"] = 1 if device == "cuda" else 0
        if batch is not None:
            overrides["training.train_batch_size_per_learner"] = batch
        return load(YAMLS[task], overrides).algorithm_config()
    from rllib_amp.bench.atari_figures import path_configs

    training = {**TRAINING, "lr": lr_schedule(steps)}
    if batch is not None:
        training["train_batch_size_per_learner"] = batch
        training["minibatch_size"] = min(training["minibatch_size"], batch)
    cfg = path_configs("PPO", [PATHS[path]], device, training=training)[PATHS[path]]
    cfg.env_runners(num_envs_per_env_runner=NUM_ENVS)
    cfg.debugging(seed=seed)
    return cfg


def _stock_appo(seed: int, device: str, batch: int | None) -> Any:
    """RLlib's APPO as it ships (float32, RLlib's Atari wrappers) with pong_appo_amp.yaml's
    training keys, on the one machine of the file's other paths."""
    from rllib_amp.bench.atari_figures import path_configs
    from rllib_amp.experiment import load

    training = dict(load(YAMLS[PONG_APPO.name], {}).get("training"))
    if batch is not None:
        training["train_batch_size_per_learner"] = batch
    label = PATHS[STOCK]
    cfg = path_configs("APPO", [label], device, training=training)[label]
    cfg.env_runners(
        num_envs_per_env_runner=ONE_MACHINE[PONG_APPO.name]["resources.num_envs_per_env_runner"]
    )
    cfg.debugging(seed=seed)
    return cfg


def train_one(
    out: str,
    path: str,
    seed: int,
    steps: int,
    device: str,
    batch: int | None,
    checkpoint_every: int,
    machine: str,
    stop_at: int | None = None,
    task: str = PONG_PPO.name,
) -> int:
    """Trains one run up to ``stop_at`` env steps (default ``steps``, the lr schedule's
    length), from its last checkpoint when there is one; appends each iteration's point to
    ``OUT/curves.parquet``. Returns the iterations run."""
    stop = steps if stop_at is None else stop_at
    run = _run_name(path, seed)
    algo = build_config(path, seed, steps, device, batch, task).build_algo()
    ckpt = last_checkpoint(out, path, seed)
    offset_s, iteration = 0.0, 0
    if ckpt is not None:
        algo.restore_from_path(ckpt["folder"])
        offset_s, iteration = ckpt["seconds"], ckpt["iteration"]
    curves = os.path.join(out, CURVES)
    # Points past the checkpoint are trained again: drop them, so the curve has no duplicate.
    rows = [
        r
        for r in read_rows(curves)
        if r["run"] != run or (ckpt is not None and r["iteration"] <= iteration)
    ]
    write_rows(rows, curves)
    start = time.perf_counter()
    ran = 0
    try:
        done = max([0.0] + [r["env_steps"] for r in rows if r["run"] == run])
        while done < stop:
            result = algo.train()
            iteration += 1
            ran += 1
            done = float(result["num_env_steps_sampled_lifetime"])
            ret = float(result["env_runners"].get(RETURN_KEY, math.nan))
            episodes = int(result["env_runners"].get("num_episodes", 0) or 0)
            point = {
                "run": run,
                "path": path,
                "seed": seed,
                "iteration": iteration,
                "env_steps": done,
                "seconds": offset_s + time.perf_counter() - start,
                "return": ret,
                "episodes": episodes,
                "date": datetime.date.today().isoformat(),
                "machine": machine,
                # ru_maxrss is in KiB on Linux; the local EnvRunner and learner live here.
                "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            }
            rows.append(point)
            write_rows(rows, curves)
            if iteration % checkpoint_every == 0 or done >= stop:
                _save_checkpoint(algo, out, path, seed, point)
            print(
                f"[{task}] {run}: {done:,.0f} steps, {point['seconds']:.0f} s, return {ret:.2f}",
                file=sys.stderr,
                flush=True,
            )
    finally:
        algo.stop()
    return ran


# -- the command ------------------------------------------------------------------------------
def _seeds(text: str) -> list[int]:
    try:
        seeds = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise UsageError(f"--seeds: got {text!r}; give integers, e.g. --seeds 0,1") from None
    if not seeds:
        raise UsageError("--seeds: got no seed; give e.g. --seeds 0,1")
    return seeds


def _paths(text: str, task: str = PONG_PPO.name) -> list[str]:
    known, t = TASK_PATHS[task], TASKS[task]
    paths = [p.strip() for p in text.split(",") if p.strip()]
    bad = [p for p in paths if p not in known]
    if bad or not paths:
        raise UsageError(
            f"--paths: got {text!r}; give one or more of {', '.join(known)} (--task {task}), "
            f"e.g. --paths {t.amp},{t.reference}"
        )
    return paths


def build_parser() -> argparse.ArgumentParser:
    p = Parser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument("--task", choices=tuple(TASKS), default=PONG_PPO.name, help="what to train")
    p.add_argument(
        "--paths",
        default=None,
        help="comma-separated; "
        + "; ".join(f"{task}: {', '.join(paths)}" for task, paths in TASK_PATHS.items())
        + " (default: the task's AMP path)",
    )
    p.add_argument("--steps", type=int, default=3_000_000, help="env steps per run")
    p.add_argument(
        "--stop-at",
        type=int,
        default=None,
        help="end each run at this many env steps; the lr schedule still spans --steps",
    )
    p.add_argument("--seeds", default="0", help="comma-separated, e.g. 0,1")
    p.add_argument("--device", choices=("cpu", "cuda"), default=None, help="default: cuda if any")
    p.add_argument("--out", default="pong_learning", help="folder for the runs")
    p.add_argument("--batch", type=int, default=None, help="train batch size (default 1024)")
    p.add_argument(
        "--checkpoint-every", type=int, default=10, help="iterations between checkpoints"
    )
    p.add_argument("--resume", metavar="OUT", help="continue the unfinished runs in OUT")
    p.add_argument("--plot-only", metavar="DIR", help="redraw learning.png and table.md")
    return p


def _new_run(args: argparse.Namespace) -> dict[str, Any]:
    if args.steps < 1:
        raise UsageError(f"--steps: got {args.steps}; must be >= 1")
    if args.stop_at is not None and not 1 <= args.stop_at <= args.steps:
        raise UsageError(
            f"--stop-at: got {args.stop_at}; must be between 1 and --steps ({args.steps}), "
            "or left out to train each run to --steps"
        )
    if args.batch is not None and args.batch < 2:
        raise UsageError(f"--batch: got {args.batch}; must be >= 2")
    if args.checkpoint_every < 1:
        raise UsageError(f"--checkpoint-every: got {args.checkpoint_every}; must be >= 1")
    spec = {
        "task": args.task,
        "paths": _paths(args.paths or TASKS[args.task].amp, args.task),
        "seeds": _seeds(args.seeds),
        "steps": args.steps,
        "stop_at": args.stop_at,
        "batch": args.batch,
        "device": args.device,
        "checkpoint_every": args.checkpoint_every,
        "command": " ".join([PROG, *sys.argv[1:]]) if sys.argv[1:] else PROG,
    }
    if os.path.exists(os.path.join(args.out, RUN_FILE)):
        raise UsageError(
            f"--out: {args.out!r} already holds a run; continue it with --resume {args.out} "
            "or pick another --out"
        )
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, RUN_FILE), "w", encoding="utf-8") as f:
        json.dump(spec, f, indent=1)
    return spec


def _resumed_run(out: str) -> dict[str, Any]:
    try:
        with open(os.path.join(out, RUN_FILE), encoding="utf-8") as f:
            return json.load(f)
    except OSError:
        raise UsageError(
            f"--resume: {out!r} holds no {RUN_FILE}; give the --out folder of an earlier run"
        ) from None


def honour_nice(autogroup: str = "/proc/self/autogroup") -> int | None:
    """Gives this process's session group (Linux's autogroup) the process's nice; returns it,
    or None where nothing was changed.

    With ``sched_autogroup_enabled``, Linux first shares the CPU equally between sessions and
    applies nice only inside one: a run started as ``setsid nice -n 19 python -m
    studies.learning`` takes half of the cores beside a busy terminal, as if it were not niced
    (on 2 cores, one run each: a PPO iteration in the terminal took 17 s instead of 1.45 s). Only a
    process in a session of its own (not its parent's) changes the group, so a run started in
    a terminal's session never renices that terminal.
    """
    nice = os.nice(0)
    try:
        own_session = os.getsid(0) != os.getsid(os.getppid())
    except OSError:  # the parent is gone: the session is this run's
        own_session = True
    if nice <= 0 or not own_session:
        return None
    try:
        # "/autogroup-35 nice 0" where the kernel has autogroup; some sandboxes' kernels give
        # the file but an empty one, and there is nothing to set.
        with open(autogroup, encoding="ascii") as f:
            if "nice" not in f.read().split():
                return None
        with open(autogroup, "w", encoding="ascii") as f:
            f.write(str(nice))
    except OSError:
        return None
    return nice


def run(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.plot_only:
        for f in write_report(args.plot_only, TASKS[args.task]):
            print(f"wrote {f}")
        return 0
    out = args.resume or args.out
    spec = _resumed_run(out) if args.resume else _new_run(args)
    # As the sweep gives its local Ray (sweep.ray_address.LOCAL_RAY_ENV), before torch loads.
    for key, value in LOCAL_RAY_ENV.items():
        os.environ.setdefault(key, value)
    import torch

    from rllib_amp.bench.harness import in_child
    from rllib_amp.bench.report import machine_description

    device = spec["device"] or ("cuda" if torch.cuda.is_available() else "cpu")
    if device == "cuda" and not torch.cuda.is_available():
        raise UsageError("--device cuda: no CUDA device is visible; use --device cpu")
    machine = machine_description(device)
    # run.json of a run started before --task existed has no "task": it is Pong PPO.
    task = spec.get("task", PONG_PPO.name)
    print(f"rllib-amp learning ({task}), {machine}", flush=True)
    if (nice := honour_nice()) is not None:
        print(f"nice {nice}: this run's session group (Linux autogroup) set to nice {nice} too")
    # run.json of a run started before --stop-at existed has no "stop_at": it trains to "steps".
    stop_at = spec.get("stop_at") or spec["steps"]
    for seed in spec["seeds"]:
        for path in spec["paths"]:
            rows = [r for r in read_rows(os.path.join(out, CURVES))
                    if r["run"] == _run_name(path, seed)]  # fmt: skip
            if rows and max(r["env_steps"] for r in rows) >= stop_at:
                continue
            in_child(
                train_one, out, path, seed, spec["steps"], device, spec["batch"],
                spec["checkpoint_every"], machine, stop_at, task, timeout_s=RUN_TIMEOUT_S,
            )  # fmt: skip
    rows = read_rows(os.path.join(out, CURVES))
    print(table(rows, TASKS[task]))
    for f in write_report(out, TASKS[task]):
        print(f"wrote {f}")
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return main_wrapper(PROG, run, argv)


if __name__ == "__main__":
    from rllib_amp.cli import local_ray_on_loopback

    local_ray_on_loopback(sys.argv[1:])  # its Ray is its own: on 127.0.0.1, before ray loads
    sys.exit(main())
