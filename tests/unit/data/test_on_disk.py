"""A natural partition of 1,000,000 clients on disk: memory-mapped, indexed once, the index cached beside the data."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from rayfl.config.sections import DataConfig
from rayfl.data import build_federated_dataset, partition
from rayfl.data.federated import IndexedRows
from rayfl.data.on_disk import client_index

NUM_CLIENTS = 1_000_000


def _write(folder: Path, ids: np.ndarray) -> dict[str, str]:
    n = len(ids)
    rng = np.random.default_rng(0)
    paths = {key: str(folder / f"{key}.npy") for key in ("x", "y", "client_ids", "x_test", "y_test")}
    np.save(paths["x"], np.arange(n, dtype=np.uint32).view(np.uint8).reshape(n, 1, 2, 2))  # row r's bytes encode r
    np.save(paths["y"], (np.arange(n) % 10).astype(np.int64))
    np.save(paths["client_ids"], ids)
    np.save(paths["x_test"], rng.integers(0, 256, (20, 1, 2, 2), dtype=np.uint8))
    np.save(paths["y_test"], rng.integers(0, 10, 20).astype(np.int64))
    return paths


def test_a_million_clients_from_disk_through_a_custom_factory(tmp_path: Path) -> None:
    """Two rows per client, sorted by client id (as a large data set is written): every client's rows are its own,
    read from the maps; the index is written beside the ids, read back by the next load and rebuilt when the file
    changes."""
    ids = np.repeat(np.arange(NUM_CLIENTS, dtype=np.int64) * 7 + 3, 2)
    paths = _write(tmp_path, ids)
    cfg = DataConfig(name="custom", factory="rayfl.data.on_disk:natural_dataset", kwargs={**paths, "num_classes": 10})
    ds = build_federated_dataset(cfg, seed=0)
    assert ds.num_clients == NUM_CLIENTS and isinstance(ds.x, IndexedRows) and isinstance(ds.y, IndexedRows)
    order, offsets, distinct = client_index(Path(paths["client_ids"]))
    assert order is None and np.array_equal(distinct, ids[::2])
    for c in (0, 1, NUM_CLIENTS // 2, NUM_CLIENTS - 1):
        x, y = ds.client_train(c)
        rows = np.ascontiguousarray(x).reshape(len(x), 4).view(np.uint32).ravel()
        expected = np.array([2 * c, 2 * c + 1])
        assert np.array_equal(rows, expected) and np.array_equal(y, expected % 10)
    cache = Path(paths["client_ids"] + ".client-index.npz")
    written = cache.stat().st_mtime_ns
    again = client_index(Path(paths["client_ids"]))
    assert cache.stat().st_mtime_ns == written and np.array_equal(again[1], offsets)
    os.utime(paths["client_ids"], ns=(written + 10**9, written + 10**9))  # the data changed: indexed again
    client_index(Path(paths["client_ids"]))
    assert cache.stat().st_mtime_ns != written


def test_grouped_rows_need_no_order_and_match_the_natural_partition(tmp_path: Path) -> None:
    """Rows grouped by client in any id order need no order either; shuffled rows get the order ``partition.natural``
    gives (clients by first appearance, rows in file order)."""
    ids = np.array([5, 5, 2, 9, 9, 9, 4], dtype=np.int64)
    order, offsets, distinct = client_index(Path(_write(tmp_path, ids)["client_ids"]))
    assert order is None and offsets.tolist() == [0, 2, 3, 6, 7] and distinct.tolist() == [5, 2, 9, 4]
    shuffled = np.array([5, 2, 5, 9, 4, 9, 2], dtype=np.int64)
    (tmp_path / "b").mkdir()
    order, offsets, distinct = client_index(Path(_write(tmp_path / "b", shuffled)["client_ids"]))
    assert order is not None and distinct.tolist() == [5, 2, 9, 4]
    parts = partition.natural(shuffled)
    assert [order[offsets[k] : offsets[k + 1]].tolist() for k in range(len(parts))] == [p.tolist() for p in parts]
