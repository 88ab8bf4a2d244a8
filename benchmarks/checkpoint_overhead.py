"""Checkpoint overhead on the embedded default run (``rayfl run`` with no file), shortened to ``--rounds`` rounds.

The default run (FedAvg, character LSTM on Shakespeare, 10 clients per round, Ray backend) runs twice: with a
checkpoint after every round (``checkpoint.every=1``, the worst case) and with none (``checkpoint.every=0``), in
alternating order over ``--repeats`` pairs. Per run it reports:

* the wall seconds per round: differences of consecutive ``wall_time_s`` after the first round (round ``r``'s
  difference includes the checkpoint written after round ``r - 1``, and evaluation every second round);
* the checkpoint's write seconds and bytes (``checkpoint_s``, ``checkpoint_bytes`` of the records).

Two overhead figures:

* ``within``: in the checkpointed runs, the summed write seconds over the summed round seconds (both measured in the
  same rounds, so a machine shared with other work inflates both alike), at a checkpoint every round and scaled to
  the default ``checkpoint.every`` (one checkpoint per ``every`` rounds);
* ``between``: the difference of the mean round seconds of the two kinds of run, relative to the run without
  checkpoints (sensitive to other load on the machine: take it with care on a shared machine).

``PYTHONPATH=$PWD python benchmarks/checkpoint_overhead.py --rounds 10 --repeats 1`` (the data cache must hold the
default Shakespeare set: ``rayfl data prepare shakespeare``).
"""

from __future__ import annotations

import argparse
import tempfile
from importlib import resources
from pathlib import Path

import numpy as np

from rayfl.config import CheckpointConfig
from rayfl.config_loader import load_config
from rayfl.engine.driver import run_experiment


def run_once(every: int, rounds: int, out: Path, backend: str) -> dict[str, float]:
    overrides = [f"rounds={rounds}", f"output_dir={out}", f"backend.kind={backend}", f"checkpoint.every={every}"]
    with resources.as_file(resources.files("rayfl.configs") / "default.yaml") as default:
        cfg = load_config(default, overrides)
    default_every = CheckpointConfig().every
    records = run_experiment(cfg).records
    wall = np.array([r.wall_time_s for r in records])
    per_round = np.diff(wall)  # rounds 1.. (round 0 holds start-up work: JIT, first Ray calls)
    written = [r for r in records if r.checkpoint_bytes > 0]
    return {
        "every": every,
        "default_every": default_every,
        "round_s": float(per_round.mean()),
        "rounds_s_sum": float(per_round.sum()),
        "checkpoint_s_sum": float(sum(r.checkpoint_s for r in written[:-1])),  # those inside the measured span
        "checkpoint_s_mean": float(np.mean([r.checkpoint_s for r in written])) if written else float("nan"),
        "checkpoint_bytes": float(written[-1].checkpoint_bytes) if written else 0.0,
        "checkpoints": len(written),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=1, help="pairs of runs (with, without), alternating order")
    parser.add_argument("--backend", choices=["ray", "local"], default="ray")
    args = parser.parse_args()
    with_ckpt: list[dict[str, float]] = []
    without: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory(prefix="rayfl-ckpt-bench-") as tmp:
        for k in range(args.repeats):
            order = (1, 0) if k % 2 == 0 else (0, 1)
            for every in order:
                result = run_once(every, args.rounds, Path(tmp) / f"{k}-{every}", args.backend)
                (with_ckpt if every else without).append(result)
                print(
                    f"run {k} every={every}: {result['round_s']:.3f} s/round, {result['checkpoints']} checkpoints, "
                    f"{result['checkpoint_s_mean']:.4f} s and {result['checkpoint_bytes'] / 2**20:.2f} MiB each",
                    flush=True,
                )
    within = sum(r["checkpoint_s_sum"] for r in with_ckpt) / sum(r["rounds_s_sum"] for r in with_ckpt)
    default_every = int(with_ckpt[0]["default_every"])
    base = float(np.mean([r["round_s"] for r in without]))
    between = float(np.mean([r["round_s"] for r in with_ckpt])) / base - 1.0
    print()
    print("| figure | value |\n|---|---|")
    print(f"| wall s/round, no checkpoints | {base:.3f} |")
    print(f"| wall s/round, a checkpoint every round | {np.mean([r['round_s'] for r in with_ckpt]):.3f} |")
    print(f"| checkpoint size | {with_ckpt[0]['checkpoint_bytes'] / 2**20:.2f} MiB |")
    print(f"| checkpoint write time (mean) | {np.mean([r['checkpoint_s_mean'] for r in with_ckpt]):.4f} s |")
    print(f"| overhead within runs, every round | {100 * within:.2f} % |")
    print(f"| overhead within runs, every {default_every} rounds (default) | {100 * within / default_every:.2f} % |")
    print(f"| overhead between runs, every round (load-sensitive) | {100 * between:.2f} % |")


if __name__ == "__main__":
    main()
