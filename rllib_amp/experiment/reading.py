"""Reading YAML: an experiment file into a raw mapping, a ``--set KEY=VALUE`` into a pair.

YAML errors become ExperimentErrors that name the file, the line and the column.

Example:
    >>> parse_override("training.lr=1e-4")
    ('training.lr', 0.0001)
"""

from __future__ import annotations

import os
import re
from typing import Any

import yaml

from rllib_amp.experiment.schema import ExperimentError


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


def read_file(path: str) -> Any:
    """The parsed content of the YAML file ``path`` (not yet validated).

    Example:
        >>> read_file("tune_configs/cartpole_ppo_amp.yaml")["algorithm"]
        'PPO'
    """
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
    return raw


def parse_override(item: str) -> tuple[str, Any]:
    """A ``--set`` item -> (dotted key, value); the value is read as YAML.

    Example:
        >>> parse_override("search.seed={grid: [0, 1]}")
        ('search.seed', {'grid': [0, 1]})
    """
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
