"""AmpSettings: the one place where rllib-amp's defaults live.

Everything that configures mixed precision (YAML files, ``with_amp(**fields)``, Tune search
spaces) ends up here, and nothing invalid gets past ``AmpSettings.from_dict``.

Example:
    >>> from rllib_amp import AmpSettings
    >>> s = AmpSettings.from_dict({"dtype": "float16", "init_scale": 1024})
    >>> s.init_scale, s.enabled
    (1024.0, 'auto')
"""

from __future__ import annotations

import dataclasses
import math
import numbers
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from rllib_amp.checks import is_number, suggest

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

EnabledT = Literal["auto"] | bool
DTypeT = Literal["auto", "float16", "bfloat16"]

DTYPES: tuple[str, ...] = ("auto", "float16", "bfloat16")
INFERENCE_DTYPES: tuple[str, ...] = ("auto", "float32", "float16", "bfloat16")
_DTYPE_ALIASES = {"fp16": "float16", "half": "float16", "bf16": "bfloat16", "fp32": "float32"}
# GradScaler keeps the scale in a float32 tensor and the growth tracker in an int32 one.
FLOAT32_MAX = 3.4028234663852886e38
# The smallest positive normal float32 (numpy.finfo(numpy.float32).tiny).
FLOAT32_TINY = 1.1754943508222875e-38
INT32_MAX = 2**31 - 1
# Below this a float16 loss times the scale underflows to zero for any ordinary loss, and
# every step would be skipped or learn nothing (2**-24 is float16's smallest subnormal).
MIN_INIT_SCALE = 2.0**-24


# Where the settings live inside an RLlib AlgorithmConfig: learner_config_dict[AMP_CONFIG_KEY].
AMP_CONFIG_KEY = "rllib_amp"
# The format of ``PolicyScaler.state_dict()``.
STATE_VERSION = 1

WARM_START_KEYS: tuple[str, ...] = ("from", "modules")
MISSING_CHECKPOINT = (
    "does not exist; give an Algorithm checkpoint folder (e.g. .../checkpoint_000009) or a "
    "learner folder of a float16 rllib-amp run, or drop warm_start to start from init_scale"
)


@dataclass(frozen=True)
class WarmStart:
    """Where a run's loss scales start: another run's checkpoint (``AmpSettings.warm_start``).

    Written ``{"from": CHECKPOINT, "modules": {new_id: old_id}}``: each module's scale and
    growth tracker come from ``old_id``'s scaler there (``rllib_amp.scaling.warm_start``);
    without ``modules``, from the module of the same id.

    Attributes:
        path: The checkpoint: an Algorithm checkpoint folder or a learner folder; a local
            path (made absolute, and checked to exist, when the settings are built) or a
            URI (``s3://...``; checked when the learner builds).
        modules: (new_id, old_id) pairs, sorted; None: same ids.

    Example:
        >>> w = WarmStart.parse({"from": "s3://b/run/checkpoint_000009", "modules": {"p1": "p0"}})
        >>> w.module_map(["p1"]), w.to_dict()["from"]
        ({'p1': 'p0'}, 's3://b/run/checkpoint_000009')
    """

    path: str
    modules: tuple[tuple[str, str], ...] | None = None

    @classmethod
    def parse(cls, value: object) -> WarmStart | None:
        """A WarmStart from its mapping (None stays None); ValueError names the bad key."""
        if value is None or isinstance(value, WarmStart):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(
                f"warm_start: got {_brief(value)}; expected a mapping such as "
                f"{{from: CHECKPOINT, modules: {{new_id: old_id}}}} (modules optional)"
            )
        _known_keys(value, "warm_start", WARM_START_KEYS, "key")
        if "from" not in value:
            raise ValueError(
                "warm_start.from: missing; name the checkpoint whose scalers seed this run, "
                "e.g. {from: /runs/stage1/checkpoint_000009}"
            )
        path = _checkpoint_path(value["from"])
        return cls(path=path, modules=_module_pairs(value.get("modules")))

    def module_map(self, module_ids: Iterable[str]) -> dict[str, str]:
        """new_id -> old_id: the given pairs, or each of ``module_ids`` to itself."""
        if self.modules is None:
            return {mid: mid for mid in module_ids}
        return dict(self.modules)

    def to_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"from": self.path}
        if self.modules is not None:
            out["modules"] = dict(self.modules)
        return out


def _checkpoint_path(value: object) -> str:
    if isinstance(value, os.PathLike):
        value = os.fspath(value)
    if not isinstance(value, str) or not value.strip():
        raise ValueError(
            f"warm_start.from: got {_brief(value)}; expected the path or URI of a checkpoint "
            f"folder, e.g. /runs/stage1/checkpoint_000009"
        )
    # Imported here: pyarrow costs the command lines' --help a tenth of a second.
    from rllib_amp.fs import existing_location

    try:
        # Absolute: Tune trials run in their own folder. A URI is checked where it is read.
        return existing_location(value)
    except FileNotFoundError:
        raise ValueError(f"warm_start.from: {value!r} {MISSING_CHECKPOINT}") from None
    except ValueError as e:  # a variable that is not set
        raise ValueError(f"warm_start.from: {e}") from None


def _module_pairs(value: object) -> tuple[tuple[str, str], ...] | None:
    if value is None:
        return None
    if not isinstance(value, Mapping) or not value:
        raise ValueError(
            f"warm_start.modules: got {_brief(value)}; expected a non-empty mapping "
            f"{{new_id: old_id}} (this run's ModuleID -> the checkpoint's), or omit it to seed "
            f"every module from the module of the same id"
        )
    for new_id, old_id in value.items():
        if not isinstance(new_id, str) or not isinstance(old_id, str) or not new_id or not old_id:
            raise ValueError(
                f"warm_start.modules: got {_brief(new_id)}: {_brief(old_id)}; both sides must "
                f"be ModuleIDs (non-empty strings), e.g. {{p1: default_policy}}"
            )
    return tuple(sorted(value.items()))


@dataclass(frozen=True)
class AmpSettings:
    """How a learner trains in mixed precision.

    Args (each a field of the same name):
        enabled: "auto" picks from the hardware (see ``rllib_amp.learner.precision``), True forces
            autocast on, False is exactly stock RLlib (float32).
        dtype: "auto", "float16" (autocast + GradScaler) or "bfloat16" (autocast, no scaling).
        init_scale: The GradScaler's first loss scale (float16 only).
        growth_factor: Multiplies the scale after ``growth_interval`` clean steps; > 1.
        backoff_factor: Multiplies the scale after an inf/nan gradient; in (0, 1).
        growth_interval: Clean steps between two scale increases; >= 1.
        skip_warning_fraction: Warn when a module skips more than this fraction of its
            optimizer steps (inf/nan gradients) ...
        skip_warning_updates: ... in this many consecutive learner updates. One WARNING per
            episode of trouble, with the module, the scale and what to change.
        inference_dtype: What the EnvRunners' forward passes run in: "auto" (the hardware's
            fast 16-bit type; on a CPU, bfloat16 only where timing the module at the
            EnvRunner's start shows it faster), "float32", "float16" or "bfloat16". Ignored
            when enabled=False.
        tune_cpu_malloc: On a CPU learner with AMP on, let glibc keep freed blocks up to 1 GiB
            for reuse (process-wide; ``rllib_amp.learner.malloc``). False: glibc's defaults.
        warm_start: Seed the scalers' scale and growth tracker from another run's checkpoint
            (``{"from": CHECKPOINT, "modules": {new_id: old_id}}``, see ``WarmStart``).
        shared_scaler: One loss scale for all modules of the learner (also those added
            later), backing off when any overflows; each still skips only its own steps.

    Example:
        >>> AmpSettings(dtype="bfloat16").enabled
        'auto'
    """

    enabled: EnabledT = "auto"
    dtype: DTypeT = "auto"
    init_scale: float = 65536.0
    growth_factor: float = 2.0
    backoff_factor: float = 0.5
    growth_interval: int = 2000
    skip_warning_fraction: float = 0.5
    skip_warning_updates: int = 3
    inference_dtype: str = "auto"
    tune_cpu_malloc: bool = True
    warm_start: WarmStart | None = None
    shared_scaler: bool = False

    def __post_init__(self) -> None:
        # Normalise and validate even when constructed directly, so that the same spellings
        # work everywhere (YAML, with_amp, Tune) and no invalid AmpSettings can exist.
        _normalise(self)
        for key, test, rule in _RULES:
            if not test(value := getattr(self, key)):
                raise ValueError(f"{key}: got {_brief(value)}; {rule}")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, d: Mapping[str, object] | None, *, where: str = "amp") -> AmpSettings:
        """Validated settings from a plain mapping (a YAML block, a Tune config); ``enabled:
        null`` means "auto". ValueError names a bad key, its value and what is allowed.

        Example:
            >>> AmpSettings.from_dict({"enabled": None}).enabled
            'auto'
        """
        if d is None:
            return cls()
        if not isinstance(d, Mapping):
            raise ValueError(
                f"{where}: expected a mapping of AMP settings, got {type(d).__name__} "
                f"{d!r}; write e.g. '{where}: {{dtype: bfloat16}}'"
            )
        kwargs: dict[str, Any] = dict(_known_keys(d, where))
        if "enabled" in kwargs and kwargs["enabled"] is None:
            kwargs["enabled"] = "auto"
        try:
            return cls(**kwargs)
        except ValueError as e:
            raise ValueError(f"{where}.{e}") from None

    def to_dict(self) -> dict[str, object]:
        """Plain values that ``from_dict`` reads back (``warm_start`` as its mapping)."""
        out = {name: getattr(self, name) for name in self.field_names()}
        out["warm_start"] = self.warm_start.to_dict() if self.warm_start is not None else None
        return out

    def replace(self, **fields: object) -> AmpSettings:
        """A copy with some fields changed, validated like ``from_dict``."""
        merged = self.to_dict()
        merged.update(fields)
        return AmpSettings.from_dict(merged)


def _known_keys(
    d: Mapping[str, object], where: str, names: tuple[str, ...] = (), what: str = "AMP setting"
) -> Mapping[str, object]:
    """``d``, after a ValueError for its first key not in ``names`` (AmpSettings' fields)."""
    names = names or AmpSettings.field_names()
    for key in d:
        if key not in names:
            raise ValueError(
                f"{where}.{key}: unknown {what}{suggest(str(key), names)}; "
                f"allowed keys: {', '.join(names)}"
            )
    return d


def _brief(value: object) -> str:
    """repr, but a 300-digit integer is shown by its size."""
    text = repr(value)
    return text if len(text) <= 24 else f"{text[:8]}... ({len(text)} digits)"


def _normalise(s: AmpSettings) -> None:
    """Same spellings everywhere: dtype aliases, numpy scalars, whole floats for integers."""

    def put(key: str, value: object) -> None:
        object.__setattr__(s, key, value)

    for key in ("dtype", "inference_dtype"):
        value = getattr(s, key)
        if isinstance(value, str):
            put(key, _DTYPE_ALIASES.get(value.lower(), value.lower()))
    put("warm_start", WarmStart.parse(s.warm_start))
    for key in ("enabled", "tune_cpu_malloc", "shared_scaler"):
        value = getattr(s, key)
        if type(value).__module__ == "numpy" and type(value).__name__ in ("bool", "bool_"):
            put(key, bool(value))
    for key in ("init_scale", "growth_factor", "backoff_factor", "skip_warning_fraction"):
        value = getattr(s, key)
        if isinstance(value, numbers.Real) and not isinstance(value, bool):
            try:
                put(key, float(value))
            except OverflowError:  # an int beyond float64 (2**1024): the range check says so
                put(key, int(value))  # type: ignore[call-overload]
    for key in ("growth_interval", "skip_warning_updates"):
        value = getattr(s, key)
        real = isinstance(value, numbers.Real) and not isinstance(value, bool)
        if real and (isinstance(value, numbers.Integral) or float(value).is_integer()):
            put(key, int(value))


def _int32_count(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= INT32_MAX


# Each field's rules, in the order checked: (key, test, what the message says of a value that
# fails it). Messages start with the key so callers can prefix where the key came from.
_RULES: tuple[tuple[str, Callable[[Any], bool], str], ...] = (
    (
        "enabled",
        lambda v: v == "auto" or isinstance(v, bool),
        "allowed: 'auto' (or null), true, false",
    ),
    ("dtype", lambda v: v in DTYPES, f"allowed: {', '.join(DTYPES)}"),
    ("inference_dtype", lambda v: v in INFERENCE_DTYPES, f"allowed: {', '.join(INFERENCE_DTYPES)}"),
    *(
        (
            key,
            lambda v: is_number(v) and (isinstance(v, int) or math.isfinite(v)),
            "expected a finite number",
        )
        for key in ("init_scale", "growth_factor", "backoff_factor")
    ),
    ("init_scale", lambda v: v > 0, "must be > 0 (the default is 65536.0)"),
    (
        "init_scale",
        lambda v: MIN_INIT_SCALE <= v <= FLOAT32_MAX,
        f"must be within [{MIN_INIT_SCALE:g}, {FLOAT32_MAX:g}] (a float32 scale that can still "
        f"scale a float16 loss); the default is 65536.0",
    ),
    (
        "growth_factor",
        lambda v: v <= 2.0**16,
        "must be <= 65536 (one growth step must not jump past float16's range); the default is 2.0",
    ),
    ("growth_factor", lambda v: v > 1, "must be > 1 (the default is 2.0)"),
    ("backoff_factor", lambda v: 0 < v < 1, "must be in (0, 1) (the default is 0.5)"),
    ("skip_warning_fraction", lambda v: is_number(v) and 0 <= v <= 1, "must be a number in [0, 1]"),
    ("skip_warning_updates", _int32_count, f"must be an integer in [1, {INT32_MAX}]"),
    ("tune_cpu_malloc", lambda v: isinstance(v, bool), "allowed: true, false"),
    ("shared_scaler", lambda v: isinstance(v, bool), "allowed: true, false"),
    (
        "growth_interval",
        _int32_count,
        f"must be an integer in [1, {INT32_MAX}] (GradScaler counts in int32); the default is 2000",
    ),
)


# -- the one reader and writer of the AMP block inside an AlgorithmConfig ---------------------
def settings_from_config(config: AlgorithmConfig) -> AmpSettings:
    """The AmpSettings stored in an AlgorithmConfig by ``with_amp`` (defaults if none).

    Example:
        >>> from ray.rllib.algorithms.ppo import PPOConfig
        >>> settings_from_config(PPOConfig()).dtype
        'auto'
    """
    raw = (config.learner_config_dict or {}).get(AMP_CONFIG_KEY)
    return AmpSettings.from_dict(raw, where="amp")


def store_in_config(
    config: AlgorithmConfig,
    settings: AmpSettings,
    *,
    searched: Mapping[str, object] | None = None,
) -> None:
    """Writes ``settings`` into ``config``; ``searched`` puts Tune samplers at some fields
    (Tune samples them before a trial's learner validates them in ``settings_from_config``).

    Example:
        >>> from ray.rllib.algorithms.ppo import PPOConfig
        >>> cfg = PPOConfig()
        >>> store_in_config(cfg, AmpSettings(init_scale=1024))
        >>> settings_from_config(cfg).init_scale
        1024.0
    """
    block = {**settings.to_dict(), **_known_keys(searched or {}, "amp")}
    config.learners(learner_config_dict={AMP_CONFIG_KEY: block})


def scaler_state_defects(state: object) -> Iterator[tuple[str, Any]]:
    """(field, value) of each field of a saved PolicyScaler state that no scaler could load
    (``""``: the state itself is no mapping); restores, warm starts and the scaler check it."""
    if not isinstance(state, Mapping):
        yield "", state
        return
    if type(version := state.get("version")) is not int or version != STATE_VERSION:
        yield "version", version
    if not isinstance(state.get("scaling"), bool):
        yield "scaling", state.get("scaling")
    if not isinstance(torch_state := state.get("torch"), Mapping):
        yield "torch", torch_state
        return
    scale = torch_state.get("scale", 1.0)
    if not (
        isinstance(scale, numbers.Real)
        and not isinstance(scale, bool)
        and math.isfinite(scale)
        and FLOAT32_TINY <= float(scale) <= FLOAT32_MAX
    ):
        yield "scale", scale
    tracker = torch_state.get("_growth_tracker", 0)
    if not isinstance(tracker, numbers.Integral) or isinstance(tracker, bool) or tracker < 0:
        yield "_growth_tracker", tracker
