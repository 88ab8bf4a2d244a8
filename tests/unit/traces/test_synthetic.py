"""Synthetic generators: a pure function of the seed, and within their stated bounds."""

from __future__ import annotations

import numpy as np
import pytest

from rayfl.traces.format import TraceError
from rayfl.traces.synthetic import bandwidth_trace, memory_trace


def test_memory_trace_deterministic_and_bounded() -> None:
    a = memory_trace(3, duration_s=2000, interval_s=2.0, base_mib=3000, dip_prob=0.05, dip_mib=800, min_mib=500)
    assert a == memory_trace(3, duration_s=2000, interval_s=2.0, base_mib=3000, dip_prob=0.05, dip_mib=800, min_mib=500)
    assert a != memory_trace(4, duration_s=2000, interval_s=2.0, base_mib=3000, dip_prob=0.05, dip_mib=800, min_mib=500)
    assert (a.kind, a.unit, a.num_samples, a.duration_s) == ("memory", "MiB", 1001, 2000.0)
    np.testing.assert_allclose(np.diff(a.t), 2.0)
    assert a.values.min() >= 500 and a.values.max() <= 3000
    assert a.values.min() < 3000 - 400  # background apps did take memory
    assert "seed=3" in a.meta["source"] and "dip_prob=0.05" in a.meta["source"]


def test_memory_trace_without_dips_is_jitter_only() -> None:
    trace = memory_trace(0, duration_s=100, dip_prob=0.0, jitter_mib=0.0, base_mib=1000)
    np.testing.assert_array_equal(trace.values, 1000.0)


def test_bandwidth_trace_deterministic_and_bounded() -> None:
    a = bandwidth_trace(1, duration_s=3000, levels_mbps=(1, 4, 16), switch_prob=0.1, direction="up")
    assert a == bandwidth_trace(1, duration_s=3000, levels_mbps=(1, 4, 16), switch_prob=0.1, direction="up")
    assert a != bandwidth_trace(2, duration_s=3000, levels_mbps=(1, 4, 16), switch_prob=0.1, direction="up")
    assert a.kind == "bandwidth_up" and a.num_samples == 3001
    assert a.values.min() >= 0.25 and a.values.max() <= 64
    assert a.values.min() < 2 and a.values.max() > 8  # the walk visits the low and the high level
    flat = bandwidth_trace(0, duration_s=50, levels_mbps=(5,), jitter=0.0)
    np.testing.assert_array_equal(flat.values, 5.0)
    clipped = bandwidth_trace(0, duration_s=500, jitter=1.0, min_mbps=1.0, max_mbps=10.0)
    assert clipped.values.min() >= 1.0 and clipped.values.max() <= 10.0


def test_generators_refuse_bad_arguments() -> None:
    with pytest.raises(TraceError):
        memory_trace(0, interval_s=0)
    with pytest.raises(TraceError):
        memory_trace(0, base_mib=100, min_mib=200)
    with pytest.raises(TraceError):
        bandwidth_trace(0, levels_mbps=())
    with pytest.raises(TraceError):
        bandwidth_trace(0, direction="sideways")
