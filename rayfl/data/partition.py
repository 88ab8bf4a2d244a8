"""Ways of splitting a centralised data set into clients.

Every function here is pure: it takes the sample count (or the labels, or the user ids) and a numpy generator
and returns one sorted ``int64`` array of sample indices per client. Callers obtain the generator from
``rayfl.core.rng.derive_rng`` so a partition depends only on the run seed.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

__all__ = [
    "cap_per_client",
    "dirichlet",
    "iid",
    "natural",
    "partition_sizes_summary",
    "pathological",
    "shards",
    "size_skew",
    "split",
]

IndexArray = npt.NDArray[np.int64]


def _group(owner: npt.NDArray[np.int64], num_clients: int) -> list[IndexArray]:
    """Indices ``i`` grouped by ``owner[i]``; ascending within each group, one group per client."""
    order = np.argsort(owner, kind="stable").astype(np.int64)  # stable: ties keep ascending sample order
    counts = np.bincount(owner, minlength=num_clients)
    return list(np.split(order, np.cumsum(counts)[:-1]))


def iid(num_samples: int, num_clients: int, rng: np.random.Generator) -> list[IndexArray]:
    """A uniformly random split into ``num_clients`` shards whose sizes differ by at most one."""
    if num_clients < 1:
        raise ValueError(f"num_clients must be at least 1, got {num_clients}")
    if num_clients > num_samples:
        raise ValueError(f"cannot give {num_clients} clients at least one of {num_samples} samples each")
    perm = rng.permutation(num_samples).astype(np.int64)
    return [np.sort(part) for part in np.array_split(perm, num_clients)]


def dirichlet(
    labels: npt.ArrayLike,
    num_clients: int,
    alpha: float,
    rng: np.random.Generator,
    min_size: int = 1,
) -> list[IndexArray]:
    """Label-skewed split: each class is spread over the clients by proportions from ``Dirichlet(alpha)``.

    One ``[num_classes, num_clients]`` matrix of proportions is drawn; each class's indices are shuffled and
    cut at the rounded cumulative proportions, so small ``alpha`` gives each client few classes and large
    ``alpha`` approaches an IID split.

    Repair: the draw can leave clients with fewer than ``min_size`` samples (always so when there are more
    clients than samples per class and ``alpha`` is small). Instead of redrawing until it happens not to,
    every short client, in client order, takes the samples it lacks one at a time from whichever client is
    currently largest (ties: the lower client id), and the donated sample is a random one of that donor's.
    A donor is never brought below ``min_size``, so the repair always ends, costs
    ``O(deficit · log num_clients)`` and depends only on ``rng``. It needs
    ``num_samples >= num_clients * min_size``.
    """
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {y.shape}")
    num_samples = len(y)
    if num_clients < 1:
        raise ValueError(f"num_clients must be at least 1, got {num_clients}")
    if alpha <= 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    if min_size < 0:
        raise ValueError(f"min_size must be non-negative, got {min_size}")
    if num_samples < num_clients * min_size:
        raise ValueError(f"{num_samples} samples cannot give {num_clients} clients at least {min_size} sample(s) each")

    _, class_of = np.unique(y, return_inverse=True)
    class_of = class_of.reshape(-1)
    num_classes = int(class_of.max()) + 1 if num_samples else 0
    proportions = rng.dirichlet(np.full(num_clients, float(alpha)), size=num_classes)  # [classes, clients]

    owner = np.empty(num_samples, dtype=np.int64)
    clients = np.arange(num_clients, dtype=np.int64)
    # Samples of each class, in ascending index order, class after class.
    by_class = np.argsort(class_of, kind="stable")
    class_counts = np.bincount(class_of, minlength=num_classes)
    class_starts = np.concatenate([[0], np.cumsum(class_counts)])
    for k in range(num_classes):
        members = by_class[class_starts[k] : class_starts[k + 1]]
        n_k = len(members)
        cuts = np.rint(np.cumsum(proportions[k]) * n_k).astype(np.int64)
        cuts = np.minimum(np.maximum.accumulate(cuts), n_k)
        cuts[-1] = n_k  # the cumulative sum may fall short of 1 by rounding error
        counts = np.diff(cuts, prepend=0)
        owner[rng.permutation(members)] = np.repeat(clients, counts)

    sizes = np.bincount(owner, minlength=num_clients).astype(np.int64)
    if min_size > 0 and sizes.min() < min_size:
        _repair(owner, sizes, min_size, rng)
    return _group(owner, num_clients)


def _repair(
    owner: npt.NDArray[np.int64], sizes: npt.NDArray[np.int64], min_size: int, rng: np.random.Generator
) -> None:
    """Top up every client below ``min_size`` from the largest ones (in place; see ``dirichlet``)."""
    # Each client's samples in random order; a donor gives away the last of its remaining ones.
    perm = rng.permutation(len(owner)).astype(np.int64)
    pool = perm[np.argsort(owner[perm], kind="stable")]
    ends = np.cumsum(sizes)  # one past the last not-yet-donated sample of each client in ``pool``
    donors = [(-int(s), int(c)) for c, s in enumerate(sizes) if s > min_size]
    heapq.heapify(donors)
    short = np.flatnonzero(sizes < min_size)
    for c in short.tolist():
        for _ in range(min_size - int(sizes[c])):
            neg_size, donor = heapq.heappop(donors)  # non-empty: the sample count covers every deficit
            ends[donor] -= 1
            owner[pool[ends[donor]]] = c
            if -neg_size - 1 > min_size:
                heapq.heappush(donors, (neg_size + 1, donor))


def shards(
    labels: npt.ArrayLike, num_clients: int, shards_per_client: int, rng: np.random.Generator
) -> list[IndexArray]:
    """McMahan et al.'s pathological non-IID split (AISTATS 2017, Sec. 3): the samples sorted by label (ties in a
    random order), cut into ``num_clients x shards_per_client`` contiguous shards whose sizes differ by at most one,
    and each client given ``shards_per_client`` shards drawn without replacement (one permutation of the shards).
    With shards no larger than a class, a client holds at most ``shards_per_client`` labels (two, in the paper)."""
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {y.shape}")
    if num_clients < 1 or shards_per_client < 1:
        raise ValueError(
            f"num_clients and shards_per_client must be at least 1, got {num_clients}, {shards_per_client}"
        )
    num_shards = num_clients * shards_per_client
    if num_shards > len(y):
        raise ValueError(f"{len(y)} samples cannot make {num_shards} shards ({num_clients} clients x "
                         f"{shards_per_client}) of at least one sample each")  # fmt: skip
    shuffled = rng.permutation(len(y)).astype(np.int64)
    by_label = shuffled[np.argsort(y[shuffled], kind="stable")]  # label-sorted, a random order within a label
    base, extra = divmod(len(y), num_shards)
    shard_sizes = np.full(num_shards, base, dtype=np.int64)
    shard_sizes[:extra] += 1  # np.array_split's sizes
    shard_owner = np.empty(num_shards, dtype=np.int64)
    shard_owner[rng.permutation(num_shards)] = np.repeat(np.arange(num_clients, dtype=np.int64), shards_per_client)
    owner = np.empty(len(y), dtype=np.int64)
    owner[by_label] = np.repeat(shard_owner, shard_sizes)
    return _group(owner, num_clients)


def pathological(
    labels: npt.ArrayLike, num_clients: int, classes_per_client: int, rng: np.random.Generator
) -> list[IndexArray]:
    """``classes_per_client`` labels per client (Flower Datasets' ``PathologicalPartitioner``, its
    "first-deterministic" assignment): client ``c``'s first label is the ``c mod num_classes``-th distinct label (so
    every label is held once there are as many clients as labels), the others distinct labels drawn at random; each
    label's samples are then shuffled and split into near-equal parts among the clients holding it. The samples of a
    label nobody holds are left out. Every client must end with at least one sample."""
    y = np.asarray(labels)
    if y.ndim != 1:
        raise ValueError(f"labels must be one-dimensional, got shape {y.shape}")
    _, class_of = np.unique(y, return_inverse=True)
    class_of = class_of.reshape(-1).astype(np.int64)
    num_classes = int(class_of.max()) + 1 if len(y) else 0
    if num_clients < 1 or not 1 <= classes_per_client <= num_classes:
        raise ValueError(f"classes_per_client must be in [1, {num_classes}] (the labels present) and num_clients at "
                         f"least 1, got {classes_per_client} and {num_clients}")  # fmt: skip
    clients = np.arange(num_clients, dtype=np.int64)
    keys = rng.random((num_clients, num_classes))
    keys[clients, clients % num_classes] = -1.0  # the first label, before every random one
    held = np.argsort(keys, axis=1, kind="stable")[:, :classes_per_client]  # [clients, k]
    holder_client = np.repeat(clients, classes_per_client)
    holder_class = held.reshape(-1)
    by_class = np.argsort(holder_class, kind="stable")  # holders class by class, ascending client id
    holders_per_class = np.bincount(holder_class, minlength=num_classes)
    holder_starts = np.concatenate([[0], np.cumsum(holders_per_class)])
    owner = np.full(len(y), -1, dtype=np.int64)
    members_by_class = np.argsort(class_of, kind="stable")
    class_starts = np.concatenate([[0], np.cumsum(np.bincount(class_of, minlength=num_classes))])
    for k in range(num_classes):  # one pass per label: O(labels) Python steps
        holders = holder_client[by_class[holder_starts[k] : holder_starts[k + 1]]]
        if len(holders) == 0:
            continue
        members = rng.permutation(members_by_class[class_starts[k] : class_starts[k + 1]])
        base, extra = divmod(len(members), len(holders))
        counts = np.full(len(holders), base, dtype=np.int64)
        counts[:extra] += 1
        owner[members] = np.repeat(holders, counts)
    kept = np.flatnonzero(owner >= 0).astype(np.int64)
    sizes = np.bincount(owner[kept], minlength=num_clients)
    if len(sizes) and sizes.min() == 0:
        raise ValueError(f"client {int(np.argmin(sizes))} got no samples: its labels have fewer samples than "
                         "clients holding them (fewer clients, or more classes_per_client)")  # fmt: skip
    return [kept[p] for p in _group(owner[kept], num_clients)]


def size_skew(num_samples: int, num_clients: int, alpha: float, rng: np.random.Generator) -> list[IndexArray]:
    """Quantity skew (Li et al., "Federated Learning on Non-IID Data Silos", ICDE 2022: proportions from
    ``Dirichlet(alpha)`` over the clients): every client gets one sample, the other ``num_samples - num_clients`` are
    shared out by one draw of proportions (cut at the rounded cumulative proportions), and which samples a client
    gets is uniformly random. Small ``alpha``: a few large clients and many small ones."""
    if num_clients < 1:
        raise ValueError(f"num_clients must be at least 1, got {num_clients}")
    if alpha <= 0:
        raise ValueError(f"alpha must be positive, got {alpha}")
    if num_clients > num_samples:
        raise ValueError(f"cannot give {num_clients} clients at least one of {num_samples} samples each")
    proportions = rng.dirichlet(np.full(num_clients, float(alpha)))
    rest = num_samples - num_clients
    cuts = np.minimum(np.maximum.accumulate(np.rint(np.cumsum(proportions) * rest).astype(np.int64)), rest)
    cuts[-1] = rest
    sizes = 1 + np.diff(cuts, prepend=0)
    perm = rng.permutation(num_samples).astype(np.int64)
    return [np.sort(p) for p in np.split(perm, np.cumsum(sizes)[:-1])]


def split(
    kind: str,
    labels: npt.ArrayLike,
    num_clients: int,
    rng: np.random.Generator,
    *,
    alpha: float = 0.5,
    shards_per_client: int = 2,
    classes_per_client: int = 2,
) -> list[IndexArray]:
    """A centralised training set's labels split into ``num_clients`` clients by the partitioner ``kind``
    (``data.partition``: ``iid``, ``dirichlet``, ``shards``, ``pathological`` or ``size_skew``)."""
    y = np.asarray(labels)
    if kind == "iid":
        return iid(len(y), num_clients, rng)
    if kind == "dirichlet":
        return dirichlet(y, num_clients, alpha, rng)
    if kind == "shards":
        return shards(y, num_clients, shards_per_client, rng)
    if kind == "pathological":
        return pathological(y, num_clients, classes_per_client, rng)
    if kind == "size_skew":
        return size_skew(len(y), num_clients, alpha, rng)
    raise ValueError(f"partition {kind!r} does not split a centralised data set (iid, dirichlet, shards, "
                     "pathological, size_skew)")  # fmt: skip


def natural(user_ids: Sequence[object] | npt.ArrayLike) -> list[IndexArray]:
    """One client per distinct user id, in order of each user's first appearance."""
    ids = np.asarray(user_ids)
    if ids.ndim != 1:
        raise ValueError(f"user_ids must be one-dimensional, got shape {ids.shape}")
    if len(ids) == 0:
        return []
    _, first, inverse = np.unique(ids, return_index=True, return_inverse=True)
    rank = np.empty(len(first), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(first), dtype=np.int64)
    return _group(rank[inverse.reshape(-1)], len(first))


def cap_per_client(parts: Sequence[IndexArray], max_per_client: int, rng: np.random.Generator) -> list[IndexArray]:
    """Keep a random ``max_per_client`` of each larger client's indices (sorted); ``0`` means no cap."""
    if max_per_client < 0:
        raise ValueError(f"max_per_client must be non-negative, got {max_per_client}")
    if max_per_client == 0:
        return [np.asarray(p, dtype=np.int64) for p in parts]
    out: list[IndexArray] = []
    for p in parts:
        arr = np.asarray(p, dtype=np.int64)
        if len(arr) > max_per_client:
            arr = np.sort(rng.choice(arr, size=max_per_client, replace=False))
        out.append(arr)
    return out


def partition_sizes_summary(parts: Sequence[IndexArray]) -> dict[str, float]:
    """Client count and min / mean / median / max client size, for logs."""
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    if len(sizes) == 0:
        return {"clients": 0.0, "min": 0.0, "mean": 0.0, "median": 0.0, "max": 0.0}
    return {
        "clients": float(len(sizes)),
        "min": float(sizes.min()),
        "mean": float(sizes.mean()),
        "median": float(np.median(sizes)),
        "max": float(sizes.max()),
    }
