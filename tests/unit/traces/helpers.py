"""Paths and small excerpts shared by the trace tests."""

from __future__ import annotations

from pathlib import Path

from rayfl.traces.catalog import SHIPPED_ROOT

REPO_ROOT = Path(__file__).resolve().parents[3]
REAL_TRACES = REPO_ROOT.parent / "shared" / "traces-real"  # the sets rayfl does not ship (ucc, mobilebandwidth)
SHIPPED = SHIPPED_ROOT  # rayfl/traces/data: the real sets in the package (mahimahi-cellular-lite, fcc-pensieve, flash)

# A hand-written trace: values 1024, 512.25, 2048 MiB at 0, 1.5 and 3 s.
GOOD = """\
# rayfl-trace v1
# kind: memory
# unit: MiB
# source: hand-written
t_s,value
0,1024
1.5,512.25
3,2048
"""


def head(path: Path, lines: int) -> str:
    """The first ``lines`` lines of a real file, as an excerpt to copy into a test's tmp_path."""
    with open(path, encoding="utf-8") as f:
        return "".join(next(f) for _ in range(lines))
