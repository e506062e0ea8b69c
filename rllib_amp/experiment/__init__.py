"""One YAML file -> a validated Experiment -> an RLlib AlgorithmConfig (+ a Tune search space).

The package: ``reading`` (YAML -> raw mapping, refusing abuse), ``schema`` (validation and
defaults), ``sampler`` (search specs), ``builder`` (-> AlgorithmConfig + Tune space),
``preflight`` (every check a sweep can fail without Ray) and ``results`` (the result keys each
algorithm reports). Unknown keys are errors (with the nearest valid key suggested), and every
error names the file, the key, the value and the fix. A missing file, bad YAML, an unknown
key, a section of the wrong type, an unknown algorithm or a bad ``--set`` are refused before
RLlib is imported.

Example:
    >>> exp = load("tune_configs/cartpole_ppo_amp.yaml", overrides=["amp.init_scale=1024"])
    >>> exp.get("amp.init_scale")
    1024
    >>> exp.notes  # a --set on a searched key replaces that search entry, and says so
    ()
    >>> config = exp.algorithm_config()  # a PPOConfig trained by rllib-amp's learner
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from rllib_amp.experiment.data import CheckpointSection, ExperimentData
from rllib_amp.experiment.errors import ExperimentError
from rllib_amp.experiment.reading import parse_override, read_file
from rllib_amp.experiment.sampler import SAMPLERS, Sampler
from rllib_amp.experiment.schema import TOP_KEYS, override_parts, validate, with_override

if TYPE_CHECKING:
    from ray.rllib.algorithms.algorithm_config import AlgorithmConfig

__all__ = [
    "SAMPLERS",
    "TOP_KEYS",
    "Experiment",
    "ExperimentError",
    "Sampler",
    "load",
    "parse_override",
    "validate",
]


def _check_overrides_type(overrides: object) -> None:
    if isinstance(overrides, (str, bytes)):
        raise TypeError(
            f"overrides: got the string {overrides!r}; pass a list, e.g. "
            f"overrides=[{overrides!r}], or a mapping such as {{'amp.init_scale': 1024}}"
        )


def _override_items(
    overrides: Mapping[str, object] | Iterable[str], path: str
) -> list[tuple[str, object]]:
    """``(dotted key, value)`` pairs, each key checked to name a section of the experiment."""
    items = (
        list(overrides.items())
        if isinstance(overrides, Mapping)
        else [parse_override(o) for o in overrides]
    )
    for key, _ in items:
        override_parts(key, path)
    return items


def _covered(key: str, value: object) -> set[str]:
    """``key`` and every key inside a mapping value (``--set amp={init_scale: 1}``)."""
    out = {key}
    if isinstance(value, Mapping):
        for k, v in value.items():
            out |= _covered(f"{key}.{k}", v)
    return out


def _spec_text(spec: object) -> str:
    if isinstance(spec, Mapping) and len(spec) == 1:
        kind, arg = next(iter(spec.items()))
        if kind in ("grid", "choice") and isinstance(arg, list):
            return f"{len(arg)} value{'s' if len(arg) != 1 else ''}"
        return f"{kind} {arg}"
    return str(spec)


def replaced_searches(
    data: Mapping[str, object], key: str, value: object
) -> tuple[dict[str, object], list[str]]:
    """``data`` without the search entries that ``--set key=value`` gives a fixed value, and
    one line per entry dropped: a fixed value the user asked for must not lose to a search
    (tests/unit/experiment/test_schema.py shows them)."""
    search = data.get("search")
    if key.split(".", 1)[0] == "search" or not isinstance(search, Mapping):
        return dict(data), []
    hit = [k for k in search if str(k) in _covered(key, value)]
    if not hit:
        return dict(data), []
    shown = json.dumps(value, default=str) if isinstance(value, (Mapping, list)) else value
    lines = [
        f"--set {key}={shown} replaces the search over {k} ({_spec_text(search[k])})" for k in hit
    ]
    return {**data, "search": {k: v for k, v in search.items() if k not in hit}}, lines


@dataclass(frozen=True)
class Experiment:
    """A validated experiment file. Build RLlib configs with ``algorithm_config()``.

    Attributes:
        data: The normalised content (``schema.validate``'s result: defaults filled in,
            ``model`` always a mapping, ``search`` dotted key -> Sampler).
        path: Where it was read from (for messages), or "<dict>".
        notes: One line per search entry an override replaced, e.g. "--set
            amp.init_scale=1024 replaces the search over amp.init_scale (4 values)": the CLI
            prints them, so that a fixed value never loses to a search without a word.
    """

    data: ExperimentData
    path: str = "<dict>"
    notes: tuple[str, ...] = field(default=(), compare=False)

    @property
    def algorithm(self) -> str:
        return str(self.data["algorithm"])

    @property
    def env(self) -> str:
        return str(self.data["env"])

    @property
    def name(self) -> str:
        """The file's name without extension: the default Tune experiment name."""
        if self.path == "<dict>":
            return "experiment"
        return os.path.splitext(os.path.basename(self.path))[0]

    # Copies of one section each, so callers may change what they get. ``tune`` is typed as
    # plain data, not a TuneSection, while sweep/ indexes ``pbt`` without a None check.
    @property
    def tune(self) -> dict[str, Any]:
        return dict(self.data["tune"])

    @property
    def stop(self) -> dict[str, float]:
        return dict(self.data["stop"])

    @property
    def checkpoint(self) -> CheckpointSection:
        return self.data["checkpoint"].copy()

    @property
    def search(self) -> dict[str, Sampler]:
        """Dotted key -> Sampler, in file order."""
        return dict(self.data["search"])

    def get(self, dotted: str, default: object = None) -> Any:
        """The value at a dotted key, e.g. ``exp.get("amp.init_scale")``."""
        node: Any = self.data
        for part in dotted.split("."):
            if not isinstance(node, Mapping) or part not in node:
                return default
            node = node[part]
        return node

    def with_overrides(self, overrides: Mapping[str, object] | Iterable[str] | None) -> Experiment:
        """A new, validated Experiment with dotted-key overrides applied.

        Example:
            >>> exp = load("tune_configs/cartpole_ppo_amp.yaml")
            >>> exp.with_overrides({"search.seed": {"grid": [0, 1, 2]}}).search["seed"].grid_size()
            3
        """
        _check_overrides_type(overrides)
        return self._with_items(_override_items(overrides or [], self.path))

    def _with_items(self, items: list[tuple[str, object]]) -> Experiment:
        if not items:
            return self
        data = self.resolved()
        notes = list(self.notes)
        for key, value in items:
            # A fixed value replaces a search over the same key: otherwise Tune's sample of the
            # search would overwrite it in every trial, and the --set would change nothing.
            data, replaced = replaced_searches(data, key, value)
            notes += replaced
            data = with_override(data, key, value, self.path)
        return Experiment(validate(data, self.path), self.path, tuple(notes))

    def algorithm_config(self) -> AlgorithmConfig:
        """The RLlib AlgorithmConfig for this experiment, built with builder methods."""
        from rllib_amp.experiment import builder

        return builder.algorithm_config(self.data)

    def resolved(self) -> dict[str, object]:
        """The full normalised experiment as plain data (for --dry-run and overrides)."""
        plain = {k: copy.deepcopy(v) for k, v in self.data.items() if k != "search"}
        return {**plain, "search": {k: s.to_dict() for k, s in self.data["search"].items()}}


def load(
    path: str | os.PathLike[str], overrides: Mapping[str, object] | Iterable[str] | None = None
) -> Experiment:
    """Reads, validates and returns the experiment in ``path``, with dotted overrides.

    ``overrides``: a list of ``KEY=VALUE`` strings (as ``--set`` takes) or a mapping of dotted
    key -> value; a single string is a TypeError (it would be read letter by letter).

    Example:
        >>> exp = load("tune_configs/cartpole_ppo_amp.yaml", overrides={"seed": 3})
        >>> exp.get("seed")
        3
    """
    _check_overrides_type(overrides)
    path = os.fspath(path)
    raw = read_file(path)
    # The --set values are parsed before the file's content is checked, which imports RLlib
    # (training keys are checked against its signatures): a typo there is refused at once.
    items = _override_items(overrides or [], path)
    return Experiment(validate(raw, path), path)._with_items(items)
