"""Opening a natural partition on disk (``rayfl.data.on_disk``): the client index built (cold) and read from its cache
(warm), for a client-id column sorted by id and for one whose rows are shuffled, and the index's bytes per client.

``python benchmarks/on_disk_index.py --clients 1000000 --rows-per-client 2`` (the samples are 4-byte stand-ins: what is
timed is the id column and the index, never the samples, which stay memory-mapped).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np

from rayfl.data.on_disk import natural_dataset


def open_times(folder: Path, ids: np.ndarray) -> dict[str, float]:
    n = len(ids)
    paths = {key: str(folder / f"{key}.npy") for key in ("x", "y", "client_ids", "x_test", "y_test")}
    np.save(paths["x"], np.zeros((n, 1, 2, 2), dtype=np.uint8))
    np.save(paths["y"], np.zeros(n, dtype=np.int64))
    np.save(paths["client_ids"], ids)
    np.save(paths["x_test"], np.zeros((10, 1, 2, 2), dtype=np.uint8))
    np.save(paths["y_test"], np.zeros(10, dtype=np.int64))
    out = {}
    for label in ("cold_s", "warm_s"):
        began = time.perf_counter()
        ds = natural_dataset(num_classes=10, **paths)
        out[label] = time.perf_counter() - began
    index = Path(paths["client_ids"] + ".client-index.npz")
    out["index_bytes_per_client"] = index.stat().st_size / ds.num_clients
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--clients", type=int, default=1_000_000)
    parser.add_argument("--rows-per-client", type=int, default=2)
    args = parser.parse_args()
    ids = np.repeat(np.arange(args.clients, dtype=np.int64), args.rows_per_client)
    shuffled = ids[np.random.default_rng(0).permutation(len(ids))]
    for name, column in (("sorted", ids), ("shuffled", shuffled)):
        with tempfile.TemporaryDirectory(prefix="rayfl-on-disk-") as folder:
            figures = open_times(Path(folder), column)
        print(
            f"{args.clients:,} clients, {len(column):,} rows, {name}: cold {figures['cold_s']:.2f} s, warm "
            f"{figures['warm_s']:.2f} s, index {figures['index_bytes_per_client']:.1f} bytes per client"
        )


if __name__ == "__main__":
    main()
