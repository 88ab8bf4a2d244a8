"""CIFAR-10 loading from a tiny folder in the release's pickle format, and its partitions."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Literal

import numpy as np
import pytest

from rayfl.config import DataConfig
from rayfl.config_loader import ConfigError
from rayfl.data import build_federated_dataset
from rayfl.data.cifar10 import CIFAR10_MEAN, FOLDER, load_cifar10, load_cifar10_arrays

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
    got = [(row.tobytes(), int(lab)) for row, lab in zip(ds.x.reshape(len(ds.x), -1), ds.y, strict=True)]
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
