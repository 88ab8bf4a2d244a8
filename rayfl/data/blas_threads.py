"""Numpy's OpenBLAS at one thread while a data set is built: safe beside a fork, and the same data everywhere.

``rayfl run`` on Ray builds the data set in a second thread while the main thread starts Ray, and ``ray.init``
starts its processes with ``subprocess.Popen(preexec_fn=...)``, a real ``fork``. OpenBLAS registers a fork handler
that shuts its thread pool down; a multi-threaded BLAS call in flight in another thread at that moment never returns
(its helper threads are gone): the synthetic labeller's matrix product hung ``rayfl run`` for good (a probe on the
2-core machine: a thread multiplying 8192x3072 by 3072x10 in a loop while the main thread forked 40 times completed
no product at all with two BLAS threads, and every product with one). A single-threaded call runs in the caller
alone and survives the fork.

So ``build_federated_dataset`` builds every data set with numpy's OpenBLAS at one thread, on every backend (a data
set must not depend on which backend built it, and OpenBLAS splits dot products over threads, so their sums depend
on the count), and ``build.prepare_run`` and ``ray_session.prestart`` hold it at one thread for as long as Ray may be
forking beside their set-up thread, whatever else that thread computes. General matrix products split rows and
columns only, never the summed dimension: the synthetic labels are the same bit for bit at one and two threads
(checked on 128,000 images), so existing runs' data did not move.

The count is a process-wide setting of the library: ``one_blas_thread`` sets it to 1 on entry and restores the
previous count when the last of (possibly nested or concurrent) entries leaves. Where numpy does not use OpenBLAS
(another BLAS, or no ``/proc/self/maps`` to find it), it does nothing.
"""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np  # loads numpy's BLAS, so that it is among the mapped libraries

__all__ = ["blas_thread_counts", "one_blas_thread"]

# the thread-count functions' names: plain OpenBLAS, numpy's 64-bit-integer builds ("64_"), and the scipy-openblas
# wheels numpy 2 bundles ("scipy_" ... "64_")
_PREFIXES = ("scipy_", "")
_SUFFIXES = ("64_", "", "_64")

_GetSet = tuple[Any, Any]  # a library's ctypes functions openblas_get_num_threads, openblas_set_num_threads

_lock = threading.Lock()
_depth = 0
_saved: list[int] = []
_found: list[_GetSet] | None = None


def _libraries() -> list[_GetSet]:
    """(get, set) thread-count functions of every OpenBLAS this process has loaded (once)."""
    global _found
    if _found is not None:
        return _found
    assert np is not None  # imported above for its side effect: numpy's BLAS is loaded
    found: list[_GetSet] = []
    try:
        maps = Path("/proc/self/maps").read_text(encoding="utf-8", errors="replace")
    except OSError:
        maps = ""
    paths = sorted({line.split()[-1] for line in maps.splitlines() if "openblas" in line.lower() and "/" in line})
    for path in paths:
        try:
            lib = ctypes.CDLL(path)  # already loaded: the same library, not a second copy
        except OSError:
            continue
        for prefix in _PREFIXES:
            for suffix in _SUFFIXES:
                get = getattr(lib, f"{prefix}openblas_get_num_threads{suffix}", None)
                put = getattr(lib, f"{prefix}openblas_set_num_threads{suffix}", None)
                if get is not None and put is not None:
                    get.restype, put.argtypes = ctypes.c_int, [ctypes.c_int]
                    found.append((get, put))
                    break
            else:
                continue
            break
    _found = found
    return found


def blas_thread_counts() -> list[int]:
    """The thread count of every OpenBLAS loaded (empty where there is none to find)."""
    return [int(get()) for get, _ in _libraries()]


@contextlib.contextmanager
def one_blas_thread() -> Iterator[None]:
    """OpenBLAS at one thread inside the block (see the module docstring); re-entrant and thread-safe."""
    global _depth
    libs = _libraries()
    with _lock:
        if _depth == 0:
            _saved[:] = [int(get()) for get, _ in libs]
            for _, put in libs:
                put(1)
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0:
                for (_, put), count in zip(libs, _saved, strict=True):
                    put(count)
