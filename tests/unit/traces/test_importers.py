"""Importers on the real logs: the sets shipped in ``rayfl/traces/data`` (see each folder's SOURCE.md) and, for ucc,
the copy in ``../shared/traces-real``."""

from __future__ import annotations

import zipfile
from pathlib import Path

import numpy as np
import pytest

from rayfl.traces.format import TraceError, read_trace, write_trace
from rayfl.traces.importers import IMPORTERS, import_mahimahi, import_pensieve, import_ucc, ucc_members
from tests.unit.traces.helpers import SHIPPED, head

UCC_MEMBER = "5G-production-dataset/Download/Static/B_2019.12.16_13.40.04.csv"


def test_mahimahi_throughput_of_hand_counted_windows(tmp_path: Path) -> None:
    # The first 104 lines of Verizon-LTE-short.down: 50 timestamps in [0, 50) ms, 53 in [50, 100) ms, then 101
    # (the period, so the partial window from 100 ms is dropped). 50 packets x 1500 B x 8 bit / 0.05 s = 12.0 Mbit/s.
    excerpt = tmp_path / "Verizon-LTE-short.down"
    excerpt.write_text(head(SHIPPED / "mahimahi-cellular-lite" / "Verizon-LTE-short.down", 104))
    trace = import_mahimahi(excerpt, window_s=0.05)
    assert trace.kind == "bandwidth_down" and trace.unit == "Mbit/s"
    np.testing.assert_allclose(trace.t, [0.0, 0.05])
    np.testing.assert_allclose(trace.values, [50 * 12_000 / 0.05 / 1e6, 53 * 12_000 / 0.05 / 1e6])
    assert trace.values[0] == pytest.approx(12.0)


def test_mahimahi_whole_file_matches_source_md() -> None:
    trace = import_mahimahi(SHIPPED / "mahimahi-cellular-lite" / "ATT-LTE-driving-2016.up")
    assert trace.kind == "bandwidth_up"  # from the .up suffix
    assert trace.num_samples == 120 and trace.duration_s == 119.0
    assert trace.values.mean() == pytest.approx(1.91, abs=0.01)  # SOURCE.md's mean rate


def test_mahimahi_errors(tmp_path: Path) -> None:
    bad = tmp_path / "x.down"
    bad.write_text("0\n5\n7.5\n")
    with pytest.raises(TraceError, match=r"x.down:3: bad number.*'7.5'"):
        import_mahimahi(bad)
    bad.write_text("0\n5\n4\n")
    with pytest.raises(TraceError, match=r"x.down:3: time decreases"):
        import_mahimahi(bad)
    bad.write_text("0\n5\n")
    with pytest.raises(TraceError, match="shorter than one"):
        import_mahimahi(bad)


def test_pensieve_first_rows_and_shift(tmp_path: Path) -> None:
    src = SHIPPED / "fcc-pensieve" / "trace_10730_http---www.facebook.com"
    trace = import_pensieve(src)
    assert trace.kind == "bandwidth_down"
    np.testing.assert_array_equal(trace.t[:3], [0.0, 5.0, 10.0])
    np.testing.assert_array_equal(trace.values[:3], [0.478392, 0.39884, 0.475904])
    shifted = tmp_path / "shifted"
    shifted.write_text("".join(f"{12.5 + 5 * i}\t{v}\n" for i, v in enumerate([0.478392, 0.39884, 0.475904])))
    np.testing.assert_array_equal(import_pensieve(shifted).t, [0.0, 5.0, 10.0])
    shifted.write_text("0.0\t0.5\n5.0 oops\n")
    with pytest.raises(TraceError, match="shifted:2: bad number"):
        import_pensieve(shifted)


def test_ucc_reads_a_zip_member_without_extracting(real_traces: Path) -> None:
    archive = real_traces / "ucc-5g-mmsys20" / "5G-production-dataset.zip"
    members = ucc_members(archive)
    assert len(members) == 83 and UCC_MEMBER in members and not any("__MACOSX" in m for m in members)
    down = import_ucc(archive / UCC_MEMBER)
    up = import_ucc(archive / UCC_MEMBER, direction="up")
    # Rows 1-3: 13.40.04 (DL 72, UL 20 kbit/s), then two rows logged in second 13.40.05, spread half a second apart.
    np.testing.assert_allclose(down.t[:4], [0.0, 1.0, 1.5, 2.0])
    np.testing.assert_allclose(down.values[:2], [0.072, 0.0])
    assert up.kind == "bandwidth_up" and up.values[0] == pytest.approx(0.020)
    assert np.all(np.diff(down.t) > 0)
    assert UCC_MEMBER in down.meta["source"] and str(real_traces) not in down.meta["source"]


def test_ucc_plain_csv_and_errors(real_traces: Path, tmp_path: Path) -> None:
    with zipfile.ZipFile(real_traces / "ucc-5g-mmsys20" / "5G-production-dataset.zip") as archive:
        text = archive.read(UCC_MEMBER).decode("utf-8")
    lines = text.splitlines(keepends=True)
    csv_path = tmp_path / "ucc.csv"
    csv_path.write_text("".join(lines[:20]))
    trace = import_ucc(csv_path)
    assert trace.num_samples == 19 and trace.values[12] == pytest.approx(185.367)  # line 14: 13.40.15, 185367 kbit/s
    csv_path.write_text("".join(lines[:5]) + lines[5].replace("2019.12.16_13.40.07", "yesterday"))
    with pytest.raises(TraceError, match=r"ucc\.csv:6: bad timestamp 'yesterday'"):
        import_ucc(csv_path)
    csv_path.write_text(lines[0].replace("DL_bitrate", "DL"))
    with pytest.raises(TraceError, match=r"ucc\.csv:1: missing header column 'DL_bitrate'"):
        import_ucc(csv_path)
    with pytest.raises(TraceError, match="name a CSV inside the zip"):
        import_ucc(real_traces / "ucc-5g-mmsys20" / "5G-production-dataset.zip")
    with pytest.raises(TraceError, match="no member"):
        import_ucc(real_traces / "ucc-5g-mmsys20" / "5G-production-dataset.zip" / "nope.csv")


def test_registry_imports_write_readable_traces(real_traces: Path, tmp_path: Path) -> None:
    sources = {
        "mahimahi": real_traces / "mahimahi-cellular" / "TMobile-LTE-short.up",
        "pensieve": SHIPPED / "fcc-pensieve" / "trace_10322_http---edition.cnn.com",
        "ucc": real_traces / "ucc-5g-mmsys20" / "5G-production-dataset.zip" / UCC_MEMBER,
    }
    assert set(IMPORTERS) == set(sources)
    for name, src in sources.items():
        trace = IMPORTERS[name](src)
        assert read_trace(write_trace(tmp_path / f"{name}.csv", trace)) == trace
