"""rayfl's trace format: round trip, SI units, and an error naming file and line for every kind of bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rayfl.traces.format import UNITS, Trace, TraceError, read_trace, write_trace
from tests.unit.traces.helpers import GOOD


def _trace(kind: str = "memory", values: tuple[float, ...] = (1024.0, 512.25, 2048.0)) -> Trace:
    return Trace(kind, UNITS[kind], np.array([0.0, 1.5, 3.0]), np.array(values), {"source": "test"})


def test_round_trip_is_exact(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    t = np.concatenate([[0.0], np.cumsum(rng.exponential(0.7, 99))])
    t[5] = t[4]  # equal times are allowed
    trace = Trace("bandwidth_up", "Mbit/s", t, rng.lognormal(1.0, 2.0, 100), {"source": "a\nb", "load": "none"})
    path = write_trace(tmp_path / "sub" / "t.csv", trace)
    back = read_trace(path)
    assert back == trace
    assert back.meta == {"source": "a\nb", "load": "none"}
    assert back.t.dtype == np.float64 and not back.t.flags.writeable
    assert path.read_text().splitlines()[:3] == ["# rayfl-trace v1", "# kind: bandwidth_up", "# unit: Mbit/s"]
    assert not [p for p in path.parent.iterdir() if p.name != "t.csv"]  # no temporary file left behind


def test_read_hand_written_file(tmp_path: Path) -> None:
    path = tmp_path / "m.csv"
    path.write_text(GOOD)
    trace = read_trace(path)
    assert (trace.kind, trace.unit, trace.duration_s, trace.num_samples) == ("memory", "MiB", 3.0, 3)
    assert trace.meta == {"source": "hand-written"}
    np.testing.assert_array_equal(trace.values, [1024, 512.25, 2048])


def test_to_si() -> None:
    np.testing.assert_array_equal(_trace("memory").to_si(), [2**30, 512.25 * 2**20, 2**31])
    np.testing.assert_array_equal(_trace("bandwidth_down").to_si(), [1024e6, 512.25e6, 2048e6])
    np.testing.assert_array_equal(_trace("compute").to_si(), [1024e9, 512.25e9, 2048e9])
    np.testing.assert_array_equal(_trace("availability", (1.0, 0.0, 1.0)).to_si(), [1, 0, 1])


@pytest.mark.parametrize(
    ("text", "line", "what"),
    [
        ("", 1, "missing header"),
        ("kind: memory\nt_s,value\n0,1\n", 1, "missing header"),
        ("# rayfl-trace v1\n# unit: MiB\nt_s,value\n0,1\n", 3, "no '# kind:'"),
        ("# rayfl-trace v1\n# kind: memory\n# unit: MiB\n0,1\n", 4, "missing header row"),
        ("# rayfl-trace v1\n# kind: memory\n# unit: MiB\n", 3, "missing header row"),
        ("# rayfl-trace v1\n# kind: ram\n# unit: MiB\nt_s,value\n0,1\n", 2, "unknown kind 'ram'"),
        ("# rayfl-trace v1\n# kind: memory\n# unit: MB\nt_s,value\n0,1\n", 3, "unit 'MB' does not match"),
        ("# rayfl-trace v1\n# kind: memory\n# kind: memory\n# unit: MiB\nt_s,value\n0,1\n", 3, "given twice"),
        ("# rayfl-trace v1\n# kind: memory\n# unit: MiB\nt_s,value\n", 4, "empty trace"),
        ("# rayfl-trace v1\n# kind: memory\n# unit: MiB\nt_s,value\n0,1\n1,x1\n", 6, "bad number for value: 'x1'"),
        ("# rayfl-trace v1\n# kind: memory\n# unit: MiB\nt_s,value\n0,1\n1;2\n", 6, "expected 2"),
        ("# rayfl-trace v1\n# kind: memory\n# unit: MiB\nt_s,value\n0,1\n2,1\n\n1.5,1\n", 8, "time decreases"),
        ("# rayfl-trace v1\n# kind: memory\n# unit: MiB\nt_s,value\n1,1\n", 5, "first time must be 0"),
        ("# rayfl-trace v1\n# kind: memory\n# unit: MiB\nt_s,value\n0,-1\n", 5, "negative"),
        ("# rayfl-trace v1\n# kind: memory\n# unit: MiB\nt_s,value\n0,nan\n", 5, "not finite"),
        ("# rayfl-trace v1\n# kind: availability\n# unit: 1\nt_s,value\n0,1\n1,0.5\n", 6, "neither 0 nor 1"),
    ],
)
def test_errors_name_file_line_and_problem(tmp_path: Path, text: str, line: int, what: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text(text)
    with pytest.raises(TraceError) as err:
        read_trace(path)
    assert f"bad.csv:{line}:" in str(err.value)
    assert what in str(err.value)


def test_not_utf8_and_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "latin1.csv"
    path.write_bytes(GOOD.replace("hand-written", "caf\u00e9").encode("latin-1"))
    with pytest.raises(TraceError, match=r"latin1\.csv: not UTF-8"):
        read_trace(path)
    with pytest.raises(FileNotFoundError):
        read_trace(tmp_path / "absent.csv")


def test_trace_checks_its_own_fields() -> None:
    with pytest.raises(TraceError, match="empty"):
        Trace("memory", "MiB", np.array([]), np.array([]))
    with pytest.raises(TraceError, match="start at 0"):
        Trace("memory", "MiB", np.array([1.0]), np.array([1.0]))
    with pytest.raises(TraceError, match="decreases"):
        Trace("memory", "MiB", np.array([0.0, 2.0, 1.0]), np.array([1.0, 1.0, 1.0]))
    with pytest.raises(TraceError, match="does not match"):
        Trace("compute", "MiB", np.array([0.0]), np.array([1.0]))
    with pytest.raises(TraceError, match="meta"):
        Trace("memory", "MiB", np.array([0.0]), np.array([1.0]), {"kind": "memory"})
