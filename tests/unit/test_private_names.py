"""The private Ray, RLlib, Tune and torch names rllib-amp touches: each is listed in the table
"Private Ray names we touch" of docs/development.md, and each still exists as we use it.

The pins here cover the names that tests/unit/test_rllib_api.py, test_rllib_checkpoint_api.py
and the module tests do not pin already (the table says which test pins which). The last
tests scan rllib_amp/ for private names reached through Ray or torch and fail on any the
table does not list, so a new private use cannot slip in unlisted.
"""

from __future__ import annotations

import ast
import inspect
import logging
import pathlib
import re

import numpy as np
import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "rllib_amp"
TABLE_DOC = ROOT / "docs" / "development.md"
SECTION = "## Private Ray names we touch"


def _source_of_module(module) -> str:
    return inspect.getsource(module)


def _sets_attribute(source: str, name: str) -> bool:
    # An annotation may run over several lines: `self.x: Dict[\n    ...\n] = ...`.
    return re.search(rf"self\.{re.escape(name)}\s*(:[^=]+)?=[^=]", source) is not None


# -- RLlib: the minibatch iterator and SampleBatch (learner/minibatch.py) --------------------
def test_minibatch_iterator_state_we_read_and_mirror():
    from ray.rllib.policy.sample_batch import MultiAgentBatch, SampleBatch
    from ray.rllib.utils.minibatch_utils import MiniBatchCyclicIterator

    batch = MultiAgentBatch({"p": SampleBatch({"obs": np.arange(6.0)})}, 6)
    it = MiniBatchCyclicIterator(
        batch, minibatch_size=2, num_epochs=3, shuffle_batch_per_epoch=False
    )
    assert it._batch is batch
    assert (it._minibatch_size, it._num_epochs, it._shuffle_batch_per_epoch) == (2, 3, False)
    assert it._num_total_minibatches == 0
    assert it._start == {"p": 0} and it._num_covered_epochs == {"p": 0}
    assert it._minibatch_count == 0


def test_sample_batch_private_flag_and_constructor_keywords():
    from ray.rllib.policy.sample_batch import SampleBatch

    assert SampleBatch({"a": np.zeros(2)})._slice_seq_lens_in_B is False
    b = SampleBatch(
        {"a": np.zeros(2)},
        seq_lens=[],
        _time_major=True,
        _zero_padded=False,
        _max_seq_len=None,
        _num_grad_updates=1.5,
    )
    assert b.time_major is True and b.zero_padded is False and b.max_seq_len is None
    assert b.num_grad_updates == 1.5


# -- RLlib: the EnvRunner internals the batched sampler keeps (envs/batched_runner.py) -------
ENV_RUNNER_METHODS = {
    "_sample": ["num_timesteps", "num_episodes", "explore", "random_actions", "force_reset"],
    "_reset_envs_and_episodes": ["explore"],
    "_log_env_steps": ["metric", "num_steps"],
    "_increase_sampled_metrics": ["num_steps", "num_episodes_completed"],
    "_new_episode": ["env_index", "episodes"],
    "_try_env_step": ["actions"],
}
ENV_RUNNER_STATE = (
    "_cached_to_module",
    "_needs_initial_reset",
    "_ongoing_episodes",
    "_ongoing_episodes_for_metrics",
    "_done_episodes_for_metrics",
    "_weights_seq_no",
    "_device",
    "_metrics_num_try_env_step",
    "_metrics_num_env_steps_sampled",
)


@pytest.mark.parametrize("name", sorted(ENV_RUNNER_METHODS))
def test_env_runner_methods_the_batched_sampler_calls(name):
    from ray.rllib.env.single_agent_env_runner import SingleAgentEnvRunner

    method = getattr(SingleAgentEnvRunner, name, None)
    assert callable(method), f"SingleAgentEnvRunner.{name} is gone"
    skip = ("self", "kwargs", "_ray_trace_ctx")  # the last added once Ray made it an actor
    params = [p for p in inspect.signature(method).parameters if p not in skip]
    assert params == ENV_RUNNER_METHODS[name], f"{name}{inspect.signature(method)}"


def test_env_runner_state_the_batched_sampler_reads_and_sets():
    from ray.rllib.env import env_runner, single_agent_env_runner

    source = _source_of_module(env_runner) + _source_of_module(single_agent_env_runner)
    missing = [n for n in ENV_RUNNER_STATE if not _sets_attribute(source, n)]
    assert not missing, f"RLlib's EnvRunners no longer set {missing}"
    assert "self._device = get_device(" in _source_of_module(single_agent_env_runner)


def test_env_step_failure_handling_we_repeat():
    """BatchedAleEnvRunner._step_failed repeats EnvRunner._try_env_step's failure branch."""
    from ray.rllib.env.env_runner import EnvRunner

    source = inspect.getsource(EnvRunner._try_env_step)
    for marker in (
        "NUM_ENV_STEP_FAILURES_LIFETIME",
        "restart_failed_sub_environments",
        "self.make_env()",
        "return ENV_STEP_FAILURE",
    ):
        assert marker in source, marker


def test_config_connector_settings_we_read():
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    cfg = AlgorithmConfig()
    assert cfg._env_to_module_connector is None and cfg._module_to_env_connector is None

    def build(env, spaces, device):
        return []

    cfg.env_runners(env_to_module_connector=build, module_to_env_connector=build)
    assert cfg._env_to_module_connector is build and cfg._module_to_env_connector is build


def test_episode_fields_the_batched_sampler_sets():
    from ray.rllib.env import single_agent_episode
    from ray.rllib.env.single_agent_episode import SingleAgentEpisode

    from rllib_amp.envs import batched_runner

    episode = SingleAgentEpisode()
    assert episode._start_time is None and episode._last_step_time is None
    episode._start_time, episode._last_step_time = 1.0, 3.5
    assert episode.get_duration_s() == 2.5
    assert single_agent_episode._REWARDS_BOX_SPACE == batched_runner._REWARDS_SPACE


# -- RLlib: metrics, config dicts, deprecation sentinel --------------------------------------
def test_item_stats_hold_their_value_in_item():
    from ray.rllib.utils.metrics.stats import ItemStats

    stats = ItemStats()
    assert stats.get_state()["item"] is None
    stats.push(3.0)
    assert stats.get_state()["item"] == 3.0


def test_config_dict_keys_the_summary_reads():
    from ray.rllib.algorithms.ppo import PPOConfig

    keys = PPOConfig().to_dict()
    assert "_model_config" in keys and "model_config" not in keys
    assert "_train_batch_size_per_learner" in keys


def test_rllib_deprecated_value_sentinel():
    from ray._common.deprecation import DEPRECATED_VALUE
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

    assert DEPRECATED_VALUE == -1
    assert AlgorithmConfig().enable_connectors == DEPRECATED_VALUE


def test_ray_rllib_logger_is_set_up_with_its_own_handler():
    import ray.rllib

    source = inspect.getsource(ray.rllib._setup_logger)
    assert 'logging.getLogger("ray.rllib")' in source
    assert "logger.addHandler(handler)" in source and "logger.propagate = False" in source


def test_log_once_registry():
    from ray.util import debug

    assert isinstance(debug._logged, set)
    assert debug.log_once("rllib_amp_test_private_names") is True
    assert "rllib_amp_test_private_names" in debug._logged


# -- Tune ----------------------------------------------------------------------------------
def test_trainable_keeps_its_storage_context():
    from ray.train._internal.storage import StorageContext
    from ray.tune import Trainable

    # Under Tune, Trainable.logdir is <...>/working_dirs/<trial folder> (learner/metrics.py).
    assert "self._storage.trial_working_directory" in inspect.getsource(Trainable._setup_logdir)
    source = inspect.getsource(StorageContext.trial_working_directory.fget)
    assert '"working_dirs", self.trial_dir_name' in source


def test_pbt_keeps_its_mutations():
    from ray.tune.schedulers import PopulationBasedTraining

    mutations = {"lr": [1e-3, 1e-4]}
    sched = PopulationBasedTraining(metric="m", mode="max", hyperparam_mutations=mutations)
    assert sched._hyperparam_mutations == mutations


def test_tune_loggers_and_messages_our_filters_match():
    from ray.tune import tune
    from ray.tune.execution import experiment_state, tune_controller

    from rllib_amp.sweep import tuner

    tune_source = _source_of_module(tune)
    controller_source = _source_of_module(tune_controller)
    state_source = _source_of_module(experiment_state)
    assert tune.__name__ == "ray.tune.tune"
    assert [f.name for f in tuner.FAULT_LOGGERS] == [
        tune_controller.__name__,
        experiment_state.__name__,
    ]
    for source in (tune_source, controller_source, state_source):
        assert "logger = logging.getLogger(__name__)" in source
    assert '"Stop signal received' in tune_source
    assert '"Experiment has been interrupted' in tune_source
    assert 'logger.error(f"Trial task failed for trial {trial}", exc_info=' in controller_source
    assert '"Saving experiment state to storage at "' in state_source
    assert "exc_info=True" in state_source
    assert tuner.FAULT_MESSAGES == (
        "Trial task failed for trial ",
        "Saving experiment state to storage at ",
    )


def test_tune_stops_on_sigusr1_and_leaves_sigint_to_us():
    from ray.tune import tune

    assert "_setup_signal_catching()" in inspect.getsource(tune.run)
    source = inspect.getsource(tune._setup_signal_catching)
    assert "signal.signal(signal.SIGUSR1, signal_interrupt_tune_run)" in source
    assert 'os.getenv("TUNE_DISABLE_SIGINT_HANDLER", "0")' in source


# -- Ray core --------------------------------------------------------------------------------
def test_bootstrap_address_resolver():
    from ray._private import services

    params = list(inspect.signature(services.canonicalize_bootstrap_address_or_die).parameters)
    assert params[:1] == ["addr"]


def test_local_resource_spec_resolves_before_ray_starts():
    from ray._private.resource_and_label_spec import ResourceAndLabelSpec

    spec = ResourceAndLabelSpec().resolve(is_head=True, node_ip_address="127.0.0.1")
    assert spec.num_cpus > 0 and spec.num_gpus >= 0


def test_the_public_runtime_context_gives_the_session_folder(ray_local):
    """sweep/grafana.py finds Ray's session folder through the public runtime context: its
    temp dir joined with the session name is the folder Ray's node keeps."""
    import os

    context = ray_local.get_runtime_context()
    session_dir = os.path.join(context.get_temp_dir(), context.get_session_name())
    assert session_dir == ray_local._private.worker.global_worker.node.get_session_dir_path()


def test_loopback_switch_is_rays_cluster_switch():
    from ray._private import ray_constants, services

    from rllib_amp.cli import LOOPBACK_RAY_ENV

    assert ray_constants.ENABLE_RAY_CLUSTERS_ENV_VAR == LOOPBACK_RAY_ENV
    assert "ray_constants.ENABLE_RAY_CLUSTER" in inspect.getsource(services)


# -- torch ---------------------------------------------------------------------------------
def test_torch_grad_scaler_internals():
    scaler = torch.amp.GradScaler("cpu", init_scale=4.0)
    assert "_growth_tracker" in scaler.state_dict()
    assert hasattr(scaler, "_per_optimizer_states")
    grads, found = [torch.tensor([1.0, float("inf")])], torch.zeros(1)
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found, torch.ones(1))
    assert found.item() == 1.0


def test_torch_norm_base_classes():
    assert issubclass(torch.nn.BatchNorm1d, torch.nn.modules.batchnorm._BatchNorm)
    assert issubclass(torch.nn.InstanceNorm1d, torch.nn.modules.instancenorm._InstanceNorm)


# -- The table lists every private name the package reaches --------------------------------
# rllib_amp's own private names that Ray or torch happen to use too (not Ray's or torch's).
OWN = {
    "_T",
    "_chunk",
    "_count",
    "_finish",
    "_handles",
    "_logger",
    "_losses",
    "_mean",
    "_released",
    "_run",
    "_scale",
    "_stop",
    "_throughput",  # a suffix rllib_amp strips from its own metric names
    # The standard library's: os._exit, namedtuple's _fields / _replace, the _thread module.
    "_exit",
    "_fields",
    "_replace",
    "_thread",
}
# Tune environment variables listed in Tune's documentation (docs.ray.io, "Environment
# variables used by Ray Tune", and RAY_AIR_NEW_OUTPUT in Tune's output docs).
DOCUMENTED_ENV = {"TUNE_DISABLE_SIGINT_HANDLER", "RAY_AIR_NEW_OUTPUT"}

_IDENT = re.compile(r"_[A-Za-z]\w*")
_UPSTREAM_TOKEN = re.compile(r"(?<![\w])_[A-Za-z]\w*")


def _table_names() -> set[str]:
    """The backticked names in the first column of the section's tables."""
    text = TABLE_DOC.read_text()
    assert SECTION in text, f"{TABLE_DOC.name} has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    names: set[str] = set()
    for line in section.splitlines():
        cells = line.split("|")
        if len(cells) < 5 or set(cells[1].strip()) <= {"-", ":", " "}:
            continue
        names.update(re.findall(r"`([^`]+)`", cells[1]))
    return names


def _listed(found: str, names: set[str]) -> bool:
    """``found`` is listed, or is a longer or shorter path of a listed private name (an
    import of ``ray._private.services`` is covered by ``ray._private.services.f``)."""
    return any(
        found == n or ("._" in n and (found.startswith(n + ".") or n.startswith(found + ".")))
        for n in names
    )


def _listed_components(names: set[str]) -> set[str]:
    out = set()
    for n in names:
        for part in re.split(r"[.(),= ]+", n):
            if _IDENT.fullmatch(part):
                out.add(part)
    return out


def _upstream_tokens() -> set[str]:
    import ray

    roots = [pathlib.Path(ray.__file__).parent, pathlib.Path(torch.__file__).parent]
    files = [*roots[0].glob("*.py"), *roots[1].glob("*.py*")]
    for sub in ("rllib", "tune", "train", "air", "util", "_private", "_common"):
        files += (roots[0] / sub).rglob("*.py")
    for sub in ("amp", "nn", "cuda", "cpu", "backends", "optim", "_C"):
        files += (roots[1] / sub).rglob("*.py*")
    tokens: set[str] = set()
    for f in files:
        if f.suffix in (".py", ".pyi"):
            tokens.update(_UPSTREAM_TOKEN.findall(f.read_text(errors="ignore")))
    return tokens


def _docstring_nodes(tree: ast.AST) -> set[int]:
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            ids.add(id(node.value))
    return ids


def _logger_or_module_names(tree: ast.AST) -> set[int]:
    """The string constants given to ``getLogger`` or ``sys.modules.get`` or assigned to a
    ``*_LOGGER`` name: the Ray loggers and modules the package reaches by name."""
    ids = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and node.args:
            func = _dotted(node.func) or ""
            if func.endswith(("getLogger", "modules.get")):
                ids.add(id(node.args[0]))
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id.endswith("LOGGER") for t in node.targets
        ):
            ids.add(id(node.value))
    return ids


def _dotted(node: ast.AST) -> str | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return None


def _scan() -> dict[str, dict[str, set[str]]]:
    """kind -> found name -> the files it is in."""
    found: dict[str, dict[str, set[str]]] = {"dotted": {}, "private": {}, "env": {}}

    def add(kind: str, name: str, where: str) -> None:
        found[kind].setdefault(name, set()).add(where)

    for path in sorted(PACKAGE.rglob("*.py")):
        where = str(path.relative_to(ROOT))
        tree = ast.parse(path.read_text())
        docstrings = _docstring_nodes(tree)
        named = _logger_or_module_names(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "ray":
                private_module = any(p.startswith("_") for p in node.module.split("."))
                for alias in node.names:
                    if private_module or alias.name.startswith("_"):
                        add("dotted", f"{node.module}.{alias.name}", where)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    parts = alias.name.split(".")
                    if parts[0] == "ray" and any(p.startswith("_") for p in parts):
                        add("dotted", alias.name, where)
            elif isinstance(node, ast.Attribute) and not isinstance(node.value, ast.Attribute):
                chain = _dotted(node)
                if chain and chain.startswith("ray.") and "._" in chain:
                    add("dotted", chain, where)
            if isinstance(node, ast.Attribute):
                name = node.attr
            elif isinstance(node, ast.keyword):
                name = node.arg or ""
            elif isinstance(node, ast.alias):
                name = node.name.split(".")[-1]
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and id(node) not in docstrings
            ):
                text = node.value
                if _IDENT.fullmatch(text):
                    name = text
                elif re.fullmatch(r"ray(\.\w+)+", text) and id(node) in named:
                    add("dotted", text, where)
                    continue
                elif re.fullmatch(r"(TUNE|RAY_AIR)_[A-Z0-9_]+", text):
                    add("env", text, where)
                    continue
                else:
                    continue
            else:
                continue
            if name.startswith("_") and not name.startswith("__"):
                add("private", name, where)
    return found


@pytest.fixture(scope="module")
def scan():
    return _scan()


def test_the_table_parses():
    names = _table_names()
    assert len(names) > 30, sorted(names)
    assert "ray.tune.trainable.metadata._TrainingRunMetadata" in names


def test_every_private_ray_module_or_name_the_package_reaches_is_listed(scan):
    names = _table_names()
    unlisted = {n: sorted(w) for n, w in scan["dotted"].items() if not _listed(n, names)}
    assert not unlisted, (
        f"private Ray names not in {TABLE_DOC.name} ({SECTION!r}): {unlisted}; add a row "
        f"(where, why no public API serves, the test that pins it)"
    )


def test_every_private_attribute_of_ray_or_torch_the_package_uses_is_listed(scan):
    upstream = _upstream_tokens()
    listed = _listed_components(_table_names())
    unlisted = {
        n: sorted(w)
        for n, w in scan["private"].items()
        if n in upstream and n not in OWN and n not in listed
    }
    assert not unlisted, (
        f"private names that Ray or torch also use, not in {TABLE_DOC.name} ({SECTION!r}): "
        f"{unlisted}; add a row, or add the name to OWN here if it is rllib_amp's own"
    )
    stale = sorted(OWN - set(scan["private"]))
    assert not stale, f"OWN lists names rllib_amp no longer uses: {stale}"


def test_every_tune_environment_variable_is_documented_or_listed(scan):
    names = _table_names()
    unlisted = {
        n: sorted(w) for n, w in scan["env"].items() if n not in DOCUMENTED_ENV and n not in names
    }
    assert not unlisted, f"Tune environment variables not in Tune's docs or the table: {unlisted}"


def test_the_scan_finds_what_it_is_meant_to(scan):
    """A scan that silently found nothing would pass the tests above."""
    assert "ray._private.resource_and_label_spec.ResourceAndLabelSpec" in scan["dotted"]
    assert "ray.tune.execution.tune_controller" in scan["dotted"]
    assert {"_torch_grad_scaler_class", "_ongoing_episodes", "_growth_tracker"} <= set(
        scan["private"]
    )
    assert "TUNE_DISABLE_SIGINT_HANDLER" in scan["env"]
    logging.getLogger(__name__).debug("scan: %s", {k: len(v) for k, v in scan.items()})
