"""``python -m rllib_amp.tune``: sweep AMP scaler settings and batch size with Ray Tune.

Runs one experiment file (default ``tune_configs/cartpole_ppo_amp.yaml``) on a local Ray
started in-process, or on a cluster (``--address auto`` on a node of it). Prints Tune's
progress table with AMP columns, then a summary of all trials sorted by the metric, the best
trial's checkpoint, and writes ``results.parquet`` (one row per trial) to the experiment
folder. Storage is a local path, a shared mount or a URI (``s3://``, ``gs://``, ...; see
``rllib_amp.sweep.storage``). Before any trial starts it checks what would otherwise fail late: on
a multi-node cluster, that every node reaches the storage; on a local Ray, that a trial's
resources fit the machine (``--fit-to-machine`` scales them down). Exit status: 0 success,
1 a trial failed or did not finish, 2 bad input (anything knowable before the first trial
starts), 130 interrupted (Ctrl-C; ``--resume`` continues).

Example:
    python -m rllib_amp.tune --set stop.training_iteration=2 --num-samples 1
    python -m rllib_amp.tune --config tune_configs/pong_ppo_amp.yaml --address auto \
        --storage-path s3://my-bucket/experiments
    python -m rllib_amp.tune --config tune_configs/pong_ppo_amp.yaml --fit-to-machine
"""

from __future__ import annotations

import argparse
import math
import os
import re
import shlex
import signal
import socket
import threading
import urllib.parse
from collections.abc import Sequence
from functools import partial
from pathlib import Path
from typing import Any

from rllib_amp.cli import EXIT_INTERRUPTED, Parser, UsageError, main_wrapper, root_error
from rllib_amp.learner import metrics as M
from rllib_amp.sweep import loggers, recommend, summary
from rllib_amp.sweep import storage as S
from rllib_amp.sweep.summary import (  # noqa: F401 - re-exported: the CLI's summary API
    MODULE_ID,
    amp_metric_key,
    config_path,
    format_table,
    summarize,
    write_parquet,
)

DEFAULT_CONFIG = "tune_configs/cartpole_ppo_amp.yaml"
RESULTS_FILE = "results.parquet"
# The resolved experiment of the first start, beside results.parquet: --resume compares to it.
EXPERIMENT_FILE = "experiment.yaml"
# A sweep larger than this is more likely a typo (num_samples: 10000 x a grid) than a plan.
DEFAULT_MAX_TRIALS = 1000
# Connecting to a Ray address that is not there: Ray itself retries for a minute or more.
ADDRESS_PROBE_TIMEOUT_S = 5.0
# Keys of the resolved experiment that may change between a run and its --resume.
UNCOMPARED_KEYS = ("storage_path",)
_NAME = re.compile(r"[\w][\w.+=-]{0,199}")
# HTTP/2 client preface and an empty SETTINGS frame (RFC 9113 3.4, 6.5); type 4 = SETTINGS.
_HTTP2_HELLO = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"
_HTTP2_SETTINGS = 4
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
    p.add_argument(
        "--name",
        default=None,
        help="experiment name, a folder name under STORAGE_PATH: letters, digits, '.', '_', "
        "'-', '+', '=' (default: the file's name)",
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
        help="continue the interrupted experiment NAME in STORAGE_PATH: finished trials are "
        "kept, unfinished ones continue from their newest intact checkpoint",
    )
    p.add_argument(
        "--accept-changes",
        action="store_true",
        help="with --resume: resume even though the experiment (file or --set values) differs "
        f"from the {EXPERIMENT_FILE} stored at the first start; trials already created keep "
        "the settings they started with",
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

    from rllib_amp.sweep import schedulers

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


def run(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.num_samples is not None and args.num_samples < 1:
        raise UsageError(f"--num-samples: got {args.num_samples}; must be >= 1")
    if args.max_trials < 1:
        raise UsageError(f"--max-trials: got {args.max_trials}; must be >= 1")
    if args.accept_changes and not args.resume:
        raise UsageError("--accept-changes: only applies with --resume; drop it or add --resume")
    from rllib_amp import experiment as E

    exp = E.load(find_config(args.config), overrides=args.overrides)
    name = args.name if args.name is not None else exp.name
    check_name(name, "--name" if args.name is not None else "the config file's name")
    trials = _count_trials(exp, args.num_samples)
    if trials > args.max_trials:
        raise UsageError(
            f"--max-trials: this sweep makes {trials:,} trials (search grid x num_samples), "
            f"more than the cap of {args.max_trials:,}; lower tune.num_samples or the grid, "
            f"or pass --max-trials {trials} to run them all"
        )
    checked = E.preflight(exp)  # what --dry-run proves, and what a real run checks before Ray
    storage = S.resolve(args.storage_path, exp.get("storage_path"))
    exp_dir = S.join(storage, name)
    if args.fit_to_machine and args.address:
        raise UsageError(
            "--fit-to-machine: scales trials to the local Ray this command starts; drop "
            "--address, or size the file's resources section for the cluster"
        )
    spec = _run_spec(exp, args.num_samples)
    if args.resume:
        if not _can_restore(exp_dir):
            raise UsageError(
                f"--resume: no experiment at {exp_dir}; pass the --name and --storage-path of "
                f"the interrupted run"
            )
        _check_unchanged(exp_dir, spec, args.accept_changes)
    elif _taken(exp_dir):
        # Tune would start a new experiment in the same folder, replace results.parquet and
        # orphan the interrupted trials' checkpoints.
        raise UsageError(
            f"--name: an experiment named {name!r} already exists at {exp_dir}; continue it "
            f"with --resume, or start a new one with another --name"
        )

    if args.dry_run:
        import yaml

        print(f"# experiment {exp.path} -> {exp_dir}")
        print(yaml.safe_dump(exp.resolved(), sort_keys=False).rstrip())
        print("# search space")
        for key, sampler in exp.search.items():
            print(f"{key}: {sampler.to_dict()}")
        print(f"# trials: {trials}")
        print(f"# pre-flight: {checked}")
        return 0

    import ray

    from rllib_amp.sweep import resources as R

    address, where = _ray_address(args)
    if address is not None:
        probe_address(address, where)
    S.check_writable(storage)
    # A local Ray (no autoscaler): what it has is all a trial can ever get. One this command
    # starts is sized before it starts, so a trial that can never fit fails within seconds
    # (Ray's own start takes longer than that on a busy machine).
    local = address is None
    predicted = R.local_capacity() if local and not ray.is_initialized() else None
    if predicted is not None:
        exp = _fit_resources(exp, args, predicted)
    started = False
    if not ray.is_initialized():
        _start_ray(address, where)
        started = True
    interrupted = False
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
        if args.resume:
            _fall_back_to_intact_checkpoints(exp_dir)
        try:
            tuner = _tuner(exp, args, storage, name, restore=args.resume)
        except Exception as e:  # noqa: BLE001 - before any trial: every failure is exit 2
            if args.resume:
                raise UsageError(
                    f"--resume: restoring the experiment at {exp_dir} failed "
                    f"({root_error(e)}); if its files are damaged, start anew with another "
                    f"--name"
                ) from None
            raise UsageError(
                f"--config: setting up Tune failed ({root_error(e)}); fix the value it names "
                f"in the file or the --set values"
            ) from None
        if not args.resume:
            S.write_bytes(S.join(exp_dir, EXPERIMENT_FILE), _dump(spec))
        grid, interrupted = _fit(tuner)
    finally:
        if started:
            ray.shutdown()

    rows = summarize(exp, grid, storage)
    parquet = S.join(exp_dir, RESULTS_FILE)
    write_parquet(rows, parquet)
    print()
    threshold = summary.target(exp)
    if threshold is None:
        order = f"best first by {exp.tune['metric']} ({exp.tune['mode']})"
    else:
        order = f"soonest first to {exp.tune['metric']} >= {threshold:g}"
    print(f"Trials of {name}, {order}:")
    print(format_table(exp, rows))
    if threshold is not None:
        print(summary.target_line(exp, rows, threshold))
    best = next((r for r in rows if r["status"] == "DONE" and r["checkpoint"]), None)
    print(f"Best trial checkpoint: {best['checkpoint'] if best else '-'}")
    print(f"Results: {parquet}")
    recommend.report(exp, rows, grid, exp_dir)
    failed = [r for r in rows if r["status"] == "ERROR"]
    unfinished = [r for r in rows if r["status"] == "UNFINISHED"]
    if unfinished or interrupted:
        print(
            f"{len(unfinished)} trial(s) did not finish; continue with: "
            + _resume_command(args, exp, name, storage)
        )
    for r in failed:
        print(f"trial {r['trial_id']} failed: {r['error']}")
    if interrupted:
        return EXIT_INTERRUPTED
    return 1 if failed or unfinished else 0


def check_name(name: str, where: str = "--name") -> None:
    """An experiment name is one folder name under the storage path, never a path: UsageError
    for ``''``, ``.``, ``..``, ``a/b``, ``../../x`` or characters a URI would misread.

    Example:
        >>> check_name("cartpole-amp_2")
        >>> check_name("../x")
        Traceback (most recent call last):
        rllib_amp.cli.UsageError: --name: got '../x'; ...
    """
    if not _NAME.fullmatch(name) or name in (".", ".."):
        raise UsageError(
            f"{where}: got {name!r}; an experiment name is a folder name, not a path: 1 to 200 "
            f"letters, digits, '.', '_', '-', '+', '=' (not starting with '.' or '-'), e.g. "
            f"--name cartpole-amp; choose the folder with --storage-path"
        )


def _ray_address(args: argparse.Namespace) -> tuple[str | None, str]:
    """The cluster to join and where it was given; ``(None, ...)`` for a Ray of our own.

    RAY_ADDRESS counts as --address, as in every Ray tool: ``ray job submit`` sets it for the
    job it starts, which must run on that cluster, not on a Ray of its own.
    """
    if args.address is not None:
        if not args.address.strip():
            raise UsageError(
                "--address: got an empty address; pass auto, HOST:PORT or ray://HOST:PORT, "
                "or drop --address for a local Ray"
            )
        return args.address.strip(), "--address"
    env = os.environ.get("RAY_ADDRESS", "").strip()
    if env:
        return env, "RAY_ADDRESS"
    return None, ""


def probe_address(address: str, where: str, timeout_s: float = ADDRESS_PROBE_TIMEOUT_S) -> None:
    """Checks that something listens at a Ray address before ``ray.init`` tries it (Ray
    retries an address nobody answers at for a minute or more): UsageError naming ``where``
    and the fix when the address is malformed, unknown or refuses connections.

    Example:
        >>> probe_address("127.0.0.1:1", "--address")  # doctest: +SKIP
        Traceback (most recent call last):
        rllib_amp.cli.UsageError: --address: nothing answers at 127.0.0.1:1 (...); ...
    """
    fix = (
        "start the cluster (ray start --head) or pass the address it printed"
        + (", or unset RAY_ADDRESS to run on a local Ray" if where == "RAY_ADDRESS" else "")
        + (", or drop --address to run on a local Ray" if where == "--address" else "")
    )
    if address == "local":
        return
    target = address
    if address == "auto":
        from ray._private import services

        try:
            target = services.canonicalize_bootstrap_address_or_die("auto")
        except (ConnectionError, RuntimeError, ValueError) as e:
            raise UsageError(
                f"{where}: auto found no Ray cluster ({root_error(e)}); {fix}"
            ) from None
    host, port = _host_port(target)
    if host is None or port is None:
        raise UsageError(
            f"{where}: got {address!r}; expected auto, HOST:PORT or ray://HOST:PORT "
            f"(e.g. 127.0.0.1:6379)"
        )
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as conn:
            conn.sendall(_HTTP2_HELLO)
            answer = _read(conn, 9)
    except OSError as e:
        raise UsageError(
            f"{where}: nothing answers at {host}:{port} ({root_error(e)}); {fix}"
        ) from None
    # Ray's GCS and its client server speak gRPC: a server that does not answer HTTP/2's
    # connection preface with a SETTINGS frame is something else, which ray.init would wait
    # on for minutes.
    if len(answer) < 9 or answer[3] != _HTTP2_SETTINGS:
        raise UsageError(
            f"{where}: {host}:{port} answers but is not a Ray cluster (no gRPC there); pass "
            f"the address `ray start --head` printed (GCS port 6379 by default, or "
            f"ray://HOST:10001 for Ray Client)"
        )


def _read(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _host_port(address: str) -> tuple[str | None, int | None]:
    text = address if "://" in address else f"ray://{address}"
    try:
        u = urllib.parse.urlsplit(text)
        port = u.port
    except ValueError:
        return None, None
    if u.scheme != "ray" or not u.hostname or port is None or not port:
        return None, None
    if u.path not in ("", "/") or u.query or u.fragment:
        return None, None
    return u.hostname, port


def _start_ray(address: str | None, where: str) -> None:
    """``ray.init``, its failures as UsageError. Without an address: a fresh local Ray, never
    a cluster some earlier ``ray start`` left recorded in Ray's temp folder."""
    import ray

    try:
        if address is None:
            ray.init(address="local", log_to_driver=False)
        else:
            ray.init(address=address, log_to_driver=False)
    except (ConnectionError, RuntimeError, ValueError, OSError, TimeoutError) as e:
        if address is None:
            raise UsageError(
                f"ray.init: could not start a local Ray ({root_error(e)}); check free disk "
                f"space and memory in /tmp (or $RAY_TMPDIR), or pass --address of a cluster"
            ) from None
        raise UsageError(
            f"{where}: could not join the Ray cluster at {address} ({root_error(e)}); check "
            f"the address and that the cluster runs the same Ray and Python versions"
        ) from None


def _fit(tuner: Any) -> tuple[Any, bool]:
    """``tuner.fit()`` and whether Ctrl-C ended it. Tune catches the first SIGINT, saves the
    experiment and returns; its handler then puts back the one it found, which is how the
    marker installed here tells an interrupted run from a finished one."""
    if threading.current_thread() is not threading.main_thread():
        return tuner.fit(), False

    def marker(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGINT, marker)
    try:
        grid = tuner.fit()
        return grid, signal.getsignal(signal.SIGINT) is marker
    finally:
        signal.signal(signal.SIGINT, previous)


def _fall_back_to_intact_checkpoints(exp_dir: str) -> None:
    """Before Tuner.restore: trials whose latest checkpoint is damaged resume from their newest
    intact one (checkpoint_fallback logs a WARNING naming both)."""
    import logging

    from rllib_amp.checkpoints import fallback as checkpoint_fallback

    # Shown as "WARNING ..." on stderr whatever logging this process has set up (none: the
    # CLI is the program), and only once.
    logger = logging.getLogger(checkpoint_fallback.__name__)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    propagate, logger.propagate = logger.propagate, False
    logger.addHandler(handler)
    try:
        checkpoint_fallback.resume_from_intact_checkpoints(exp_dir)
    except (OSError, ValueError, KeyError, TypeError) as e:  # TypeError, KeyError: bad state
        raise UsageError(
            f"--resume: cannot read the checkpoints at {exp_dir} ({root_error(e)}); check the "
            f"storage, or start anew with another --name"
        ) from None
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def _run_spec(exp: Any, num_samples: int | None) -> dict[str, Any]:
    """What a run is: the resolved experiment, with --num-samples in it."""
    spec = exp.resolved()
    if num_samples is not None:
        spec["tune"] = {**spec["tune"], "num_samples": num_samples}
    for key in UNCOMPARED_KEYS:
        spec.pop(key, None)
    return spec


def _dump(spec: dict[str, Any]) -> bytes:
    import yaml

    return yaml.safe_dump(spec, sort_keys=False).encode()


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(d, dict) or not d:
        return {prefix: d}
    out: dict[str, Any] = {}
    for k, v in d.items():
        out.update(_flat(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def changed_keys(stored: dict[str, Any], current: dict[str, Any]) -> list[str]:
    """``key: old -> new`` for each dotted key whose value differs.

    Example:
        >>> changed_keys({"amp": {"init_scale": 1.0}}, {"amp": {"init_scale": 2.0}})
        ['amp.init_scale: 1.0 -> 2.0']
    """
    old, new = _flat(stored), _flat(current)

    def show(d: dict[str, Any], k: str) -> str:
        return repr(d[k]) if k in d else "(not set)"

    return [
        f"{k}: {show(old, k)} -> {show(new, k)}"
        for k in dict.fromkeys([*old, *new])
        if old.get(k, ...) != new.get(k, ...)
    ]


def _check_unchanged(exp_dir: str, spec: dict[str, Any], accept: bool) -> None:
    import yaml

    location = S.join(exp_dir, EXPERIMENT_FILE)
    if not S.exists(location):
        return  # started before experiments were stored: nothing to compare with
    try:
        stored = yaml.safe_load(S.read_bytes(location))
    except (OSError, yaml.YAMLError) as e:
        raise UsageError(
            f"--resume: cannot read {location} ({root_error(e)}); restore it, or start anew "
            f"with another --name"
        ) from None
    diff = changed_keys(stored if isinstance(stored, dict) else {}, spec)
    if diff and not accept:
        raise UsageError(
            f"--resume: the experiment differs from the one stored at {location}: "
            f"{'; '.join(diff)}; resume with the same file and --set values, start a new run "
            f"with another --name, or pass --accept-changes (trials already created keep "
            f"their settings)"
        )
    if diff:
        print(f"--accept-changes: resuming despite {'; '.join(diff)}")


def _resume_command(args: argparse.Namespace, exp: Any, name: str, storage: str) -> str:
    """The command that continues this run: the same file, --set values and sample count."""
    words = ["python", "-m", "rllib_amp.tune", "--config", exp.path, "--name", name]
    words += ["--storage-path", storage]
    for item in args.overrides:
        words += ["--set", item]
    if args.num_samples is not None:
        words += ["--num-samples", str(args.num_samples)]
    if args.address is not None:
        words += ["--address", args.address]
    return " ".join(shlex.quote(w) for w in [*words, "--resume"])


def _taken(exp_dir: str) -> bool:
    """Whether an experiment (anything) is at ``exp_dir``. Storage that cannot be reached is
    not judged here: --dry-run touches no storage, and a real run's check_writable names it."""
    try:
        return S.has_contents(exp_dir)
    except OSError:
        return False


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
    from rllib_amp.sweep import resources as R

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
    from rllib_amp.sweep.resources import ResourceError

    # Tune's classic reporter, so the AMP columns show in the progress table.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    return main_wrapper(
        "python -m rllib_amp.tune", run, argv, (ExperimentError, S.StorageError, ResourceError)
    )


if __name__ == "__main__":
    raise SystemExit(main())
