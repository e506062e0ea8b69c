"""Keeps a CPU learner's large per-update buffers in the heap instead of handing them back.

glibc serves every allocation above its mmap threshold (at most 32 MiB by default) with a
fresh ``mmap`` and unmaps it on ``free``; a CPU update allocates dozens of such buffers (29 MB
for a minibatch of Atari observations in float32, then its bfloat16 copy and the convolution
workspaces), page-faulted in again every update. Measured on a PPO update (Nature CNN, batch
1024, 2 cores): minor page faults per update, float32 104,392 -> 14,672 and bf16 60,112 -> 2;
CPU time, float32 2.92 -> 2.12 s and bf16 1.21 -> 1.03 s.

``tune_cpu_malloc()`` raises glibc's mmap and trim thresholds to 1 GiB (``mallopt``), for the
whole process, so the next update reuses freed blocks; the resident size then stays near the
update's peak. It does nothing where the allocator is not glibc's, or where you chose one
(``MALLOC_*`` environment variables, jemalloc or tcmalloc preloaded).

Example:
    >>> isinstance(tune_cpu_malloc(), bool)
    True
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

logger = logging.getLogger(__name__)

# <malloc.h>
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3
THRESHOLD_BYTES = 1 << 30

_USER_CHOICE_VARS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_CONF")
_OTHER_ALLOCATORS = ("jemalloc", "tcmalloc", "mimalloc")

_state: bool | None = None  # None: not tried yet in this process


def why_not() -> str | None:
    """Why this process's allocator is left alone, or None when it can be tuned."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "the C library is not glibc"
    chosen = [v for v in _USER_CHOICE_VARS if v in os.environ]
    if chosen:
        return f"{chosen[0]} is set in the environment"
    preload = os.environ.get("LD_PRELOAD", "")
    other = next((name for name in _OTHER_ALLOCATORS if name in preload), None)
    return None if other is None else f"{other} is preloaded"


def tune_cpu_malloc() -> bool:
    """Applies the thresholds once per process; True when they are in effect."""
    global _state
    if _state is not None:
        return _state
    reason = why_not()
    if reason is None:
        try:
            libc = ctypes.CDLL("libc.so.6")
            ok = (
                libc.mallopt(M_MMAP_THRESHOLD, THRESHOLD_BYTES) == 1
                and libc.mallopt(M_TRIM_THRESHOLD, THRESHOLD_BYTES) == 1
            )
            reason = None if ok else "mallopt refused the thresholds"
        except (OSError, AttributeError) as e:
            reason = f"libc.so.6 has no usable mallopt ({e})"
    _state = reason is None
    if _state:
        logger.info(
            "rllib_amp: CPU learner: glibc keeps freed blocks up to 1 GiB for reuse (saves "
            "re-faulting the update's buffers every step; set the AMP setting "
            "tune_cpu_malloc: false to keep glibc's defaults)"
        )
    else:
        logger.info("rllib_amp: CPU allocator left as it is: %s", reason)
    return _state
