"""Keep glibc's allocator from returning training buffers to the kernel after every step.

By default glibc serves allocations above a dynamic threshold (128 KiB at process start) with a fresh ``mmap`` and
unmaps them on free, so every activation and gradient buffer of every local step costs page faults. A long-lived
process that once freed a large block (the driver, after building a data set) has raised that threshold and does not
pay this; a freshly started Ray worker does, and measured 20-25% slower on the same conv training loop
(``benchmarks/engine_overhead.py``). Fixing the thresholds makes a host's speed independent of its history.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["MMAP_THRESHOLD_BYTES", "TRIM_THRESHOLD_BYTES", "tune_allocator"]

MMAP_THRESHOLD_BYTES = 256 << 20  # buffers below this come from the heap and are reused across steps
TRIM_THRESHOLD_BYTES = 512 << 20  # free heap memory kept before it is handed back to the kernel

_M_TRIM_THRESHOLD = -1  # constants from glibc's malloc.h
_M_MMAP_THRESHOLD = -3
_tuned = False


def tune_allocator() -> bool:
    """Apply the thresholds once per process; returns whether they are in effect (False off glibc)."""
    global _tuned
    if _tuned:
        return True
    if not sys.platform.startswith("linux"):
        return False
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # musl and other libcs have no mallopt
        return False
    ok = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES)
    )
    _tuned = ok
    return ok
