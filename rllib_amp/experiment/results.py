"""The result keys each algorithm reports, flattened with '/' as Tune sees them.

A ``stop`` key or ``tune.metric`` that no result carries is not an error to Tune: the sweep
never stops, or every trial fails at its first result. ``catalog(name)`` says which keys an
algorithm reports, so that ``preflight`` can refuse the others and name the nearest real key.
It is built from RLlib's own names (``ray.rllib.utils.metrics``, the constants of the
algorithm's and learner's modules), Tune's automatic keys, rllib-amp's per-module keys and
what the algorithm's registry record adds; literals where RLlib logs a key under one.
``tests/cli/experiment/test_results.py`` runs a real iteration of each algorithm: every key of
the result is accepted, and every key offered as a suggestion is really reported.

Example:
    >>> c = catalog("PPO")
    >>> c.accepts("env_runners/episode_return_mean"), c.accepts("episode_reward_mean")
    (True, False)
    >>> c.nearest("episode_reward_mean")
    'env_runners/episode_return_mean'
"""

from __future__ import annotations

import difflib
import functools
import importlib
import re
from collections.abc import Collection
from dataclasses import dataclass

from ray.rllib.core import ALL_MODULES, DEFAULT_AGENT_ID, DEFAULT_MODULE_ID
from ray.rllib.core.learner import learner as rllib_learner
from ray.rllib.utils import metrics as rllib_metrics
from ray.tune import result as tune_result

from rllib_amp.algorithms import algorithm, rllib_value
from rllib_amp.learner import metrics as amp_metrics

# Keys Tune puts on every result of a class Trainable. Its timesteps_total, episodes_total and
# timesteps_since_restore are filled only when the trainable reports timesteps_this_iter,
# which RLlib's new API stack never does: a stop on them never triggers.
_NEVER_FILLED = {tune_result.TIMESTEPS_TOTAL, tune_result.EPISODES_TOTAL, "timesteps_since_restore"}
TUNE_KEYS = (set(tune_result.AUTO_RESULT_KEYS) - _NEVER_FILLED - {tune_result.CONFIG_PREFIX}) | {
    tune_result.DONE,
    tune_result.TRIAL_ID,
    tune_result.EXPERIMENT_TAG,
}
# Tune keys that are text, or bookkeeping: accepted, never offered as a suggestion.
_NOT_SUGGESTED = {
    tune_result.HOSTNAME,
    tune_result.NODE_IP,
    tune_result.TRIAL_ID,
    tune_result.EXPERIMENT_TAG,
    tune_result.DONE,
    "date",
    "checkpoint_dir_name",
}
# Top-level keys RLlib's Algorithm reports for every algorithm.
RLLIB_TOP_KEYS = (
    rllib_metrics.NUM_ENV_STEPS_SAMPLED_LIFETIME,
    rllib_metrics.NUM_TRAINING_STEP_CALLS_PER_ITERATION,
)
# Scopes every algorithm reports under (the first part of a flattened key).
SCOPES = (
    rllib_metrics.ENV_RUNNER_RESULTS,
    rllib_metrics.LEARNER_RESULTS,
    rllib_metrics.TIMERS,
    rllib_metrics.FAULT_TOLERANCE_STATS,
    "perf",
    "env_runner_group",
)
# Names RLlib logs as string literals rather than through a constant.
LITERAL_LEAVES = (
    "agent_episode_return_mean",
    "module_episode_return_mean",
    "num_healthy_workers",
    "num_remote_worker_restarts",
    "num_env_runners_dropped_lifetime",
    "actor_manager_num_outstanding_async_reqs",
    "learner_group_ts_dropped_lifetime",
    "learner_thread_out_queue_size",
    "cpu_util_percent",
    "ram_util_percent",
    "gpu_util_percent0",
    "vram_util_percent0",
    rllib_learner.Learner.TOTAL_LOSS_KEY,
)
CONNECTOR_GROUPS = (
    rllib_metrics.ENV_TO_MODULE_CONNECTOR,
    rllib_metrics.MODULE_TO_ENV_CONNECTOR,
    rllib_metrics.LEARNER_CONNECTOR,
)
THROUGHPUT_PARTS = ("throughput_since_last_reduce", "throughput_since_last_restore")
_NAME = r"[A-Za-z0-9_]+"


# Old API stack names that users carry over, and what the new stack reports instead.
_RUNNERS = rllib_metrics.ENV_RUNNER_RESULTS
RENAMED = {
    "timesteps_total": rllib_metrics.NUM_ENV_STEPS_SAMPLED_LIFETIME,
    "episodes_total": f"{_RUNNERS}/{rllib_metrics.NUM_EPISODES_LIFETIME}",
    "episode_reward_mean": f"{_RUNNERS}/{rllib_metrics.EPISODE_RETURN_MEAN}",
    "episode_reward_max": f"{_RUNNERS}/{rllib_metrics.EPISODE_RETURN_MAX}",
    "episode_reward_min": f"{_RUNNERS}/{rllib_metrics.EPISODE_RETURN_MIN}",
    "episode_len_mean": f"{_RUNNERS}/{rllib_metrics.EPISODE_LEN_MEAN}",
}
# Suggested for every algorithm: what a stop or a metric is usually meant to be.
ENV_RUNNER_HEADLINES = (
    rllib_metrics.EPISODE_RETURN_MEAN,
    rllib_metrics.EPISODE_RETURN_MAX,
    rllib_metrics.EPISODE_RETURN_MIN,
    rllib_metrics.EPISODE_LEN_MEAN,
    rllib_metrics.EPISODE_LEN_MAX,
    rllib_metrics.EPISODE_LEN_MIN,
    rllib_metrics.NUM_EPISODES,
    rllib_metrics.NUM_EPISODES_LIFETIME,
    rllib_metrics.NUM_ENV_STEPS_SAMPLED,
    rllib_metrics.NUM_ENV_STEPS_SAMPLED_LIFETIME,
)
ALL_MODULES_HEADLINES = (
    rllib_metrics.NUM_ENV_STEPS_TRAINED,
    rllib_metrics.NUM_ENV_STEPS_TRAINED_LIFETIME,
    rllib_metrics.NUM_MODULE_STEPS_TRAINED,
    rllib_metrics.NUM_MODULE_STEPS_TRAINED_LIFETIME,
)


@dataclass(frozen=True)
class ResultCatalog:
    """The flattened result keys one algorithm reports (single-agent: one module, one agent):
    unscoped ``top`` keys, the ``scopes`` and the ``leaves`` that may follow one, and the
    ``suggestions`` offered as "did you mean" (each one really reported)."""

    algorithm: str
    top: frozenset[str]
    scopes: frozenset[str]
    leaves: frozenset[str]
    suggestions: tuple[str, ...]

    def accepts(self, key: str, config_keys: Collection[str] = ()) -> bool:
        """True when a result of this algorithm can carry ``key``; ``config_keys`` (the trial
        config's ``to_dict()`` keys) for ``config/<key>/...``, which Tune adds to every result
        (the module's example)."""
        scope, *rest = key.split("/")
        if not rest:
            return key in self.top
        if scope == tune_result.CONFIG_PREFIX:
            return rest[0] in config_keys or rest == ["class"]
        if scope not in self.scopes:
            return False
        if scope == rllib_metrics.LEARNER_RESULTS:
            if rest[0] not in (DEFAULT_MODULE_ID, ALL_MODULES):
                return False
            rest = rest[1:]
            if len(rest) == 1 and re.fullmatch(
                rf"gradients_{_NAME}_global_norm|{_NAME}_{rllib_learner.LR_KEY}", rest[0]
            ):
                return True
        if not rest:
            return False
        head = rest[0]
        if head in CONNECTOR_GROUPS:
            return rest[1:] == [rllib_metrics.CONNECTOR_PIPELINE_TIMER] or (
                len(rest) == 4
                and rest[1:3] == [rllib_metrics.TIMERS, rllib_metrics.CONNECTOR_TIMERS]
                and re.fullmatch(_NAME, rest[3]) is not None
            )
        base = head.removesuffix("_throughput")
        if head not in self.leaves and base not in self.leaves:
            return False
        if len(rest) == 2:
            return rest[1] in (
                THROUGHPUT_PARTS if head != base else (DEFAULT_MODULE_ID, DEFAULT_AGENT_ID)
            )
        return len(rest) == 1

    def nearest(self, key: str) -> str | None:
        """The suggested key most like ``key`` (whole key, or its last part), or None (the
        module's example)."""
        last = key.rsplit("/", 1)[-1]
        renamed = RENAMED.get(key) or RENAMED.get(last)
        if renamed in self.suggestions:
            return renamed
        best: tuple[float, str] | None = None
        for candidate in self.suggestions:
            whole = difflib.SequenceMatcher(None, key, candidate).ratio()
            tail = difflib.SequenceMatcher(None, last, candidate.rsplit("/", 1)[-1]).ratio()
            score = max(whole, tail - 0.05)  # the whole key wins a tie
            if best is None or score > best[0]:
                best = (score, candidate)
        return best[1] if best and best[0] >= 0.6 else None


@functools.cache
def catalog(name: str) -> ResultCatalog:
    """The result catalog of the algorithm ``name`` (case-insensitive).

    Example:
        >>> "learners/default_policy/amp_grad_scale" in catalog("DQN").suggestions
        True
    """
    record = algorithm(name)
    # The UPPER_CASE string constants that look like key names, in the modules of the
    # algorithm's and its learner's classes.
    algo_class = record.config_class().algo_class
    classes = [*(algo_class.__mro__ if algo_class else ()), *record.learner.__mro__]
    names = sorted({c.__module__ for c in classes if c.__module__.startswith("ray.rllib.")})
    leaves = {
        value
        for module in (rllib_metrics, rllib_learner, *map(importlib.import_module, names))
        for constant, value in vars(module).items()
        if constant.isupper() and isinstance(value, str) and re.fullmatch(_NAME, value)
    }
    leaves.update(LITERAL_LEAVES)
    leaves.update(amp_metrics.ALL_KEYS)
    top = {*TUNE_KEYS, *RLLIB_TOP_KEYS, *map(rllib_value, record.top_keys)}
    module = f"{rllib_metrics.LEARNER_RESULTS}/{DEFAULT_MODULE_ID}"
    suggestions = [
        *sorted(k for k in top if k not in _NOT_SUGGESTED),
        *(f"{rllib_metrics.ENV_RUNNER_RESULTS}/{k}" for k in ENV_RUNNER_HEADLINES),
        f"{rllib_metrics.ENV_RUNNER_RESULTS}/agent_episode_return_mean/{DEFAULT_AGENT_ID}",
        f"{rllib_metrics.ENV_RUNNER_RESULTS}/module_episode_return_mean/{DEFAULT_MODULE_ID}",
        *(f"{rllib_metrics.LEARNER_RESULTS}/{ALL_MODULES}/{k}" for k in ALL_MODULES_HEADLINES),
        *(f"{module}/{k}" for k in amp_metrics.ALL_KEYS),
        f"{module}/{rllib_learner.Learner.TOTAL_LOSS_KEY}",
        *(f"{module}/{rllib_value(k)}" for k in record.learner_keys),
    ]
    return ResultCatalog(
        algorithm=record.name,
        top=frozenset(top),
        scopes=frozenset((*SCOPES, *record.scopes)),
        leaves=frozenset(leaves),
        suggestions=tuple(dict.fromkeys(suggestions)),
    )
