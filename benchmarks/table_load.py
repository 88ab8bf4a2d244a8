"""Set-up time of the table sources (``rayfl/data/table.py``) as rows and clients grow: one Parquet file and one Arrow
IPC file of ``--rows`` rows (16 uint8 pixel values as a fixed-size list, a label in 0-9, a client id out of
``--clients``, interleaved), loaded with every partitioner into ``--clients`` clients.

Each load runs in a fresh process (``python -c``), so the figures include reading the file but not imports that an
earlier load paid (torch, pyarrow, which ``rayfl.core.rng`` and the reader import once per run). Prints a markdown
table: load seconds (``build_federated_dataset`` alone) and the process's peak RSS.

``python benchmarks/table_load.py --rows 1000000 --clients 10000``
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

_CHILD = """
import json, resource, sys, time
from rayfl.config.sections import DataConfig
from rayfl.data import build_federated_dataset
import rayfl.core.rng, pyarrow.parquet  # imports paid before the clock starts
kw = json.loads(sys.argv[1])
began = time.perf_counter()
ds = build_federated_dataset(DataConfig(**kw), seed=0)
took = time.perf_counter() - began
print(json.dumps({"load_s": took, "clients": ds.num_clients, "rows": int(ds.offsets[-1]),
                  "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def write(folder: Path, rows: int, clients: int) -> tuple[Path, Path]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = np.random.default_rng(0)
    pixels = pa.FixedSizeListArray.from_arrays(pa.array(rng.integers(0, 256, size=rows * 16, dtype=np.uint8)), 16)
    table = pa.table({"pixels": pixels, "label": rng.integers(0, 10, size=rows),
                      "client": rng.integers(0, clients, size=rows)})  # fmt: skip
    parquet, arrow = folder / "t.parquet", folder / "t.arrow"
    pq.write_table(table, parquet)
    with pa.OSFile(str(arrow), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    return parquet, arrow


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--clients", type=int, default=10_000)
    ns = parser.parse_args()
    print(f"{ns.rows:,} rows, {ns.clients:,} clients\n")
    print("| file | partition | load s | peak RSS MiB | clients |\n|---|---|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for path in write(Path(tmp), ns.rows, ns.clients):
            for partition in ("natural", "iid", "dirichlet", "shards", "pathological", "size_skew"):
                kw = {"name": "parquet", "path": str(path), "input_columns": ["pixels"], "input_shape": [1, 4, 4],
                      "partition": partition, "num_clients": ns.clients, "min_samples": 1, "test_fraction": 0.05,
                      "client_column": "client" if partition == "natural" else ""}  # fmt: skip
                done = subprocess.run([sys.executable, "-c", _CHILD, json.dumps(kw)], capture_output=True, text=True,
                                      check=False)  # fmt: skip
                if done.returncode != 0:
                    print(f"| {path.suffix} | {partition} | failed: {done.stderr.strip().splitlines()[-1]} | | |")
                    continue
                got = json.loads(done.stdout.strip().splitlines()[-1])
                print(f"| {path.suffix} | {partition} | {got['load_s']:.2f} | {got['peak_mib']:.0f} | "
                      f"{got['clients']:,} |")  # fmt: skip


if __name__ == "__main__":
    main()
