"""Record this machine's free memory and network throughput as rayfl traces (``rayfl traces record``).

No public, clearly licensed memory-availability logs exist, so rayfl records its own. At every interval the recorder
samples, one file per kind (``OUT.<name>.csv``):

- ``memory``: host RAM available to new processes, ``psutil.virtual_memory().available``, in MiB;
- ``gpu_memory``: free memory of the current CUDA device, ``torch.cuda.mem_get_info()[0]``, in MiB (kind ``memory``);
- ``bandwidth_down`` / ``bandwidth_up``: bytes received / sent on all non-loopback interfaces over the interval
  (``psutil.net_io_counters`` deltas), in Mbit/s, stamped at the interval's start (a trace row holds until the next).

Memory is read at each tick, so both files have one row per interval and the same time stamps: the seconds since the
first tick, as measured (sleeps drift by a few ms; the real time is recorded, not the planned one).
"""

from __future__ import annotations

import logging
import math
import os
import platform
import socket
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from rayfl.traces.format import Trace, TraceError, write_trace

__all__ = ["RECORDABLE", "host_description", "record", "trace_paths"]

log = logging.getLogger(__name__)

RECORDABLE = ("memory", "gpu_memory", "bandwidth_down", "bandwidth_up")
_MIB = float(2**20)


def _psutil() -> Any:
    import psutil  # a declared dependency; imported on use so that reading traces does not need it

    return psutil


def _cuda() -> Any:
    """torch.cuda when a CUDA device is present, else None (torch is imported only when asked for)."""
    import torch

    return torch.cuda if torch.cuda.is_available() else None


def host_description() -> str:
    """What goes into ``# recorded_on:``: hostname, CPU count, total RAM, platform."""
    total = _psutil().virtual_memory().total
    return f"{socket.gethostname()}, {os.cpu_count()} CPUs, {total / 2**30:.1f} GiB RAM, {platform.platform()}"


def trace_paths(out_path: str | os.PathLike[str], names: Sequence[str]) -> dict[str, Path]:
    """``OUT.<name>.csv`` for each name (a trailing ``.csv`` on OUT is dropped first)."""
    base = Path(out_path)
    stem = base.name[: -len(".csv")] if base.name.endswith(".csv") else base.name
    return {name: base.with_name(f"{stem}.{name}.csv") for name in names}


def _net_bytes(psutil: Any) -> tuple[int, int, list[str]]:
    """(bytes received, bytes sent, interface names) summed over non-loopback interfaces."""
    counters = psutil.net_io_counters(pernic=True)
    nics = sorted(n for n in counters if not n.startswith("lo"))
    return sum(counters[n].bytes_recv for n in nics), sum(counters[n].bytes_sent for n in nics), nics


def record(
    out_path: str | os.PathLike[str],
    interval_s: float = 1.0,
    duration_s: float = 60.0,
    kinds: Sequence[str] | None = None,
    note: str = "",
    *,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> dict[str, Path]:
    """Sample for ``duration_s`` seconds, every ``interval_s`` seconds, and write one trace file per kind.

    ``kinds`` is a subset of ``RECORDABLE``; by default all of them, with ``gpu_memory`` only when CUDA is available.
    ``note`` says what load ran meanwhile (the ``# load:`` header). Returns the files written, by kind name.
    """
    if not (interval_s > 0 and math.isfinite(interval_s)) or not (duration_s > 0 and math.isfinite(duration_s)):
        raise TraceError(f"need interval_s > 0 and duration_s > 0, got {interval_s!r} and {duration_s!r}")
    names = list(kinds) if kinds is not None else [k for k in RECORDABLE if k != "gpu_memory"]
    unknown = [k for k in names if k not in RECORDABLE]
    if unknown or not names:
        raise TraceError(f"kinds must be a non-empty subset of {', '.join(RECORDABLE)}, got {names!r}")
    cuda: Any = _cuda() if kinds is None or "gpu_memory" in names else None
    if kinds is None and cuda is not None:
        names.insert(1, "gpu_memory")
    if "gpu_memory" in names and cuda is None:
        raise TraceError("gpu_memory asked for, but torch sees no CUDA device")
    psutil = _psutil()
    num_samples = max(1, round(duration_s / interval_s))
    samples: dict[str, list[float]] = {name: [] for name in names}
    times: list[float] = []
    recv0, sent0, nics = _net_bytes(psutil)
    start = clock()
    for i in range(num_samples + 1):  # the extra tick closes the last bandwidth interval
        sleep(max(0.0, start + i * interval_s - clock()))
        now = 0.0 if i == 0 else clock() - start
        recv, sent, _ = _net_bytes(psutil)
        if i > 0:
            dt = max(now - times[-1], 1e-9)
            if "bandwidth_down" in samples:
                samples["bandwidth_down"].append(max(0, recv - recv0) * 8 / dt / 1e6)
            if "bandwidth_up" in samples:
                samples["bandwidth_up"].append(max(0, sent - sent0) * 8 / dt / 1e6)
        recv0, sent0 = recv, sent
        if i == num_samples:
            break
        times.append(now)
        if "memory" in samples:
            samples["memory"].append(psutil.virtual_memory().available / _MIB)
        if "gpu_memory" in samples:
            samples["gpu_memory"].append(cuda.mem_get_info()[0] / _MIB)
    meta = {
        "source": "rayfl traces record",
        "recorded_on": host_description(),
        "load": note or "not stated",
        "interval_s": f"{interval_s:g}",
    }
    what = {
        "memory": "psutil.virtual_memory().available (host RAM available to new processes)",
        "gpu_memory": "torch.cuda.mem_get_info()[0] (free memory of the current CUDA device)",
        "bandwidth_down": f"psutil.net_io_counters bytes_recv delta over each interval, interfaces {', '.join(nics)}",
        "bandwidth_up": f"psutil.net_io_counters bytes_sent delta over each interval, interfaces {', '.join(nics)}",
    }
    paths = trace_paths(out_path, names)
    t = np.round(np.asarray(times), 4)  # 0.1 ms: finer than sleep() keeps time anyway
    for name in names:
        extra = {"measure": what[name]}
        if name == "gpu_memory":
            _, total = cuda.mem_get_info()
            extra["device"] = f"{cuda.get_device_name()}, {total / 2**30:.1f} GiB"
        kind = "memory" if name == "gpu_memory" else name
        unit = "MiB" if kind == "memory" else "Mbit/s"
        values = np.round(np.asarray(samples[name]), 3 if kind == "memory" else 6)  # 1 KiB, 1 bit/s
        write_trace(paths[name], Trace(kind, unit, t, values, {**meta, **extra}))
        log.info("wrote %s (%d samples)", paths[name], t.size)
    return paths
