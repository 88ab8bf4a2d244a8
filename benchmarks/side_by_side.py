"""rayfl against pfl-research on the same FedAvg workload, interleaved (issue 41's "must show").

Each point is a fresh process: rayfl through ``scale.py --point`` (its CNN, 64 synthetic images a client, one local
epoch of batch 32, ``--rounds`` rounds, 2 hosts) as a user gets it (``backend.kind: auto``, ``backend.processes:
auto``) and with each backend forced (in-process on one process, in-process on worker processes, Ray), and
pfl-research through its own harness ``pfl_side.py`` (torch's default threads, one per core). For every N the five
run one after another, ``--repeat`` times, so that a drift of the machine hits them all alike. Printed: end to end
(from the process's first import to the last round), the first client update (both harnesses: when the first
client's trained update exists; from the process's start, and from the run's call, imports and Ray's start left out),
steady client updates/s (rounds after the first) and the process tree's peak PSS.

Run (pfl in its own venv, ``pfl_side.py``'s docstring)::

    python benchmarks/side_by_side.py [--n 100 1000 10000] [--k 100] [--repeat 2] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
# label -> scale.py arguments (rayfl) or None (pfl-research)
VARIANTS: dict[str, list[str] | None] = {
    "rayfl auto": ["--backend", "auto", "--processes", "auto"],
    "rayfl in-process, 1 process": ["--backend", "local", "--processes", "1"],
    "rayfl in-process, worker processes": ["--backend", "local", "--processes", "auto"],
    "rayfl Ray": ["--backend", "ray"],
    "pfl-research": None,
}


def point(label: str, n: int, k: int, rounds: int, pfl_python: Path, labels: str = "pool") -> dict[str, Any]:
    """One run in a fresh process: its JSON row."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    extra = VARIANTS[label]
    if extra is None:
        cmd = [str(pfl_python), str(HERE / "pfl_side.py"), "--n", str(n), "--k", str(k), "--rounds", str(rounds)]
    else:
        cmd = [sys.executable, str(HERE / "scale.py"), "--point", "--n", str(n), "--k", str(k), "--mode", "train"]
        cmd += ["--rounds", str(rounds), "--labels", labels, *extra]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith(("{", "SCALE-ROW "))]
    if done.returncode != 0 or not lines:
        sys.stderr.write(done.stderr[-3000:])
        raise SystemExit(f"{label} at N={n} failed (exit {done.returncode}): {' '.join(cmd)}")
    row = json.loads(lines[-1].removeprefix("SCALE-ROW "))
    if extra is None:
        first, peak = row["first_update_s"], row["peak_pss_mib"]
    else:
        first, peak = row["first_client_update_s"], row["peak_pss_total_mib"]
    after_call = row["first_update_after_call_s" if extra is None else "first_client_update_after_call_s"]
    return {
        "label": label,
        "n": n,
        "k": k,
        "taken": row.get("backend", row.get("framework")),
        "end_to_end_s": row["end_to_end_s"],
        "first_update_s": first,
        "first_update_after_call_s": after_call,
        "steady_updates_per_s": row["steady_updates_per_s"],
        "peak_pss_mib": peak,
        "load_before": os.getloadavg()[0],
    }


def table(rows: list[dict[str, Any]]) -> str:
    """Per N and variant: the runs' figures side by side (run 1, run 2, ...)."""
    out = [
        "| N | run | taken | end to end s | first client update s | from the run's call s | steady updates/s "
        "| peak PSS MiB |",
        "|---|---|---|---:|---:|---:|---:|---:|",
    ]
    for n in sorted({r["n"] for r in rows}):
        for label in VARIANTS:
            got = [r for r in rows if r["n"] == n and r["label"] == label]
            if not got:
                continue

            def cells(key: str, fmt: str, got: list[dict[str, Any]] = got) -> str:
                return ", ".join(format(r[key], fmt) for r in got)

            out.append(
                f"| {n:,} | {label} | {got[0]['taken']} | {cells('end_to_end_s', '.2f')} | "
                f"{cells('first_update_s', '.2f')} | {cells('first_update_after_call_s', '.2f')} | "
                f"{cells('steady_updates_per_s', '.1f')} | "
                f"{cells('peak_pss_mib', '.0f')} |"
            )
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[100, 1000, 10000])
    parser.add_argument("--k", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    # rayfl's synthetic labels (data.synthetic_labels): 'pool' labels the 8,192-image chunk a client's rows lie in when
    # it first trains, 'image' only the client's own images (pfl_side.py draws its labels at random, per user)
    parser.add_argument("--labels", choices=["pool", "image"], default="pool")
    parser.add_argument("--pfl-python", type=Path, default=ROOT / ".pflvenv" / "bin" / "python")
    parser.add_argument("--out", type=Path, default=None, help="JSON file for the rows and the table")
    args = parser.parse_args()
    rows = []
    for n in args.n:
        for _ in range(args.repeat):
            for label in args.variants:
                rows.append(point(label, n, args.k, args.rounds, args.pfl_python, args.labels))
                r = rows[-1]
                sys.stderr.write(
                    f"N={n} {label}: {r['end_to_end_s']:.2f} s, first {r['first_update_s']:.2f} s, "
                    f"{r['steady_updates_per_s']:.1f}/s, {r['peak_pss_mib']:.0f} MiB\n"
                )
    text = table(rows)
    if args.out is not None:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=False)
        report = {"command": "python benchmarks/side_by_side.py " + " ".join(sys.argv[1:]), "commit": commit.stdout}
        args.out.write_text(json.dumps({**report, "rows": rows, "table": text}, indent=1) + "\n", encoding="utf-8")
    print(text)


if __name__ == "__main__":
    main()
