"""The mini comparison of docs/reproductions.md, from the records of experiments/mini/run_all.sh.

PYTHONPATH=$PWD python experiments/mini/table.py [RUNS_DIR] > experiments/mini/results/table.md

RUNS_DIR (default: experiments/mini/results, the committed records) holds one folder per run, ``mini-<method>``,
each with the run's ``config.yaml``, ``rounds.csv`` and ``summary.json`` (``evals.csv`` is kept beside them but not
read). Two tables: the methods without server-side distillation (the comparison), then the variants that add paper
000's in-place distillation ("w/" in its Table 3), told apart by ``algorithm.distill.enabled`` in ``config.yaml``.
Per run: the test accuracy at the last evaluation, the mean of the last three evaluations (the curves are noisy with
10 of 100 clients per round), the most-frequent-label accuracy of the test set (``baseline_acc``), the margin of that
mean over it, the clients that trained of those sampled, and the simulated time. A run "learns" when the mean of its
last three evaluations is more than ``MARGIN`` points above the baseline (as in experiments/distill/README.md).
"""

from __future__ import annotations

import csv
import json
import math
import sys
from pathlib import Path

import yaml

from rayfl.core.units import format_sim_time

LAST = 3
MARGIN = 2.0  # points above the most-frequent-label accuracy that count as learning
LABELS = {
    "largest": "FedAvg, the full model (budgets ignored)",
    "smallest": "FedAvg, the smallest model (S = 0)",
    "heterofl": "HeteroFL",
    "fedrolex": "FedRolex",
    "feddropout": "Federated Dropout",
    "anycostfl": "AnycostFL",
    "fjord": "FjORD",
    "model_search-no-distill": "core method (model search), no distillation",
    "model_search": "core method, in-place distillation (Eq. 2, paper-faithful)",
    "model_search-copies": "core method, copy-and-average distillation",
    "model_search-frozen": "core method, Eq. 2 with the teacher frozen per round",
    "heterofl-distill": "HeteroFL + in-place distillation",
}
ORDER = list(LABELS)


def _floats(rows: list[dict[str, str]], key: str) -> list[float]:
    values = [float(r[key]) for r in rows if r.get(key) not in (None, "", "nan")]
    return [v for v in values if not math.isnan(v)]


def _read(run_dir: Path) -> dict[str, object]:
    cfg = yaml.safe_load((run_dir / "config.yaml").read_text())
    summary = json.loads((run_dir / "summary.json").read_text())
    with (run_dir / "rounds.csv").open() as f:
        rounds = list(csv.DictReader(f))
    accs = _floats(rounds, "test_acc")
    distill = (cfg["algorithm"].get("distill") or {}).get("enabled", False)
    return {
        "method": run_dir.name.removeprefix("mini-"),
        "distill": bool(distill),
        "rounds": len(rounds),
        "last": 100 * accs[-1],
        "mean_last": 100 * sum(accs[-LAST:]) / len(accs[-LAST:]),
        "baseline": 100 * float(summary["baseline_acc"]),
        "trained": sum(int(r["clients_run"]) for r in rounds),
        "sampled": sum(int(r["clients_sampled"] or r["clients_run"]) for r in rounds),
        "sim_s": float(summary["sim_time_s"]),
    }


def _table(runs: list[dict[str, object]]) -> list[str]:
    if not runs:
        return ["(none in these records)"]
    lines = [
        f"| method | run | test acc, last (%) | mean of last {LAST} evals (%) | baseline (%) | margin (points) "
        "| learns | clients trained / sampled | simulated time |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in runs:
        margin = float(r["mean_last"]) - float(r["baseline"])  # type: ignore[arg-type]
        lines.append(
            f"| {LABELS.get(str(r['method']), r['method'])} | `mini-{r['method']}` | {r['last']:.2f} | "
            f"{r['mean_last']:.2f} | {r['baseline']:.2f} | {margin:+.2f} | {'yes' if margin > MARGIN else '**no**'} "
            f"| {r['trained']} / {r['sampled']} | {format_sim_time(float(r['sim_s']))} |"  # type: ignore[arg-type]
        )
    return lines


def main(argv: list[str]) -> int:
    root = Path(argv[0] if argv else "experiments/mini/results")
    dirs = sorted(d for d in root.glob("mini-*") if (d / "summary.json").is_file())
    if not dirs:
        print(f"no run folders (mini-*/summary.json) under {root}", file=sys.stderr)
        return 2
    runs = sorted((_read(d) for d in dirs), key=lambda r: ORDER.index(r["method"]) if r["method"] in ORDER else 99)
    rounds = sorted({int(r["rounds"]) for r in runs})  # type: ignore[call-overload]
    out = [
        f"Runs: {len(runs)} of experiments/mini/shakespeare_bert.yaml, rounds {', '.join(map(str, rounds))}; "
        f"a run learns when the mean of its last {LAST} evaluations is more than {MARGIN:g} points above the "
        "most-frequent-label baseline.",
        "",
        "Without distillation (the comparison):",
        "",
        *_table([r for r in runs if not r["distill"]]),
        "",
        "With paper 000's in-place distillation (named variants):",
        "",
        *_table([r for r in runs if r["distill"]]),
    ]
    print("\n".join(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
