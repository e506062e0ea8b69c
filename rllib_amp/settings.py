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
from collections.abc import Mapping
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


# Where the settings live inside an RLlib AlgorithmConfig: learner_config_dict[AMP_CONFIG_KEY].
AMP_CONFIG_KEY = "rllib_amp"


@dataclass(frozen=True)
class AmpSettings:
    """How a learner trains in mixed precision.

    Attributes:
        enabled: "auto" picks from the hardware (see ``rllib_amp.precision``), True forces
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
        inference_dtype: What the EnvRunners' forward passes (action computation) run in:
            "auto" (the hardware's fast 16-bit type, as for training), "float32", "float16"
            or "bfloat16". Inference needs no loss scaling. Ignored when enabled=False.
        tune_cpu_malloc: On a CPU learner with AMP on, let glibc keep freed blocks up to
            1 GiB for reuse instead of re-faulting them every update (process-wide; see
            ``rllib_amp.malloc``). False keeps glibc's defaults.

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

    def __post_init__(self) -> None:
        # Validate even when constructed directly, so no invalid AmpSettings can exist.
        _validate(self)

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None, *, where: str = "amp") -> AmpSettings:
        """Builds validated settings from a plain mapping (a YAML block, a Tune config).

        ``enabled: null`` (YAML) means "auto". Unknown keys and invalid values raise
        ValueError naming the key, the value and what is allowed.

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
        names = cls.field_names()
        kwargs: dict[str, Any] = {}
        for key, value in d.items():
            if key not in names:
                raise ValueError(
                    f"{where}.{key}: unknown AMP setting{suggest(str(key), names)}; "
                    f"allowed keys: {', '.join(names)}"
                )
            kwargs[key] = value
        if "enabled" in kwargs and kwargs["enabled"] is None:
            kwargs["enabled"] = "auto"
        for key in ("dtype", "inference_dtype"):
            if isinstance(kwargs.get(key), str):
                kwargs[key] = _DTYPE_ALIASES.get(kwargs[key], kwargs[key])
        for key in ("init_scale", "growth_factor", "backoff_factor", "skip_warning_fraction"):
            if key in kwargs and is_number(kwargs[key]):
                kwargs[key] = float(kwargs[key])
        if (
            "growth_interval" in kwargs
            and isinstance(kwargs["growth_interval"], float)
            and kwargs["growth_interval"].is_integer()
        ):
            kwargs["growth_interval"] = int(kwargs["growth_interval"])
        try:
            return cls(**kwargs)
        except ValueError as e:
            raise ValueError(f"{where}.{e}") from None

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def replace(self, **fields: Any) -> AmpSettings:
        """A copy with some fields changed, validated like ``from_dict``."""
        merged = self.to_dict()
        merged.update(fields)
        return AmpSettings.from_dict(merged)


def _validate(s: AmpSettings) -> None:
    # Messages start with the key so callers can prefix where the key came from.
    if not (s.enabled == "auto" or isinstance(s.enabled, bool)):
        raise ValueError(f"enabled: got {s.enabled!r}; allowed: 'auto' (or null), true, false")
    if s.dtype not in DTYPES:
        raise ValueError(f"dtype: got {s.dtype!r}; allowed: {', '.join(DTYPES)}")
    if s.inference_dtype not in INFERENCE_DTYPES:
        raise ValueError(
            f"inference_dtype: got {s.inference_dtype!r}; allowed: {', '.join(INFERENCE_DTYPES)}"
        )
    for key in ("init_scale", "growth_factor", "backoff_factor"):
        v = getattr(s, key)
        if not is_number(v) or not math.isfinite(v):
            raise ValueError(f"{key}: got {v!r}; expected a finite number")
    if s.init_scale <= 0:
        raise ValueError(f"init_scale: got {s.init_scale!r}; must be > 0 (the default is 65536.0)")
    if s.growth_factor <= 1:
        raise ValueError(
            f"growth_factor: got {s.growth_factor!r}; must be > 1 (the default is 2.0)"
        )
    if not 0 < s.backoff_factor < 1:
        raise ValueError(
            f"backoff_factor: got {s.backoff_factor!r}; must be in (0, 1) (the default is 0.5)"
        )
    swf = s.skip_warning_fraction
    if not is_number(swf) or not 0 <= swf <= 1:
        raise ValueError(f"skip_warning_fraction: got {swf!r}; must be a number in [0, 1]")
    swu = s.skip_warning_updates
    if not isinstance(swu, int) or isinstance(swu, bool) or swu < 1:
        raise ValueError(f"skip_warning_updates: got {swu!r}; must be an integer >= 1")
    if not isinstance(s.tune_cpu_malloc, bool):
        raise ValueError(f"tune_cpu_malloc: got {s.tune_cpu_malloc!r}; allowed: true, false")
    gi = s.growth_interval
    if not isinstance(gi, int) or isinstance(gi, bool) or gi < 1:
        raise ValueError(
            f"growth_interval: got {gi!r}; must be an integer >= 1 (the default is 2000)"
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
    searched: Mapping[str, Any] | None = None,
) -> None:
    """Writes ``settings`` into ``config``; ``searched`` puts Tune samplers at some fields.

    Samplers are for a Tune ``param_space``: Tune replaces them with values before a trial
    builds its learner, which then validates them through ``settings_from_config``.

    Example:
        >>> from ray.rllib.algorithms.ppo import PPOConfig
        >>> cfg = PPOConfig()
        >>> store_in_config(cfg, AmpSettings(init_scale=1024))
        >>> settings_from_config(cfg).init_scale
        1024.0
    """
    block = settings.to_dict()
    names = AmpSettings.field_names()
    for key, sampler in (searched or {}).items():
        if key not in names:
            raise ValueError(
                f"amp.{key}: unknown AMP setting{suggest(key, names)}; "
                f"allowed keys: {', '.join(names)}"
            )
        block[key] = sampler
    config.learners(learner_config_dict={AMP_CONFIG_KEY: block})
