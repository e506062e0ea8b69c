"""``python -m rllib_amp.tune``: sweep AMP scaler settings and batch size with Ray Tune.

Runs one experiment file (default ``tune_configs/cartpole_ppo_amp.yaml``) on a local Ray
started in-process, or on a cluster (``--address auto`` on a node of it). Prints Tune's
progress table with AMP columns, then a summary of all trials sorted by the metric, the best
trial's checkpoint, and writes ``results.parquet`` (one row per trial) to the experiment
folder. Storage is a local path, a shared mount or a URI (``s3://``, ``gs://``, ...; see
``rllib_amp.storage``). Before any trial starts it checks what would otherwise fail late: on
a multi-node cluster, that every node reaches the storage; on a local Ray, that a trial's
resources fit the machine (``--fit-to-machine`` scales them down). Exit status: 0 success,
1 a trial failed or did not finish, 2 bad input.

Example:
    python -m rllib_amp.tune --set stop.training_iteration=2 --num-samples 1
    python -m rllib_amp.tune --config tune_configs/pong_ppo_amp.yaml --address auto \
        --storage-path s3://my-bucket/experiments
    python -m rllib_amp.tune --config tune_configs/pong_ppo_amp.yaml --fit-to-machine
"""

from __future__ import annotations

import argparse
import io
import math
import os
import shlex
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from rllib_amp import loggers, recommend
from rllib_amp import metrics as M
from rllib_amp import storage as S
from rllib_amp.cli import Parser, UsageError, main_wrapper
from rllib_amp.settings import AMP_CONFIG_KEY

DEFAULT_CONFIG = "tune_configs/cartpole_ppo_amp.yaml"
MODULE_ID = "default_policy"
RESULTS_FILE = "results.parquet"
# Result keys RLlib reports only once an episode has ended (ray.rllib.utils.metrics). Until
# then they are missing, and Tune ends the whole sweep when its metric is missing from a
# result: Pong's first iterations (episodes of thousands of steps) did exactly that.
EPISODE_METRICS = tuple(
    f"env_runners/episode_{what}_{stat}"
    for what in ("return", "len")
    for stat in ("mean", "max", "min")
)


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="python -m rllib_amp.tune",
        description="Sweep the GradScaler's init_scale / growth_interval and the batch size "
        "of an rllib-amp experiment with Ray Tune.",
    )
    p.add_argument("--config", default=None, help=f"experiment YAML (default: {DEFAULT_CONFIG})")
    p.add_argument(
        "--address",
        default=None,
        help="Ray cluster: 'auto', host:port or ray://host:port (default: a local Ray "
        "started in this process)",
    )
    p.add_argument("--num-samples", type=int, default=None, help="samples per grid point")
    p.add_argument(
        "--storage-path",
        default=None,
        help="where experiments go: a local path, a shared mount or a URI such as "
        "s3://bucket/experiments (default: the file's storage_path, else "
        f"${S.STORAGE_ENV}, else {S.DEFAULT_STORAGE})",
    )
    p.add_argument("--name", default=None, help="experiment name (default: the file's name)")
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
        help="continue the interrupted experiment NAME in STORAGE_PATH: finished trials are "
        "kept, unfinished ones continue from their last checkpoint",
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
        default=None,
        help="also log every trial to this Weights & Biases project (needs pip install wandb)",
    )
    p.add_argument(
        "--dry-run", action="store_true", help="print the resolved config and search space only"
    )
    return p


def find_config(path: str | None) -> str:
    """The experiment file: as given, or the default next to the package or in the cwd."""
    if path is not None:
        return path
    for base in (Path.cwd(), Path(__file__).resolve().parent.parent):
        candidate = base / DEFAULT_CONFIG
        if candidate.is_file():
            return str(candidate)
    raise UsageError(
        f"--config: no {DEFAULT_CONFIG} in the current folder or beside the package; "
        f"pass --config PATH"
    )


# -- trial config <-> dotted keys ------------------------------------------------------------
def config_path(dotted: str, config: dict[str, Any]) -> tuple[str, ...]:
    """Where a dotted experiment key lives in a trial's config (``AlgorithmConfig.to_dict()``).

    ``config`` is such a dict: it decides between RLlib's public and underscored names
    (``train_batch_size_per_learner`` is stored as ``_train_batch_size_per_learner``).
    """
    top, _, rest = dotted.partition(".")
    parts = rest.split(".") if rest else []
    if top == "amp":
        return ("learner_config_dict", AMP_CONFIG_KEY, *parts)
    if top == "env_config":
        return ("env_config", *parts)
    if top == "model":
        return ("_model_config", *parts)
    if top == "seed":
        return ("seed",)
    head = parts[0] if parts else top
    for candidate in (head, f"_{head}", head.rstrip("_")):
        if candidate in config:
            return (candidate, *parts[1:])
    return (head, *parts[1:])


def _dig(d: Any, path: Sequence[str]) -> Any:
    for key in path:
        if not isinstance(d, dict) or key not in d:
            return None
        d = d[key]
    return d


def _metric(result: dict[str, Any] | None, key: str) -> Any:
    if not result:
        return None
    if key in result:
        return result[key]
    return _dig(result, key.split("/"))


def amp_metric_key(name: str, module_id: str = MODULE_ID) -> str:
    return f"learners/{module_id}/{name}"


# -- running --------------------------------------------------------------------------------
def _progress_reporter(exp: Any) -> Any:
    from ray.tune import CLIReporter

    columns = {
        "training_iteration": "iter",
        exp.tune["metric"]: "return" if "return" in exp.tune["metric"] else exp.tune["metric"],
        amp_metric_key(M.GRAD_SCALE): "grad scale",
        amp_metric_key(M.SKIP_FRACTION): "skip frac",
        "env_runners/num_env_steps_sampled_lifetime_throughput/throughput_since_last_reduce": (
            "env steps/s"
        ),
        "num_env_steps_sampled_lifetime": "env steps",
    }
    sample = exp.algorithm_config().to_dict()
    params = {"/".join(config_path(k, sample)): k.split(".")[-1] for k in exp.search}
    return CLIReporter(
        metric_columns=columns,
        parameter_columns=params,
        max_report_frequency=10,
    )


def _tuner(exp: Any, args: argparse.Namespace, storage: str, name: str, restore: bool) -> Any:
    from ray import tune

    from rllib_amp import schedulers

    trainable = exp.algorithm_config().algo_class
    param_space = schedulers.param_space(exp)
    if exp.tune["metric"] in EPISODE_METRICS:
        param_space.callbacks(
            on_train_result=partial(_no_episode_yet_as_nan, metric=exp.tune["metric"])
        )
    if restore:
        return tune.Tuner.restore(
            S.join(storage, name),
            trainable=trainable,
            resume_unfinished=True,
            resume_errored=True,
            param_space=param_space,
        )
    t = exp.tune
    scheduler = schedulers.scheduler(exp, config_path)
    ck = exp.checkpoint
    run_config = tune.RunConfig(
        name=name,
        storage_path=storage,
        stop=exp.stop,
        checkpoint_config=tune.CheckpointConfig(
            checkpoint_frequency=ck["frequency"],
            num_to_keep=ck["num_to_keep"],
            checkpoint_at_end=ck["at_end"],
        ),
        # A failed trial restarts from its last checkpoint, scaler state included.
        failure_config=tune.FailureConfig(max_failures=t["max_failures"]),
        progress_reporter=_progress_reporter(exp),
        callbacks=loggers.wandb_callbacks(getattr(args, "wandb_project", None)),
        verbose=1,
    )
    return tune.Tuner(
        trainable,
        param_space=param_space,
        tune_config=tune.TuneConfig(
            metric=t["metric"],
            mode=t["mode"],
            num_samples=args.num_samples or t["num_samples"],
            scheduler=scheduler,
            max_concurrent_trials=t["max_concurrent_trials"],
        ),
        run_config=run_config,
    )


def _no_episode_yet_as_nan(*, result: dict[str, Any], metric: str, **kwargs: Any) -> None:
    """RLlib ``on_train_result`` callback: an episode metric of an iteration in which no
    episode has ended yet is reported as NaN ("nothing yet") instead of being left out.

    Example:
        >>> r = {"env_runners": {}}
        >>> _no_episode_yet_as_nan(result=r, metric="env_runners/episode_return_mean")
        >>> r
        {'env_runners': {'episode_return_mean': nan}}
    """
    *parents, leaf = metric.split("/")
    node = result
    for key in parents:
        node = node.setdefault(key, {})
    node.setdefault(leaf, math.nan)


def summarize(exp: Any, grid: Any, storage: str | None = None) -> list[dict[str, Any]]:
    """One row per trial: searched parameters, final metrics, checkpoint, error.

    With ``storage`` (a URI), checkpoints are given as URIs on it, as the user passed it.
    """
    rows = []
    for result in grid:
        cfg = result.config or {}
        final = result.metrics or {}
        row: dict[str, Any] = {"trial_id": final.get("trial_id")}
        for key in exp.search:
            row[key] = _dig(cfg, config_path(key, cfg))
        steps = _metric(final, "num_env_steps_sampled_lifetime")
        total = _metric(final, "time_total_s")
        status = "ERROR" if result.error else ("DONE" if final.get("done") else "UNFINISHED")
        row.update(
            {
                "status": status,
                "training_iteration": final.get("training_iteration"),
                exp.tune["metric"]: _metric(final, exp.tune["metric"]),
                "grad_scale": _metric(final, amp_metric_key(M.GRAD_SCALE)),
                "skip_fraction": _metric(final, amp_metric_key(M.SKIP_FRACTION)),
                "skipped_steps": _metric(final, amp_metric_key(M.SKIPPED_STEPS_LIFETIME)),
                "env_steps_per_s": (steps / total) if steps and total else None,
                "checkpoint": _checkpoint_location(result.checkpoint, storage),
                "error": str(result.error).splitlines()[0] if result.error else None,
            }
        )
        rows.append(row)
    reverse = exp.tune["mode"] == "max"

    def sort_key(r: dict[str, Any]) -> float:
        v = r[exp.tune["metric"]]
        if v is None or (isinstance(v, float) and math.isnan(v)):
            return -math.inf if reverse else math.inf
        return float(v)

    rows.sort(key=sort_key, reverse=reverse)
    return rows


def _checkpoint_location(checkpoint: Any, storage: str | None) -> str | None:
    if checkpoint is None:
        return None
    return S.to_uri(storage, checkpoint.path) if storage else checkpoint.path


def _fmt(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if v.is_integer() and abs(v) < 1e15:
            return f"{v:,.0f}"
        return f"{v:,.1f}" if abs(v) >= 100 else f"{v:.4g}"
    return str(v)


def format_table(exp: Any, rows: list[dict[str, Any]]) -> str:
    short = {k: k.split(".")[-1] for k in exp.search}
    cols = [
        ("trial_id", "trial"),
        *short.items(),
        ("grad_scale", "final grad scale"),
        ("skip_fraction", "skip frac"),
        (exp.tune["metric"], exp.tune["metric"].split("/")[-1]),
        ("env_steps_per_s", "env steps/s"),
        ("status", "status"),
    ]
    table = [[title for _, title in cols]]
    table += [[_fmt(r.get(key)) for key, _ in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in table]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def write_parquet(rows: list[dict[str, Any]], path: str) -> None:
    """Writes the rows as one parquet table to ``path``: a local path or a storage URI."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    columns: dict[str, list[Any]] = {}
    for key in dict.fromkeys(k for r in rows for k in r):
        values = [r.get(key) for r in rows]
        # Mixed ints/floats (e.g. a searched init_scale) become floats, for one column type.
        if any(isinstance(v, float) for v in values) and all(
            v is None or isinstance(v, (int, float)) for v in values
        ):
            values = [None if v is None else float(v) for v in values]
        columns[key] = values
    buffer = io.BytesIO()
    pq.write_table(pa.table(columns), buffer)
    S.write_bytes(path, buffer.getvalue())


def run(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.num_samples is not None and args.num_samples < 1:
        raise UsageError(f"--num-samples: got {args.num_samples}; must be >= 1")
    from rllib_amp import experiment as E

    exp = E.load(find_config(args.config), overrides=args.overrides)
    checked = E.preflight(exp)  # what --dry-run proves, and what a real run checks before Ray
    name = args.name or exp.name
    storage = S.resolve(args.storage_path, exp.get("storage_path"))
    exp_dir = S.join(storage, name)
    if args.fit_to_machine and args.address:
        raise UsageError(
            "--fit-to-machine: scales trials to the local Ray this command starts; drop "
            "--address, or size the file's resources section for the cluster"
        )
    if args.resume and not _can_restore(exp_dir):
        raise UsageError(
            f"--resume: no experiment at {exp_dir}; pass the --name and --storage-path of the "
            f"interrupted run"
        )

    if args.dry_run:
        import yaml

        print(f"# experiment {exp.path} -> {exp_dir}")
        print(yaml.safe_dump(exp.resolved(), sort_keys=False).rstrip())
        print("# search space")
        for key, sampler in exp.search.items():
            print(f"{key}: {sampler.to_dict()}")
        print(f"# trials: {_count_trials(exp, args.num_samples)}")
        print(f"# pre-flight: {checked}")
        return 0

    import ray

    from rllib_amp import resources as R

    # A local Ray (no autoscaler): what it has is all a trial can ever get. One this command
    # starts is sized before it starts, so a trial that can never fit fails within seconds
    # (Ray's own start takes longer than that on a busy machine).
    local = not args.address and not os.environ.get("RAY_ADDRESS")
    predicted = R.local_capacity() if local and not ray.is_initialized() else None
    if predicted is not None:
        exp = _fit_resources(exp, args, predicted)
    S.check_writable(storage)
    started = False
    if not ray.is_initialized():
        if args.address:
            ray.init(address=args.address, log_to_driver=False)
        else:
            ray.init(log_to_driver=False)
            started = True
    try:
        if local:
            actual = R.capacity_of(ray.cluster_resources())
            if actual != predicted:
                exp = _fit_resources(exp, args, actual)
        # A node that cannot reach the storage would fail at its first checkpoint.
        S.check_reachable_from_nodes(storage)
        dashboard = M.install_grafana_dashboard()
        if dashboard:
            print(f"AMP Grafana dashboard: {dashboard}")
        tuner = _tuner(exp, args, storage, name, restore=args.resume)
        grid = tuner.fit()
    finally:
        if started:
            ray.shutdown()

    rows = summarize(exp, grid, storage)
    parquet = S.join(exp_dir, RESULTS_FILE)
    write_parquet(rows, parquet)
    print()
    print(f"Trials of {name}, best first by {exp.tune['metric']} ({exp.tune['mode']}):")
    print(format_table(exp, rows))
    best = next((r for r in rows if r["status"] == "DONE" and r["checkpoint"]), None)
    print(f"Best trial checkpoint: {best['checkpoint'] if best else '-'}")
    print(f"Results: {parquet}")
    recommend.report(exp, rows, grid, exp_dir)
    failed = [r for r in rows if r["status"] == "ERROR"]
    unfinished = [r for r in rows if r["status"] == "UNFINISHED"]
    if unfinished:
        print(
            f"{len(unfinished)} trial(s) did not finish; continue with: python -m rllib_amp.tune "
            f"--config {shlex.quote(exp.path)} --name {shlex.quote(name)} "
            f"--storage-path {shlex.quote(storage)} --resume"
        )
    if failed:
        print(f"{len(failed)} trial(s) failed: {', '.join(str(r['trial_id']) for r in failed)}")
    return 1 if failed or unfinished else 0


def _can_restore(exp_dir: str) -> bool:
    from ray import tune

    try:
        return bool(tune.Tuner.can_restore(exp_dir))
    except (OSError, ValueError):
        return False


def _fit_resources(exp: Any, args: argparse.Namespace, capacity: dict[str, float]) -> Any:
    """On a local Ray (no autoscaler), a trial that needs more CPUs or GPUs than the machine
    has would stay PENDING forever: exit 2 with the numbers and the fix, or scale it down
    with --fit-to-machine. (On a cluster pending trials are normal: nodes can be added.)"""
    from rllib_amp import resources as R

    if not args.fit_to_machine:
        R.check_fits(exp, capacity)
        return exp
    overrides = R.fit_overrides(exp, capacity)
    if overrides:
        exp = exp.with_overrides(overrides)
        print(
            f"--fit-to-machine: this machine's Ray has {R.format_amount(capacity)}; running "
            "with " + " ".join(f"--set {k}={v}" for k, v in overrides.items())
        )
    return exp


def _count_trials(exp: Any, num_samples: int | None) -> int:
    n = num_samples or exp.tune["num_samples"]
    for sampler in exp.search.values():
        n *= sampler.grid_size()
    return n


def main(argv: Sequence[str] | None = None) -> int:
    from rllib_amp.experiment import ExperimentError
    from rllib_amp.resources import ResourceError

    # Tune's classic reporter, so the AMP columns show in the progress table.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    return main_wrapper(
        "python -m rllib_amp.tune", run, argv, (ExperimentError, S.StorageError, ResourceError)
    )


if __name__ == "__main__":
    raise SystemExit(main())
