"""The federated dataset container shared by every loader, partitioner and backend.

All clients' samples live in a few large numpy arrays in client-major order, with an ``offsets`` array marking where
each client's rows start (CSR layout). One ``ray.put`` of the container then places every client's data in the object
store once per run; a host reads its clients' rows as zero-copy, read-only slices. Rows read from memory-mapped files
(``IndexedRows``) may instead travel as the files' paths, which each host maps on its own node (``mapped_file.py``,
``data.ship``).

Sample arrays that can be produced on demand need not be held at all: ``x`` and ``x_test`` may be ``LazyRows``, which
keep only a recipe (a generator's seed, a text and window starts) and make the rows a caller indexes. Such a data set
pickles in a few bytes per sample, so the driver, the object store and every host hold the recipe rather than copies of
the images (``rayfl/data/synthetic.py``, ``rayfl/data/shakespeare.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from rayfl.data.mapped_file import MappedFile, mapped_file, open_mapped

__all__ = [
    "FederatedDataset",
    "IndexedRows",
    "InputKind",
    "LazyRows",
    "RowSubset",
    "Rows",
    "client_major",
    "from_client_arrays",
    "hold_out_client_tests",
    "hold_out_validation",
    "mapped",
]

InputKind = Literal["tokens", "image", "features"]


class LazyRows(ABC):
    """A sample array whose rows are made when indexed: ``rows[i]``, ``rows[lo:hi]`` and ``rows[index_array]`` return
    new numpy arrays equal to what the materialised array would give; ``np.asarray(rows)`` materialises all of them.

    Subclasses give ``shape`` and ``dtype`` and implement ``take`` (rows by position, in the order asked)."""

    shape: tuple[int, ...]
    dtype: np.dtype[Any]

    @abstractmethod
    def take(self, index: npt.NDArray[np.int64]) -> np.ndarray:
        """The rows at positions ``index`` (any order, repeats allowed), ``[len(index), *shape[1:]]``."""

    def __len__(self) -> int:
        return self.shape[0]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __getitem__(self, key: int | slice | npt.NDArray[np.integer[Any]] | list[int]) -> np.ndarray:
        n = len(self)
        if isinstance(key, slice):  # the slice's rows only: an index of every row costs 8 bytes a row per read
            return self.take(np.arange(*key.indices(n), dtype=np.int64))
        if isinstance(key, (int, np.integer)):
            row = int(key) + (n if key < 0 else 0)
            if not 0 <= row < n:
                raise IndexError(f"row {key} out of range for {n} rows")
            out: np.ndarray = self.take(np.array([row], dtype=np.int64))[0]
            return out
        given = np.asarray(key)
        index = np.flatnonzero(given) if given.dtype == np.bool_ else given.astype(np.int64, copy=False)
        if index.ndim != 1:
            raise IndexError("rows are indexed by an int, a slice or a one-dimensional index array")
        if len(index) and (int(index.min()) < -n or int(index.max()) >= n):
            raise IndexError(f"row index out of range for {n} rows")
        return self.take(np.where(index < 0, index + n, index))

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> np.ndarray:
        out = self.take(np.arange(len(self), dtype=np.int64))
        return out if dtype is None else out.astype(dtype, copy=False)


class IndexedRows(LazyRows):
    """Rows ``base[order]`` (``base`` itself without an order), gathered when indexed: a memory-mapped array read in
    client-major order without a gathered copy of it (``client_major``). Pickles as ``base`` and ``order``, ``base``
    as a plain array, so that Ray places a mapped array in its object store out of band, once, as it does any array;
    or, made ``by_path`` (a read-only map of a file block, ``mapped_file.py``), as the file's name and place, so that
    the reader maps the file again on its own node and no object store holds the samples."""

    def __init__(self, base: np.ndarray, order: npt.NDArray[np.int64] | None = None, *, by_path: bool = False) -> None:
        self.file = mapped_file(base)  # read before ``asarray`` drops the map's file name
        if by_path and self.file is None:
            raise ValueError("only a read-only memory map of a file block can be shipped by path")
        self.by_path = by_path
        self.base = np.asarray(base)  # a memmap as a plain array over the same pages (pickle 5 keeps it out of band)
        self.order = None if order is None else np.asarray(order, dtype=np.int64)
        self.shape = (len(self.base) if self.order is None else len(self.order), *self.base.shape[1:])
        self.dtype = self.base.dtype

    def __reduce__(self) -> tuple[Any, ...]:
        if self.by_path and self.file is not None:
            return (_reopened, (self.file, self.order))
        return (IndexedRows, (self.base, self.order))

    def shipped_by_path(self) -> IndexedRows:
        """The same rows, pickled by path (the caller checked that ``file`` is ``problem``-free where they go)."""
        if self.file is None:
            raise ValueError("only a read-only memory map of a file block can be shipped by path")
        rows = object.__new__(IndexedRows)  # not ``copy.copy``: that goes through ``__reduce__``, which drops the file
        rows.__dict__.update(self.__dict__, by_path=True)
        return rows

    def take(self, index: npt.NDArray[np.int64]) -> np.ndarray:
        return np.asarray(self.base[index if self.order is None else self.order[index]])


def _reopened(file: MappedFile, order: npt.NDArray[np.int64] | None) -> IndexedRows:
    """An ``IndexedRows`` pickled by path, mapped again on the reader's node (still by path, if passed on)."""
    return IndexedRows(open_mapped(file), order, by_path=True)


def client_major(x: np.ndarray, order: npt.NDArray[np.int64]) -> Rows:
    """``x[order]``: gathered into a new array when ``x`` is in memory; when it is a memory map (``np.load(...,
    mmap_mode="r")``), an ``IndexedRows`` over the map, so that the process holds the file's pages (shared and
    evictable) rather than an anonymous copy of a large data set."""
    if isinstance(x, np.memmap):
        return IndexedRows(x, order)
    return x[order]


def mapped(x: Rows) -> Rows:
    """``x`` as it is, or a memory map as an ``IndexedRows`` (which pickles out of band; a ``np.memmap`` itself
    pickles its bytes in band, which every Ray reader would copy)."""
    return IndexedRows(x) if isinstance(x, np.memmap) else x


# a sample array: held in full, or made on demand
Rows = np.ndarray | LazyRows


class RowSubset(LazyRows):
    """Rows ``index`` of a ``LazyRows`` (row ``r`` is ``base[index[r]]``), still made on demand: a subset of a recipe
    pickles as the recipe and the index."""

    def __init__(self, base: LazyRows, index: npt.NDArray[np.int64]) -> None:
        self.base, self.index = base, np.asarray(index, dtype=np.int64)
        self.shape = (len(self.index), *base.shape[1:])
        self.dtype = base.dtype

    def take(self, index: npt.NDArray[np.int64]) -> np.ndarray:
        return self.base.take(self.index[index])


def take_rows(rows: Rows, index: npt.NDArray[np.int64]) -> Rows:
    """Rows ``index`` of ``rows``: a numpy array's copy, or a ``RowSubset`` of a ``LazyRows`` (made on demand)."""
    return RowSubset(rows, index) if isinstance(rows, LazyRows) else rows[index]


@dataclass(frozen=True)
class FederatedDataset:
    """Train data of every client plus a test set.

    Attributes:
        name: Short name of the source (``"shakespeare"``, ``"cifar10"`` ...).
        input_kind: ``"tokens"`` (int sequences, e.g. characters), ``"image"`` (uint8 NCHW or float NCHW) or
            ``"features"`` (float32 ``[N, F]``: a table's numeric columns).
        num_classes: Size of the label space (the vocabulary for next-character prediction).
        x, y: Training samples of all clients, client-major; each held in full or made on demand (``LazyRows``: the
            synthetic images, and their labels unless a Dirichlet pool split needed them all).
        offsets: ``int64[num_clients + 1]``; client ``c`` owns rows ``offsets[c]:offsets[c + 1]`` of ``x`` and ``y``.
        x_test, y_test: The test set the global model is evaluated on (for LEAF data: the union of the clients'
            test splits, in client order).
        test_offsets: Per-client rows of the test set when the test set is split by client, else ``None``.
        x_val, y_val: A validation set on the server that no client trains on (``hold_out_validation``), else
            ``None``: what FedorAS's search scores its candidates on.
        client_names: A human-readable id per client (play and role for Shakespeare, writer for FEMNIST), a tuple or
            names made when read (``NumberedNames``).
        meta: Loader facts such as the vocabulary or channel means; JSON-serialisable values only.
    """

    name: str
    input_kind: InputKind
    num_classes: int
    x: Rows
    y: Rows
    offsets: np.ndarray
    x_test: Rows
    y_test: np.ndarray
    test_offsets: np.ndarray | None = None
    client_names: Sequence[str] = ()
    meta: dict[str, object] = field(default_factory=dict)
    x_val: Rows | None = None
    y_val: Rows | None = None

    def __post_init__(self) -> None:
        if self.offsets.ndim != 1 or self.offsets[0] != 0 or self.offsets[-1] != len(self.x):
            raise ValueError("offsets must start at 0 and end at len(x)")
        if np.any(np.diff(self.offsets) < 0):
            raise ValueError("offsets must be non-decreasing")
        if len(self.x) != len(self.y) or len(self.x_test) != len(self.y_test):
            raise ValueError("x and y must have the same number of rows")
        if (self.x_val is None) != (self.y_val is None) or (
            self.x_val is not None and self.y_val is not None and len(self.x_val) != len(self.y_val)
        ):
            raise ValueError("x_val and y_val must both be given, with the same number of rows")

    @property
    def sample_shape(self) -> tuple[int, ...]:
        """The shape of one sample (``x.shape[1:]``)."""
        return tuple(int(d) for d in self.x.shape[1:])

    @property
    def num_clients(self) -> int:
        return len(self.offsets) - 1

    def num_examples(self, client_id: int) -> int:
        return int(self.offsets[client_id + 1] - self.offsets[client_id])

    def client_sizes(self) -> np.ndarray:
        """Number of training samples per client, ``int64[num_clients]``."""
        return np.diff(self.offsets)

    def client_train(self, client_id: int) -> tuple[np.ndarray, np.ndarray]:
        """Zero-copy views of one client's training rows."""
        lo, hi = int(self.offsets[client_id]), int(self.offsets[client_id + 1])
        return self.x[lo:hi], self.y[lo:hi]

    def client_test(self, client_id: int) -> tuple[np.ndarray, np.ndarray]:
        """One client's test rows; only for data whose test set is split by client."""
        if self.test_offsets is None:
            raise ValueError(f"dataset {self.name!r} has no per-client test split")
        lo, hi = int(self.test_offsets[client_id]), int(self.test_offsets[client_id + 1])
        return self.x_test[lo:hi], self.y_test[lo:hi]

    def client_labels(self, client_id: int) -> np.ndarray:
        """Sorted distinct labels in a client's training data (HeteroFL's ``label_split``)."""
        return np.unique(self.client_train(client_id)[1])


def from_client_arrays(
    name: str,
    input_kind: InputKind,
    num_classes: int,
    train: list[tuple[np.ndarray, np.ndarray]],
    x_test: np.ndarray,
    y_test: np.ndarray,
    *,
    test: list[tuple[np.ndarray, np.ndarray]] | None = None,
    client_names: Sequence[str] = (),
    meta: dict[str, object] | None = None,
) -> FederatedDataset:
    """Pack per-client arrays into the CSR container.

    ``test`` gives per-client test splits; when it is passed, ``x_test``/``y_test`` are ignored and the test set is
    their concatenation.
    """
    sizes = np.array([len(x) for x, _ in train], dtype=np.int64)
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    x = np.concatenate([x for x, _ in train]) if train else np.empty((0,))
    y = np.concatenate([y for _, y in train]) if train else np.empty((0,), dtype=np.int64)
    test_offsets = None
    if test is not None:
        tsizes = np.array([len(xt) for xt, _ in test], dtype=np.int64)
        test_offsets = np.concatenate([[0], np.cumsum(tsizes)]).astype(np.int64)
        x_test = np.concatenate([xt for xt, _ in test])
        y_test = np.concatenate([yt for _, yt in test])
    return FederatedDataset(
        name=name,
        input_kind=input_kind,
        num_classes=num_classes,
        x=x,
        y=y,
        offsets=offsets,
        x_test=x_test,
        y_test=y_test,
        test_offsets=test_offsets,
        client_names=client_names,
        meta=dict(meta or {}),
    )


def hold_out_client_tests(ds: FederatedDataset, fraction: float, rng: np.random.Generator) -> FederatedDataset:
    """``ds`` with ``round(fraction x n)`` of every client's ``n`` samples (at least one when ``n >= 2``, never all)
    moved to its own test set, chosen by one permutation per client drawn from ``rng`` in client order; the test set
    becomes the union of the clients' (``data.client_test_fraction``)."""
    if ds.test_offsets is not None:
        raise ValueError(f"data {ds.name!r} already has per-client test sets; data.client_test_fraction applies to "
                         "data without them (set it to 0)")  # fmt: skip
    train: list[tuple[np.ndarray, np.ndarray]] = []
    test: list[tuple[np.ndarray, np.ndarray]] = []
    for client in range(ds.num_clients):
        x, y = ds.client_train(client)
        n = len(y)
        k = min(max(round(fraction * n), 1 if n >= 2 else 0), max(n - 1, 0))
        order = rng.permutation(n)
        keep, held = np.sort(order[k:]), np.sort(order[:k])
        train.append((x[keep], y[keep]))
        test.append((x[held], y[held]))
    meta = {**ds.meta, "client_test_fraction": fraction}
    return from_client_arrays(
        ds.name, ds.input_kind, ds.num_classes, train, np.asarray(ds.x_test), ds.y_test, test=test,
        client_names=ds.client_names, meta=meta,
    )  # fmt: skip


_VAL_CHUNK = 1 << 16  # clients whose held-out rows are marked at once (their permutations' memory)


def hold_out_validation(ds: FederatedDataset, fraction: float, rng: np.random.Generator) -> FederatedDataset:
    """``ds`` with ``round(fraction x n)`` of every client's ``n`` training samples (at least one when ``n >= 2``,
    never all) moved to the server's validation set ``x_val``/``y_val``, which no client trains on
    (``data.val_fraction``). The rows are chosen by one permutation per client drawn from ``rng`` in client order; the
    clients keep the rest in their order, and the validation set is the held-out rows in client order, so its labels
    follow the pooled data's (paper 003 App. J.1: "a held-out portion of the clients' datasets"). Training rows made on
    demand stay so (``RowSubset``), in the validation set too; the test set is untouched."""
    if ds.x_val is not None:
        raise ValueError(f"data {ds.name!r} already has a validation set")
    n_all = ds.client_sizes().astype(np.int64)
    k_all = np.minimum(
        np.maximum(np.rint(fraction * n_all).astype(np.int64), (n_all >= 2).astype(np.int64)), np.maximum(n_all - 1, 0)
    )
    base = int(ds.offsets[0])
    held_flag = np.zeros(int(ds.offsets[-1]) - base, dtype=bool)
    for start in range(0, ds.num_clients, _VAL_CHUNK):
        stop = min(start + _VAL_CHUNK, ds.num_clients)
        # the permutations drawn one per client in client order (the generator's stream, as records have it); which
        # rows each holds out is then marked for the whole chunk at once: the first k of its permutation
        n, k = n_all[start:stop], k_all[start:stop]
        ends = np.cumsum(n)
        first = np.repeat(ends - n, n)
        rank = np.arange(int(ends[-1]) if len(ends) else 0, dtype=np.int64) - first
        orders = rank.copy()
        for lo, hi in zip((ends - n).tolist(), ends.tolist(), strict=True):
            rng.shuffle(orders[lo:hi])  # ``rng.permutation(hi - lo)``, shuffled in place: the same draws
        held_flag[np.repeat(ds.offsets[start:stop].astype(np.int64) - base, n) + orders] = rank < np.repeat(k, n)
    kept = np.flatnonzero(~held_flag).astype(np.int64) + base
    val = np.flatnonzero(held_flag).astype(np.int64) + base
    sizes = n_all - k_all
    offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
    return replace(
        ds,
        x=take_rows(ds.x, kept),
        y=take_rows(ds.y, kept),
        offsets=offsets,
        x_val=take_rows(ds.x, val),
        y_val=take_rows(ds.y, val),  # labels made on demand stay so: a fraction of every client's is O(population)
        meta={**ds.meta, "val_fraction": fraction},
    )
