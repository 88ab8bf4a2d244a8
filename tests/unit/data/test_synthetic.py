"""The generated image task: shapes, determinism and labels that carry signal."""

from __future__ import annotations

import dataclasses
import hashlib
import pickle
from pathlib import Path

import numpy as np
import pytest

from rayfl.config.sections import DataConfig
from rayfl.data import build_federated_dataset, with_validation
from rayfl.data.federated import LazyRows
from rayfl.data.synthetic import (
    _CHUNK,
    TEST_SIZE,
    PoolLabels,
    SyntheticImages,
    _pool_labels,
    _Teacher,
    load_synthetic,
)
from tests.helpers import count_data_work


def test_shapes_and_metadata() -> None:
    ds = load_synthetic(DataConfig(name="synthetic", num_clients=5, synthetic_samples=8), seed=0)
    assert ds.num_clients == 5 and ds.client_sizes().tolist() == [8] * 5
    assert ds.x.shape == (40, 3, 32, 32) and ds.x.dtype == np.uint8
    assert ds.y.shape == (40,) and ds.y.dtype == np.int64
    assert ds.x_test.shape == (TEST_SIZE, 3, 32, 32) and ds.y_test.shape == (TEST_SIZE,)
    assert ds.input_kind == "image" and ds.num_classes == 10
    assert ds.client_names[4] == "client0004"
    assert ds.meta["mean"] == [0.5, 0.5, 0.5] and ds.meta["std"] == [0.25, 0.25, 0.25]
    assert isinstance(ds.y, PoolLabels) and np.asarray(ds.y).min() >= 0 and np.asarray(ds.y).max() < 10


def test_determinism() -> None:
    cfg = DataConfig(name="synthetic", num_clients=3, synthetic_samples=4)
    a, b, c = load_synthetic(cfg, 1), load_synthetic(cfg, 1), load_synthetic(cfg, 2)
    assert np.array_equal(a.x, b.x) and np.array_equal(a.y, b.y) and np.array_equal(a.y_test, b.y_test)
    assert not np.array_equal(a.x, c.x)


def test_labels_are_varied_and_follow_a_linear_teacher() -> None:
    ds = load_synthetic(DataConfig(name="synthetic", num_clients=20, synthetic_samples=100), seed=0)
    y = np.asarray(ds.y)
    counts = np.bincount(y, minlength=10)
    assert (counts > 0).sum() >= 8  # not all equal; roughly balanced
    assert counts.max() < 0.3 * len(y)

    # learnable: least squares on the 8x8 block means of the training images predicts the test labels well
    def feats(x: np.ndarray) -> np.ndarray:
        m = x.reshape(len(x), 3, 4, 8, 4, 8).mean(axis=(3, 5)).reshape(len(x), -1)
        return np.hstack([m - 127.5, np.ones((len(x), 1))])

    w, *_ = np.linalg.lstsq(feats(np.asarray(ds.x)), np.eye(10)[y], rcond=None)
    acc = float(np.mean((feats(ds.x_test) @ w).argmax(1) == ds.y_test))
    assert acc > 0.5


def test_dispatcher_builds_1000_clients(tmp_path: Path) -> None:
    cfg = DataConfig(name="synthetic", num_clients=1000, synthetic_samples=2)
    ds = build_federated_dataset(cfg, seed=0, cache_dir=tmp_path)
    assert ds.num_clients == 1000 and len(ds.x) == 2000
    assert ds.client_names[-1] == "client0999"


def test_dirichlet_partition_skews_labels_and_sizes() -> None:
    """``partition: dirichlet`` splits the same image pool as CIFAR-10 is split: label skew, unequal clients."""
    cfg = DataConfig(name="synthetic", num_clients=20, synthetic_samples=50, partition="dirichlet", dirichlet_alpha=0.1)
    ds = load_synthetic(cfg, seed=0)
    pool = load_synthetic(DataConfig(name="synthetic", num_clients=20, synthetic_samples=50), seed=0)
    assert ds.num_clients == 20 and len(ds.y) == 1000 and ds.client_sizes().min() >= 1
    assert len(set(ds.client_sizes().tolist())) > 1
    # the same images, regrouped: every pool image appears once
    assert sorted(ds.y.tolist()) == sorted(np.asarray(pool.y).tolist())
    flat, pool_flat = np.asarray(ds.x).reshape(1000, -1), np.asarray(pool.x).reshape(1000, -1)
    assert np.array_equal(np.sort(flat, axis=0), np.sort(pool_flat, axis=0))
    # alpha 0.1: most clients hold few classes; an IID block of 50 holds nearly all ten
    classes = [len(ds.client_labels(c)) for c in range(ds.num_clients)]
    assert np.median(classes) <= 4 < min(len(pool.client_labels(c)) for c in range(pool.num_clients))
    assert ds.meta["partition"] == "dirichlet" and ds.meta["dirichlet_alpha"] == 0.1
    again = load_synthetic(cfg, seed=0)
    assert np.array_equal(again.offsets, ds.offsets) and np.array_equal(again.y, ds.y)


def test_iid_partition_is_the_consecutive_split() -> None:
    natural = load_synthetic(DataConfig(name="synthetic", num_clients=4, synthetic_samples=6), seed=2)
    iid = load_synthetic(DataConfig(name="synthetic", num_clients=4, synthetic_samples=6, partition="iid"), seed=2)
    assert np.array_equal(natural.x, iid.x) and np.array_equal(natural.offsets, iid.offsets)


def test_less_noise_keeps_the_labelling_rule_and_full_noise_the_old_images() -> None:
    plain = load_synthetic(DataConfig(name="synthetic", num_clients=5, synthetic_samples=40), seed=3)
    same = load_synthetic(DataConfig(name="synthetic", num_clients=5, synthetic_samples=40, synthetic_noise=1.0), 3)
    assert np.array_equal(plain.x, same.x) and np.array_equal(plain.y, same.y)
    smooth = load_synthetic(DataConfig(name="synthetic", num_clients=5, synthetic_samples=40, synthetic_noise=0.25), 3)
    # labels are the teacher's on the new images: recomputing them gives the same
    from rayfl.data.synthetic import _label

    images = np.asarray(smooth.x)
    assert np.array_equal(_label(images, 3), smooth.y)
    # the 8x8 block means now carry most of the pixel variance
    blocks = images.reshape(200, 3, 4, 8, 4, 8).astype(np.float64)
    within = blocks.var(axis=(3, 5)).mean()
    assert within < 0.15 * images.astype(np.float64).var()
    counts = np.bincount(smooth.y, minlength=10)
    assert (counts > 0).sum() >= 8


# Digests of (x, y, offsets, x_test, y_test) as the eager generator made them, before images were made on demand
# (commit b27ae4b): every existing experiment on synthetic data must keep training on exactly these arrays.
TODAYS_ARRAYS = {
    "natural": ({"num_clients": 7, "synthetic_samples": 5}, 0, "d48b1d6dabf3d4b7"),
    "iid": ({"num_clients": 6, "synthetic_samples": 9, "partition": "iid"}, 3, "9938ed9976af74f3"),
    "dirichlet": (
        {"num_clients": 10, "synthetic_samples": 20, "partition": "dirichlet", "dirichlet_alpha": 0.3},
        1,
        "6e24ffa337942327",
    ),
    "noise": ({"num_clients": 6, "synthetic_samples": 9, "synthetic_noise": 0.25}, 2, "1dfcb67349b2ba73"),
    "dirichlet_noise": (
        {
            "num_clients": 5,
            "synthetic_samples": 30,
            "partition": "dirichlet",
            "dirichlet_alpha": 1.0,
            "synthetic_noise": 0.4,
        },
        4,
        "d75f9fc7cd8ab5eb",
    ),
    # 9,000 images: past the first 8,192-image labelling chunk
    "chunks": ({"num_clients": 3, "synthetic_samples": 3000, "synthetic_noise": 0.5}, 5, "3df720264a363e3f"),
}


def _digest(*arrays: object) -> str:
    h = hashlib.sha256()
    for a in arrays:
        arr = np.ascontiguousarray(np.asarray(a))
        h.update(str((arr.dtype.str, arr.shape)).encode())
        h.update(arr.tobytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("case", sorted(TODAYS_ARRAYS))
def test_synthetic_images_are_todays(case: str) -> None:
    """Images made on demand equal the arrays the eager generator made (digests pinned before the change), and a
    client's rows made alone equal its slice of the whole pool."""
    kwargs, seed, expected = TODAYS_ARRAYS[case]
    ds = load_synthetic(DataConfig(name="synthetic", **kwargs), seed)
    assert isinstance(ds.x, SyntheticImages)
    whole = np.asarray(ds.x)
    assert _digest(whole, ds.y, ds.offsets, ds.x_test, ds.y_test) == expected
    for c in (0, ds.num_clients // 2, ds.num_clients - 1):
        x, y = ds.client_train(c)
        lo, hi = int(ds.offsets[c]), int(ds.offsets[c + 1])
        assert np.array_equal(x, whole[lo:hi]) and np.array_equal(y, ds.y[lo:hi])
    picks = np.array([len(whole) - 1, 0, 3, 2, 3])  # any order, repeats
    assert np.array_equal(ds.x[picks], whole[picks]) and np.array_equal(ds.x[-1], whole[-1])


@pytest.mark.parametrize(("seed", "noise"), [(0, 1.0), (7, 0.25)])
def test_pool_labels_on_demand_are_the_pools(monkeypatch: pytest.MonkeyPatch, seed: int, noise: float) -> None:
    """``PoolLabels`` gives, for any rows in any order, the labels ``_pool_labels`` makes over the whole pool, bit for
    bit: rows on both sides of the 8,192-image chunk boundaries, in the short last chunk, repeated, out of order, read
    through a fresh object or one that kept chunks, and after a pickle (a host's copy). Labels alone would rarely show
    a block of other rows (its float32 logits differ in the last bits, which move an arg-max in near-ties only), so
    the teacher is also seen to label whole pool-aligned chunks only, as ``_pool_labels`` does."""
    pool = SyntheticImages(seed, "synthetic_train", 2 * _CHUNK + 1000, noise)  # two chunks and a short third
    every = _pool_labels(pool)
    starts = {pool.pool(np.array([lo]))[0].tobytes(): lo for lo in range(0, pool.num, _CHUNK)}
    blocks: set[tuple[int, int]] = set()
    label_chunk = _Teacher.label_chunk

    def seen(self: _Teacher, x: np.ndarray) -> np.ndarray:
        lo = starts.get(x[0].tobytes(), -1)
        blocks.add((lo, len(x)))
        assert np.array_equal(x[-1], pool.pool(np.array([lo + len(x) - 1]))[0])
        return label_chunk(self, x)

    monkeypatch.setattr(_Teacher, "label_chunk", seen)
    rng = np.random.default_rng(seed)
    edges = np.array([0, _CHUNK - 1, _CHUNK, 2 * _CHUNK - 1, 2 * _CHUNK, pool.num - 1])
    picks = [
        rng.integers(0, pool.num, size=300),
        np.concatenate([edges, edges[::-1], rng.integers(_CHUNK - 50, _CHUNK + 50, size=40)]),
        np.arange(_CHUNK - 64, _CHUNK + 64),  # a client across a boundary
        np.arange(pool.num - 64, pool.num),  # ... in the short last chunk
    ]
    labels = PoolLabels(pool)
    for index in picks:
        index = index.astype(np.int64)
        fresh, again = PoolLabels(pool).take(index), pickle.loads(pickle.dumps(labels)).take(index)
        assert np.array_equal(fresh, every[index]) and np.array_equal(again, every[index])
        first, kept = labels[index], labels[index]  # the second read from the chunks kept
        assert np.array_equal(first, every[index]) and np.array_equal(kept, every[index])
    assert np.array_equal(labels[_CHUNK - 3 : _CHUNK + 3], every[_CHUNK - 3 : _CHUNK + 3])
    assert np.array_equal(np.asarray(labels), every) and np.array_equal(labels.every(), every)
    assert np.bincount(every, minlength=10).min() > 0
    assert blocks == {(0, _CHUNK), (_CHUNK, _CHUNK), (2 * _CHUNK, 1000)}


def test_a_large_iid_population_labels_nothing_at_set_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """Loading a million IID clients with the pool's labels (the default) makes and labels the 1,000 test images only,
    as loading ten does; a client's labels are made when read, from the one chunk that holds its rows (kept for the
    next read), and are its rows of the pool's labels."""
    made = count_data_work(monkeypatch)
    labelled: list[int] = []
    label_chunk = _Teacher.label_chunk

    def counted(self: _Teacher, x: np.ndarray) -> np.ndarray:
        labelled.append(len(x))
        return label_chunk(self, x)

    monkeypatch.setattr(_Teacher, "label_chunk", counted)
    seen = {}
    for n in (10, 1_000_000):
        made.clear()
        labelled.clear()
        ds = load_synthetic(DataConfig(name="synthetic", partition="iid", num_clients=n, synthetic_samples=64), 3)
        seen[n] = (dict(made), list(labelled))
    assert seen[10] == seen[1_000_000] == ({"images": TEST_SIZE}, [TEST_SIZE])
    assert isinstance(ds.y, PoolLabels) and len(ds.y) == 64_000_000
    assert len(pickle.dumps(ds.y)) < 2000
    client = 500_000  # rows 32,000,000-32,000,063: inside chunk 3,906
    _, y = ds.client_train(client)
    assert labelled[1:] == [_CHUNK]
    _, again = ds.client_train(client)
    assert labelled[1:] == [_CHUNK] and np.array_equal(y, again)
    lo = 3906 * _CHUNK
    chunk = _Teacher(3).label_chunk(ds.x[lo : lo + _CHUNK])
    assert np.array_equal(y, chunk[client * 64 - lo : client * 64 - lo + 64])


def test_synthetic_data_pickles_as_a_recipe() -> None:
    """What the object store and every host receive is labels and a recipe, not pixels: at 64 images per client the
    pickled data set is about 16 bytes per image (label and pool index), not 3,072."""
    cfg = DataConfig(name="synthetic", num_clients=200, synthetic_samples=64, partition="dirichlet")
    ds = load_synthetic(cfg, 0)
    blob = pickle.dumps(ds)
    assert len(blob) < 20 * len(ds.y) + np.asarray(ds.x_test).nbytes + 100_000
    again = pickle.loads(blob)
    assert np.array_equal(np.asarray(again.x), np.asarray(ds.x))


def test_client_test_fraction_holds_out_part_of_every_client() -> None:
    cfg = DataConfig(name="synthetic", partition="dirichlet", num_clients=8, synthetic_samples=20)
    whole = build_federated_dataset(cfg, 0)
    split = build_federated_dataset(dataclasses.replace(cfg, client_test_fraction=0.25), 0)
    assert split.test_offsets is not None and whole.test_offsets is None
    tests, trains = np.diff(split.test_offsets), split.client_sizes()
    np.testing.assert_array_equal(tests + trains, whole.client_sizes())  # every sample kept, on one side
    assert np.all(tests == np.maximum(np.round(0.25 * whole.client_sizes()), 1))
    assert len(split.y_test) == tests.sum()
    for c in range(8):  # a client's test rows are its own samples
        x_all, _ = whole.client_train(c)
        x_test, _ = split.client_test(c)
        own = {row.tobytes() for row in x_all}
        assert all(row.tobytes() in own for row in x_test)


def test_val_fraction_holds_out_a_validation_set_no_client_trains_on() -> None:
    """``data.val_fraction`` moves round(0.25 x n) of every client's n samples to the server's validation set: every
    sample stays on exactly one side, the clients keep the rest in their order, the images are still made on demand
    (the pickled data set stays a recipe), and at 0 the data set is the one without the option, bit for bit."""
    cfg = DataConfig(name="synthetic", partition="dirichlet", num_clients=8, synthetic_samples=20)
    whole = build_federated_dataset(cfg, 0)
    assert whole.x_val is None and with_validation(whole, cfg, 0) is whole  # off: the data set as it was
    split = build_federated_dataset(dataclasses.replace(cfg, val_fraction=0.25), 0)
    assert split.x_val is not None and split.y_val is not None
    held = whole.client_sizes() - split.client_sizes()
    assert np.all(held == np.maximum(np.round(0.25 * whole.client_sizes()), 1)) and len(split.y_val) == held.sum()
    assert isinstance(split.x, LazyRows) and isinstance(split.x_val, LazyRows)
    everything = {(row.tobytes(), int(label)) for row, label in zip(np.asarray(whole.x), whole.y, strict=True)}
    train = [(row.tobytes(), int(label)) for row, label in zip(np.asarray(split.x), split.y, strict=True)]
    val = [(row.tobytes(), int(label)) for row, label in zip(np.asarray(split.x_val), split.y_val, strict=True)]
    assert not set(train) & set(val) and set(train) | set(val) == everything
    assert len(train) + len(val) == len(whole.y)
    for c in range(8):  # a client's remaining rows are its own samples, in their order
        own = [row.tobytes() for row in whole.client_train(c)[0]]
        kept = [row.tobytes() for row in split.client_train(c)[0]]
        assert kept == [r for r in own if r in set(kept)]
    assert np.array_equal(np.asarray(pickle.loads(pickle.dumps(split)).x_val), np.asarray(split.x_val))
    assert np.array_equal(split.x_test, whole.x_test)
