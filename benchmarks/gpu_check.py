"""The GPU check (issue 45, item 7): does the GPU path run, how fast, in how much memory, and with which records.

On a machine with CUDA it

1. runs the GPU tests (``pytest tests/integration/test_gpu.py``) and prints their summary line;
2. runs a short paper setting (``experiments/paper/cpu/setting3.yaml``: model search with in-place distillation on
   a ResNet34 at 1/16 width, cut to ``--rounds`` rounds of ``--clients`` clients of at most ``--samples`` digits)
   twice on the in-process backend, once with its one host and the server's distillation on the GPU
   (``backend.gpus_per_host=1 algorithm.distill.device=cuda``) and once on the CPU, each in a fresh process;
3. prints one table: where it ran, median wall seconds per round, peak GPU memory (``torch.cuda.
   max_memory_allocated`` in the run's process: the host and the server share it on the in-process backend) and
   whether the records (``rounds.csv``: losses, accuracy, clients, bytes) equal the CPU run's, bit for bit.

Without CUDA the first line says that no GPU is available; the GPU tests still run (and skip), the CPU run still
runs, and the table marks the GPU row "not run". ``--out FILE`` writes the same text to a file as well (e.g.
``benchmarks/results/gpu_check_h200.txt``, to commit).

Cost: at the defaults (3 rounds of 4 clients of 200 digits) the whole check took 261 s without a GPU on the
development machine (2 cores shared with other work, load about 12, under ``nice``): 48 s for the GPU tests to skip
(imports) and 40 s a round for the CPU run on its one torch thread. A GPU machine's idle cores run the CPU half
several times faster and the GPU half adds a faster run, so the check should fit five minutes there; this is an
estimate until it has run on one, and the last line says when the total went past 300 s (then lower ``--rounds`` or
``--samples``). The setting's ``server_time: measured`` is overridden to ``none`` so that the records hold no
wall-clock time, and the learning-rate steps are dropped (the file's steps lie past a short run's end).

``python benchmarks/gpu_check.py [--rounds 3] [--clients 4] [--samples 200] [--out FILE]``
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SETTING = ROOT / "experiments" / "paper" / "cpu" / "setting3.yaml"
GPU_TESTS = "tests/integration/test_gpu.py"
# the rounds.csv columns compared between the runs: what training and evaluation computed (times are left out)
METRICS = ("train_loss", "test_loss", "test_acc", "clients_run", "bytes_down", "bytes_up")
NOT_RUN = "not run"
LIMIT_S = 300.0  # the check's budget on a GPU machine (issue 45)


def overrides(device: str, rounds: int, clients: int, samples: int, out_dir: str) -> list[str]:
    """The ``key=value`` overrides of the setting for one run on ``device`` (``cpu`` or ``cuda``)."""
    on_gpu = device == "cuda"
    return [
        f"rounds={rounds}",
        f"clients_per_round={clients}",
        "eval_every=1",
        f"output_dir={out_dir}",
        f"data.num_clients={clients}",
        f"data.max_samples_per_client={samples}",
        "train.lr_schedule=constant",
        "train.lr_decay_rounds=[]",
        "system.server_time=none",
        "backend.kind=local",
        "backend.num_hosts=1",
        f"backend.gpus_per_host={1 if on_gpu else 0}",
        f"algorithm.distill.device={device}",
    ]


def point(device: str, rounds: int, clients: int, samples: int, out_dir: str) -> dict[str, Any]:
    """One run in this process: median wall seconds per round, peak GPU memory and the run's directory."""
    import torch

    from rayfl.engine.driver import run_experiment
    from rayfl.experiment.loader import load_config

    cfg = load_config(SETTING, overrides(device, rounds, clients, samples, out_dir))
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    result = run_experiment(cfg, write=True)
    peak = torch.cuda.max_memory_allocated() / 2**20 if device == "cuda" else None
    return {
        "round_s": statistics.median(r.round_wall_s for r in result.records),
        "peak_gpu_mib": peak,
        "run_dir": str(result.run_dir),
    }


def run_point(device: str, ns: argparse.Namespace, out_dir: str) -> dict[str, Any]:
    """``point`` in a fresh process (a clean peak and a clean start); its last output line is the JSON result."""
    args = [sys.executable, __file__, "--point", device, "--rounds", str(ns.rounds), "--clients", str(ns.clients)]
    args += ["--samples", str(ns.samples), "--run-root", out_dir]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the {device} run failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def gpu_tests() -> str:
    """Run the GPU tests; their pytest summary line (e.g. ``3 passed in 41.2s`` or ``3 skipped in 3.0s``)."""
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", GPU_TESTS]
    done = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, check=False)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    summary = lines[-1].strip("= ") if lines else "no output"
    return summary if done.returncode in (0, 5) else f"FAILED (exit {done.returncode}): {summary}"


def records(run_dir: str) -> list[dict[str, str]]:
    with open(Path(run_dir) / "rounds.csv", newline="") as f:
        return [{k: row[k] for k in METRICS} for row in csv.DictReader(f)]


def compare(reference: list[dict[str, str]], other: list[dict[str, str]]) -> str:
    """``equal`` when every compared value is the same text (the CSV holds the floats' exact repr), else how far the
    floats are apart."""
    if reference == other:
        return "equal"
    if len(reference) != len(other):
        return f"differ ({len(other)} rounds against {len(reference)})"
    gap = 0.0
    for a, b in zip(reference, other, strict=True):
        for key in METRICS:
            x, y = float(a[key]), float(b[key])
            if x != y and not (math.isnan(x) and math.isnan(y)):
                gap = max(gap, abs(x - y) / max(abs(x), 1e-12))
    return f"differ (largest relative gap {gap:.2g})"


def _cell(value: float | None, digits: int) -> str:
    return NOT_RUN if value is None else f"{value:.{digits}f}"


def table(cpu: dict[str, Any], gpu: dict[str, Any] | None) -> list[str]:
    rows = ["| run | device | s per round (median) | peak GPU MiB | records equal to the CPU run |"]
    rows.append("| --- | --- | --- | --- | --- |")
    rows.append(f"| in-process, 1 host | cpu | {cpu['round_s']:.3f} | - | (reference) |")
    if gpu is None:
        rows.append(f"| in-process, 1 host | cuda | {NOT_RUN} | {NOT_RUN} | {NOT_RUN} |")
    else:
        same = compare(records(cpu["run_dir"]), records(gpu["run_dir"]))
        rows.append(f"| in-process, 1 host | cuda | {gpu['round_s']:.3f} | {_cell(gpu['peak_gpu_mib'], 1)} | {same} |")
    return rows


def device_line() -> tuple[bool, str]:
    """Whether CUDA works here, and the report's first line saying so."""
    import torch

    if not torch.cuda.is_available():
        return False, "no GPU available (torch.cuda.is_available() is False): the GPU rows below are not run"
    props = torch.cuda.get_device_properties(0)
    memory_gib = props.total_memory / 2**30
    return True, f"GPU: {props.name}, {memory_gib:.1f} GiB, torch {torch.__version__} (CUDA {torch.version.cuda})"


def check(ns: argparse.Namespace) -> list[str]:
    began = time.perf_counter()
    has_gpu, first = device_line()
    lines = [first, f"GPU tests ({GPU_TESTS}): {gpu_tests()}"]
    lines.append(
        f"setting: {SETTING.relative_to(ROOT)}, {ns.rounds} rounds of {ns.clients} clients of at most "
        f"{ns.samples} samples, in-process backend"
    )
    with tempfile.TemporaryDirectory() as out_dir:
        cpu = run_point("cpu", ns, out_dir)
        gpu = run_point("cuda", ns, out_dir) if has_gpu else None
        lines += table(cpu, gpu)
    total_s = time.perf_counter() - began
    over = f" (over the {LIMIT_S:.0f} s target)" if total_s > LIMIT_S else ""
    lines.append(f"total wall seconds: {total_s:.1f}{over}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--samples", type=int, default=200, help="at most this many training digits per client")
    parser.add_argument("--out", type=Path, default=None, help="also write the report to this file")
    parser.add_argument("--point", choices=["cpu", "cuda"], default=None, help=argparse.SUPPRESS)
    parser.add_argument("--run-root", default="", help=argparse.SUPPRESS)
    ns = parser.parse_args()
    if ns.point:
        print(json.dumps(point(ns.point, ns.rounds, ns.clients, ns.samples, ns.run_root)))
        return
    lines = check(ns)
    print("\n".join(lines))
    if ns.out is not None:
        ns.out.parent.mkdir(parents=True, exist_ok=True)
        ns.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
