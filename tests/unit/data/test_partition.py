"""Partitioners: coverage, sizes, determinism, the Dirichlet repair and the effect of alpha."""

from __future__ import annotations

import numpy as np
import pytest

from rayfl.core.rng import derive_rng
from rayfl.data import partition


def _labels(n: int, num_classes: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, num_classes, size=n)


def _check_cover(parts: list[np.ndarray], n: int) -> None:
    assert sum(len(p) for p in parts) == n
    allidx = np.concatenate(parts)
    assert np.array_equal(np.sort(allidx), np.arange(n))  # every index exactly once
    for p in parts:
        assert p.dtype == np.int64
        assert np.all(np.diff(p) > 0)  # sorted, no duplicates


def _mean_entropy(parts: list[np.ndarray], labels: np.ndarray, num_classes: int) -> float:
    ent = []
    for p in parts:
        freq = np.bincount(labels[p], minlength=num_classes) / len(p)
        nz = freq[freq > 0]
        ent.append(float(-(nz * np.log(nz)).sum()))
    return float(np.mean(ent))


@pytest.mark.parametrize("n,clients", [(100, 7), (100, 100), (10, 1), (1003, 10)])
def test_iid_sizes_and_coverage(n: int, clients: int) -> None:
    parts = partition.iid(n, clients, derive_rng(0, "partition"))
    assert len(parts) == clients
    _check_cover(parts, n)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 1


def test_iid_deterministic_and_rejects_too_many_clients() -> None:
    a = partition.iid(50, 5, derive_rng(1, "partition"))
    b = partition.iid(50, 5, derive_rng(1, "partition"))
    c = partition.iid(50, 5, derive_rng(2, "partition"))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))
    with pytest.raises(ValueError):
        partition.iid(3, 4, derive_rng(0, "partition"))


@pytest.mark.parametrize("alpha", [0.01, 0.5, 100.0])
def test_dirichlet_covers_every_index_once_and_no_client_is_empty(alpha: float) -> None:
    labels = _labels(2000, 10)
    parts = partition.dirichlet(labels, 50, alpha, derive_rng(0, "partition"))
    assert len(parts) == 50
    _check_cover(parts, 2000)
    assert min(len(p) for p in parts) >= 1


def test_dirichlet_more_clients_than_samples_per_class() -> None:
    labels = _labels(300, 10)  # ~30 samples per class, 200 clients
    parts = partition.dirichlet(labels, 200, 0.01, derive_rng(3, "partition"))
    _check_cover(parts, 300)
    assert min(len(p) for p in parts) >= 1


def test_dirichlet_min_size_and_impossible_request() -> None:
    labels = _labels(500, 5)
    parts = partition.dirichlet(labels, 40, 0.05, derive_rng(0, "partition"), min_size=5)
    _check_cover(parts, 500)
    assert min(len(p) for p in parts) >= 5
    with pytest.raises(ValueError, match="cannot give"):
        partition.dirichlet(labels, 101, 0.5, derive_rng(0, "partition"), min_size=5)


def test_dirichlet_one_client_and_one_class() -> None:
    parts = partition.dirichlet(_labels(20, 3), 1, 0.5, derive_rng(0, "partition"))
    assert len(parts) == 1 and np.array_equal(parts[0], np.arange(20))
    parts = partition.dirichlet(np.zeros(30, dtype=np.int64), 4, 0.1, derive_rng(0, "partition"))
    _check_cover(parts, 30)
    assert min(len(p) for p in parts) >= 1


def test_dirichlet_works_with_string_labels() -> None:
    labels = np.array(["cat", "dog", "emu"] * 20)
    parts = partition.dirichlet(labels, 6, 0.3, derive_rng(0, "partition"))
    _check_cover(parts, 60)


def test_dirichlet_determinism() -> None:
    labels = _labels(1000, 10)
    a = partition.dirichlet(labels, 20, 0.3, derive_rng(7, "partition"))
    b = partition.dirichlet(labels, 20, 0.3, derive_rng(7, "partition"))
    c = partition.dirichlet(labels, 20, 0.3, derive_rng(8, "partition"))
    assert all(np.array_equal(x, y) for x, y in zip(a, b, strict=True))
    assert not all(np.array_equal(x, y) for x, y in zip(a, c, strict=True))


def test_dirichlet_alpha_controls_label_skew() -> None:
    labels = _labels(5000, 10)
    skewed = partition.dirichlet(labels, 50, 0.05, derive_rng(0, "partition"))
    mixed = partition.dirichlet(labels, 50, 100.0, derive_rng(0, "partition"))
    h_skewed = _mean_entropy(skewed, labels, 10)
    h_mixed = _mean_entropy(mixed, labels, 10)
    assert h_skewed < h_mixed
    assert h_mixed > 0.9 * np.log(10)  # near-uniform label mix per client
    assert h_skewed < 0.5 * np.log(10)


def test_dirichlet_scales_to_10k_clients() -> None:
    labels = _labels(50_000, 10)
    for alpha in (0.01, 0.5):
        parts = partition.dirichlet(labels, 10_000, alpha, derive_rng(0, "partition"))
        assert len(parts) == 10_000
        assert min(len(p) for p in parts) >= 1
        assert sum(len(p) for p in parts) == 50_000


def test_natural_groups_by_first_appearance() -> None:
    users = ["bob", "amy", "bob", "cid", "amy", "bob"]
    parts = partition.natural(users)
    assert [p.tolist() for p in parts] == [[0, 2, 5], [1, 4], [3]]
    parts = partition.natural(np.array([5, 5, 2, 9, 2]))
    assert [p.tolist() for p in parts] == [[0, 1], [2, 4], [3]]
    assert partition.natural([]) == []


def test_cap_per_client() -> None:
    parts = [np.arange(10, dtype=np.int64), np.arange(10, 13, dtype=np.int64)]
    capped = partition.cap_per_client(parts, 4, derive_rng(0, "partition_cap"))
    assert len(capped[0]) == 4 and set(capped[0].tolist()) <= set(range(10))
    assert np.all(np.diff(capped[0]) > 0)
    assert capped[1].tolist() == [10, 11, 12]
    uncapped = partition.cap_per_client(parts, 0, derive_rng(0, "partition_cap"))
    assert [len(p) for p in uncapped] == [10, 3]


def test_sizes_summary() -> None:
    summary = partition.partition_sizes_summary([np.arange(2), np.arange(4)])
    assert summary == {"clients": 2.0, "min": 2.0, "mean": 3.0, "median": 3.0, "max": 4.0}


# --------------------------------------------------------------------- Flower-style partitioners (issue 29, Build 3)
def test_dirichlet_label_counts_match_the_hand_checked_cut() -> None:
    # seed 7's proportions (rows: classes 0-2, columns: clients 0-2), 10 samples a class, cut at the rounded
    # cumulative sums: class 0 (.163, .113, .724) -> cuts 2, 3, 10 -> 2, 1, 7; class 1 (.752, .248, 0) -> 8, 10, 10 ->
    # 8, 2, 0; class 2 (.641, .246, .113) -> 6, 9, 10 -> 6, 3, 1
    y = np.repeat(np.arange(3), 10)
    parts = partition.dirichlet(y, 3, 1.0, derive_rng(7, "partition"), min_size=0)
    assert [np.bincount(y[p], minlength=3).tolist() for p in parts] == [[2, 8, 6], [1, 2, 3], [7, 0, 1]]


def test_shards_each_client_holds_exactly_its_shards() -> None:
    # 10 labels x 20 samples, 10 clients x 2 shards: 20 shards of 10 samples, each inside one label
    y = np.repeat(np.arange(10), 20)[np.random.default_rng(3).permutation(200)]
    parts = partition.shards(y, 10, 2, derive_rng(0, "partition"))
    _check_cover(parts, 200)
    for p in parts:
        counts = np.bincount(y[p], minlength=10)
        assert len(p) == 20 and set(counts.tolist()) <= {0, 10, 20}  # whole shards of one label each
        assert 1 <= np.count_nonzero(counts) <= 2
    # every shard handed out once: the 20 (label, shard) blocks add up to every label's 20 samples
    held = np.sum([np.bincount(y[p], minlength=10) for p in parts], axis=0)
    assert held.tolist() == [20] * 10


def test_shards_sizes_and_refusal() -> None:
    y = _labels(1003, 10)
    parts = partition.shards(y, 7, 3, derive_rng(1, "partition"))
    _check_cover(parts, 1003)
    sizes = [len(p) for p in parts]
    assert max(sizes) - min(sizes) <= 3  # three shards of 47 or 48 samples each
    with pytest.raises(ValueError, match="cannot make 12 shards"):
        partition.shards(np.arange(10), 4, 3, derive_rng(0, "partition"))


def test_pathological_gives_k_labels_first_deterministic_and_even_shares() -> None:
    y = _labels(3000, 10)
    k = 3
    parts = partition.pathological(y, 20, k, derive_rng(0, "partition"))
    holders: dict[int, list[int]] = {}
    for c, p in enumerate(parts):
        labels = np.unique(y[p])
        assert len(labels) == k and c % 10 in labels  # k labels, the first one c mod 10
        for label in labels.tolist():
            holders.setdefault(label, []).append(c)
    _check_cover(parts, 3000)  # 20 clients x first labels cover all 10: nothing left out
    for label, cs in holders.items():
        shares = [int(np.sum(y[parts[c]] == label)) for c in cs]
        assert max(shares) - min(shares) <= 1 and sum(shares) == int(np.sum(y == label))


def test_pathological_leaves_out_labels_nobody_holds_and_refuses_empty_clients() -> None:
    y = np.repeat(np.arange(10), 5)
    parts = partition.pathological(y, 3, 1, derive_rng(0, "partition"))
    assert [np.unique(y[p]).tolist() for p in parts] == [[0], [1], [2]]
    with pytest.raises(ValueError, match="got no samples"):
        partition.pathological(np.array([0, 1, 1, 1]), 4, 1, derive_rng(0, "partition"))
    with pytest.raises(ValueError, match=r"classes_per_client must be in \[1, 2\]"):
        partition.pathological(np.array([0, 1]), 2, 3, derive_rng(0, "partition"))


def test_size_skew_sizes_match_the_hand_checked_cut() -> None:
    # seed 7's proportions (.008, .023, .844, .124) share out 40 - 4 = 36 samples: cuts 0, 1, 32, 36, plus one each
    parts = partition.size_skew(40, 4, 0.5, derive_rng(7, "partition"))
    assert [len(p) for p in parts] == [1, 2, 32, 5]
    _check_cover(parts, 40)
    big = partition.size_skew(100_000, 1000, 0.3, derive_rng(0, "partition"))
    sizes = np.array([len(p) for p in big])
    assert sizes.min() >= 1 and sizes.sum() == 100_000 and sizes.max() > 20 * np.median(sizes)


def test_split_dispatches_and_is_reproducible() -> None:
    y = _labels(500, 5)
    for kind in ("iid", "dirichlet", "shards", "pathological", "size_skew"):
        a = partition.split(kind, y, 10, derive_rng(4, "partition"))
        b = partition.split(kind, y, 10, derive_rng(4, "partition"))
        assert len(a) == 10 and all(np.array_equal(p, q) for p, q in zip(a, b, strict=True))
    with pytest.raises(ValueError, match="does not split"):
        partition.split("natural", y, 10, derive_rng(0, "partition"))
