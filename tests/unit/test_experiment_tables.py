"""The decided paper tables regenerate byte for byte from their committed records with their documented command.

Each table is a script's standard output over records committed beside it (``rayfl.report.decide`` gives every
verdict); a change to a script, to the records or to the decision rule that alters a committed table fails here
with the first differing line.
"""

from __future__ import annotations

import difflib
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# (the command's arguments after the interpreter, the committed table it prints or, after ``--out``, writes)
FEDRESCUE = (
    "experiments/fedrescue/run_table.py --config mnist.yaml --table-only --decide --methods FedResCuE FjORD-004-S2 "
    "HeteroFL HeteroFL-x2 --error-rates 0 0.2 --runs experiments/fedrescue/runs_mnist.json --out "
    "experiments/fedrescue/results_mnist.md"
)
TABLES = [
    (["experiments/fedhen/table.py", "experiments/fedhen/runs-iid-3seeds"], "experiments/fedhen/results-iid-3seeds.md"),
    (
        ["experiments/fedhen/table.py", "experiments/fedhen/runs-fixeddata-3seeds"],
        "experiments/fedhen/results-fixeddata-3seeds.md",
    ),
    (["experiments/fedhen/control.py", "experiments/fedhen/runs-control"], "experiments/fedhen/control.md"),
    (
        ["experiments/fedhen/control.py", "experiments/fedhen/runs-control-mnist", "--horizons", "100", "200"],
        "experiments/fedhen/control_mnist.md",
    ),
    (["experiments/issue40/table.py"], "experiments/issue40/table.md"),
    (["experiments/fedtrans/decided.py"], "experiments/fedtrans/decided.md"),
    (["experiments/fedoras/decided.py"], "experiments/fedoras/decided.md"),
    (FEDRESCUE.split(), "experiments/fedrescue/results_mnist.md"),
]


@pytest.mark.parametrize(("args", "table"), TABLES, ids=[t for _, t in TABLES])
def test_a_committed_table_is_what_its_command_prints_from_the_committed_records(
    args: list[str], table: str, tmp_path: Path
) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "MPLBACKEND": "Agg"}
    run = list(args)
    if "--out" in run:  # written to a scratch file, the documented command line stated in it as documented
        run[run.index("--out") + 1] = str(tmp_path / "table.md")
        run += ["--command", "python " + " ".join(args)]
    done = subprocess.run(
        [sys.executable, *run], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, f"python {' '.join(args)} failed:\n{done.stderr[-3000:]}"
    got = (tmp_path / "table.md").read_text() if "--out" in run else done.stdout
    want = (ROOT / table).read_text()
    if got != want:
        diff = "".join(
            list(difflib.unified_diff(want.splitlines(True), got.splitlines(True), table, "regenerated"))[:40]
        )
        pytest.fail(f"{table} is not what `python {' '.join(args)}` prints from the committed records:\n{diff}")
