"""One YAML file -> a validated Experiment -> an RLlib AlgorithmConfig (+ a Tune search space).

The schema is strict: unknown keys are errors (with the nearest valid key suggested), and
every error names the file, the key, the value and the fix. Config flows one way, through
RLlib's builder methods; never ``update_from_dict`` (it accepts typos silently).

Example:
    >>> exp = load("tune_configs/cartpole_ppo_amp.yaml", overrides=["amp.init_scale=1024"])
    >>> exp.get("amp.init_scale")
    1024
    >>> config = exp.algorithm_config()  # a PPOConfig trained by rllib-amp's learner
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import math
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import yaml
from ray.rllib.algorithms.algorithm_config import AlgorithmConfig
from ray.rllib.core.rl_module.default_model_config import DefaultModelConfig

from rllib_amp import envs, models
from rllib_amp.algorithms import ALGORITHMS, algorithm
from rllib_amp.api import with_amp
from rllib_amp.checks import is_number, suggest
from rllib_amp.metrics import tag_learners_with_trial
from rllib_amp.settings import AmpSettings, store_in_config

TOP_KEYS = (
    "algorithm",
    "env",
    "env_config",
    "model",
    "amp",
    "training",
    "resources",
    "search",
    "tune",
    "stop",
    "checkpoint",
    "seed",
    "storage_path",
)
# Sections whose keys may be searched or overridden with a sampler.
SEARCHABLE = ("amp", "training", "resources", "env_config", "model", "seed")
SAMPLERS = ("grid", "choice", "loguniform", "uniform", "randint")
EXAMPLES = {"algorithm": "PPO", "env": "CartPole-v1"}
SCHEDULERS = ("fifo", "asha")

# resources key -> (builder method, allowed python types, minimum)
RESOURCES: dict[str, tuple[str, tuple[type, ...], float]] = {
    "num_env_runners": ("env_runners", (int,), 0),
    "num_envs_per_env_runner": ("env_runners", (int,), 1),
    "num_cpus_per_env_runner": ("env_runners", (int, float), 0),
    "num_gpus_per_env_runner": ("env_runners", (int, float), 0),
    "num_learners": ("learners", (int,), 0),
    "num_cpus_per_learner": ("learners", (int, float), 0),
    "num_gpus_per_learner": ("learners", (int, float), 0),
}
TUNE_DEFAULTS: dict[str, Any] = {
    "metric": "env_runners/episode_return_mean",
    "mode": "max",
    "num_samples": 1,
    "scheduler": "fifo",
    "max_concurrent_trials": None,
    "max_failures": 2,
}
CHECKPOINT_DEFAULTS: dict[str, Any] = {"frequency": 1, "num_to_keep": 2, "at_end": True}
# Numeric training keys checked here (RLlib checks the rest when the config is built).
TRAINING_NUMBERS: dict[str, tuple[tuple[type, ...], float, float | None]] = {
    "lr": ((int, float), 0.0, None),
    "gamma": ((int, float), 0.0, 1.0),
    "train_batch_size_per_learner": ((int,), 1, None),
    "minibatch_size": ((int,), 1, None),
    "num_epochs": ((int,), 1, None),
    "grad_clip": ((int, float), 0.0, None),
}
MODEL_KEYS = ("preset", "batchnorm", *(f.name for f in dataclasses.fields(DefaultModelConfig)))


class _Loader(yaml.SafeLoader):
    """SafeLoader that also reads ``1e-4`` as a float (PyYAML's YAML 1.1 wants ``1.0e-4``)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+][0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def _yaml_load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a SafeLoader subclass


class ExperimentError(ValueError):
    """Bad experiment input: the message names the file, the key, the value and the fix."""


def algorithm_config_class(name: str) -> type[AlgorithmConfig]:
    try:
        return algorithm(name).config_class
    except ValueError as e:
        raise ExperimentError(str(e)) from None


def _training_keys(cls: type[AlgorithmConfig]) -> tuple[str, ...]:
    names: list[str] = []
    for klass in cls.__mro__:
        fn = vars(klass).get("training")
        if fn is None:
            continue
        for p in inspect.signature(fn).parameters.values():
            if p.name != "self" and p.kind is not p.VAR_KEYWORD and p.name not in names:
                names.append(p.name)
    return tuple(names)


def _type_name(types: tuple[type, ...]) -> str:
    return "an integer" if types == (int,) else "a number"


def parse_override(item: str) -> tuple[str, Any]:
    """``"amp.init_scale=1024"`` -> ``("amp.init_scale", 1024)`` (values parsed as YAML)."""
    if "=" not in item:
        raise ExperimentError(
            f"--set {item!r}: expected KEY=VALUE with a dotted key, e.g. amp.init_scale=1024"
        )
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key:
        raise ExperimentError(f"--set {item!r}: the key is empty; write e.g. amp.init_scale=1024")
    try:
        value = _yaml_load(raw) if raw.strip() else None
    except yaml.YAMLError:
        value = raw
    return key, value


@dataclass(frozen=True)
class Experiment:
    """A validated experiment file. Build RLlib configs with ``algorithm_config()``.

    Attributes:
        data: The normalised content (defaults filled in, ``model`` always a mapping).
        path: Where it was read from (for messages), or "<dict>".
    """

    data: dict[str, Any]
    path: str = "<dict>"

    # -- access ---------------------------------------------------------------------------
    @property
    def algorithm(self) -> str:
        return str(self.data["algorithm"])

    @property
    def env(self) -> str:
        return str(self.data["env"])

    @property
    def name(self) -> str:
        return (
            os.path.splitext(os.path.basename(self.path))[0]
            if self.path != "<dict>"
            else "experiment"
        )

    @property
    def tune(self) -> dict[str, Any]:
        return dict(self.data["tune"])

    @property
    def stop(self) -> dict[str, Any]:
        return dict(self.data["stop"])

    @property
    def checkpoint(self) -> dict[str, Any]:
        return dict(self.data["checkpoint"])

    @property
    def search(self) -> dict[str, dict[str, Any]]:
        return copy.deepcopy(self.data["search"])

    @property
    def amp_settings(self) -> AmpSettings:
        return AmpSettings.from_dict(self.data["amp"])

    def get(self, dotted: str, default: Any = None) -> Any:
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return default
            node = node[part]
        return node

    # -- derived experiments ----------------------------------------------------------------
    def with_overrides(self, overrides: Mapping[str, Any] | Iterable[str] | None) -> Experiment:
        """A new, validated Experiment with dotted-key overrides applied."""
        if not overrides:
            return self
        items = (
            list(overrides.items())
            if isinstance(overrides, Mapping)
            else [parse_override(o) for o in overrides]
        )
        data = copy.deepcopy(self.data)
        for key, value in items:
            _set_dotted(data, key, value, self.path)
        return Experiment(validate(data, self.path), self.path)

    # -- RLlib ----------------------------------------------------------------------------
    def algorithm_config(self, samplers: Mapping[str, Any] | None = None) -> AlgorithmConfig:
        """The RLlib AlgorithmConfig for this experiment, built with builder methods.

        ``samplers`` (dotted key -> Tune Domain) are placed at their keys after validation, so
        the config can serve as a Tune ``param_space``.
        """
        d = copy.deepcopy(self.data)
        for key, domain in (samplers or {}).items():
            _set_dotted(d, key, domain, self.path)
        cls = algorithm_config_class(d["algorithm"])
        config = cls()
        envs.configure_env(config, d["env"], d["env_config"])
        if d["training"]:
            config.training(**d["training"])
        by_method: dict[str, dict[str, Any]] = {}
        for key, value in d["resources"].items():
            by_method.setdefault(RESOURCES[key][0], {})[key] = value
        if by_method.get("env_runners"):
            config.env_runners(**by_method["env_runners"])
        if by_method.get("learners"):
            config.learners(**by_method["learners"])
        model = dict(d["model"])
        preset = model.pop("preset", None)
        batchnorm = model.pop("batchnorm", False)
        image = envs.is_atari(d["env"])
        model_cfg = models.model_config(preset, image=image, overrides=model) if preset else model
        config.rl_module(model_config=model_cfg)
        if batchnorm:
            from ray.rllib.core.rl_module.rl_module import RLModuleSpec

            config.rl_module(
                rl_module_spec=RLModuleSpec(
                    module_class=algorithm(d["algorithm"]).batchnorm_module,
                    model_config=model_cfg,
                )
            )
        if d["seed"] is not None:
            config.debugging(seed=d["seed"])
        # Tag the learners' Ray metrics (dashboard / Prometheus) with the Tune trial.
        config.callbacks(on_algorithm_init=tag_learners_with_trial)
        # AMP settings: validated values through with_amp, samplers placed afterwards.
        plain_amp = {k: v for k, v in d["amp"].items() if not _is_domain(v)}
        with_amp(config, AmpSettings.from_dict(plain_amp, where="amp"))
        searched = {k: v for k, v in d["amp"].items() if _is_domain(v)}
        if searched:
            store_in_config(config, AmpSettings.from_dict(plain_amp), searched=searched)
        return config

    def param_space(self) -> dict[str, Any]:
        """The Tune search space: dotted key -> Tune Domain (or grid_search dict)."""
        from ray import tune

        space: dict[str, Any] = {}
        for key, spec in self.data["search"].items():
            ((kind, arg),) = spec.items()
            if kind == "grid":
                space[key] = tune.grid_search(list(arg))
            elif kind == "choice":
                space[key] = tune.choice(list(arg))
            elif kind == "loguniform":
                space[key] = tune.loguniform(arg[0], arg[1])
            elif kind == "uniform":
                space[key] = tune.uniform(arg[0], arg[1])
            else:
                space[key] = tune.randint(arg[0], arg[1])
        return space

    def tune_param_space(self) -> AlgorithmConfig:
        """``algorithm_config`` with the search space placed at its keys."""
        return self.algorithm_config(samplers=self.param_space())

    def resolved(self) -> dict[str, Any]:
        """The full normalised experiment (for --dry-run)."""
        return copy.deepcopy(self.data)


def _is_domain(value: Any) -> bool:
    from ray.tune.search.sample import Domain

    return isinstance(value, Domain) or (isinstance(value, dict) and "grid_search" in value)


def _set_dotted(data: dict[str, Any], key: str, value: Any, path: str) -> None:
    """Sets ``data[a][b]...`` for the dotted key ``a.b...``; the caller re-validates."""
    parts = str(key).split(".")
    top = parts[0]
    if top not in TOP_KEYS or not all(parts):
        raise ExperimentError(
            f"{path}: {key}: unknown key '{top}'{suggest(top, TOP_KEYS)}; dotted keys start "
            f"with one of: {', '.join(TOP_KEYS)}"
        )
    if len(parts) == 1:
        data[top] = value
        return
    if top == "model" and isinstance(data.get("model"), str):
        data["model"] = {"preset": data["model"]}
    node = data
    for part in parts[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ExperimentError(
                f"{path}: {key}: '{part}' holds {child!r}, not a mapping; set '{part}' itself"
            )
        node = child
    node[parts[-1]] = value


# -- validation ----------------------------------------------------------------------------
def _err(path: str, key: str, msg: str) -> ExperimentError:
    return ExperimentError(f"{path}: {key}: {msg}")


def _check_mapping(path: str, key: str, value: Any) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _err(path, key, f"expected a mapping, got {type(value).__name__} {value!r}")
    return dict(value)


def _check_keys(path: str, section: str, d: Mapping[str, Any], allowed: Iterable[str]) -> None:
    allowed = tuple(allowed)
    for k in d:
        if k not in allowed:
            raise _err(
                path,
                f"{section}.{k}" if section else str(k),
                f"unknown key{suggest(str(k), allowed)}; allowed: {', '.join(allowed)}",
            )


def _check_number(
    path: str, key: str, v: Any, types: tuple[type, ...], lo: float | None, hi: float | None = None
) -> None:
    ok_type = is_number(v) and (float in types or isinstance(v, int))
    if not ok_type or (isinstance(v, float) and not math.isfinite(v)):
        raise _err(path, key, f"got {v!r}; expected {_type_name(types)}")
    if lo is not None and v < lo:
        raise _err(path, key, f"got {v!r}; must be >= {lo}")
    if hi is not None and v > hi:
        raise _err(path, key, f"got {v!r}; must be <= {hi}")


def validate(raw: Any, path: str = "<dict>") -> dict[str, Any]:
    """Checks and normalises an experiment mapping. Raises ExperimentError."""
    if not isinstance(raw, Mapping):
        raise ExperimentError(
            f"{path}: expected a mapping of experiment keys at the top level, got "
            f"{type(raw).__name__}; start the file with e.g. 'algorithm: PPO'"
        )
    d = dict(raw)
    _check_keys(path, "", d, TOP_KEYS)  # message reads "path: .key" -> fix below
    for required in ("algorithm", "env"):
        if required not in d or d[required] in (None, ""):
            raise _err(
                path,
                required,
                f"missing; add e.g. '{required}: {EXAMPLES[required]}'",
            )

    algo = d["algorithm"]
    if not isinstance(algo, str):
        raise _err(path, "algorithm", f"got {algo!r}; allowed: {', '.join(ALGORITHMS)}")
    if algo.upper() in ALGORITHMS:
        algo = algo.upper()
    try:
        cls = algorithm_config_class(algo)
    except ExperimentError as e:
        raise ExperimentError(f"{path}: {e}") from None
    env = d["env"]
    if not isinstance(env, str):
        raise _err(path, "env", f"got {env!r}; expected a gymnasium id such as 'CartPole-v1'")
    try:
        envs.check_env_id(env)
    except ValueError as e:
        raise ExperimentError(f"{path}: {e}") from None

    out: dict[str, Any] = {"algorithm": algo, "env": env}
    out["env_config"] = _check_mapping(path, "env_config", d.get("env_config"))

    # model: a preset name, or a mapping of preset / batchnorm / RLlib model settings.
    model = d.get("model")
    if model is None:
        model = {}
    if isinstance(model, str):
        model = {"preset": model}
    model = _check_mapping(path, "model", model)
    _check_keys(path, "model", model, MODEL_KEYS)
    if (
        "preset" in model
        and not _is_domain(model["preset"])
        and model["preset"] not in models.PRESETS
    ):
        raise _err(
            path,
            "model.preset",
            f"unknown preset {model['preset']!r}{suggest(str(model['preset']), models.PRESETS)}; "
            f"allowed: {', '.join(models.PRESETS)}",
        )
    if "batchnorm" in model and not isinstance(model["batchnorm"], bool):
        raise _err(path, "model.batchnorm", f"got {model['batchnorm']!r}; expected true or false")
    if model.get("batchnorm") and not envs.is_atari(env) and "conv_filters" not in model:
        raise _err(
            path,
            "model.batchnorm",
            "BatchNorm goes after conv layers, and this env has vector input; drop it or "
            "use an image env such as ALE/Pong-v5",
        )
    out["model"] = model

    amp = d.get("amp")
    amp = _check_mapping(path, "amp", amp)
    try:
        AmpSettings.from_dict({k: v for k, v in amp.items() if not _is_domain(v)}, where="amp")
    except ValueError as e:
        raise ExperimentError(f"{path}: {e}") from None
    out["amp"] = amp

    training = _check_mapping(path, "training", d.get("training"))
    _check_keys(path, "training", training, _training_keys(cls))
    for k, (types, lo, hi) in TRAINING_NUMBERS.items():
        if k in training and training[k] is not None and not _is_domain(training[k]):
            _check_number(path, f"training.{k}", training[k], types, lo, hi)
    out["training"] = training

    resources = _check_mapping(path, "resources", d.get("resources"))
    _check_keys(path, "resources", resources, RESOURCES)
    for k, v in resources.items():
        if not _is_domain(v):
            _check_number(path, f"resources.{k}", v, RESOURCES[k][1], RESOURCES[k][2])
    out["resources"] = resources

    tune_cfg = _check_mapping(path, "tune", d.get("tune"))
    _check_keys(path, "tune", tune_cfg, TUNE_DEFAULTS)
    tune_cfg = {**TUNE_DEFAULTS, **tune_cfg}
    if not isinstance(tune_cfg["metric"], str) or not tune_cfg["metric"]:
        raise _err(path, "tune.metric", f"got {tune_cfg['metric']!r}; expected a result key")
    if tune_cfg["mode"] not in ("max", "min"):
        raise _err(path, "tune.mode", f"got {tune_cfg['mode']!r}; allowed: max, min")
    if tune_cfg["scheduler"] not in SCHEDULERS:
        raise _err(
            path,
            "tune.scheduler",
            f"got {tune_cfg['scheduler']!r}; allowed: {', '.join(SCHEDULERS)}",
        )
    _check_number(path, "tune.num_samples", tune_cfg["num_samples"], (int,), 1)
    _check_number(path, "tune.max_failures", tune_cfg["max_failures"], (int,), 0)
    if tune_cfg["max_concurrent_trials"] is not None:
        _check_number(
            path, "tune.max_concurrent_trials", tune_cfg["max_concurrent_trials"], (int,), 1
        )
    out["tune"] = tune_cfg

    stop = _check_mapping(path, "stop", d.get("stop"))
    if not stop:
        raise _err(path, "stop", "missing or empty; add e.g. 'stop: {training_iteration: 10}'")
    for k, v in stop.items():
        _check_number(path, f"stop.{k}", v, (int, float), None)
    out["stop"] = stop

    ckpt = _check_mapping(path, "checkpoint", d.get("checkpoint"))
    _check_keys(path, "checkpoint", ckpt, CHECKPOINT_DEFAULTS)
    ckpt = {**CHECKPOINT_DEFAULTS, **ckpt}
    _check_number(path, "checkpoint.frequency", ckpt["frequency"], (int,), 0)
    if ckpt["num_to_keep"] is not None:
        _check_number(path, "checkpoint.num_to_keep", ckpt["num_to_keep"], (int,), 1)
    if not isinstance(ckpt["at_end"], bool):
        raise _err(path, "checkpoint.at_end", f"got {ckpt['at_end']!r}; expected true or false")
    out["checkpoint"] = ckpt

    seed = d.get("seed")
    if seed is not None and not _is_domain(seed):
        _check_number(path, "seed", seed, (int,), 0)
    out["seed"] = seed

    storage_path = d.get("storage_path")
    if storage_path is not None and (not isinstance(storage_path, str) or not storage_path.strip()):
        raise _err(
            path,
            "storage_path",
            f"got {storage_path!r}; expected a local path, a shared mount or a URI such as "
            f"s3://BUCKET/experiments",
        )
    out["storage_path"] = storage_path

    out["search"] = _validate_search(path, d.get("search"), out)
    _check_batch_sizes(path, out)
    return out


def _validate_search(path: str, raw: Any, exp: dict[str, Any]) -> dict[str, dict[str, Any]]:
    search = _check_mapping(path, "search", raw)
    out: dict[str, dict[str, Any]] = {}
    for key, spec in search.items():
        where = f"search.{key}"
        top = str(key).split(".")[0]
        if top not in SEARCHABLE:
            raise _err(
                path,
                where,
                f"'{top}' cannot be searched{suggest(top, SEARCHABLE)}; "
                f"searchable sections: {', '.join(SEARCHABLE)}",
            )
        if not isinstance(spec, Mapping) or len(spec) != 1:
            raise _err(
                path,
                where,
                f"expected one sampler ({', '.join(SAMPLERS)}), "
                f"e.g. '{{grid: [1024, 65536]}}', got {spec!r}",
            )
        ((kind, arg),) = spec.items()
        if kind not in SAMPLERS:
            raise _err(
                path,
                where,
                f"unknown sampler {kind!r}{suggest(str(kind), SAMPLERS)}; "
                f"allowed: {', '.join(SAMPLERS)}",
            )
        if kind in ("grid", "choice"):
            if not isinstance(arg, list) or not arg:
                raise _err(path, where, f"{kind} needs a non-empty list of values, got {arg!r}")
            candidates = list(arg)
        else:
            if not isinstance(arg, list) or len(arg) != 2 or not all(is_number(a) for a in arg):
                raise _err(path, where, f"{kind} needs [lo, hi] (two numbers), got {arg!r}")
            lo, hi = arg
            if lo >= hi:
                raise _err(path, where, f"{kind} needs lo < hi, got [{lo}, {hi}]")
            if kind == "loguniform" and lo <= 0:
                raise _err(path, where, f"loguniform needs lo > 0, got [{lo}, {hi}]")
            if kind == "randint" and not all(isinstance(a, int) for a in arg):
                raise _err(path, where, f"randint needs integer bounds, got {arg!r}")
            candidates = [lo, hi - 1 if kind == "randint" else hi]
        # Each value the sampler can produce at its edges must itself be valid.
        for value in candidates:
            trial = copy.deepcopy(exp)
            trial["search"] = {}
            _set_dotted(trial, str(key), value, path)
            try:
                validate_values_only(trial, path)
            except ExperimentError as e:
                raise ExperimentError(f"{e} (value {value!r} of {where})") from None
        out[str(key)] = {kind: list(arg)}
    return out


def validate_values_only(d: dict[str, Any], path: str) -> None:
    """Re-validates a normalised experiment (used for sampler edge values)."""
    clean = {k: v for k, v in d.items() if k != "search"}
    validate(clean, path)


def _batch_bounds(exp: dict[str, Any], key: str, default: int | None) -> tuple[Any, Any]:
    """(smallest, largest) value ``training.key`` can take, searched or not."""
    spec = exp.get("search", {}).get(f"training.{key}")
    if spec:
        ((kind, arg),) = spec.items()
        vals = list(arg) if kind in ("grid", "choice") else [arg[0], arg[1]]
        nums = [v for v in vals if is_number(v)]
        if nums:
            return min(nums), max(nums)
    v = exp["training"].get(key, default)
    return v, v


def _check_batch_sizes(path: str, exp: dict[str, Any]) -> None:
    if exp["algorithm"] not in ("PPO", "APPO"):
        return
    defaults = algorithm_config_class(exp["algorithm"])()
    batch_lo, _ = _batch_bounds(
        exp, "train_batch_size_per_learner", defaults.train_batch_size_per_learner
    )
    _, mb_hi = _batch_bounds(exp, "minibatch_size", defaults.minibatch_size)
    if is_number(batch_lo) and is_number(mb_hi) and mb_hi > batch_lo:
        raise _err(
            path,
            "training.minibatch_size",
            f"{mb_hi} is larger than the smallest train batch "
            f"(train_batch_size_per_learner={batch_lo}); lower minibatch_size or raise the batch",
        )


def load(
    path: str | os.PathLike[str], overrides: Mapping[str, Any] | Iterable[str] | None = None
) -> Experiment:
    """Reads, validates and returns the experiment in ``path``, with dotted overrides.

    Example:
        >>> exp = load("tune_configs/cartpole_ppo_amp.yaml", overrides={"seed": 3})
        >>> exp.get("seed")
        3
    """
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ExperimentError(
            f"{path}: no such file; pass an experiment YAML such as "
            f"tune_configs/cartpole_ppo_amp.yaml"
        )
    with open(path, encoding="utf-8") as f:
        text = f.read()
    try:
        raw = _yaml_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}" if mark else "unknown place"
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise ExperimentError(f"{path}: YAML syntax error at {where}: {problem}") from None
    if raw is None:
        raise ExperimentError(f"{path}: the file is empty; start it with e.g. 'algorithm: PPO'")
    return Experiment(validate(raw, path), path).with_overrides(overrides)
