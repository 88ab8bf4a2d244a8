"""The recorder on this machine: a few real samples, read back through the format's checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rayfl.traces.format import TraceError, read_trace
from rayfl.traces.recorder import record, trace_paths


def test_records_three_samples_per_kind(tmp_path: Path) -> None:
    kinds = ["memory", "bandwidth_down", "bandwidth_up"]
    paths = record(tmp_path / "host.csv", interval_s=0.05, duration_s=0.15, kinds=kinds, note="pytest, idle")
    assert paths == trace_paths(tmp_path / "host", kinds)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "host.bandwidth_down.csv",
        "host.bandwidth_up.csv",
        "host.memory.csv",
    ]
    traces = {name: read_trace(path) for name, path in paths.items()}
    for name, trace in traces.items():
        assert trace.kind == name and trace.num_samples == 3
        assert trace.t[0] == 0.0 and np.all(np.diff(trace.t) > 0)
        assert trace.meta["source"] == "rayfl traces record" and trace.meta["load"] == "pytest, idle"
        assert "CPUs" in trace.meta["recorded_on"] and "GiB RAM" in trace.meta["recorded_on"]
        np.testing.assert_array_equal(trace.t, traces["memory"].t)
    memory = traces["memory"]
    assert memory.unit == "MiB" and (memory.values > 0).all()
    assert traces["bandwidth_down"].unit == "Mbit/s" and (traces["bandwidth_down"].values >= 0).all()


def test_refuses_unknown_kinds_and_bad_intervals(tmp_path: Path) -> None:
    with pytest.raises(TraceError, match="subset"):
        record(tmp_path / "x", interval_s=0.05, duration_s=0.1, kinds=["swap"])
    with pytest.raises(TraceError, match="interval_s > 0"):
        record(tmp_path / "x", interval_s=0, duration_s=0.1, kinds=["memory"])
    assert not list(tmp_path.iterdir())
