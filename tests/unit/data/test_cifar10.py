"""CIFAR-10 loading from a tiny folder in the release's pickle format, and its partitions."""

from __future__ import annotations

import os
import pickle
from pathlib import Path
from typing import Literal

import numpy as np
import pytest

from rayfl.config.sections import DataConfig
from rayfl.core.errors import ConfigError
from rayfl.data import build_federated_dataset
from rayfl.data.cifar10 import (
    CIFAR10_MEAN,
    DECODED,
    FOLDER,
    TEST_BATCH,
    TRAIN_BATCHES,
    _batch_arrays,
    load_cifar10,
    load_cifar10_arrays,
)
from rayfl.data.federated import IndexedRows

PER_BATCH = 6
TEST_SIZE = 5


def _write(path: Path, obj: object) -> None:
    with path.open("wb") as fh:
        pickle.dump(obj, fh, protocol=2)


def _batch(rng: np.random.Generator, n: int, first_label: int) -> dict[bytes, object]:
    data = rng.integers(0, 256, size=(n, 3072), dtype=np.uint8)
    labels = [(first_label + i) % 10 for i in range(n)]
    return {b"batch_label": b"batch", b"labels": labels, b"data": data, b"filenames": [b"x.png"] * n}


def make_cifar(root: Path, *, str_keys: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """A ``cifar-10-batches-py`` folder: 5 x PER_BATCH train, TEST_SIZE test images; returns train data."""
    folder = root / FOLDER
    folder.mkdir(parents=True)
    rng = np.random.default_rng(0)
    datas: list[np.ndarray] = []
    labels: list[int] = []
    for i in range(1, 6):
        batch = _batch(rng, PER_BATCH, first_label=i)
        if i == 2:
            data = batch[b"data"]
            assert isinstance(data, np.ndarray)
            # image 0 of batch 2: green channel (c=1), row 5, column 7
            data[0, 1 * 1024 + 5 * 32 + 7] = 201
            data[0, 1 * 1024 + 5 * 32 + 8] = 17
        if str_keys:
            _write(folder / f"data_batch_{i}", {k.decode(): v for k, v in batch.items()})
        else:
            _write(folder / f"data_batch_{i}", batch)
        datas.append(np.asarray(batch[b"data"]))
        labels.extend(int(v) for v in np.asarray(batch[b"labels"]))
    _write(folder / "test_batch", _batch(rng, TEST_SIZE, first_label=0))
    names = [
        b"airplane",
        b"automobile",
        b"bird",
        b"cat",
        b"deer",
        b"dog",
        b"frog",
        b"horse",
        b"ship",
        b"truck",
    ]
    _write(folder / "batches.meta", {b"label_names": names, b"num_cases_per_batch": PER_BATCH, b"num_vis": 3072})
    return np.concatenate(datas), np.array(labels)


def test_arrays_shapes_dtypes_labels_and_pixel_layout(tmp_path: Path) -> None:
    raw, labels = make_cifar(tmp_path)
    x, y, xt, yt = load_cifar10_arrays(tmp_path, download=False)
    assert x.shape == (5 * PER_BATCH, 3, 32, 32) and x.dtype == np.uint8
    assert xt.shape == (TEST_SIZE, 3, 32, 32) and xt.dtype == np.uint8
    assert y.dtype == np.int64 and yt.dtype == np.int64
    assert y.tolist() == labels.tolist()
    assert yt.tolist() == list(range(TEST_SIZE))
    assert x[PER_BATCH, 1, 5, 7] == 201 and x[PER_BATCH, 1, 5, 8] == 17
    assert np.array_equal(x.reshape(len(x), -1), raw)


def test_root_may_be_the_batches_folder_and_str_keys_work(tmp_path: Path) -> None:
    make_cifar(tmp_path, str_keys=True)
    x, _, _, _ = load_cifar10_arrays(tmp_path / FOLDER)
    assert x.shape == (5 * PER_BATCH, 3, 32, 32)
    assert x[PER_BATCH, 1, 5, 7] == 201


def test_missing_folder_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=str(tmp_path / FOLDER)):
        load_cifar10_arrays(tmp_path, download=False)


def test_incomplete_folder(tmp_path: Path) -> None:
    make_cifar(tmp_path)
    (tmp_path / FOLDER / "data_batch_3").unlink()
    with pytest.raises(FileNotFoundError, match="data_batch_3"):
        load_cifar10_arrays(tmp_path)


def test_foreign_objects_in_pickles_are_refused(tmp_path: Path) -> None:
    make_cifar(tmp_path)
    _write(tmp_path / FOLDER / "test_batch", {b"data": Path("x"), b"labels": []})
    with pytest.raises(ConfigError, match="not allowed"):
        load_cifar10_arrays(tmp_path)


@pytest.mark.parametrize("part", ["iid", "dirichlet"])
def test_federated_partition(tmp_path: Path, part: Literal["iid", "dirichlet"]) -> None:
    make_cifar(tmp_path)
    cfg = DataConfig(name="cifar10", root=str(tmp_path), partition=part, num_clients=7, dirichlet_alpha=0.3)
    ds = load_cifar10(cfg, seed=0)
    x, y, xt, yt = load_cifar10_arrays(tmp_path)
    assert ds.num_clients == 7 and ds.input_kind == "image" and ds.num_classes == 10
    assert ds.client_names[3] == "client0003"
    assert ds.x.shape == x.shape and ds.x.dtype == np.uint8
    assert np.array_equal(ds.x_test, xt) and np.array_equal(ds.y_test, yt)
    assert ds.test_offsets is None
    assert min(ds.client_sizes()) >= 1
    if part == "iid":
        assert max(ds.client_sizes()) - min(ds.client_sizes()) <= 1
    # every training image appears exactly once, with its own label
    flat = x.reshape(len(x), -1)
    keys = {flat[i].tobytes(): int(y[i]) for i in range(len(x))}
    got = [(row.tobytes(), int(lab)) for row, lab in zip(np.asarray(ds.x).reshape(len(ds.x), -1), ds.y, strict=True)]
    assert sorted(k for k, _ in got) == sorted(keys)
    assert all(keys[k] == lab for k, lab in got)
    assert ds.meta["mean"] == list(CIFAR10_MEAN)
    assert len(ds.meta["std"]) == 3  # type: ignore[arg-type]
    assert ds.meta["classes"][0] == "airplane"  # type: ignore[index]
    # same seed, same split; another seed, another split
    again = load_cifar10(cfg, seed=0)
    other = load_cifar10(cfg, seed=1)
    assert np.array_equal(again.x, ds.x) and np.array_equal(again.offsets, ds.offsets)
    assert not np.array_equal(other.x, ds.x)


def test_natural_partition_is_refused(tmp_path: Path) -> None:
    make_cifar(tmp_path)
    cfg = DataConfig(name="cifar10", root=str(tmp_path), partition="natural", num_clients=3)
    with pytest.raises(ValueError, match="no natural users"):
        load_cifar10(cfg, seed=0)


def test_cap_and_dispatcher(tmp_path: Path) -> None:
    make_cifar(tmp_path / "cifar10")
    cfg = DataConfig(name="cifar10", partition="iid", num_clients=3, max_samples_per_client=4)
    ds = build_federated_dataset(cfg, seed=0, cache_dir=tmp_path)  # root None -> cache_dir/"cifar10"
    assert ds.client_sizes().tolist() == [4, 4, 4]
    cfg2 = DataConfig(name="cifar10", root=str(tmp_path / "cifar10"), partition="iid", num_clients=3)
    assert build_federated_dataset(cfg2, seed=0).num_examples(0) == 10


def _decoded_directly(folder: Path) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The batches decoded as the loader always did, without any file it writes."""
    train = [_batch_arrays(folder / name) for name in TRAIN_BATCHES]
    xt, yt = _batch_arrays(folder / TEST_BATCH)
    return np.concatenate([x for x, _ in train]), np.concatenate([y for _, y in train]), xt, yt


def test_decoded_arrays_are_written_once_and_then_memory_mapped(tmp_path: Path) -> None:
    """The first load writes the decoded arrays beside the batches and returns them mapped; a later load maps them
    without decoding (a batch made unreadable is not read while the decoded arrays are its own); the arrays are the
    ones decoding gives."""
    make_cifar(tmp_path)
    folder = tmp_path / FOLDER
    expected = _decoded_directly(folder)
    first = load_cifar10_arrays(tmp_path)
    assert sorted(p.name for p in (folder / DECODED).iterdir()) == [
        "sources.json", "x_test.npy", "x_train.npy", "y_test.npy", "y_train.npy"
    ]  # fmt: skip
    assert isinstance(first[0], np.memmap) and isinstance(first[2], np.memmap)
    for got, want in zip(first, expected, strict=True):
        assert got.dtype == want.dtype and np.array_equal(got, want)
    written = (folder / DECODED / "x_train.npy").stat().st_mtime_ns
    second = load_cifar10_arrays(tmp_path)
    assert (folder / DECODED / "x_train.npy").stat().st_mtime_ns == written  # mapped, not written again
    for got, want in zip(second, expected, strict=True):
        assert np.array_equal(got, want)


def test_changed_or_damaged_decoded_arrays_are_decoded_again(tmp_path: Path) -> None:
    make_cifar(tmp_path)
    folder = tmp_path / FOLDER
    load_cifar10_arrays(tmp_path)
    # a batch replaced since: its size or time differs, so its arrays are decoded again
    batch = _batch(np.random.default_rng(7), PER_BATCH + 1, first_label=3)
    _write(folder / "data_batch_4", batch)
    x, _, _, _ = load_cifar10_arrays(tmp_path)
    assert len(x) == 5 * PER_BATCH + 1
    assert np.array_equal(x[3 * PER_BATCH : 4 * PER_BATCH + 1].reshape(PER_BATCH + 1, -1), batch[b"data"])
    # a truncated .npy file is not trusted either
    path = folder / DECODED / "x_train.npy"
    path.write_bytes(path.read_bytes()[:200])
    again = load_cifar10_arrays(tmp_path)
    for got, want in zip(again, _decoded_directly(folder), strict=True):
        assert np.array_equal(got, want)


def test_a_folder_without_room_for_the_decoded_arrays_is_decoded_in_memory(tmp_path: Path) -> None:
    make_cifar(tmp_path)
    folder = tmp_path / FOLDER
    (folder / f".{DECODED}.{os.getpid()}").write_text("in the way")  # the fresh folder cannot be made
    x, _, _, _ = load_cifar10_arrays(tmp_path)
    assert not isinstance(x, np.memmap) and not (folder / DECODED).exists()
    assert np.array_equal(x, _decoded_directly(folder)[0])


def test_mapped_training_images_are_read_in_client_order_and_pickle_out_of_band(tmp_path: Path) -> None:
    """The data set reads the mapped images in client-major order (the rows the old gather made), and pickles them
    as one out-of-band buffer, which Ray's object store holds once and every host maps (a ``np.memmap`` itself would
    pickle its bytes in band, copied by every reader)."""
    make_cifar(tmp_path)
    cfg = DataConfig(name="cifar10", root=str(tmp_path), partition="dirichlet", num_clients=4, dirichlet_alpha=0.5)
    ds = load_cifar10(cfg, seed=3)
    assert isinstance(ds.x, IndexedRows) and isinstance(ds.x_test, IndexedRows)
    x, y, xt, _ = _decoded_directly(tmp_path / FOLDER)
    order = np.concatenate([np.flatnonzero((x.reshape(len(x), -1) == row).all(axis=1))[:1]
                            for row in np.asarray(ds.x).reshape(len(ds.x), -1)])  # fmt: skip
    assert np.array_equal(y[order], ds.y)
    for c in range(ds.num_clients):
        cx, cy = ds.client_train(c)
        lo, hi = int(ds.offsets[c]), int(ds.offsets[c + 1])
        assert np.array_equal(cx, x[order[lo:hi]]) and np.array_equal(cy, y[order[lo:hi]])
    assert np.array_equal(ds.x_test[1:4], xt[1:4])
    buffers: list[pickle.PickleBuffer] = []
    blob = pickle.dumps(ds, protocol=5, buffer_callback=buffers.append)
    out_of_band = sum(memoryview(b).nbytes for b in buffers)  # the images, and the labels and indices (int64)
    assert x.nbytes + xt.nbytes <= out_of_band < x.nbytes + xt.nbytes + 1000 and len(blob) < 20_000
    back = pickle.loads(blob, buffers=buffers)
    assert np.array_equal(np.asarray(back.x), np.asarray(ds.x)) and np.array_equal(np.asarray(back.x_test), xt)
