"""The federated dataset container shared by every loader, partitioner and backend.

All clients' samples live in a few large numpy arrays in client-major order, with an ``offsets`` array marking where
each client's rows start (CSR layout). One ``ray.put`` of the container then places every client's data in the object
store once per run; a host reads its clients' rows as zero-copy, read-only slices.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

__all__ = ["FederatedDataset", "InputKind", "from_client_arrays", "hold_out_client_tests"]

InputKind = Literal["tokens", "image"]


@dataclass(frozen=True)
class FederatedDataset:
    """Train data of every client plus a test set.

    Attributes:
        name: Short name of the source (``"shakespeare"``, ``"cifar10"`` ...).
        input_kind: ``"tokens"`` (int sequences, e.g. characters) or ``"image"`` (uint8 NCHW or float NCHW).
        num_classes: Size of the label space (the vocabulary for next-character prediction).
        x, y: Training samples of all clients, client-major.
        offsets: ``int64[num_clients + 1]``; client ``c`` owns rows ``offsets[c]:offsets[c + 1]`` of ``x`` and ``y``.
        x_test, y_test: The test set the global model is evaluated on (for LEAF data: the union of the clients'
            test splits, in client order).
        test_offsets: Per-client rows of the test set when the test set is split by client, else ``None``.
        client_names: A human-readable id per client (play and role for Shakespeare, writer for FEMNIST).
        meta: Loader facts such as the vocabulary or channel means; JSON-serialisable values only.
    """

    name: str
    input_kind: InputKind
    num_classes: int
    x: np.ndarray
    y: np.ndarray
    offsets: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    test_offsets: np.ndarray | None = None
    client_names: tuple[str, ...] = ()
    meta: dict[str, object] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.offsets.ndim != 1 or self.offsets[0] != 0 or self.offsets[-1] != len(self.x):
            raise ValueError("offsets must start at 0 and end at len(x)")
        if np.any(np.diff(self.offsets) < 0):
            raise ValueError("offsets must be non-decreasing")
        if len(self.x) != len(self.y) or len(self.x_test) != len(self.y_test):
            raise ValueError("x and y must have the same number of rows")

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
    client_names: tuple[str, ...] = (),
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
        ds.name, ds.input_kind, ds.num_classes, train, ds.x_test, ds.y_test, test=test,
        client_names=ds.client_names, meta=meta,
    )  # fmt: skip
