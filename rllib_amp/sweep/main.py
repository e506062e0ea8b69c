"""``python -m rllib_amp.tune``: sweep AMP scaler settings and batch size with Ray Tune.

Runs one experiment file on a local Ray started in-process, or on a cluster (``--address``),
checks before any trial what would otherwise fail late (storage every node reaches, resources
that fit a local Ray), then prints the summary and writes ``results.parquet``. The flags, the
exit statuses (0, 1, 2, 130, 143) and each fault's line: docs/cli.md.

Example:
    python -m rllib_amp.tune --set stop.training_iteration=2 --num-samples 1
    python -m rllib_amp.tune --config tune_configs/pong_ppo_amp.yaml --address auto \
        --storage-path s3://my-bucket/experiments
"""

from __future__ import annotations

import argparse
import math
import os
import sys
from collections.abc import Mapping, Sequence
from functools import partial
from typing import TYPE_CHECKING

from rllib_amp import fs as files
from rllib_amp.cli import (
    UsageError,
    interrupted_line,
    main_wrapper,
    may_end_process,
    root_error,
    signal_exit_status,
)
from rllib_amp.sweep import lock as experiment_lock
from rllib_amp.sweep import resources as sweep_resources
from rllib_amp.sweep import resume as sweep_resume
from rllib_amp.sweep import storage as sweep_storage
from rllib_amp.sweep import transcript
from rllib_amp.sweep.arguments import PROG, build_parser, check_flags, find_config, say
from rllib_amp.sweep.ray_address import LocalRayWatchdog, probe_address, ray_address, start_ray
from rllib_amp.sweep.resources import ResourceError, RllibNotices

if TYPE_CHECKING:
    from ray.tune import ResultGrid, Tuner

    from rllib_amp.experiment import Experiment
    from rllib_amp.sweep.tuner import StopOnSignals


def run(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    check_flags(args)
    from rllib_amp import experiment  # not before: --help answers without the schema loaded
    from rllib_amp.experiment.preflight import preflight

    try:
        exp = experiment.load(find_config(args.config), overrides=args.overrides)
        for note in exp.notes:  # a --set on a searched key replaces that search entry
            print(note)
        grid_size = math.prod(sampler.grid_size() for sampler in exp.search.values())
        trials = (args.num_samples or exp.tune["num_samples"]) * grid_size
        if trials > args.max_trials:
            raise UsageError(
                f"--max-trials: this sweep makes {trials:,} trials (search grid x num_samples), "
                f"more than the cap of {args.max_trials:,}; lower tune.num_samples or the grid, "
                f"or pass --max-trials {trials} to run them all"
            )
        with RllibNotices() as notices:  # shown once the trials start: a refusal stays one line
            checked = preflight(exp)  # what --dry-run proves, and a real run before Ray
            return _checked_run(args, exp, trials, checked, notices)
    except experiment.ExperimentError as e:
        raise UsageError(str(e)) from None


def _checked_run(
    args: argparse.Namespace, exp: Experiment, trials: int, checked: str, notices: RllibNotices
) -> int:
    storage = sweep_storage.resolve(args.storage_path, exp.get("storage_path"))
    if args.resume:  # Tune's own reads would wait minutes on a dead endpoint, then say "none"
        sweep_storage.check_reachable(storage)
    try:
        name = sweep_resume.choose_name(exp.name, storage, name=args.name, resume=args.resume)
    except sweep_resume.Finished as done:  # --resume of a finished run: where its results are
        print(done)
        return 0
    spec = sweep_resume.run_spec(exp, args.num_samples)
    if args.resume:
        sweep_resume.check_unchanged(files.join(storage, str(name)), spec, args.accept_changes)
    if args.dry_run:  # touches no storage
        exp_dir = files.join(storage, name or sweep_resume.timestamped(exp.name))
        print(f"# experiment {exp.path} -> {exp_dir}")
        print(sweep_resume.dump(exp.resolved()).decode().rstrip())
        print("# search space")
        for key, sampler in exp.search.items():
            print(f"{key}: {sampler.to_dict()}")
        print(f"# trials: {trials}")
        print(f"# pre-flight: {checked}")
        return 0

    address, where = ray_address(args)
    if address is not None:
        probe_address(address, where)
    sweep_storage.check_writable(storage)
    from rllib_amp.sweep import tuner as sweep_tuner

    # A second signal must not cut the summary short either; the lock outlives both.
    with experiment_lock.locks_released(), sweep_tuner.StopOnSignals() as stop:
        try:
            if name is not None:  # a new run's name is locked as it is taken
                experiment_lock.lock(storage, name, "--resume" if args.resume else "--name")
                if args.resume:  # before Ray: a trial with no intact checkpoint is exit 2
                    exp_dir = files.join(storage, name)
                    sweep_resume.fall_back_to_intact_checkpoints(exp_dir, args.restart_damaged)
                    stop.resume_command = sweep_resume.resume_command(args, exp, name, storage)
            exp, name, grid, stopped = _tune(
                exp, args, storage, name, spec, address, where, notices, stop
            )
        except KeyboardInterrupt as e:  # a signal, or Ray's death, before Tune's loop
            return _stopped_before_trials(stop, e)
        except sweep_storage.StorageFailed as e:  # said once, as the summary would: no grid to show
            say(f"{e}; fix it, then continue with: {stop.resume_command}")
            return 1
        with transcript.also_into(files.join(storage, name, transcript.FILE)):
            return _report(exp, grid, storage, name, stopped, stop)


def _stopped_before_trials(stop: StopOnSignals, e: KeyboardInterrupt) -> int:
    if stop.ray_dead:
        say(_ray_died_line(stop))
        return 1
    line, status = interrupted_line(PROG, e)
    print(f"{line} before the trials started; {_then(stop)}", file=sys.stderr, flush=True)
    return status


def _then(stop: StopOnSignals) -> str:
    if stop.resume_command:
        return f"continue with: {stop.resume_command}"
    return "nothing was written; run the same command to start it again"


def _ray_died_line(stop: StopOnSignals) -> str:
    return f"Ray died under the sweep ({stop.ray_dead}); its trials stopped with it; {_then(stop)}"


def _ray_died_stuck(stop: StopOnSignals, what: str) -> None:
    """Says Ray died and releases the locks, before the watchdog ends a command stuck on it."""
    stop.ray_dead = stop.ray_dead or what
    say(_ray_died_line(stop))
    for location in list(experiment_lock._held):
        experiment_lock.unlock(location)


def _tune(
    exp: Experiment,
    args: argparse.Namespace,
    storage: str,
    name: str | None,
    spec: dict[str, object],
    address: str | None,
    where: str,
    notices: RllibNotices,
    stop: StopOnSignals,
) -> tuple[Experiment, str, ResultGrid, int]:
    """Starts or joins Ray, fits the trials to it, runs Tune: ``(experiment as run, its name,
    result grid, the stopping signal or 0)``. A new run (``name`` None) takes its name once
    every check passed, so a refused start leaves no folder."""
    import ray

    from rllib_amp.sweep import grafana

    # A local Ray (no autoscaler) is all a trial can ever get. One this command starts is
    # sized before it starts: a trial that can never fit fails within seconds, not a Ray start.
    local, started = address is None, not ray.is_initialized()
    predicted = sweep_resources.local_capacity() if local and started else None
    if predicted is not None:
        exp = _fit_resources(exp, args, predicted)
    watchdog = LocalRayWatchdog(on_death=stop.ray_died, on_stuck=partial(_ray_died_stuck, stop))
    if started:
        session_dir = start_ray(address, where)
        if local and session_dir and may_end_process():  # never a caller's process
            watchdog.start(session_dir)
    try:
        if local:
            actual = sweep_resources.capacity_of(ray.cluster_resources())
            if actual != predicted:
                exp = _fit_resources(exp, args, actual)
        # A node that cannot reach the storage would fail at its first checkpoint.
        sweep_storage.check_reachable_from_nodes(storage)
        with sweep_resume.warnings_on_stderr(grafana.__name__):
            dashboard = grafana.install_dashboard()
        if dashboard:
            print(f"AMP Grafana dashboard: {dashboard}")
        new = name is None
        name = name or sweep_resume.new_run_name(exp.name, storage)
        try:
            tuner = _build_tuner(exp, args, storage, name, spec)
        except BaseException as e:
            if isinstance(e, KeyboardInterrupt) and not args.resume:
                _discard_unstarted(storage, name)  # Tune's tuner.pkl, experiment.yaml, the lock
            if new:
                sweep_resume.release(storage, name)  # only if empty: Tune wrote nothing there yet
            raise
        stop.resume_command = sweep_resume.resume_command(args, exp, name, storage)
        notices.release()
        try:
            with sweep_storage.keep_files_whole():  # a full disk keeps each file's last whole copy
                grid, interrupted = stop.fit(tuner)
        except OSError as e:  # Tune reading back a storage that failed under the trials?
            if not sweep_storage.failed(e, files.join(storage, name)):
                raise
            raise sweep_storage.StorageFailed(files.join(storage, name), e) from None
        except KeyboardInterrupt:  # before Tune's loop: no experiment state saved
            if not args.resume and _discard_unstarted(storage, name):
                stop.resume_command = None
            raise
    finally:
        watchdog.stop_checking()
        if started:
            ray.shutdown()
        watchdog.release()
    return exp, name, grid, interrupted


def _discard_unstarted(storage: str, name: str) -> bool:
    """Removes a new run stopped before Tune saved any state (True); one with a state stays."""
    try:
        fs, path = files.resolve(files.join(storage, name))
        if files.experiment_state_file(fs, path) is not None:
            return False
        fs.delete_dir(path)
    except (OSError, ValueError):
        return False
    return True


def _build_tuner(
    exp: Experiment, args: argparse.Namespace, storage: str, name: str, spec: dict[str, object]
) -> Tuner:
    from rllib_amp.sweep import tuner as sweep_tuner

    exp_dir = files.join(storage, name)
    try:
        tuner = sweep_tuner.build_tuner(exp, args, storage, name, restore=args.resume)
    except Exception as e:  # noqa: BLE001 - before any trial: every failure is exit 2
        if args.resume:
            raise UsageError(
                f"--resume: restoring the experiment at {exp_dir} failed ({root_error(e)}); if "
                f"its files are damaged, start anew with another --name"
            ) from None
        raise UsageError(
            f"--config: setting up Tune failed ({root_error(e)}); fix the value it names "
            f"in the file or the --set values"
        ) from None
    if not args.resume:
        files.write_bytes(
            *files.resolve(files.join(exp_dir, sweep_resume.EXPERIMENT_FILE)),
            sweep_resume.dump(spec),
        )
    return tuner


def _report(
    exp: Experiment,
    grid: ResultGrid,
    storage: str,
    name: str,
    interrupted: int,
    stop: StopOnSignals,
) -> int:
    """Prints the summary and writes results.parquet: exit 0, 1 (a trial failed or did not
    finish, Ray died) or 128 + the signal."""
    from rllib_amp.sweep import figure, groups, recommend, summary

    exp_dir = files.join(storage, name)
    parquet = files.join(exp_dir, sweep_resume.RESULTS_FILE)
    results = [grid[i] for i in range(len(grid))]  # a ResultGrid is indexed, not iterable
    rows = summary.summarize(exp, results, storage)
    fault = sweep_storage.storage_fault(exp_dir, rows)
    if fault is not None:  # said once; only the results are tried on a storage that fails
        print(summary.format_table(exp, rows))
        if summary.try_write_parquet(rows, parquet):
            print(f"Results: {parquet}")
        say(f"{fault}; free space or fix the storage, then continue with: {stop.resume_command}")
        return signal_exit_status(interrupted) if interrupted else 1
    summary.write_parquet(rows, parquet)
    print()
    threshold = summary.target(exp)
    if threshold is None:
        order = f"best first by {exp.tune['metric']} ({exp.tune['mode']})"
    else:
        order = f"soonest first to {exp.tune['metric']} >= {threshold:g}"
    print(f"Trials of {name}, {order}:")
    print(summary.format_table(exp, rows))
    for line in summary.warning_lines(rows):  # logged in the learners' processes, unseen
        print(line)
    if threshold is not None:
        print(summary.target_line(exp, rows, threshold))
    best = next((r for r in rows if r["status"] == "DONE" and r["checkpoint"]), None)
    print(f"Best trial checkpoint: {best['checkpoint'] if best else '-'}")
    print(f"Results: {parquet}")
    print(figure.report(exp, groups.report(exp, rows, exp_dir), results, exp_dir))
    recommend.report(exp, rows, results, exp_dir)
    failed = [r for r in rows if r["status"] == "ERROR"]
    unfinished = [r for r in rows if r["status"] == "UNFINISHED"]
    if stop.ray_dead:  # the trials' errors are Ray's death, said once
        say(_ray_died_line(stop))
        return 1
    if unfinished or interrupted:
        print(f"{len(unfinished)} trial(s) did not finish; continue with: {stop.resume_command}")
    for r in failed:
        where = f" (traceback: {r['error_file']})" if r.get("error_file") else ""
        print(f"trial {r['trial_id']} failed: {r['error']}{where}")
    if interrupted:
        return signal_exit_status(interrupted)
    return 1 if failed or unfinished else 0


def _fit_resources(
    exp: Experiment, args: argparse.Namespace, capacity: Mapping[str, float]
) -> Experiment:
    """A trial that does not fit a local Ray would stay PENDING forever: exit 2, or with
    --fit-to-machine scale it down."""
    if not args.fit_to_machine:
        sweep_resources.check_fits(exp, capacity)
        return exp
    overrides = sweep_resources.fit_overrides(exp, capacity)
    if overrides:
        exp = exp.with_overrides(overrides)
        print(
            "--fit-to-machine: this machine's Ray has "
            f"{sweep_resources.format_amount(capacity)}; running with "
            + " ".join(f"--set {k}={v}" for k, v in overrides.items())
        )
    return exp


def main(argv: Sequence[str] | None = None) -> int:
    # Tune's classic reporter, so the AMP columns show in the progress table.
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    bad_input = (sweep_storage.StorageError, ResourceError)
    return main_wrapper(PROG, run, argv, errors=bad_input)
