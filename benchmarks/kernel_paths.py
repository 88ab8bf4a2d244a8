"""The same seeded run under each CPU vector-kernel path (issue 46): how far a run's records move when PyTorch picks
other kernels, which is what differs between two machines of one kind whose CPUs have other instruction sets.

Runs ``examples/resnet18_synthetic.yaml`` (seed 0, evaluated every round) once per path, each in its own process
(the variables are read when torch loads): this machine's own kernels, ``ATEN_CPU_CAPABILITY=default`` (ATen's
scalar kernels), ``ONEDNN_MAX_CPU_ISA=SSE41`` (oneDNN's convolutions, which dispatch on the CPU apart from ATen),
both together, and ``OMP_NUM_THREADS=1`` (a thread-count control). Prints a markdown table of the accuracy after
each round. Issue 46's figures: ``python benchmarks/kernel_paths.py rounds=12 data.kwargs.num_samples=512``.

Run from the repository root: ``python benchmarks/kernel_paths.py [override ...]``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

PATHS = {
    "own": {},
    "ATEN_CPU_CAPABILITY=default": {"ATEN_CPU_CAPABILITY": "default"},
    "ONEDNN_MAX_CPU_ISA=SSE41": {"ONEDNN_MAX_CPU_ISA": "SSE41"},
    "both": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "own, 1 thread": {"OMP_NUM_THREADS": "1"},
}

ONE_RUN = """
import json, sys, torch
from rayfl.engine.driver import run_experiment
from rayfl.experiment.loader import load_config
cfg = load_config("examples/resnet18_synthetic.yaml", sys.argv[1:])
result = run_experiment(cfg)
accs = [r.test_acc for r in result.records if r.test_acc == r.test_acc]
print("RESULT", json.dumps({"accs": accs, "baseline": result.baseline_acc,
                            "kernels": torch.backends.cpu.get_cpu_capability(), "threads": torch.get_num_threads()}))
"""


def main() -> None:
    overrides = sys.argv[1:]
    rows = []
    for name, env in PATHS.items():
        with tempfile.TemporaryDirectory() as out:
            args = [f"output_dir={out}", "eval_every=1", *overrides]
            done = subprocess.run(
                [sys.executable, "-c", ONE_RUN, *args],
                env={**os.environ, **env},
                capture_output=True,
                text=True,
                check=False,
            )
        line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT ")), None)
        if line is None:
            raise SystemExit(f"{name}: the run failed:\n{done.stderr[-3000:]}")
        rows.append((name, json.loads(line[len("RESULT ") :])))
    rounds = max(len(r["accs"]) for _, r in rows)
    print(f"`python benchmarks/kernel_paths.py {' '.join(overrides)}` (baseline {rows[0][1]['baseline']:.3f})\n")
    print("| path | kernels | threads | " + " | ".join(f"r{i + 1}" for i in range(rounds)) + " |")
    print("|---|---|---|" + "---|" * rounds)
    for name, r in rows:
        accs = " | ".join(f"{a:.3f}" for a in r["accs"])
        print(f"| {name} | {r['kernels']} | {r['threads']} | {accs} |")


if __name__ == "__main__":
    main()
