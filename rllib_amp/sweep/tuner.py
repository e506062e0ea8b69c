"""Tune wiring: the Tuner of a new or resumed experiment, its progress table with the AMP
columns, and ``StopOnSignals.fit``, stopped by SIGINT or SIGTERM with the state saved.

Example:
    >>> r = {"env_runners": {}}
    >>> no_episode_yet_as_nan(result=r, metric="env_runners/episode_return_mean")
    >>> r
    {'env_runners': {'episode_return_mean': nan}}
"""

from __future__ import annotations

import _thread
import argparse
import contextlib
import logging
import math
import os
import signal
import threading
from functools import partial
from types import FrameType
from typing import TYPE_CHECKING, Any, cast

from rllib_amp import fs as files
from rllib_amp.cli import STOP_SIGNALS, Interrupted, root_error, silence_closed_terminal
from rllib_amp.learner import metrics as amp_metrics
from rllib_amp.sweep import loggers
from rllib_amp.sweep.arguments import say
from rllib_amp.sweep.summary import amp_metric_key, config_path

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm import Algorithm
    from ray.tune import CLIReporter, ResultGrid, Tuner

    from rllib_amp.experiment import Experiment

# Result keys RLlib reports only once an episode has ended (ray.rllib.utils.metrics). Until
# then they are missing, and Tune ends the whole sweep when its metric is missing from a
# result, which Pong's first iterations (episodes of thousands of steps) would do.
EPISODE_METRICS = tuple(
    f"env_runners/episode_{what}_{stat}"
    for what in ("return", "len")
    for stat in ("mean", "max", "min")
)


def progress_reporter(exp: Experiment) -> CLIReporter:
    """Tune's CLIReporter with the metric, the AMP columns and the searched keys."""
    from ray.tune import CLIReporter

    columns = {
        "training_iteration": "iter",
        exp.tune["metric"]: "return" if "return" in exp.tune["metric"] else exp.tune["metric"],
        amp_metric_key(amp_metrics.GRAD_SCALE): "grad scale",
        amp_metric_key(amp_metrics.SKIP_FRACTION): "skip frac",
        "env_runners/num_env_steps_sampled_lifetime_throughput/throughput_since_last_reduce": (
            "env steps/s"
        ),
        "num_env_steps_sampled_lifetime": "env steps",
    }
    sample = exp.algorithm_config().to_dict()
    params = {"/".join(config_path(k, sample)): k.split(".")[-1] for k in exp.search}
    # No searched key: the seed, as Tune's reporter prints the whole config (12,000 characters
    # on one line) for an empty parameter set.
    params = params or {"seed": "seed"}
    return CLIReporter(metric_columns=columns, parameter_columns=params, max_report_frequency=10)


def build_tuner(
    exp: Experiment, args: argparse.Namespace, storage: str, name: str, restore: bool
) -> Tuner:
    """A new Tuner, or with ``restore`` the stored one, unfinished and errored trials going on."""
    from ray import tune

    from rllib_amp.sweep import schedulers

    trainable = cast("type[Algorithm]", exp.algorithm_config().algo_class)
    param_space = schedulers.param_space(exp)
    if exp.tune["metric"] in EPISODE_METRICS:
        param_space.callbacks(
            on_train_result=partial(no_episode_yet_as_nan, metric=exp.tune["metric"])
        )
    if restore:
        return tune.Tuner.restore(
            files.join(storage, name),
            trainable=trainable,
            resume_unfinished=True,
            resume_errored=True,
            param_space=param_space.to_dict(),  # what Tune makes of an AlgorithmConfig
        )
    t, ck = exp.tune, exp.checkpoint
    scheduler = schedulers.scheduler(exp, config_path)
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
        progress_reporter=progress_reporter(exp),
        callbacks=loggers.wandb_callbacks(getattr(args, "wandb_project", None)),
        verbose=1,
    )
    return tune.Tuner(
        trainable,
        param_space=param_space.to_dict(),
        tune_config=tune.TuneConfig(
            metric=t["metric"],
            mode=t["mode"],
            num_samples=args.num_samples or t["num_samples"],
            scheduler=scheduler,
            max_concurrent_trials=t["max_concurrent_trials"],
        ),
        run_config=run_config,
    )


def no_episode_yet_as_nan(*, result: dict[str, Any], metric: str, **kwargs: object) -> None:
    """RLlib ``on_train_result`` callback: an episode metric no episode gave yet is NaN."""
    group, leaf = metric.split("/")
    result.setdefault(group, {}).setdefault(leaf, math.nan)


class StopOnSignals:
    """SIGINT (Ctrl-C), SIGTERM (``ray job stop``, schedulers) and SIGHUP (the terminal closed)
    each stop Tune as its own Ctrl-C does: it saves the experiment state and returns. A further
    signal is reported and otherwise ignored (raising would cut the state file short mid-upload);
    one before Tune's loop (nothing to save yet) raises ``Interrupted``. ``signum``: the signal
    that stopped the run, 0 none; ``ray_dead``: what of the local Ray died (``ray_died``).
    Outside the main thread it installs nothing."""

    def __init__(self) -> None:
        self.signum = 0
        self.fitted = False
        self.ray_dead: str | None = None
        self.resume_command: str | None = None
        self._previous: dict[int, Any] = {}
        self._before_tune: Any = None
        self._undo = contextlib.ExitStack()

    def __enter__(self) -> StopOnSignals:
        if threading.current_thread() is not threading.main_thread():
            return self
        self._before_tune = signal.getsignal(signal.SIGUSR1)
        self._previous = {s: signal.getsignal(s) for s in (signal.SIGINT, *STOP_SIGNALS)}
        for s, handler in {**self._previous, signal.SIGUSR1: self._before_tune}.items():
            self._undo.callback(signal.signal, s, handler)
        self.install()
        if (disabled := os.environ.get(_TUNE_SIGINT_ENV)) is None:
            self._undo.callback(os.environ.pop, _TUNE_SIGINT_ENV, None)
        else:
            self._undo.callback(os.environ.__setitem__, _TUNE_SIGINT_ENV, disabled)
        os.environ[_TUNE_SIGINT_ENV] = "1"
        faults = OneLinePerFault()
        for logger in (logging.getLogger("ray.tune.tune"), *FAULT_LOGGERS):
            logger.addFilter(faults)
            self._undo.callback(logger.removeFilter, faults)
        return self

    def __exit__(self, *exc: object) -> None:
        self._undo.close()
        self._previous = {}

    def install(self) -> None:
        """Puts this object's handler on SIGINT, SIGTERM and SIGHUP."""
        for s in self._previous:
            signal.signal(s, self._stop)

    def fit(self, tuner: Tuner) -> tuple[ResultGrid, int]:
        """``tuner.fit()`` and the signal that stopped it (0: none)."""
        self.install()  # again: ray.init, since this was entered, puts its own on SIGTERM
        try:
            return tuner.fit(), self.signum
        finally:
            self.fitted = True

    def ray_died(self, what: str) -> None:
        """From the watchdog's thread: records what died and stops as Ctrl-C would."""
        self.ray_dead = what
        _thread.interrupt_main(signal.SIGINT)  # runs ``_stop`` in the main thread

    def _stop(self, signum: int, frame: FrameType | None) -> None:
        if signum == signal.SIGHUP:
            silence_closed_terminal()
        name = signal.Signals(signum).name
        if self.signum or self.fitted:
            if not self.ray_dead:
                say(
                    f"{name}: still saving the experiment state and the summary; stopping "
                    "once they are written (SIGKILL stops at once and loses what is not saved)"
                )
            return
        # Tune's stop handler is on SIGUSR1 from the start of its loop (Tune always installs
        # it there); with TUNE_DISABLE_SIGINT_HANDLER, SIGINT is left to this handler.
        tune_stop = signal.getsignal(signal.SIGUSR1)
        if tune_stop is self._before_tune or not callable(tune_stop):
            raise Interrupted(signum)
        self.signum = signum
        if not self.ray_dead:
            say(f"{name}: stopping; saving the experiment state")
        tune_stop(signal.SIGUSR1, frame)


# Tune's own SIGINT handler would leave SIGTERM out and let a second Ctrl-C interrupt the save.
_TUNE_SIGINT_ENV = "TUNE_DISABLE_SIGINT_HANDLER"


class OneLinePerFault(logging.Filter):
    """Tune logs each failed trial attempt and experiment-state save with the whole traceback,
    again for each retry: this makes each one line with the exception's, once per message and
    cause (a trial's tracebacks stay in its ``error.txt``, which the summary names). It drops
    Tune's stop advice: a second Ctrl-C skipping the save (``fit`` prevents it), and the
    Python ``Tuner.restore(...)`` (the CLI prints its own ``--resume`` command).

    Example:
        >>> f, failed = OneLinePerFault(), (OSError, OSError("disk gone"), None)
        >>> def record():
        ...     msg = "Trial task failed for trial T_1"
        ...     return logging.LogRecord("ray.tune", logging.ERROR, "", 0, msg, None, failed)
        >>> r = record()
        >>> f.filter(r), r.getMessage(), r.exc_info
        (True, 'Trial task failed for trial T_1: OSError: disk gone', None)
        >>> f.filter(record())  # the same fault again (a retry): said already
        False
    """

    def __init__(self) -> None:
        super().__init__()
        self._said: set[tuple[str, str]] = set()

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if message.startswith(("Stop signal received", "Experiment has been interrupted")):
            return False
        if not message.startswith(FAULT_MESSAGES) or not record.exc_info:
            return True
        cause = root_error(record.exc_info[1])
        if (message, cause) in self._said:
            return False
        self._said.add((message, cause))
        line = f"{message.rstrip(': ')}: {cause}"
        record.msg, record.args, record.exc_info, record.exc_text = line, (), None, None
        return True


# Tune's records of a fault (ray/tune/execution/tune_controller.py, experiment_state.py), and
# the loggers they come from.
FAULT_MESSAGES = ("Trial task failed for trial ", "Saving experiment state to storage at ")
FAULT_LOGGERS = (
    logging.getLogger("ray.tune.execution.tune_controller"),
    logging.getLogger("ray.tune.execution.experiment_state"),
)
