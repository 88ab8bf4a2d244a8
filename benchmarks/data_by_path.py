"""Object-store bytes per node with the data set through the object store and by path (issue 45, item 2).

Set-up: the emulated cluster of ``tests/emulated_cluster.py`` (needs Linux and root): a head reserved for the driver
(0 CPUs) and two 1-CPU worker nodes, each with its own IP and its own ``/tmp``, every store capped at 100 MiB. An
on-disk natural partition (``rayfl/data/on_disk.py``: ``--clients`` clients of ``--rows-per-client`` 3x32x32 uint8
images, 48 MiB by default) is written to the storage both workers mount at the same path, as NFS would be. One
3-round FedAvg run (two 0.5-CPU hosts, four clients a round, two batches each: ``tests/object_store_bytes.py``) is
made with ``data.ship: object_store`` (what every run did before) and one with ``data.ship: path``; meanwhile a second
driver asks every raylet for its plasma store's bytes in use (``GetNodeStats``) five times a second and keeps each
node's peak. Prints the peak per node for both runs, and whether their records are the same bits.

Run (as root, from the repository root): ``PYTHONPATH=. python benchmarks/data_by_path.py [--clients 8]
[--rows-per-client 2048] [--out benchmarks/results/data_by_path.json]``. A set larger than a store (100 MiB) cannot be
run through the object store at all without spilling, which is the limit by-path shipping lifts.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
import time
from pathlib import Path

from tests.emulated_cluster import emulated_cluster, leftovers, unavailable
from tests.local_cluster import BIN
from tests.object_store_bytes import make_on_disk_data, on_disk_experiment, read_peaks, watch_object_stores
from tests.resume_cases import assert_same_run

MODES = ("object_store", "path")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--rows-per-client", type=int, default=2048)
    parser.add_argument("--out", type=Path, default=None, help="write the figures here as JSON")
    args = parser.parse_args()
    reason = unavailable()
    if reason is not None:
        raise SystemExit(reason)
    with (
        tempfile.TemporaryDirectory(prefix="rayfl-data-by-path-") as tmp,
        emulated_cluster(workers=2, worker_cpus=1, head_cpus=0) as cluster,
    ):
        data = make_on_disk_data(cluster.shared_dir / "data", args.clients, args.rows_per_client)
        data_bytes = Path(data["x"]).stat().st_size
        config = on_disk_experiment(Path(tmp) / "experiment.yaml", data)
        peaks, wall_s, run_dirs = {}, {}, {}
        for ship in MODES:
            out = Path(tmp) / ship
            argv = [str(BIN / "rayfl"), "run", str(config), f"backend.address={cluster.address}",
                    f"output_dir={out}", f"data.ship={ship}"]  # fmt: skip
            with watch_object_stores(cluster.address, cluster.env, Path(tmp) / f"{ship}.json") as watched:
                began = time.perf_counter()
                run = subprocess.run(argv, env=cluster.env, capture_output=True, text=True, timeout=600, check=False)
                wall_s[ship] = time.perf_counter() - began
            if run.returncode != 0:
                raise SystemExit(f"data.ship={ship} failed:\n{run.stderr[-4000:]}")
            peaks[ship] = read_peaks(watched)
            (run_dirs[ship],) = [p for p in out.iterdir() if p.is_dir()]
        try:
            assert_same_run(run_dirs["object_store"], run_dirs["path"])
            same = True
        except AssertionError:
            same = False
        roles = {cluster.head_ip: "head (driver, 0 CPUs)"}
        roles.update({w.ip: f"worker {w.index} (1 CPU, a host)" for w in cluster.workers})
    assert leftovers(cluster) == []
    mib = 2.0**20
    print(f"data set: {args.clients} clients x {args.rows_per_client} images, x.npy {data_bytes / mib:.1f} MiB")
    print(f"{'node':<16}{'role':<26}{'object_store MiB':>18}{'path MiB':>10}")
    for ip, role in roles.items():
        before, after = (peaks[ship].get(ip, 0) / mib for ship in MODES)
        print(f"{ip:<16}{role:<26}{before:>18.2f}{after:>10.2f}")
    print(f"run wall s: object_store {wall_s['object_store']:.1f}, path {wall_s['path']:.1f}; same records: {same}")
    if args.out is not None:
        figures = {
            "data_bytes": data_bytes,
            "clients": args.clients,
            "rows_per_client": args.rows_per_client,
            "peak_object_store_bytes": {ship: {roles[ip]: b for ip, b in peaks[ship].items()} for ship in MODES},
            "run_wall_s": wall_s,
            "same_records": same,
        }
        args.out.write_text(json.dumps(figures, indent=2) + "\n")


if __name__ == "__main__":
    main()
