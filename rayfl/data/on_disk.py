"""Natural partitions of large data sets on disk: an index from client id to rows, built once, cached beside the data.

A data set of ``.npy`` files (samples ``x``, labels ``y`` and a client-id column, one entry per row) is opened as memory
maps, so the driver reads no sample. What it needs per client is where the client's rows are: ``client_index`` reads
the client-id column once, vectorised, and writes the answer beside it (``<ids file>.client-index.npz``: the distinct
ids in order of first appearance, the row offsets per client and, when the rows are not grouped by client already,
the client-major row order), which later runs load instead (8 or 16 bytes a client or row, no pass over the column).
The cache belongs to the file's size and modification time; a changed file is indexed again.

``natural_dataset`` is a ``data.name: custom`` factory (``factory: "rayfl.data.on_disk:natural_dataset"``, the paths in
``data.kwargs``): client ``k`` is the ``k``-th distinct id in order of first appearance (``partition.natural``'s
rule), its rows in file order, its images and labels read from the maps when it trains (``IndexedRows``).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import numpy.typing as npt

from rayfl.data.client_names import NumberedNames
from rayfl.data.federated import FederatedDataset, IndexedRows, InputKind

__all__ = ["ClientIndex", "client_index", "natural_dataset"]

log = logging.getLogger(__name__)

ClientIndex = tuple[npt.NDArray[np.int64] | None, npt.NDArray[np.int64], np.ndarray]  # order, offsets, ids


def _build(ids: np.ndarray) -> ClientIndex:
    """The index of a client-id column (see the module docstring), in a few vectorised passes."""
    n = len(ids)
    if n == 0:
        return None, np.zeros(1, dtype=np.int64), ids[:0].copy()
    starts = np.concatenate([[0], np.flatnonzero(ids[1:] != ids[:-1]) + 1]).astype(np.int64)
    run_ids = np.asarray(ids[starts])
    if len(run_ids) == 1 or bool(np.all(run_ids[1:] > run_ids[:-1])):  # sorted by id: grouped, seen without a sort
        return None, np.append(starts, n).astype(np.int64), run_ids
    distinct, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    if len(distinct) == len(run_ids):  # each client's rows are one run: no order to keep
        return None, np.append(starts, n).astype(np.int64), run_ids
    by_first = np.argsort(first, kind="stable")
    rank = np.empty(len(first), dtype=np.int64)
    rank[by_first] = np.arange(len(first), dtype=np.int64)
    owner = rank[inverse.reshape(-1)]
    order = np.argsort(owner, kind="stable").astype(np.int64)  # stable: a client's rows in file order
    offsets = np.concatenate([[0], np.cumsum(np.bincount(owner, minlength=len(first)))]).astype(np.int64)
    return order, offsets, distinct[by_first]


def client_index(ids_path: Path) -> ClientIndex:
    """``(order, offsets, ids)`` of the client-id column in ``ids_path`` (a ``.npy`` file): client ``k`` (id
    ``ids[k]``) owns rows ``order[offsets[k]:offsets[k + 1]]`` (``order`` None: rows ``offsets[k]:offsets[k + 1]``).
    Loaded from the cache beside the file when it matches the file's size and modification time, else built and
    cached (a folder rayfl cannot write to: built on every load)."""
    ids_path = Path(ids_path)
    cache = ids_path.with_name(ids_path.name + ".client-index.npz")
    stat = ids_path.stat()
    stamp = np.array([stat.st_size, stat.st_mtime_ns], dtype=np.int64)
    if cache.exists():
        with np.load(cache, allow_pickle=False) as held:
            if np.array_equal(held["stamp"], stamp):
                order = held["order"] if bool(held["has_order"]) else None
                return order, held["offsets"], held["ids"]
    order, offsets, ids = _build(np.load(ids_path, mmap_mode="r"))
    tmp = cache.with_name(cache.name + f".{os.getpid()}.tmp.npz")
    try:
        np.savez(tmp, stamp=stamp, has_order=np.array(order is not None), order=order if order is not None else
                 np.zeros(0, dtype=np.int64), offsets=offsets, ids=ids)  # fmt: skip
        tmp.replace(cache)  # whole or not at all, whoever reads it meanwhile
    except OSError as err:
        log.warning("client index of %s not cached (%s): it is built again on every load", ids_path, err)
        tmp.unlink(missing_ok=True)
    return order, offsets, ids


def natural_dataset(
    x: str,
    y: str,
    client_ids: str,
    x_test: str,
    y_test: str,
    num_classes: int,
    input_kind: InputKind = "image",
    name: str = "on_disk",
) -> FederatedDataset:
    """One client per distinct id of the ``client_ids`` column (``.npy`` files, one row per sample; the test set as
    its own two files), its rows read from memory maps of ``x`` and ``y`` when it trains (see the module docstring)."""
    order, offsets, ids = client_index(Path(client_ids))
    x_map, y_map = np.load(x, mmap_mode="r"), np.load(y, mmap_mode="r")
    if not len(x_map) == len(y_map) == int(offsets[-1]):
        raise ValueError(
            f"{x}, {y} and {client_ids} must have one row per sample: {len(x_map)}, {len(y_map)}, {int(offsets[-1])}"
        )
    width = max(4, len(str(len(ids) - 1)))
    return FederatedDataset(
        name=name,
        input_kind=input_kind,
        num_classes=num_classes,
        x=IndexedRows(x_map, order),
        y=IndexedRows(y_map, order),
        offsets=offsets,
        x_test=IndexedRows(np.load(x_test, mmap_mode="r")),
        y_test=np.load(y_test),
        client_names=NumberedNames("client", len(ids), width),
        meta={"partition": "natural", "client_index": str(Path(client_ids).name) + ".client-index.npz"},
    )
