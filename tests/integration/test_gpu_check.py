"""``benchmarks/gpu_check.py`` runs for real at its smallest: without CUDA its first line says that no GPU is available,
the GPU tests skip, the CPU run runs and the table marks the GPU row "not run"; the report it writes is what it
printed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[2]


def _cells(row: str) -> list[str]:
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


def test_the_gpu_check_reports_its_table(tmp_path: Path) -> None:
    out = tmp_path / "results" / "gpu_check.txt"
    args = [sys.executable, "benchmarks/gpu_check.py", "--rounds", "1", "--clients", "2", "--samples", "16"]
    done = subprocess.run([*args, "--out", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.strip().splitlines()
    assert out.read_text().splitlines() == lines
    has_gpu = torch.cuda.is_available()
    assert lines[0].startswith("GPU: ") if has_gpu else lines[0].startswith("no GPU available")
    assert lines[1].startswith("GPU tests (tests/integration/test_gpu.py): ")
    assert ("passed" if has_gpu else "skipped") in lines[1] and "FAILED" not in lines[1]
    rows = [_cells(line) for line in lines if line.startswith("|")]
    assert len(rows) == 4 and all(len(r) == 5 for r in rows)  # header, rule, the CPU row, the GPU row
    assert rows[0][2:] == ["s per round (median)", "peak GPU MiB", "records equal to the CPU run"]
    cpu, gpu = rows[2], rows[3]
    assert cpu[1] == "cpu" and float(cpu[2]) > 0 and cpu[4] == "(reference)"
    assert gpu[1] == "cuda"
    if has_gpu:
        assert float(gpu[2]) > 0 and float(gpu[3]) > 0 and gpu[4].startswith(("equal", "differ"))
    else:
        assert gpu[2:] == ["not run"] * 3
    assert lines[-1].startswith("total wall seconds: ")
