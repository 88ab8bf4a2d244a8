"""How a Ray run gives its client hosts a data set whose samples are memory-mapped files (``data.ship``).

Put in the object store as it is, a data set of ``.npy`` maps is copied whole into the store of the driver's node and
of every node whose hosts read it, though a node's clients read only their own rows: the data a run can use is capped
by one node's object store. Shipped by path, each map pickles as its file's name and place
(``rayfl/data/mapped_file.py``) and every host maps the file again on its own node; the store holds the offsets and
whatever is in memory (labels read whole, a test set's labels), and each node's page cache the rows its clients read.
With work-conserving dispatch any host may train any client, so the data is read where it is used rather than
partitioned by node ahead of time.

By path needs every node that may host clients to read the same files: ``auto`` asks each alive node once, at start,
with a zero-CPU task pinned to it (the same size and modification time at the same path; ``MappedFile.problem``) and
falls back to the object store with one log line naming the nodes that cannot; ``path`` refuses the run in one line
instead. A node that joins later, or a file changed during the run, stops the run where the host maps it, in one line
naming the path and the node. The rows, their order and so the records are the same either way.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Literal

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from rayfl.core.errors import ConfigError
from rayfl.data.federated import FederatedDataset, IndexedRows, Rows, RowSubset
from rayfl.data.mapped_file import MappedFile

__all__ = ["PROBE_TIMEOUT_S", "Ship", "by_path", "mapped_files", "ship", "unreadable"]

log = logging.getLogger(__name__)

PROBE_TIMEOUT_S = 60.0
_SAMPLES = ("x", "y", "x_test", "y_test", "x_val", "y_val")  # the data set's fields that may hold mapped rows

Ship = Literal["auto", "object_store", "path"]


def _rows_by_path(rows: Rows | None) -> Rows | None:
    if isinstance(rows, IndexedRows) and rows.file is not None:
        return rows.shipped_by_path()
    if isinstance(rows, RowSubset):  # a validation split of mapped rows (``hold_out_validation``)
        base = _rows_by_path(rows.base)
        return rows if base is rows.base else RowSubset(base, rows.index)  # type: ignore[arg-type]
    return rows


def _files_of(rows: object) -> list[MappedFile]:
    if isinstance(rows, IndexedRows) and rows.file is not None:
        return [rows.file]
    return _files_of(rows.base) if isinstance(rows, RowSubset) else []


def mapped_files(dataset: FederatedDataset) -> list[MappedFile]:
    """The distinct file blocks ``dataset``'s samples are mapped from, in field order."""
    files = [f for name in _SAMPLES for f in _files_of(getattr(dataset, name))]
    return list(dict.fromkeys(files))


def by_path(dataset: FederatedDataset) -> FederatedDataset:
    """``dataset`` with every mapped sample array made to pickle by path; the same rows in the same order."""
    changes: dict[str, Any] = {name: _rows_by_path(getattr(dataset, name)) for name in _SAMPLES}
    return dataclasses.replace(dataset, **changes)


def _problems(files: list[MappedFile]) -> list[str]:
    """On the node it runs on: why each file it cannot map as the driver does cannot be (empty: it can map all)."""
    return [f"{f.path} {p}" for f in files if (p := f.problem()) is not None]


def unreadable(files: list[MappedFile], timeout_s: float = PROBE_TIMEOUT_S) -> dict[str, str]:
    """The alive nodes other than the driver's that cannot map ``files`` as the driver does (or did not answer within
    ``timeout_s``), by address, each with its first reason; empty on a one-node cluster."""
    here = ray.get_runtime_context().get_node_id()
    others = [n for n in ray.nodes() if n.get("Alive") and n["NodeID"] != here]
    if not others or not files:
        return {}
    probe = ray.remote(num_cpus=0, max_retries=0)(_problems)
    pinned = [NodeAffinitySchedulingStrategy(n["NodeID"], soft=False) for n in others]
    refs = {
        probe.options(scheduling_strategy=s).remote(files): n["NodeManagerAddress"]
        for s, n in zip(pinned, others, strict=True)
    }
    ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
    found = {refs[r]: f"did not answer within {timeout_s:.0f} s" for r in refs if r not in ready}
    for ref in ready:
        try:
            problems = ray.get(ref)
        except ray.exceptions.RayError as err:
            problems = [f"the probe failed ({type(err).__name__})"]
        if problems:
            found[refs[ref]] = problems[0]
    return dict(sorted(found.items()))


def ship(dataset: FederatedDataset, mode: Ship) -> FederatedDataset:
    """``dataset`` as the object store should receive it under ``data.ship: mode`` (see the module docstring)."""
    files = mapped_files(dataset)
    if mode == "object_store" or not files:
        return dataset
    blind = unreadable(files)
    if blind:
        where = "; ".join(f"Ray node {node}: {why}" for node, why in blind.items())
        if mode == "path":
            raise ConfigError(
                f"the data set's files cannot be mapped on every node ({where}); put them on storage every node "
                "mounts at the same path, or set data.ship: object_store",
                "data.ship",
            )
        log.warning("data.ship auto: the data set goes through Ray's object store, as not every node sees its "
                    "files (%s)", where)  # fmt: skip
        return dataset
    mib = sum(f.nbytes for f in files) / 2**20
    log.info("data.ship %s: %d mapped file(s), %.1f MiB, shipped by path, mapped by each host on its own node",
             mode, len(files), mib)  # fmt: skip
    return by_path(dataset)
