"""The driver's memory at checkpoint time with client state on, for 10,000 clients on Ray (issue 32, finding 3).

Workload: ``N`` synthetic clients (2 images each), all of them in one round, ``train.noop`` (the clients send back the
weights they got, so the run costs no training) and ``eval_all_devices`` (every client keeps its last upload: one
client memory of the CNN's 5,418 float32 weights, 21.7 KB, per client), one checkpoint after the round. The driver's
RSS and PSS (``/proc/self/status``, ``/proc/self/smaps_rollup``) are sampled every 5 ms by a thread of this process
from the start of the checkpoint (the snapshot taken, ``take_snapshot``) to the end of its state file's writing
(``CheckpointStore.write_state``), and printed beside their values just before it: ``before_mib`` (what the driver
holds between rounds), ``peak_mib`` and ``peak - before``. Also printed: the checkpoint's bytes and seconds, the run's
wall seconds.

Run: ``PYTHONPATH=$PWD python benchmarks/client_state_checkpoint.py [--clients 10000] [--hosts 2] [--out DIR]``
"""

from __future__ import annotations

import argparse
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

_MIB = 1024 * 1024


def _rss_pss() -> tuple[int, int]:
    """This process's RSS and PSS in bytes."""
    rss = pss = 0
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                rss = int(line.split()[1]) * 1024
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Pss:"):
                pss = int(line.split()[1]) * 1024
    return rss, pss


class _Sampler:
    """Peak RSS and PSS of this process while it runs (a thread sampling every ``period_s``)."""

    def __init__(self, period_s: float = 0.005) -> None:
        self.period_s = period_s
        self.before = _rss_pss()
        self.peak = self.before
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            rss, pss = _rss_pss()
            self.peak = (max(self.peak[0], rss), max(self.peak[1], pss))
            time.sleep(self.period_s)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()
        rss, pss = _rss_pss()
        self.peak = (max(self.peak[0], rss), max(self.peak[1], pss))


def _config(n: int, hosts: int, out: Path) -> Any:
    from rayfl.config.model import CNNConfig
    from rayfl.config.sections import BackendConfig, CheckpointConfig, DataConfig, TrainConfig
    from rayfl.experiment.schema import ExperimentConfig
    from rayfl.fl.methods.fedavg.config import FedAvgConfig

    return ExperimentConfig(
        name="client-state-checkpoint",
        rounds=1,
        clients_per_round=n,
        eval_every=10_000,
        eval_all_devices=True,
        output_dir=str(out),
        data=DataConfig(name="synthetic", partition="iid", num_clients=n, synthetic_samples=2),  # type: ignore[arg-type]
        model=CNNConfig(channels=(16, 32)),
        algorithm=FedAvgConfig(),
        train=TrainConfig(epochs=1, batch_size=32, lr=0.05, optimizer="sgd", noop=True),
        backend=BackendConfig(kind="ray", num_hosts=hosts, num_cpus=hosts),  # type: ignore[arg-type]
        checkpoint=CheckpointConfig(every=1, keep=1),
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=10_000)
    parser.add_argument("--hosts", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="run directory parent (default: a temporary one)")
    args = parser.parse_args()

    from rayfl.engine import driver
    from rayfl.engine.persist.checkpoint import CheckpointStore
    from rayfl.engine.ray.session import shutdown_ray

    samples: list[_Sampler] = []
    written: list[Any] = []
    inner_snapshot, inner_write = driver.take_snapshot, CheckpointStore.write_state

    def snapshot(*a: Any, **k: Any) -> Any:  # the checkpoint starts: sample from here
        samples.append(_Sampler())
        return inner_snapshot(*a, **k)

    def write_state(self: Any, *a: Any, **k: Any) -> Any:
        pending = inner_write(self, *a, **k)
        samples[-1].stop()
        written.append(pending)
        return pending

    driver.take_snapshot = snapshot  # type: ignore[assignment]
    CheckpointStore.write_state = write_state  # type: ignore[method-assign]
    with tempfile.TemporaryDirectory(prefix="rayfl-cs-ckpt-") as tmp:
        out = args.out or Path(tmp)
        began = time.perf_counter()
        try:
            driver.run_experiment(_config(args.clients, args.hosts, out))
        finally:
            shutdown_ray()
        wall = time.perf_counter() - began
    sample, pending = samples[-1], written[-1]
    (rss0, pss0), (rss1, pss1) = sample.before, sample.peak
    print(f"clients {args.clients}, hosts {args.hosts}, run wall {wall:.1f} s")
    print("| driver | before checkpoint MiB | peak during checkpoint MiB | peak - before MiB |")
    print("|---|---|---|---|")
    print(f"| RSS | {rss0 / _MIB:.0f} | {rss1 / _MIB:.0f} | {(rss1 - rss0) / _MIB:.0f} |")
    print(f"| PSS | {pss0 / _MIB:.0f} | {pss1 / _MIB:.0f} | {(pss1 - pss0) / _MIB:.0f} |")
    written_bytes = getattr(pending, "total_bytes", pending.state_bytes)  # client part files included
    print(f"checkpoint: {written_bytes / 1e6:.1f} MB written in {pending.write_s:.2f} s (memories fetched included)")


if __name__ == "__main__":
    main()
