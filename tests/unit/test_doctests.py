"""Every ``>>>`` example in rllib_amp runs, one test case per docstring (id = module.qualname).

Examples that need a running Ray, a network, a GPU or real training say so with
``# doctest: +SKIP``; everything else has to run as written, so a docstring that drifts from
the code fails here instead of misleading the next reader.
"""

from __future__ import annotations

import doctest
import importlib
import pkgutil
import traceback
from pathlib import Path

import pytest

import rllib_amp

_REPO = Path(__file__).resolve().parents[2]
# Importing ``bench/__main__`` runs the benchmark; ``python -m`` entry shims hold no examples.
_NOT_IMPORTED = {"rllib_amp.bench.__main__"}
_FLAGS = doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE


def _module_names() -> list[str]:
    names = [rllib_amp.__name__]
    # A subpackage that fails to import is still listed, and fails as its own case below.
    packages = pkgutil.walk_packages(
        rllib_amp.__path__, prefix=f"{rllib_amp.__name__}.", onerror=lambda name: None
    )
    for info in packages:
        if info.name not in _NOT_IMPORTED:
            names.append(info.name)
    return sorted(names)


def _collect() -> list:
    params = []
    finder = doctest.DocTestFinder(exclude_empty=True)
    for name in _module_names():
        try:
            module = importlib.import_module(name)
        except Exception:
            # A module that cannot be imported is a failing case of its own, not a collection
            # error that hides every other module's examples.
            params.append(pytest.param(name, None, traceback.format_exc(), id=name))
            continue
        # The finder skips what a module merely imports, so each docstring is tested once,
        # under the module that defines it.
        for test in finder.find(module, name):
            if test.examples:
                params.append(pytest.param(name, test, None, id=test.name))
    return params


_CASES = _collect()


def test_every_module_is_collected():
    # A package renamed or moved must not silently drop out of the doctest run.
    ids = {p.values[0] for p in _CASES}
    for expected in ("rllib_amp.learner.fused_adam", "rllib_amp.scaling.scaler"):
        assert expected in ids, sorted(ids)


@pytest.mark.parametrize(("module_name", "test", "import_error"), _CASES)
def test_docstring_examples(
    module_name: str,
    test: doctest.DocTest | None,
    import_error: str | None,
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
):
    if test is None:
        pytest.fail(f"cannot import {module_name}:\n{import_error}")
    # Examples name files as a reader at the repository root would ("tune_configs/...").
    monkeypatch.chdir(_REPO)
    # Anything an example writes under ~ (Tune's ~/ray_results) lands in a throwaway home.
    monkeypatch.setenv("HOME", str(tmp_path))
    runner = doctest.DocTestRunner(optionflags=_FLAGS)
    failures: list[str] = []
    # Each DocTest holds its own copy of its module's globals: nothing leaks between cases.
    runner.run(test, out=failures.append, clear_globs=True)
    if runner.summarize(verbose=False).failed:
        pytest.fail("".join(failures), pytrace=False)
