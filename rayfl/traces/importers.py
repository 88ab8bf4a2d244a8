"""Importers from published network logs to rayfl ``Trace`` objects (bandwidth in Mbit/s).

Each importer reads one third-party log as its authors describe it (see the ``SOURCE.md`` of each set shipped in
``rayfl/traces/data/``, and ``traces/README.md`` for the others) and returns a bandwidth trace starting at t = 0. The
logs themselves stay where they are; ``rayfl traces import`` writes the result in rayfl's format. Two of the data sets
are distributions rather than time series; they get samplers (``rayfl.traces.samplers``) instead of importers.

Every problem in an input file is a ``TraceError`` naming the file and line.
"""

from __future__ import annotations

import csv
import io
import logging
import math
import os
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

import numpy as np

from rayfl.traces.format import Trace, TraceError
from rayfl.traces.samplers import FlashSpeedSampler, MobileBandwidthSampler

__all__ = [
    "EXPECTED",
    "IMPORTERS",
    "MAHIMAHI_PACKET_BYTES",
    "FlashSpeedSampler",
    "MobileBandwidthSampler",
    "import_mahimahi",
    "import_pensieve",
    "import_trace",
    "import_ucc",
    "ucc_members",
]

log = logging.getLogger(__name__)

MAHIMAHI_PACKET_BYTES = 1500
UCC_TIME_FORMAT = "%Y.%m.%d_%H.%M.%S"
_EPOCH = datetime(1970, 1, 1)  # naive: the logs are local wall-clock time, and only differences matter
_DIRECTIONS = ("down", "up")


def _kind(direction: str) -> str:
    if direction not in _DIRECTIONS:
        raise TraceError(f"direction must be 'down' or 'up', got {direction!r}")
    return f"bandwidth_{direction}"


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}: not UTF-8 text ({err.reason} at byte {err.start})") from err


def import_mahimahi(path: str | os.PathLike[str], window_s: float = 1.0, *, direction: str | None = None) -> Trace:
    """A mahimahi ``mm-link`` trace as throughput per window of ``window_s`` seconds.

    Each line is a millisecond timestamp at which one 1500-byte packet can be delivered, so a window's throughput is
    ``packets * 1500 * 8 / window_s`` bit/s. The trace's period is its last timestamp (mahimahi loops there); a last
    partial window is dropped. ``direction`` defaults to ``up`` for ``*.up`` files and ``down`` otherwise.
    """
    p = Path(path)
    if not (window_s > 0 and math.isfinite(window_s)):
        raise TraceError(f"{p}: window_s must be a positive number of seconds, got {window_s!r}")
    kind = _kind(direction or ("up" if p.suffix == ".up" else "down"))
    stamps: list[int] = []
    for line_no, raw in enumerate(_read_lines(p), start=1):
        text = raw.strip()
        if not text:
            continue
        try:
            ms = int(text)
        except ValueError:
            raise TraceError(
                f"{p}:{line_no}: bad number: expected an integer millisecond timestamp, got {text!r}"
            ) from None
        if ms < 0 or (stamps and ms < stamps[-1]):
            raise TraceError(f"{p}:{line_no}: time decreases or is negative ({stamps[-1] if stamps else 0} -> {ms} ms)")
        stamps.append(ms)
    if not stamps:
        raise TraceError(f"{p}: empty trace: no timestamps")
    window_ms = window_s * 1000.0
    num_windows = int(stamps[-1] // window_ms)
    if num_windows == 0:
        raise TraceError(f"{p}: the trace lasts {stamps[-1]} ms, shorter than one {window_s} s window")
    index = np.floor(np.asarray(stamps, dtype=np.float64) / window_ms).astype(np.int64)
    packets = np.bincount(index[index < num_windows], minlength=num_windows)
    mbps = packets * (MAHIMAHI_PACKET_BYTES * 8) / window_s / 1e6
    meta = {
        "source": f"mahimahi mm-link trace {p.name} (1500-byte packet delivery opportunities per ms)",
        "import": f"rayfl traces import mahimahi, window_s={window_s:g}, period {stamps[-1]} ms",
    }
    return Trace(kind, "Mbit/s", np.arange(num_windows) * window_s, mbps, meta)


def import_pensieve(path: str | os.PathLike[str], *, direction: str | None = None) -> Trace:
    """A Pensieve ``cooked_traces`` file: rows of ``time_s Mbit/s``, shifted so that the first row is at t = 0."""
    p = Path(path)
    kind = _kind(direction or "down")
    times: list[float] = []
    values: list[float] = []
    for line_no, raw in enumerate(_read_lines(p), start=1):
        cells = raw.split()
        if not cells:
            continue
        if len(cells) != 2:
            raise TraceError(f"{p}:{line_no}: expected 2 whitespace-separated fields 'time_s Mbit/s', got {raw!r}")
        try:
            t, v = float(cells[0]), float(cells[1])
        except ValueError:
            raise TraceError(f"{p}:{line_no}: bad number in {raw.strip()!r}") from None
        if not (math.isfinite(t) and math.isfinite(v)) or v < 0:
            raise TraceError(f"{p}:{line_no}: time and throughput must be finite and throughput >= 0, got {raw!r}")
        if times and t < times[-1]:
            raise TraceError(f"{p}:{line_no}: time decreases ({times[-1]!r} -> {t!r})")
        times.append(t)
        values.append(v)
    if not times:
        raise TraceError(f"{p}: empty trace: no rows")
    meta = {"source": f"Pensieve cooked trace {p.name} (FCC Measuring Broadband America 2016)"}
    return Trace(kind, "Mbit/s", np.asarray(times) - times[0], np.asarray(values), meta)


def ucc_members(zip_path: str | os.PathLike[str]) -> list[str]:
    """The CSV traces inside a UCC 5G dataset zip, without the ``__MACOSX/`` resource forks."""
    with zipfile.ZipFile(zip_path) as archive:
        return sorted(n for n in archive.namelist() if n.endswith(".csv") and not n.startswith("__MACOSX/"))


def _split_zip_member(spec: Path) -> tuple[Path, str] | None:
    """``archive.zip/dir/file.csv`` -> (archive.zip, 'dir/file.csv'); None when no prefix of ``spec`` is a zip."""
    for parent in spec.parents:
        if parent.suffix.lower() == ".zip" and parent.is_file():
            return parent, spec.relative_to(parent).as_posix()
    return None


@contextmanager
def _open_csv_text(spec: str | os.PathLike[str]) -> Iterator[tuple[str, str, io.TextIOBase]]:
    """(name for messages, name for the trace header, text stream) of a CSV file or of a zip member named as
    ``archive.zip/member``; the header name is the file name or the member path, never a machine path."""
    path = Path(spec)
    split = None if path.is_file() else _split_zip_member(path)
    if split is None:
        if path.suffix.lower() == ".zip" and path.is_file():
            some = ", ".join(ucc_members(path)[:3])
            raise TraceError(f"{path}: name a CSV inside the zip as '{path}/<member>', e.g. one of: {some}")
        with open(path, encoding="utf-8", newline="") as f:
            yield str(path), path.name, f
        return
    archive_path, member = split
    with zipfile.ZipFile(archive_path) as archive:
        try:
            raw = archive.open(member)
        except KeyError:
            raise TraceError(f"{archive_path}: no member {member!r} in the zip") from None
        with raw, io.TextIOWrapper(raw, encoding="utf-8", newline="") as f:
            yield f"{archive_path}/{member}", member, f


def _spread_repeated_seconds(seconds: np.ndarray) -> np.ndarray:
    """Rows logged within the same whole second (n of them) are placed at s, s + 1/n, ..., s + (n-1)/n."""
    _, first, counts = np.unique(seconds, return_index=True, return_counts=True)
    rank = np.arange(seconds.size) - np.repeat(first, counts)
    return seconds + rank / np.repeat(counts, counts)


def import_ucc(path_or_zip_member: str | os.PathLike[str], direction: str = "down") -> Trace:
    """One trace of the UCC 5G production dataset (Raca et al., MMSys 2020): ``DL_bitrate``/``UL_bitrate`` in kbit/s.

    ``path_or_zip_member`` is a CSV file or a member of the dataset's zip named as ``archive.zip/member`` (read
    without extracting; ``ucc_members`` lists them). Timestamps have whole-second resolution and repeat when the
    logger wrote several rows in one second: those rows are spread evenly within their second. A timestamp earlier than
    the one before it (one row in the whole dataset) is taken as the earlier row's. Rows whose bitrate is ``-``
    (missing) are skipped.
    """
    kind = _kind(direction)
    column = "DL_bitrate" if direction == "down" else "UL_bitrate"
    with _open_csv_text(path_or_zip_member) as (name, short_name, f):
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise TraceError(f"{name}:1: missing header: empty file")
        header = [h.strip() for h in header]
        for needed in ("Timestamp", column):
            if needed not in header:
                raise TraceError(f"{name}:1: missing header column {needed!r} (is this a UCC 5G dataset CSV?)")
        i_time, i_rate = header.index("Timestamp"), header.index(column)
        seconds: list[float] = []
        kbps: list[float] = []
        clamped = 0
        for row in reader:
            if not row:
                continue
            where = f"{name}:{reader.line_num}"
            if len(row) != len(header):
                raise TraceError(f"{where}: expected {len(header)} fields, got {len(row)}")
            try:
                stamp = (datetime.strptime(row[i_time].strip(), UCC_TIME_FORMAT) - _EPOCH).total_seconds()
            except ValueError:
                raise TraceError(f"{where}: bad timestamp {row[i_time]!r} (expected YYYY.MM.DD_hh.mm.ss)") from None
            rate = row[i_rate].strip()
            if rate == "-":
                continue
            try:
                value = float(rate)
            except ValueError:
                raise TraceError(f"{where}: bad number for {column}: {rate!r}") from None
            if not math.isfinite(value) or value < 0:
                raise TraceError(f"{where}: {column} must be finite and >= 0, got {rate!r}")
            if seconds and stamp < seconds[-1]:
                clamped += 1
                stamp = seconds[-1]
            seconds.append(stamp)
            kbps.append(value)
    if not seconds:
        raise TraceError(f"{name}: empty trace: no rows with a {column}")
    if clamped:
        log.info("%s: %d timestamps earlier than the previous row were set to the previous row's", name, clamped)
    t = _spread_repeated_seconds(np.asarray(seconds) - seconds[0])
    meta = {
        "source": f"UCC 5G production dataset (Raca et al., MMSys 2020), {short_name}, column {column} (kbit/s)",
        "import": "rayfl traces import ucc; rows within one logged second spread evenly over it",
    }
    return Trace(kind, "Mbit/s", t, np.asarray(kbps) / 1000.0, meta)


# Formats ``rayfl traces import FORMAT`` accepts: a name -> a function (path, *, direction=...) -> Trace.
IMPORTERS: dict[str, Callable[..., Trace]] = {
    "mahimahi": import_mahimahi,
    "pensieve": import_pensieve,
    "ucc": import_ucc,
}

# What each format's file holds, for the line that refuses a file that is not one
EXPECTED = {
    "mahimahi": "a mahimahi mm-link trace: UTF-8 text, one integer millisecond timestamp per line",
    "pensieve": "a Pensieve cooked trace: UTF-8 text, lines of 'time_s Mbit/s'",
    "ucc": "a UCC 5G dataset CSV (UTF-8, columns Timestamp and DL_bitrate/UL_bitrate), or archive.zip/member.csv",
}


def import_trace(fmt: str, path: str | os.PathLike[str], **options: object) -> Trace:
    """``IMPORTERS[fmt](path, **options)``; any problem with the file (binary, damaged zip, not CSV) is one
    ``TraceError`` naming the file and the format expected."""
    importer = IMPORTERS.get(fmt)
    if importer is None:
        raise TraceError(f"unknown trace format {fmt!r} (known: {', '.join(IMPORTERS)})")
    try:
        return importer(path, **options)
    except TraceError as err:
        raise TraceError(f"{err} (expected {EXPECTED[fmt]})") from err
    except UnicodeDecodeError as err:
        raise TraceError(f"{path}: not UTF-8 text at byte {err.start} (expected {EXPECTED[fmt]})") from err
    except (csv.Error, zipfile.BadZipFile, zipfile.LargeZipFile, EOFError) as err:
        raise TraceError(f"{path}: {err} (expected {EXPECTED[fmt]})") from err
    except OSError as err:
        raise TraceError(f"{path}: cannot read it: {err.strerror or err} (expected {EXPECTED[fmt]})") from err
