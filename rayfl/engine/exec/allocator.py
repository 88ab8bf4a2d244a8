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
# Free memory at the heap's top kept before it is handed back to the kernel. Measured with
# `python benchmarks/host_heap.py` (a client host in a fresh process, FedAvg on synthetic 3x32x32 images, batch 32, one
# thread; CNNs 3 rounds of 4 clients, ResNet-18 `--rounds 2 --clients 2`; loaded 2-core machine): RSS after the rounds,
# and minor page faults per client update at caps of 128 KiB / 32 MiB / 128 MiB / 512 MiB / 2 GiB (glibc untuned):
#   two-conv CNN (16-32):        RSS 556-567 MiB at every cap; faults 1,932 / 24 / 0 / 96 / 24 (untuned 184)
#   CNN 64-128-256-512:          RSS 623-650 MiB; faults 20,432 / 11,968 / 0 / 0 / 232 (untuned 8,076)
#   ResNet-18 at width 1/4:      RSS 613-641 MiB; faults 21,746 / 514 / 1 / 2 / 1 (untuned 2,241)
#   ResNet-18 (64-512):          RSS 1,038-1,056 MiB; faults 26,690 / 17,233 / 21,746 / 3,329 / 1,152 (untuned 46,162)
# The cap does not change what a host holds after its rounds (within 20 MiB, a round's high-water mark under every
# setting): glibc trims only free memory at the heap's top, and blocks allocated late in a round (the update, the
# float64 pre-aggregated sums, Ray's buffers) sit above the freed activations. It only decides whether each step's
# transient buffers go back to the kernel and are faulted in again: a cap below a step's transient (the full
# ResNet-18's ~430 MiB at batch 32) churns pages every step. 512 MiB keeps the transients of the models this project
# trains on CPU in the heap.
TRIM_THRESHOLD_BYTES = 512 << 20

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
