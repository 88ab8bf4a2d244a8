"""A Dirichlet label split of the synthetic task that labels no image at set-up (``data.dirichlet_split: counts``).

The pool split (``rayfl.data.partition.dirichlet``) spreads every class over the clients by proportions
``p_k ~ Dirichlet(alpha, ..., alpha)`` over the ``N`` clients, so it needs the label of every image of the pool before
the first round: minutes at a million clients. Written with Gamma variables, ``p_ki = g_ki / sum_j g_kj`` with
``g_ki ~ Gamma(alpha)``, and ``sum_j g_kj`` is ``N alpha`` up to a relative error of ``1 / sqrt(N alpha)``; client
``i``'s count of class ``k`` is then ``n_k p_ki ~= samples x share_k x g_ki / alpha``, where ``share_k`` is the class's
share of the labels. This module takes that limit as the definition: client ``i`` holds
``rint(samples x share_k x g_ki / alpha)`` images of class ``k`` (the label distribution ``share`` measured on the
test set, a fixed 1,000 images), so only a ``[N, classes]`` matrix of Gamma draws is made at set-up, in one
vectorised call whose first rows do not depend on ``N``. A client left with no image gets one of the class with the
largest ``share_k x g_ki`` (the pool split's ``min_size`` of 1).

A client's images are found when it trains: candidates ``c x STRIDE + j`` (``j = 0, 1, ...``) of the stream
``derive_rng(seed, "synthetic_train/dirichlet")`` are labelled one at a time (``image_labels.label_images``) and the
first ``count_k`` of each class are kept, class after class, so client ``i``'s rows depend on its seed, index and
counts only, whatever ``N`` is. The labels are known without images (its rows are sorted by class), so ``y`` costs
nothing; the images cost about ``max_k count_k / share_k`` labelled candidates per client.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from rayfl.data.federated import LazyRows
from rayfl.data.image_labels import label_images, teacher_directions

__all__ = ["STRIDE", "CountedImages", "CountedLabels", "client_label_counts", "pick_candidates"]

STRIDE = 1 << 24  # candidate images reserved per client in the stream (a client needing more fails with one line)
_BATCH = 1024  # candidates labelled per step


def client_label_counts(
    num_clients: int, samples: int, alpha: float, share: npt.NDArray[np.float64], rng: np.random.Generator
) -> npt.NDArray[np.int32]:
    """Each client's count of each class, ``int32[num_clients, len(share)]`` (see the module docstring); row ``i`` is
    the same for any ``num_clients > i``."""
    gamma = rng.standard_gamma(alpha, size=(num_clients, len(share)))  # filled row by row: a prefix is N-free
    weight = gamma * share
    counts = np.rint(weight * (samples / alpha)).astype(np.int64)
    empty = np.flatnonzero(counts.sum(axis=1) == 0)
    counts[empty, np.argmax(weight[empty], axis=1)] = 1
    return counts.astype(np.int32)  # 40 bytes a client at ten classes


def pick_candidates(
    client: int, counts: npt.NDArray[np.int32], images: LazyRows, directions: npt.NDArray[np.float64]
) -> npt.NDArray[np.int64]:
    """Client ``client``'s images as positions in ``images``'s stream, class by class: the first ``counts[k]``
    candidates ``client x STRIDE + j`` that the teacher labels ``k``."""
    need = counts.astype(np.int64)
    found: list[list[int]] = [[] for _ in counts]
    start = client * STRIDE
    for lo in range(0, STRIDE, _BATCH):
        if not need.any():
            break
        index = np.arange(start + lo, start + lo + _BATCH, dtype=np.int64)
        labels = label_images(images.take(index), directions)
        for k in np.flatnonzero(need).tolist():
            hits = index[labels == k][: need[k]]
            found[k].extend(hits.tolist())
            need[k] -= len(hits)
    else:
        if need.any():
            raise ValueError(f"synthetic data: client {client} found too few images of classes "
                             f"{np.flatnonzero(need).tolist()} among {STRIDE} candidates")  # fmt: skip
    return np.array([i for per_class in found for i in per_class], dtype=np.int64)


class _Counted(LazyRows):
    """Rows of clients whose rows are sorted by class with ``counts`` per client (``offsets`` their cumulative sums)."""

    def __init__(self, counts: npt.NDArray[np.int32]) -> None:
        self.counts = counts
        self.offsets = np.concatenate([[0], np.cumsum(counts.sum(axis=1, dtype=np.int64))]).astype(np.int64)

    def _locate(self, index: npt.NDArray[np.int64]) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]]:
        """Each row's client and its position within the client."""
        client = np.searchsorted(self.offsets, index, side="right") - 1
        return client, index - self.offsets[client]


class CountedLabels(_Counted):
    """The labels of a counts split: row ``r`` of client ``c`` is the class whose block of ``c``'s rows holds it."""

    dtype = np.dtype(np.int64)

    def __init__(self, counts: npt.NDArray[np.int32]) -> None:
        super().__init__(counts)
        self.shape = (int(self.offsets[-1]),)

    def __reduce__(self) -> tuple[Any, ...]:
        return (CountedLabels, (self.counts,))

    def take(self, index: npt.NDArray[np.int64]) -> np.ndarray:
        client, pos = self._locate(index)
        ends = np.cumsum(self.counts[client], axis=1)
        labels: np.ndarray = (pos[:, None] >= ends).sum(axis=1).astype(np.int64)
        return labels


class CountedImages(_Counted):
    """The images of a counts split, found per client when indexed (``pick_candidates``) in ``stream``, a pool of
    synthetic images indexed by stream position. Pickles as the counts, the seed and the stream's recipe."""

    def __init__(self, counts: npt.NDArray[np.int32], seed: int, stream: LazyRows) -> None:
        super().__init__(counts)
        self.seed, self.stream = seed, stream
        self.dtype = stream.dtype
        self.shape = (int(self.offsets[-1]), *stream.shape[1:])
        self._directions = teacher_directions(seed)

    def __reduce__(self) -> tuple[Any, ...]:
        return (CountedImages, (self.counts, self.seed, self.stream))

    def take(self, index: npt.NDArray[np.int64]) -> np.ndarray:
        client, pos = self._locate(index)
        positions = np.empty(len(index), dtype=np.int64)
        for c in np.unique(client).tolist():
            rows = client == c
            chosen = pick_candidates(c, self.counts[c], self.stream, self._directions)
            positions[rows] = chosen[pos[rows]]
        return self.stream.take(positions)
