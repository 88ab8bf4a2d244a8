"""Seeded synthetic traces, for tests and for settings where no measured trace fits.

- ``memory_trace``: free memory of a device whose background apps now and then take a chunk of it for a while.
- ``bandwidth_trace``: throughput that walks between a few rate levels (a Markov chain) with log-normal jitter.

Each is a pure function of its arguments: the same seed gives the same trace, bit for bit, and the header records
every argument so a file says how to make it again.
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Sequence

import numpy as np

from rayfl.traces.format import Trace, TraceError

__all__ = ["bandwidth_trace", "memory_trace"]


def _rng(seed: int, purpose: str) -> np.random.Generator:
    """A generator for (seed, purpose): a memory and a bandwidth trace of the same seed are independent."""
    return np.random.default_rng([int(seed) & 0xFFFFFFFFFFFFFFFF, zlib.crc32(purpose.encode("utf-8"))])


def _times(duration_s: float, interval_s: float) -> np.ndarray:
    if not (interval_s > 0 and math.isfinite(interval_s)) or not (duration_s >= 0 and math.isfinite(duration_s)):
        raise TraceError(f"need interval_s > 0 and duration_s >= 0, got {interval_s!r} and {duration_s!r}")
    return np.arange(math.floor(duration_s / interval_s + 1e-9) + 1) * interval_s


def memory_trace(
    seed: int,
    duration_s: float = 600.0,
    interval_s: float = 1.0,
    *,
    base_mib: float = 4096.0,
    dip_prob: float = 0.02,
    dip_mib: float = 1024.0,
    dip_duration_s: float = 30.0,
    jitter_mib: float = 32.0,
    min_mib: float = 256.0,
) -> Trace:
    """Free memory (MiB) sampled every ``interval_s``: ``base_mib`` less background use, never below ``min_mib``.

    At each sample a background app starts with probability ``dip_prob``; it takes Uniform(0.5, 1.5) x ``dip_mib``
    for an exponentially distributed time of mean ``dip_duration_s`` (at least one interval), and apps overlap. On top,
    ordinary churn takes |Normal(0, ``jitter_mib``)|. Values lie in [``min_mib``, ``base_mib``].
    """
    if not (0 <= dip_prob <= 1) or min(base_mib, dip_mib, dip_duration_s, jitter_mib, min_mib) < 0:
        raise TraceError("memory_trace: dip_prob must be in [0, 1] and the sizes and durations >= 0")
    if min_mib > base_mib:
        raise TraceError(f"memory_trace: min_mib {min_mib} exceeds base_mib {base_mib}")
    t = _times(duration_s, interval_s)
    n = t.size
    rng = _rng(seed, "rayfl.traces.synthetic.memory")
    # Every draw is made for every sample, used or not, so the stream does not depend on which branches ran.
    starts = rng.random(n) < dip_prob
    depth = rng.uniform(0.5, 1.5, n) * dip_mib
    length = np.maximum(1, np.ceil(rng.exponential(dip_duration_s, n) / interval_s)).astype(np.int64)
    churn = np.abs(rng.normal(0.0, jitter_mib, n))
    change = np.zeros(n + 1)
    idx = np.flatnonzero(starts)
    np.add.at(change, idx, depth[idx])
    np.add.at(change, np.minimum(idx + length[idx], n), -depth[idx])
    used = np.cumsum(change[:n])
    free = np.clip(np.round(base_mib - used - churn, 3), min_mib, base_mib)  # 1 KiB steps keep files compact
    args = (
        f"seed={seed}, duration_s={duration_s:g}, interval_s={interval_s:g}, base_mib={base_mib:g}, "
        f"dip_prob={dip_prob:g}, dip_mib={dip_mib:g}, dip_duration_s={dip_duration_s:g}, jitter_mib={jitter_mib:g}, "
        f"min_mib={min_mib:g}"
    )
    return Trace("memory", "MiB", t, free, {"source": f"rayfl.traces.synthetic.memory_trace({args})"})


def bandwidth_trace(
    seed: int,
    duration_s: float = 600.0,
    interval_s: float = 1.0,
    *,
    levels_mbps: Sequence[float] = (0.5, 2.0, 8.0, 20.0),
    switch_prob: float = 0.05,
    jitter: float = 0.25,
    direction: str = "down",
    min_mbps: float | None = None,
    max_mbps: float | None = None,
) -> Trace:
    """Throughput (Mbit/s) from a random walk over ``levels_mbps``, sampled every ``interval_s``.

    The walk starts at a uniformly drawn level; at each sample it moves to a neighbouring level with probability
    ``switch_prob`` (either way with equal odds, staying put at the ends), as a link drifts between coverage
    conditions. Each sample is the level times a mean-one log-normal factor of log-std ``jitter``, clipped to
    [``min_mbps``, ``max_mbps``] (default: a quarter of the lowest level, four times the highest).
    """
    levels = np.asarray(sorted(float(x) for x in levels_mbps))
    if levels.size == 0 or levels[0] <= 0 or not np.all(np.isfinite(levels)):
        raise TraceError("bandwidth_trace: levels_mbps must be non-empty, positive and finite")
    if not (0 <= switch_prob <= 1) or jitter < 0 or direction not in ("down", "up"):
        raise TraceError("bandwidth_trace: need 0 <= switch_prob <= 1, jitter >= 0 and direction 'down' or 'up'")
    lo = levels[0] / 4 if min_mbps is None else float(min_mbps)
    hi = levels[-1] * 4 if max_mbps is None else float(max_mbps)
    if not 0 <= lo <= hi:
        raise TraceError(f"bandwidth_trace: need 0 <= min_mbps <= max_mbps, got {lo} and {hi}")
    t = _times(duration_s, interval_s)
    n = t.size
    rng = _rng(seed, f"rayfl.traces.synthetic.bandwidth_{direction}")
    first = int(rng.integers(levels.size))
    steps = np.where(rng.random(n) < switch_prob, rng.choice((-1, 1), size=n), 0)
    steps[0] = 0
    state = np.empty(n, dtype=np.int64)
    current = first
    for i in range(n):
        current = min(max(current + int(steps[i]), 0), levels.size - 1)
        state[i] = current
    noise = np.exp(rng.normal(-0.5 * jitter**2, jitter, n))
    mbps = np.clip(np.round(levels[state] * noise, 6), lo, hi)  # 1 bit/s
    args = (
        f"seed={seed}, duration_s={duration_s:g}, interval_s={interval_s:g}, "
        f"levels_mbps=({', '.join(f'{x:g}' for x in levels)}), switch_prob={switch_prob:g}, jitter={jitter:g}, "
        f"direction={direction!r}, min_mbps={lo:g}, max_mbps={hi:g}"
    )
    meta = {"source": f"rayfl.traces.synthetic.bandwidth_trace({args})"}
    return Trace(f"bandwidth_{direction}", "Mbit/s", t, mbps, meta)
