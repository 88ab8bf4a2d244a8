"""rayfl's own trace file format: one resource of one device over time, as a small commented CSV.

A trace is a step function: the value of a row holds from its ``t_s`` until the next row's (replay loops at the end).
Every trace file names its kind and unit in its header, so a file can never be replayed in the wrong unit::

    # rayfl-trace v1
    # kind: memory
    # unit: MiB
    # source: rayfl traces record
    # recorded_on: host, 2 CPUs, 23.5 GiB RAM, Linux-6.1-x86_64
    t_s,value
    0,20814.2
    1.002,20790.7

Each kind has exactly one unit (``UNITS``); ``Trace.to_si`` converts to SI base units (bytes, bit/s, FLOP/s).
Reading checks every line and reports the file and line number of the first problem as a ``TraceError``.
"""

from __future__ import annotations

import math
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["MAGIC", "SI_FACTORS", "UNITS", "Trace", "TraceError", "read_trace", "write_trace"]

MAGIC = "rayfl-trace v1"
HEADER_ROW = "t_s,value"

# The one unit each kind is stored in, and the factor that takes it to SI base units.
UNITS: dict[str, str] = {
    "memory": "MiB",
    "bandwidth_down": "Mbit/s",
    "bandwidth_up": "Mbit/s",
    "compute": "GFLOP/s",
    "availability": "1",
    "link_error": "1",  # probability that one transfer unit (column) is lost (system.links.error_rate)
}
SI_FACTORS: dict[str, float] = {"MiB": float(2**20), "Mbit/s": 1e6, "GFLOP/s": 1e9, "1": 1.0}

_META_LINE = re.compile(r"^#\s*([A-Za-z_][A-Za-z0-9_.-]*)\s*:\s*(.*?)\s*$")


class TraceError(ValueError):
    """A trace file or trace value that cannot be used; the message names the file and line where there is one."""


def _where(path: str | os.PathLike[str] | None, line_no: int | None) -> str:
    if path is None:
        return "trace"
    return f"{path}:{line_no}" if line_no is not None else str(path)


def _check_kind_unit(kind: str, unit: str) -> str | None:
    """None when (kind, unit) is valid, else what is wrong."""
    if kind not in UNITS:
        return f"unknown kind {kind!r} (expected one of {', '.join(UNITS)})"
    if unit != UNITS[kind]:
        return f"unit {unit!r} does not match kind {kind!r} (expected {UNITS[kind]!r})"
    return None


def _check_value(kind: str, value: float) -> str | None:
    """None when ``value`` is a possible sample of ``kind``, else what is wrong."""
    if not math.isfinite(value):
        return f"value {value!r} is not finite"
    if kind == "availability" and value not in (0.0, 1.0):
        return f"availability value {value!r} is neither 0 nor 1"
    if value < 0:
        return f"{kind} value {value!r} is negative"
    return None


@dataclass(frozen=True, eq=False)
class Trace:
    """Samples ``values[i]`` (in ``unit``) holding from ``t[i]`` seconds after the trace start.

    ``t`` starts at 0 and never decreases. Arrays are float64 and read-only. ``meta`` holds the header lines other than
    kind and unit (``source``, ``recorded_on``, ``load``, ...); a key given on several lines has its values joined by
    newlines.
    """

    kind: str
    unit: str
    t: np.ndarray
    values: np.ndarray
    meta: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        problem = _check_kind_unit(self.kind, self.unit)
        if problem:
            raise TraceError(f"trace: {problem}")
        t = np.array(self.t, dtype=np.float64).reshape(-1)
        values = np.array(self.values, dtype=np.float64).reshape(-1)
        if t.size == 0:
            raise TraceError("trace: empty trace (no samples)")
        if t.shape != values.shape:
            raise TraceError(f"trace: {t.size} times but {values.size} values")
        if not np.all(np.isfinite(t)) or t[0] != 0.0:
            raise TraceError(f"trace: times must be finite and start at 0 (first is {t[0]!r})")
        if np.any(np.diff(t) < 0):
            i = int(np.argmax(np.diff(t) < 0)) + 1
            raise TraceError(f"trace: time decreases at sample {i} ({t[i - 1]!r} -> {t[i]!r})")
        for i, v in enumerate(values):
            problem = _check_value(self.kind, float(v))
            if problem:
                raise TraceError(f"trace: sample {i}: {problem}")
        for key, text in self.meta.items():
            if not _META_LINE.match(f"# {key}: x"):
                raise TraceError(f"trace: bad meta key {key!r}")
            if key in ("kind", "unit"):
                raise TraceError(f"trace: meta may not repeat {key!r}; it is a field")
            if "\r" in text:
                raise TraceError(f"trace: meta {key!r} contains a carriage return")
        t.setflags(write=False)
        values.setflags(write=False)
        object.__setattr__(self, "t", t)
        object.__setattr__(self, "values", values)
        object.__setattr__(self, "meta", dict(self.meta))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Trace):
            return NotImplemented
        return (
            self.kind == other.kind
            and self.unit == other.unit
            and self.meta == other.meta
            and np.array_equal(self.t, other.t)
            and np.array_equal(self.values, other.values)
        )

    __hash__ = None  # type: ignore[assignment]

    @property
    def duration_s(self) -> float:
        """Time of the last sample, in seconds since the start (0 for a one-sample trace)."""
        return float(self.t[-1])

    @property
    def num_samples(self) -> int:
        return int(self.t.size)

    def to_si(self) -> np.ndarray:
        """Values in SI base units: bytes (memory), bit/s (bandwidth), FLOP/s (compute), 0/1 (availability)."""
        return self.values * SI_FACTORS[self.unit]


def _fmt(x: float) -> str:
    """Shortest text that reads back to the same float64 (``repr``), without a useless trailing ``.0``."""
    text = repr(float(x))
    return text[:-2] if text.endswith(".0") else text


def write_trace(path: str | os.PathLike[str], trace: Trace) -> Path:
    """Write ``trace`` to ``path`` atomically: a temporary file in the same folder, then a rename."""
    out = Path(path)
    lines = [f"# {MAGIC}", f"# kind: {trace.kind}", f"# unit: {trace.unit}"]
    for key, text in trace.meta.items():
        lines.extend(f"# {key}: {part}" for part in text.split("\n"))
    lines.append(HEADER_ROW)
    lines.extend(f"{_fmt(t)},{_fmt(v)}" for t, v in zip(trace.t, trace.values, strict=True))
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write("\n".join(lines) + "\n")
        os.chmod(tmp, 0o644)  # mkstemp makes 0600; a trace is a data file to share
        os.replace(tmp, out)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return out


def _hint(first: str) -> str:
    """What to do with a file that is not a rayfl trace: most are published logs read by their own format."""
    guess = " (its lines look like a mahimahi log: one delivery time in ms per line)" if first.isdigit() else ""
    return (
        f"; a published network log{guess} is read by naming its format in the config (format: mahimahi, pensieve "
        "or ucc) or converted once with: rayfl traces import FORMAT SRC OUT"
    )


def _parse_header(path: str | os.PathLike[str], lines: list[str]) -> tuple[dict[str, str], dict[str, int], int]:
    """The ``# key: value`` lines before the header row: (meta with kind and unit, line number of each key, index of
    the header row)."""
    if not lines or lines[0].strip() != f"# {MAGIC}":
        first = lines[0].strip() if lines else "<empty file>"
        raise TraceError(
            f"{_where(path, 1)}: missing header: expected '# {MAGIC}' as the first line, got {first!r}{_hint(first)}"
        )
    meta: dict[str, str] = {}
    key_lines: dict[str, int] = {}
    for i in range(1, len(lines)):
        line = lines[i].strip()
        if not line:
            continue
        if not line.startswith("#"):
            if line.replace(" ", "") != HEADER_ROW:
                raise TraceError(f"{_where(path, i + 1)}: missing header row: expected {HEADER_ROW!r}, got {line!r}")
            return meta, key_lines, i
        match = _META_LINE.match(line)
        if match is None:
            continue  # a free-text comment
        key, text = match.group(1), match.group(2)
        if key in ("kind", "unit") and key in meta:
            raise TraceError(f"{_where(path, i + 1)}: '# {key}:' given twice (first on line {key_lines[key]})")
        meta[key] = f"{meta[key]}\n{text}" if key in meta else text
        key_lines[key] = i + 1
    raise TraceError(f"{_where(path, len(lines))}: missing header row {HEADER_ROW!r}")


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read a rayfl trace file, checking every line; a ``TraceError`` names the file, line and problem."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from err
    lines = text.splitlines()
    meta, key_lines, header_idx = _parse_header(path, lines)
    for key in ("kind", "unit"):
        if key not in meta:
            raise TraceError(
                f"{_where(path, header_idx + 1)}: missing header: no '# {key}:' line before the header row"
            )
    kind, unit = meta.pop("kind"), meta.pop("unit")
    problem = _check_kind_unit(kind, unit)
    if problem:
        line_no = key_lines["kind"] if kind not in UNITS else key_lines["unit"]
        raise TraceError(f"{_where(path, line_no)}: {problem}")
    times: list[float] = []
    values: list[float] = []
    for i in range(header_idx + 1, len(lines)):
        line = lines[i].strip()
        if not line:
            continue
        where = _where(path, i + 1)
        cells = line.split(",")
        if len(cells) != 2:
            raise TraceError(f"{where}: expected 2 comma-separated fields 't_s,value', got {len(cells)}: {line!r}")
        t, v = (_number(where, name, cell) for name, cell in zip(("time", "value"), cells, strict=True))
        if not times and t != 0.0:
            raise TraceError(f"{where}: the first time must be 0, got {t!r}")
        if not math.isfinite(t):
            raise TraceError(f"{where}: time {t!r} is not finite")
        if times and t < times[-1]:
            raise TraceError(f"{where}: time decreases ({times[-1]!r} -> {t!r}); times must not decrease")
        problem = _check_value(kind, v)
        if problem:
            raise TraceError(f"{where}: {problem}")
        times.append(t)
        values.append(v)
    if not times:
        raise TraceError(f"{_where(path, len(lines))}: empty trace: no data rows after the header row")
    return Trace(kind=kind, unit=unit, t=np.asarray(times), values=np.asarray(values), meta=meta)


def _number(where: str, name: str, cell: str) -> float:
    try:
        return float(cell.strip())
    except ValueError:
        raise TraceError(f"{where}: bad number for {name}: {cell.strip()!r}") from None
