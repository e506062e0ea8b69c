"""Lazy exports for a package root: names load from their modules on first use.

A package whose ``__init__`` imported its exports eagerly would make every ``python -m``
under it pay for torch and RLlib before the command could even print ``--help``.

Example:
    >>> getattr_, dir_ = lazy_exports("pkg", {"sqrt": "math"}, {})
    >>> getattr_("sqrt")(9.0), "sqrt" in dir_()
    (3.0, True)
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping


def lazy_exports(
    package: str, exports: Mapping[str, str], namespace: dict[str, object]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of a package root whose ``exports`` map each name
    to the module that defines it; a name, once loaded, is kept in ``namespace`` (the
    package's ``globals()``) so later lookups skip ``__getattr__``."""

    def getattr_(name: str) -> object:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def dir_() -> list[str]:
        return sorted({*namespace, *exports})

    return getattr_, dir_
