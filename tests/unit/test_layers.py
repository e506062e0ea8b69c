"""The package's layers: each module imports only its own layer and the layers below it.

Imports are read with ``ast`` from every module of ``rllib_amp`` (module level, inside
functions and under ``TYPE_CHECKING``; absolute and relative), so a lazy import cannot hide an
upward dependency.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

import rllib_amp

ROOT = pathlib.Path(__file__).resolve().parents[2] / "rllib_amp"
PACKAGE = "rllib_amp"

# Lowest first. A module may import its own layer and any layer before it in this list.
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "base",
        (
            "checks",
            "cli",
            "lazy",
            "log_events",
            "fs",
            "checkpoint_files",
            "checkpoint_manifest",
            "settings",
            "text_table",
        ),
    ),
    ("scaling", ("scaling",)),
    ("checkpoints", ("checkpoints",)),
    ("learner", ("learner",)),
    ("algorithms, api, envs", ("algorithms", "api", "envs")),
    ("experiment", ("experiment",)),
    ("sweep", ("sweep",)),
    ("bench", ("bench",)),
)
# Entry-point shims and the lazy package root name what lies above them on purpose.
EXEMPT = ("rllib_amp", "rllib_amp.tune", "rllib_amp.params")
# Besides sweep itself, only these may import rllib_amp.sweep.
SWEEP_USERS = ("rllib_amp.tune", "rllib_amp.bench")
RAY_FREE = "rllib_amp.scaling"


def _layer(module: str) -> tuple[int, str] | None:
    """(rank, layer name) of a module of the package; None for the root and outside names."""
    parts = module.split(".")
    if parts[0] != PACKAGE or len(parts) < 2:
        return None
    for rank, (name, members) in enumerate(LAYERS):
        if parts[1] in members:
            return rank, name
    return None


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def imports(module: str, source: str, *, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in ``source``, the module ``module``.

    ``from X import name`` yields ``X.name`` (a submodule, or a name inside X: both lie in X's
    layer) so that ``from rllib_amp import sweep`` is seen as importing the sweep.
    """
    package = module if is_package else module.rpartition(".")[0]
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            for alias in node.names:
                # The root's lazy exports stand for the modules that define them.
                lazy = rllib_amp._EXPORTS.get(alias.name) if base == PACKAGE else None
                out.append((node.lineno, lazy or f"{base}.{alias.name}"))
    return out


def violations(module: str, source: str, *, is_package: bool = False) -> list[str]:
    """One line per import of ``module`` that breaks a layering rule, naming the rule."""
    found = []
    own = _layer(module)
    for line, target in imports(module, source, is_package=is_package):
        where = f"{module}:{line} imports {target}"
        if _within(module, RAY_FREE) and _within(target, "ray"):
            found.append(f"{where}: {RAY_FREE} is pure torch and must not import ray")
            continue
        if (
            _within(target, f"{PACKAGE}.sweep")
            and not _within(module, f"{PACKAGE}.sweep")
            and not any(_within(module, user) for user in SWEEP_USERS)
        ):
            found.append(
                f"{where}: only rllib_amp.sweep, the shim rllib_amp.tune and rllib_amp.bench "
                f"may import rllib_amp.sweep"
            )
            continue
        theirs = _layer(target)
        if module in EXEMPT or own is None or theirs is None:
            continue
        if theirs[0] > own[0]:
            found.append(
                f"{where}: layer '{own[1]}' may not import the higher layer '{theirs[1]}' "
                f"(order: {' < '.join(name for name, _ in LAYERS)})"
            )
    return found


def _modules() -> list[tuple[str, pathlib.Path]]:
    out = []
    for path in sorted(ROOT.rglob("*.py")):
        parts = path.relative_to(ROOT.parent).with_suffix("").parts
        out.append((".".join(parts).removesuffix(".__init__"), path))
    return out


def test_every_module_imports_only_its_layer_and_those_below():
    found = []
    for module, path in _modules():
        found += violations(module, path.read_text(), is_package=path.name == "__init__.py")
    assert not found, "\n".join(found)


def test_every_module_has_a_layer():
    unplaced = [m for m, _ in _modules() if m not in EXEMPT and _layer(m) is None]
    assert not unplaced, f"add these to LAYERS in {__file__}: {unplaced}"


@pytest.mark.parametrize(
    "module, source, rule",
    [
        ("rllib_amp.scaling.scaler", "def f():\n    import ray.rllib\n", "must not import ray"),
        ("rllib_amp.scaling.scaler", "from ray import tune\n", "must not import ray"),
        (
            "rllib_amp.experiment.schema",
            "def f():\n    from ..sweep import storage\n",
            "may import rllib_amp.sweep",
        ),
        ("rllib_amp.envs.atari", "from rllib_amp import sweep\n", "may import rllib_amp.sweep"),
        (
            "rllib_amp.scaling.state",
            "from rllib_amp.checkpoints.verify import CheckpointError\n",
            "layer 'scaling' may not import the higher layer 'checkpoints'",
        ),
        (
            "rllib_amp.learner",
            "from . import mixin\nfrom ..experiment import load\n",
            "layer 'learner' may not import the higher layer 'experiment'",
        ),
        ("rllib_amp.settings", "import rllib_amp.api\n", "higher layer 'algorithms, api, envs'"),
        (
            "rllib_amp.learner.mixin",
            "def f():\n    from rllib_amp import with_amp\n",
            "imports rllib_amp.api",
        ),
    ],
)
def test_the_checker_catches_a_violation(module, source, rule):
    found = violations(module, source, is_package=module == "rllib_amp.learner")
    assert len(found) == 1 and rule in found[0], found
    assert module in found[0]


@pytest.mark.parametrize(
    "module, source",
    [
        ("rllib_amp.scaling.scaler", "import torch\nfrom rllib_amp.settings import AmpSettings\n"),
        ("rllib_amp.api", "from rllib_amp.algorithms import algorithm\nfrom .envs import atari\n"),
        ("rllib_amp.tune", "from rllib_amp.sweep.main import main\n"),
        ("rllib_amp.bench.command", "from rllib_amp.sweep import storage\n"),
        ("rllib_amp.sweep.main", "from rllib_amp.experiment import load\n"),
    ],
)
def test_the_checker_allows_downward_imports(module, source):
    assert violations(module, source) == []
