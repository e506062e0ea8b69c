"""Tune wiring: the Tuner of a new or resumed experiment, its progress table with the AMP
columns, and ``fit`` that tells an interrupted run (Ctrl-C) from a finished one.

Example:
    >>> r = {"env_runners": {}}
    >>> no_episode_yet_as_nan(result=r, metric="env_runners/episode_return_mean")
    >>> r
    {'env_runners': {'episode_return_mean': nan}}
"""

from __future__ import annotations

import argparse
import math
import signal
import threading
from functools import partial
from typing import Any

from rllib_amp.learner import metrics as M
from rllib_amp.sweep import loggers
from rllib_amp.sweep import storage as S
from rllib_amp.sweep.summary import amp_metric_key, config_path

# Result keys RLlib reports only once an episode has ended (ray.rllib.utils.metrics). Until
# then they are missing, and Tune ends the whole sweep when its metric is missing from a
# result, which Pong's first iterations (episodes of thousands of steps) would do.
EPISODE_METRICS = tuple(
    f"env_runners/episode_{what}_{stat}"
    for what in ("return", "len")
    for stat in ("mean", "max", "min")
)


def progress_reporter(exp: Any) -> Any:
    """Tune's CLIReporter with the metric, the AMP columns and the searched keys."""
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


def build_tuner(exp: Any, args: argparse.Namespace, storage: str, name: str, restore: bool) -> Any:
    """The Tuner of experiment ``name`` under ``storage``: a new one, or with ``restore`` the
    stored one, unfinished and errored trials continuing."""
    from ray import tune

    from rllib_amp.sweep import schedulers

    trainable = exp.algorithm_config().algo_class
    param_space = schedulers.param_space(exp)
    if exp.tune["metric"] in EPISODE_METRICS:
        param_space.callbacks(
            on_train_result=partial(no_episode_yet_as_nan, metric=exp.tune["metric"])
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
        progress_reporter=progress_reporter(exp),
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


def no_episode_yet_as_nan(*, result: dict[str, Any], metric: str, **kwargs: Any) -> None:
    """RLlib ``on_train_result`` callback: an episode metric of an iteration in which no
    episode has ended yet is reported as NaN ("nothing yet") instead of being left out."""
    *parents, leaf = metric.split("/")
    node = result
    for key in parents:
        node = node.setdefault(key, {})
    node.setdefault(leaf, math.nan)


def fit(tuner: Any) -> tuple[Any, bool]:
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
