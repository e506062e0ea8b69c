"""ExperimentError: the one error of the experiment package, and the one way to word it.

Example:
    >>> str(err("exp.yaml", "training.lr", "got -1; must be >= 0"))
    'exp.yaml: training.lr: got -1; must be >= 0'
"""

from __future__ import annotations


class ExperimentError(ValueError):
    """Bad experiment input: the message names the file, the key, the value and the fix.

    The message is one line whatever the input: a key or value with a newline or another
    line-breaking character (``\x1e``, ``\u2028``) is shown escaped.

    Example:
        >>> str(ExperimentError("exp.yaml: env: got 'a\\nb'"))
        "exp.yaml: env: got 'a\\\\nb'"
    """

    def __init__(self, message: object = "") -> None:
        text = str(message)
        super().__init__(
            "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)
        )


def err(path: str, key: str, msg: str) -> ExperimentError:
    """The error for ``key`` of the file at ``path``: ``"{path}: {key}: {msg}"``."""
    return ExperimentError(f"{path}: {key}: {msg}")
