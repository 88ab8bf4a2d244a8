"""The object-store bytes each Ray node holds while a run goes on, and a run of an on-disk data set to measure them on
(issue 45, "data where it is used"; ``tests/integration/test_data_by_path.py``, ``benchmarks/data_by_path.py``).

Each raylet answers ``GetNodeStats`` with its plasma store's bytes in use (``store_stats.object_store_bytes_used``,
what ``ray memory --stats-only`` sums), without the dashboard. ``watch_object_stores`` runs this file as a second
driver beside the run, which asks every alive node a few times a second and keeps each node's peak in a JSON file
(by node address), until told to stop.

``make_on_disk_data`` writes a natural partition as ``.npy`` files (``rayfl/data/on_disk.py``): uint8 images, client
``k``'s rows together, plus a small test set. ``on_disk_experiment`` is a short Ray run of it whose hosts train only
a few batches per client, so a run's time is start-up more than training.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import yaml

POLL_PERIOD_S = 0.2
IMAGE_SHAPE = (3, 32, 32)


def make_on_disk_data(folder: Path, num_clients: int, rows_per_client: int, num_test: int = 200) -> dict[str, str]:
    """A natural partition in ``folder`` (the ``natural_dataset`` factory's kwargs, paths as strings); seeded."""
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(45)
    n = num_clients * rows_per_client
    paths = {k: str(folder / f"{k}.npy") for k in ("x", "y", "client_ids", "x_test", "y_test")}
    x = np.lib.format.open_memmap(paths["x"], mode="w+", dtype=np.uint8, shape=(n, *IMAGE_SHAPE))
    for lo in range(0, n, 4096):  # written in chunks: the set may be larger than the memory one wants to use
        x[lo : lo + 4096] = rng.integers(0, 256, size=(min(4096, n - lo), *IMAGE_SHAPE), dtype=np.uint8)
    x.flush()
    del x
    np.save(paths["y"], rng.integers(0, 10, size=n, dtype=np.int64))
    np.save(paths["client_ids"], np.repeat(np.arange(num_clients, dtype=np.int64), rows_per_client))
    np.save(paths["x_test"], rng.integers(0, 256, size=(num_test, *IMAGE_SHAPE), dtype=np.uint8))
    np.save(paths["y_test"], rng.integers(0, 10, size=num_test, dtype=np.int64))
    return paths


def on_disk_experiment(path: Path, data: Mapping[str, str], **changes: Any) -> Path:
    """A 3-round Ray run of the on-disk set ``data``: two 0.5-CPU hosts, four clients a round, 2 batches each."""
    exp: dict[str, Any] = {
        "name": "data-by-path",
        "seed": 0,
        "rounds": 3,
        "clients_per_round": 4,
        "eval_every": 1,
        "data": {
            "name": "custom",
            "factory": "rayfl.data.on_disk:natural_dataset",
            "kwargs": {**data, "num_classes": 10},
        },
        "model": {"name": "cnn", "channels": [4, 8]},
        "train": {"lr": 0.05, "batch_size": 8, "max_steps": 2, "eval_batch_size": 200},
        "backend": {"kind": "ray", "num_hosts": 2, "num_shards": 1, "torch_threads": 1, "cpus_per_host": 0.5},
        **changes,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"# rayfl run {path}\n" + yaml.safe_dump(exp, sort_keys=False))
    return path


@contextlib.contextmanager
def watch_object_stores(address: str, env: Mapping[str, str], out: Path) -> Iterator[Path]:
    """While the ``with`` body runs, the peak object-store bytes of every node of the cluster at ``address``, kept in
    ``out`` as ``{node address: bytes}`` (read it after the block). The watcher is connected before the body
    starts."""
    stop = out.with_suffix(".stop")
    ready = out.with_suffix(".ready")
    for f in (out, stop, ready):
        f.unlink(missing_ok=True)
    watcher = subprocess.Popen(
        [sys.executable, __file__, address, str(out), str(stop), str(ready)],
        env=dict(env),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            if watcher.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError("the object-store watcher did not start")
            time.sleep(0.1)
        yield out
    finally:
        stop.touch()
        try:
            watcher.wait(timeout=60)
        except subprocess.TimeoutExpired:
            watcher.kill()
            watcher.wait()
    if watcher.returncode != 0:
        said = watcher.stderr.read() if watcher.stderr else ""
        raise RuntimeError(f"the object-store watcher failed: {said[-2000:]}")


def read_peaks(out: Path) -> dict[str, int]:
    """The peaks ``watch_object_stores`` kept, by node address."""
    return {str(k): int(v) for k, v in json.loads(out.read_text()).items()}


def _watch(address: str, out: Path, stop: Path, ready: Path) -> None:
    import ray
    from ray._private.internal_api import node_stats

    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    raylets = {n["NodeManagerAddress"]: n["NodeManagerPort"] for n in ray.nodes() if n.get("Alive")}
    peaks = dict.fromkeys(raylets, 0)

    def sample() -> None:
        for ip, port in raylets.items():
            with contextlib.suppress(Exception):  # a node busy or gone this instant: the next sample counts
                used = node_stats(ip, port, include_memory_info=False).store_stats.object_store_bytes_used
                peaks[ip] = max(peaks[ip], int(used))

    sample()
    ready.touch()
    while not stop.exists():
        sample()
        time.sleep(POLL_PERIOD_S)
    sample()
    out.write_text(json.dumps(peaks))
    ray.shutdown()


if __name__ == "__main__":
    _watch(sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4]))
