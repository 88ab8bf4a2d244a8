"""``rayfl traces show|import|synth|record`` through ``rayfl.cli.main``, on real files."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayfl.cli import main
from rayfl.traces.format import read_trace
from rayfl.traces.importers import import_mahimahi
from tests.unit.traces.helpers import GOOD, SHIPPED

PNG = b"\x89PNG\r\n\x1a\n"


def test_show_prints_statistics_and_writes_png(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.csv"
    path.write_text(GOOD)  # values 1024, 512.25, 2048
    png = tmp_path / "plots" / "m.png"
    assert main(["traces", "show", str(path), "--plot", str(png)]) == 0
    out = capsys.readouterr().out
    for line in (
        "kind: memory",
        "unit: MiB",
        "duration_s: 3.000",
        "samples: 3",
        "min: 512.250",
        "mean: 1194.750",
        "median: 1024.000",
        "p5: 563.425",
        "p95: 1945.600",
        "max: 2048.000",
        "source: hand-written",
    ):
        assert line in out.splitlines()
    assert png.read_bytes()[:8] == PNG


def test_import_writes_a_readable_trace(real_traces: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src = SHIPPED / "mahimahi-cellular-lite" / "Verizon-LTE-short.up"
    out = tmp_path / "verizon-up.csv"
    assert main(["traces", "import", "mahimahi", str(src), str(out), "--window-s", "2"]) == 0
    assert "wrote" in capsys.readouterr().out
    assert read_trace(out) == import_mahimahi(src, window_s=2.0)
    zipped = real_traces / "ucc-5g-mmsys20" / "5G-production-dataset.zip"
    member = "5G-production-dataset/Download/Driving/B_2019.12.16_11.49.59.csv"
    assert main(["traces", "import", "ucc", f"{zipped}/{member}", str(out), "--direction", "up"]) == 0
    assert read_trace(out).kind == "bandwidth_up"


def test_synth_then_show(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "bw.csv"
    assert main(["traces", "synth", "bandwidth_down", str(out), "--seed", "5", "--duration", "60"]) == 0
    assert read_trace(out).num_samples == 61
    assert main(["traces", "show", str(out)]) == 0
    assert "kind: bandwidth_down" in capsys.readouterr().out


def test_record(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["traces", "record", str(tmp_path / "r"), "--interval", "0.05", "--duration", "0.1", "--kinds", "memory"]
    assert main([*args, "--note", "test"]) == 0
    assert read_trace(tmp_path / "r.memory.csv").meta["load"] == "test"
    assert "r.memory.csv" in capsys.readouterr().out


def test_errors_exit_2_with_file_and_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.csv"
    bad.write_text(GOOD.replace("1.5,512.25", "1.5,lots"))
    assert main(["traces", "show", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "rayfl: error:" in err and "bad.csv:7:" in err and "'lots'" in err
    assert main(["traces", "import", "tcpdump", str(bad), str(tmp_path / "o.csv")]) == 2
    assert "unknown trace format 'tcpdump'" in capsys.readouterr().err
    assert main(["traces", "show", str(tmp_path / "absent.csv")]) == 2
    assert "absent.csv" in capsys.readouterr().err
    assert main(["traces", "import", "pensieve", str(bad), str(tmp_path / "o.csv"), "--window-s", "1"]) == 2
    assert not (tmp_path / "o.csv").exists()


GARBAGE = {
    "binary": bytes(range(256)) * 4,  # not UTF-8
    "nul bytes": b"Timestamp,DL_bitrate\n\x00\x00,\x00\n",
    "a png": PNG + b"\x00\x00\x00\rIHDR" + bytes(40),
    "a broken zip": b"PK\x03\x04" + bytes(60),
}


@pytest.mark.parametrize("fmt", ["mahimahi", "pensieve", "ucc"])
@pytest.mark.parametrize("kind", sorted(GARBAGE))
def test_import_of_garbage_is_one_line_naming_the_file_and_the_format(
    fmt: str, kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Issue 26: whatever the file holds, one line that names it and says what the format expects."""
    src = tmp_path / ("trace.zip" if kind == "a broken zip" else "trace.csv")
    src.write_bytes(GARBAGE[kind])
    out = tmp_path / "o.csv"
    assert main(["traces", "import", fmt, str(src), str(out)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert str(src) in line and "(expected a" in line, line
    assert not out.exists()
