"""``backend.kind: auto`` against forcing a backend, on a config as ``rayfl run`` runs it.

Each point is a fresh Python process that runs ``rayfl run [FILE] key=value ... backend.kind=KIND`` through the CLI
(so Ray, when taken, starts the way ``rayfl run`` starts it) while ``process_roles.PssSampler`` samples the process
tree, and prints the run's first line (the backend taken and why), its wall seconds (from before the CLI's imports
to its exit) and the tree's peak PSS.

The embedded default, 2 rounds, auto vs Ray:
``python benchmarks/default_backend.py --backend auto ray -- rounds=2``
(the Shakespeare data must be prepared: ``rayfl data prepare shakespeare``).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent


def point(args: list[str]) -> dict[str, object]:
    """One run in this process: its first line, wall seconds and peak PSS of the tree."""
    sys.path.insert(0, str(HERE))
    from process_roles import PssSampler

    began = time.perf_counter()
    sampler = PssSampler()
    sampler.start()
    from rayfl.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(["run", *args])
    wall_s = time.perf_counter() - began
    sampler.stop()
    first = out.getvalue().splitlines()[0] if out.getvalue() else ""
    return {"exit": code, "first_line": first, "wall_s": wall_s, "peak_pss_mib": round(sampler.peak_total, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", nargs="+", default=["auto", "ray"], choices=["auto", "local", "ray"])
    parser.add_argument("--point", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None, help="JSON file for the rows (default: print only)")
    parser.add_argument("args", nargs="*", help="FILE and key=value overrides, as for rayfl run")
    ns = parser.parse_args()
    rows: list[dict[str, object]] = []
    if ns.point:
        print(json.dumps(point(ns.args)))
        return
    print("| backend.kind | first line's backend | wall s | peak PSS MiB |\n| --- | --- | --- | --- |")
    for kind in ns.backend:
        with tempfile.TemporaryDirectory() as out:
            cmd = [sys.executable, __file__, "--point", "--", *ns.args, f"backend.kind={kind}", f"output_dir={out}"]
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            print(f"| {kind} | failed (exit {done.returncode}): {done.stderr.strip().splitlines()[-1:]} | | |")
            continue
        row = json.loads(done.stdout.strip().splitlines()[-1])
        rows.append({"kind": kind, "args": ns.args, **row})
        taken = str(row["first_line"]).split("backend ", 1)[-1]
        print(f"| {kind} | {taken} | {row['wall_s']:.1f} | {row['peak_pss_mib']:.0f} |")
    if ns.out is not None:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text(json.dumps(rows, indent=2) + "\n")


if __name__ == "__main__":
    main()
