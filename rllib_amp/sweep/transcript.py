"""What the command prints at its end (the summary, the recommendation, the ``--resume``
command) also goes into ``summary.txt`` in the experiment folder: a user whose terminal
closed, or who ran the command under a scheduler, finds it there.

Example:
    >>> import os, tempfile
    >>> folder = tempfile.mkdtemp()
    >>> with also_into(os.path.join(folder, "summary.txt")):
    ...     print("Results: ...")
    Results: ...
    >>> open(os.path.join(folder, "summary.txt")).read()
    'Results: ...\\n'
"""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from typing import TextIO

FILE = "summary.txt"


class _Tee(io.TextIOBase):
    """Writes to a stream and a copy; a stream that fails (a closed terminal) is left out."""

    def __init__(self, stream: TextIO, copy: io.StringIO) -> None:
        self.stream, self.copy = stream, copy

    def write(self, text: str) -> int:
        self.copy.write(text)
        with contextlib.suppress(OSError, ValueError):
            self.stream.write(text)
        return len(text)

    def flush(self) -> None:
        with contextlib.suppress(OSError, ValueError):
            self.stream.flush()


@contextlib.contextmanager
def also_into(location: str) -> Iterator[None]:
    """Within it, stdout and stderr are also copied; at the end the copy is written to
    ``location`` (a path or a storage URI). A failure to write it never hides the summary."""
    copy = io.StringIO()
    try:
        with (
            contextlib.redirect_stdout(_Tee(sys.stdout, copy)),
            contextlib.redirect_stderr(_Tee(sys.stderr, copy)),
        ):
            yield
    finally:
        from rllib_amp import fs

        with contextlib.suppress(Exception):  # a storage that failed is said in the summary
            fs.write_bytes(*fs.resolve(location), copy.getvalue().encode())
