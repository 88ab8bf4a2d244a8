"""Reading resource logs for replay: rayfl's trace format, or a third-party format through its importer."""

from __future__ import annotations

from pathlib import Path

import numpy as np

__all__ = ["load_distribution_si", "load_si"]


def load_si(path: Path, fmt: str, kind: str, direction: str = "down") -> tuple[np.ndarray, np.ndarray]:
    """``(seconds from the start, values in SI units)`` of one log; ``kind`` is memory, bandwidth, compute or
    availability and must match what the file declares."""
    from rayfl.traces.format import TraceError, read_trace

    if fmt == "rayfl":
        trace = read_trace(path)
    else:
        from rayfl.traces.importers import IMPORTERS

        importer = IMPORTERS[fmt]
        trace = importer(path, direction=direction) if fmt == "ucc" else importer(path)
    if not trace.kind.startswith(kind):
        raise TraceError(f"{path}: is a {trace.kind} trace, but it is configured as a {kind} source")
    return np.asarray(trace.t, dtype=np.float64), np.asarray(trace.to_si(), dtype=np.float64)


def load_distribution_si(path: Path, fmt: str, kind: str, technology: str = "") -> np.ndarray:
    """Every value of an empirical distribution file, in SI units (bit/s for bandwidth)."""
    from rayfl.traces.samplers import MobileBandwidthSampler

    if fmt != "mobilebandwidth" or kind != "bandwidth":
        raise ValueError(f"{path}: an empirical {kind} distribution in format {fmt!r} is not supported")
    sampler = MobileBandwidthSampler(path, technology=technology or None)
    return np.asarray(sampler.values_mbps, dtype=np.float64) * 1e6
