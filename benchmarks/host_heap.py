"""What a client host's heap keeps after its rounds, and the page faults it pays, per glibc trim threshold.

``rayfl/engine/exec/allocator.py`` fixes glibc's thresholds in every client host so that training buffers stay in the
heap across steps; ``TRIM_THRESHOLD_BYTES`` caps the free memory at the heap's top that is kept. For each model and
each cap (and glibc's own dynamic thresholds, ``untuned``) this runs a ``ClientHost`` in a fresh process (FedAvg on
synthetic 3x32x32 images, one thread): one warm-up round, then ``--rounds - 1`` timed rounds of ``--clients``
clients, and prints the host's RSS and USS after them, its peak RSS, the minor page faults per client update (each a
4 KiB page handed back and faulted in again: load-independent) and the CPU per update (load-dependent).

Run: ``python benchmarks/host_heap.py --models cnn-16-32 cnn resnet18-quarter resnet18 --rounds 2 --clients 2``
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
from typing import Any

MODELS: dict[str, dict[str, Any]] = {
    "cnn-16-32": {"name": "cnn", "channels": (16, 32)},  # scale.py's workload
    "cnn": {"name": "cnn", "channels": (64, 128, 256, 512)},  # the CNN's default widths
    "resnet18-quarter": {"name": "resnet", "widths": (16, 32, 64, 128)},
    "resnet18": {"name": "resnet", "widths": (64, 128, 256, 512)},
}
CAPS = ("untuned", str(128 << 10), str(32 << 20), str(128 << 20), str(512 << 20), str(2 << 30))


def measure(model: str, cap: str, rounds: int, clients: int, batch: int) -> dict[str, float]:
    """One host, in this (fresh) process, with the trim threshold ``cap`` (bytes, or ``untuned``)."""
    import psutil
    import torch

    import rayfl.engine.exec.allocator as allocator

    if cap == "untuned":
        allocator._tuned = True  # the host's tune_allocator then leaves glibc's dynamic thresholds alone
    else:
        allocator.TRIM_THRESHOLD_BYTES = int(cap)
    from rayfl.config.model import CNNConfig, ResNetConfig
    from rayfl.config.sections import BackendConfig, DataConfig, TrainConfig
    from rayfl.core.messages import Assignment, TrainTask
    from rayfl.engine.build import build_setup
    from rayfl.engine.exec.backend import to_numpy
    from rayfl.engine.exec.host import ClientHost
    from rayfl.engine.exec.param_server import plan_shards
    from rayfl.experiment.schema import ExperimentConfig
    from rayfl.fl.methods.fedavg.config import FedAvgConfig
    from rayfl.fl.registry import build_algorithm

    spec = MODELS[model]
    model_cfg: Any = (
        CNNConfig(channels=spec["channels"]) if spec["name"] == "cnn" else ResNetConfig(depth=18, widths=spec["widths"])
    )
    cfg = ExperimentConfig(
        name="host-heap",
        rounds=rounds,
        clients_per_round=clients,
        data=DataConfig(name="synthetic", partition="iid", num_clients=clients * rounds, synthetic_samples=64),
        model=model_cfg,
        algorithm=FedAvgConfig(),
        train=TrainConfig(epochs=1, batch_size=batch, lr=0.05, optimizer="sgd"),
        backend=BackendConfig(kind="local", num_hosts=1, num_cpus=1),
    )
    torch.set_num_threads(1)
    setup = build_setup(cfg)
    host = ClientHost(0, setup.dataset, cfg.model, build_algorithm(cfg.algorithm, cfg.train), cfg.backend, cfg.seed)
    arrays = to_numpy(setup.params)
    shard_of = plan_shards({k: tuple(v.shape) for k, v in setup.params.items()}, 1)
    me = psutil.Process()
    before = me.memory_full_info()

    def run(round_idx: int) -> None:
        ids = range(round_idx * clients, (round_idx + 1) * clients)
        host.run_round(
            [TrainTask(client_id=c, round_idx=round_idx, seed=cfg.seed, lr=0.05, assignment=Assignment()) for c in ids],
            arrays,
            shard_of,
            1,
        )

    run(0)  # warm-up
    faults, cpu = resource.getrusage(resource.RUSAGE_SELF).ru_minflt, time.thread_time()
    for round_idx in range(1, rounds):
        run(round_idx)
    updates = clients * (rounds - 1)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    cpu = time.thread_time() - cpu
    after = me.memory_full_info()
    return {
        "rss_before_mib": before.rss / 2**20,
        "rss_after_mib": after.rss / 2**20,
        "uss_after_mib": after.uss / 2**20,
        "peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "faults_per_update": faults / updates,
        "cpu_ms_per_update": 1000 * cpu / updates,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", choices=sorted(MODELS), default=sorted(MODELS))
    parser.add_argument("--caps", nargs="+", default=list(CAPS), help="trim thresholds in bytes, or untuned")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # internal: one model and cap, JSON out
    args = parser.parse_args()
    if args.one:
        print("HEAP-ROW " + json.dumps(measure(args.one[0], args.one[1], args.rounds, args.clients, args.batch)))
        return
    print("| model | trim cap | RSS after the rounds MiB (before) | USS after MiB | peak RSS MiB | minor faults/update "
          "| CPU ms/update |\n| --- | --- | --- | --- | --- | --- | --- |")  # fmt: skip
    for model in args.models:
        for cap in args.caps:
            cmd = [sys.executable, __file__, "--one", model, cap, "--rounds", str(args.rounds)]
            cmd += ["--clients", str(args.clients), "--batch", str(args.batch)]
            out = subprocess.run(cmd, capture_output=True, text=True, check=False)
            found = [ln for ln in out.stdout.splitlines() if ln.startswith("HEAP-ROW ")]
            if out.returncode != 0 or not found:
                sys.stderr.write(out.stderr[-4000:])
                raise SystemExit(f"{model} at cap {cap} failed (exit {out.returncode})")
            r = json.loads(found[0].removeprefix("HEAP-ROW "))
            label = cap if cap == "untuned" else f"{int(cap) / 2**20:g} MiB"
            print(
                f"| {model} | {label} | {r['rss_after_mib']:.0f} ({r['rss_before_mib']:.0f}) | "
                f"{r['uss_after_mib']:.0f} | {r['peak_rss_mib']:.0f} | {r['faults_per_update']:,.0f} | "
                f"{r['cpu_ms_per_update']:.0f} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
