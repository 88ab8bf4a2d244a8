"""CIFAR-10 from its Python-pickle release, split into clients IID or by a Dirichlet label skew.

The files are read here with ``pickle`` and numpy (torchvision is imported only to download them). Images
stay ``uint8`` in ``[N, 3, 32, 32]`` (channel, row, column) layout; models scale them by 1/255 and normalise
them with ``meta["mean"]`` and ``meta["std"]``.

Memory maps. The first load decodes the batches (with an unpickler that builds numpy arrays and nothing else) and
writes the arrays as ``.npy`` files into ``cifar-10-batches-py/rayfl-decoded-v1/``, with the batches' sizes and
modification times; later loads map those files (``np.load(mmap_mode="r")``) while the batches are unchanged, and
decode again otherwise. The training images then stay a memory map read in client-major order
(``federated.IndexedRows``): a process holds the file's pages, shared with every other process mapping them and
evictable, not a 150 MB copy of its own (the local backend, the driver before the data goes to Ray's object
store, which holds one copy that every host maps). A folder rayfl cannot write to is decoded into memory on every
load, as before. ``.npy`` was chosen over Arrow or Parquet because the arrays are fixed-shape numpy arrays: numpy
maps them with no conversion and no new dependency.
"""

from __future__ import annotations

import io
import json
import logging
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rayfl.config.sections import DataConfig
from rayfl.core.errors import ConfigError
from rayfl.core.rng import derive_rng
from rayfl.data import partition
from rayfl.data.federated import FederatedDataset, client_major, mapped

log = logging.getLogger(__name__)

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "FOLDER", "load_cifar10", "load_cifar10_arrays"]

FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
META_FILE = "batches.meta"
DECODED = "rayfl-decoded-v1"  # the decoded arrays as .npy files, inside the batches' folder
_DECODED_ARRAYS = ("x_train", "y_train", "x_test", "y_test")
_IMAGES, _LABELS = ("x_train", "x_test"), ("y_train", "y_test")
NUM_CLASSES = 10
# Per-channel mean and standard deviation of the training images on the 0-1 scale.
CIFAR10_MEAN = (0.4914, 0.4822, 0.4465)
CIFAR10_STD = (0.2470, 0.2435, 0.2616)

# What a CIFAR-10 pickle may reference: numpy's array reconstruction and nothing else.
_ALLOWED_GLOBALS = {
    ("numpy", "ndarray"),
    ("numpy", "dtype"),
    ("numpy.core.multiarray", "_reconstruct"),
    ("numpy._core.multiarray", "_reconstruct"),
    ("numpy.core.multiarray", "scalar"),
    ("numpy._core.multiarray", "scalar"),
    ("_codecs", "encode"),
}


class _ArrayUnpickler(pickle.Unpickler):
    """An unpickler that builds plain containers and numpy arrays but refuses any other object."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in _ALLOWED_GLOBALS:
            raise pickle.UnpicklingError(f"CIFAR-10 file references {module}.{name}, which is not allowed")
        if module == "numpy.core.multiarray":  # written by numpy < 2; numpy 2 moved the module
            module = "numpy._core.multiarray" if hasattr(np, "_core") else module
        return super().find_class(module, name)


def _read_batch(path: Path) -> dict[str, Any]:
    """One pickled batch as a dict with ``str`` keys.

    The release was pickled by Python 2, whose strings load as ``str`` with ``encoding="latin1"`` (the
    encoding numpy needs for Python-2 arrays); keys pickled as ``bytes`` by Python 3 are decoded the same way.
    """
    # Unpickled from memory (a batch is 30 MB): a garbage length field then reads as truncated data instead of
    # making the unpickler allocate the length it claims.
    data = path.read_bytes()
    errors = (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError)
    try:
        obj = _ArrayUnpickler(io.BytesIO(data), encoding="latin1").load()
    except (*errors, OverflowError, MemoryError) as err:
        # garbage bytes fail inside the unpickler in many ways (e.g. "invalid literal for int()"); a foreign object
        # is refused by ``_ArrayUnpickler`` and lands here too
        raise _bad_batch(path, f"{type(err).__name__}: {err}") from None
    if not isinstance(obj, dict):
        raise _bad_batch(path, f"holds a {type(obj).__name__}, not a dict")
    return {k.decode("latin1") if isinstance(k, bytes) else str(k): v for k, v in obj.items()}


def _bad_batch(path: Path, why: str) -> ConfigError:
    return ConfigError(
        f"not a CIFAR-10 batch ({why}); replace the folder with an intact cifar-10-batches-py "
        "(or delete it and set data.download=true)",
        file=str(path),
    )


def _batch_arrays(path: Path) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    batch = _read_batch(path)
    try:
        data, labels = batch["data"], batch["labels"]
    except KeyError as exc:
        raise _bad_batch(path, f"no key {exc.args[0]!r}") from None
    try:
        x = np.asarray(data, dtype=np.uint8)
        y = np.asarray(labels, dtype=np.int64).reshape(-1)
    except (TypeError, ValueError, OverflowError) as err:
        raise _bad_batch(path, f"data or labels are not numbers: {err}") from None
    if x.ndim != 2 or x.shape[1] != 3 * 32 * 32:
        raise _bad_batch(path, f"data has shape {x.shape}, expected [n, 3072]")
    if len(y) != len(x):
        raise _bad_batch(path, f"{len(x)} images but {len(y)} labels")
    # Each row is the red plane, then green, then blue, each 32 rows of 32 pixels.
    return x.reshape(-1, 3, 32, 32), y


def _find_folder(root: Path) -> Path:
    """``root/cifar-10-batches-py``, or ``root`` itself when it already is that folder."""
    if (root / TEST_BATCH).is_file() and not (root / FOLDER).is_dir():
        return root
    return root / FOLDER


def _download(root: Path) -> None:
    import torchvision  # heavy; only needed to fetch the archive

    root.mkdir(parents=True, exist_ok=True)
    torchvision.datasets.CIFAR10(root=str(root), train=True, download=True)


def load_cifar10_arrays(
    root: Path, download: bool = False
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.uint8], npt.NDArray[np.int64]]:
    """``(x_train, y_train, x_test, y_test)``; images ``uint8[N, 3, 32, 32]``, labels ``int64[N]``.

    ``root`` holds (or is) the ``cifar-10-batches-py`` folder. When the folder is missing, ``download=True``
    fetches it with torchvision; otherwise a ``FileNotFoundError`` names the folder that was expected.
    """
    root = Path(root)
    folder = _find_folder(root)
    if not folder.is_dir():
        if not download:
            raise FileNotFoundError(
                f"CIFAR-10 not found: expected the folder {folder} (the Python version of CIFAR-10, with "
                f"{', '.join(TRAIN_BATCHES)} and {TEST_BATCH}); set data.download=true to fetch it"
            )
        _download(root)
        folder = root / FOLDER
    missing = [name for name in (*TRAIN_BATCHES, TEST_BATCH) if not (folder / name).is_file()]
    if missing:
        raise FileNotFoundError(f"CIFAR-10 folder {folder} is incomplete: missing {', '.join(missing)}")
    sources = _sources(folder)
    decoded = _read_decoded(folder, sources)
    if decoded is not None:
        return decoded
    train = [_batch_arrays(folder / name) for name in TRAIN_BATCHES]
    x_test, y_test = _batch_arrays(folder / TEST_BATCH)
    x_train = np.concatenate([x for x, _ in train])
    y_train = np.concatenate([y for _, y in train])
    for name, labels in (("train", y_train), ("test", y_test)):
        if len(labels) and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
            raise ValueError(f"CIFAR-10 {name} labels outside 0..{NUM_CLASSES - 1} in {folder}")
    if _write_decoded(folder, sources, (x_train, y_train, x_test, y_test)):
        written = _read_decoded(folder, sources)  # mapped: the decoded copies in memory go
        if written is not None:
            return written
    return x_train, y_train, x_test, y_test


def _sources(folder: Path) -> dict[str, list[int]]:
    """Size and modification time of every batch: the decoded arrays are the batches' while these are the same."""
    out = {}
    for name in (*TRAIN_BATCHES, TEST_BATCH):
        stat = (folder / name).stat()
        out[name] = [stat.st_size, stat.st_mtime_ns]
    return out


def _read_decoded(
    folder: Path, sources: dict[str, list[int]]
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.int64], npt.NDArray[np.uint8], npt.NDArray[np.int64]] | None:
    """The decoded arrays of ``folder`` (images as read-only memory maps), or ``None`` when there are none for these
    batches, or they cannot be read or do not have the shapes decoding gives (they are then made again)."""
    cache = folder / DECODED
    try:
        if json.loads((cache / "sources.json").read_text(encoding="utf-8")) != sources:
            return None
        x_train, x_test = (np.load(cache / f"{n}.npy", mmap_mode="r", allow_pickle=False) for n in _IMAGES)
        y_train, y_test = (np.load(cache / f"{n}.npy", allow_pickle=False) for n in _LABELS)
    except (OSError, ValueError, EOFError):  # missing, truncated or not .npy
        return None
    for x, y in ((x_train, y_train), (x_test, y_test)):
        if x.dtype != np.uint8 or x.shape[1:] != (3, 32, 32) or y.dtype != np.int64 or y.shape != (len(x),):
            return None
    return x_train, y_train, x_test, y_test


def _write_decoded(folder: Path, sources: dict[str, list[int]], arrays: tuple[np.ndarray, ...]) -> bool:
    """Write the decoded arrays beside the batches (into a fresh folder renamed into place, so that a reader never
    sees half of them); ``False`` where the folder is not writable (or another process was quicker)."""
    cache, fresh = folder / DECODED, folder / f".{DECODED}.{os.getpid()}"
    try:
        shutil.rmtree(fresh, ignore_errors=True)
        fresh.mkdir()
        for name, array in zip(_DECODED_ARRAYS, arrays, strict=True):
            np.save(fresh / f"{name}.npy", np.ascontiguousarray(array), allow_pickle=False)
        (fresh / "sources.json").write_text(json.dumps(sources), encoding="utf-8")
        shutil.rmtree(cache, ignore_errors=True)  # decoded from batches that have changed since
        os.replace(fresh, cache)
    except OSError as err:
        shutil.rmtree(fresh, ignore_errors=True)
        log.debug("CIFAR-10 decoded in memory only: %s is not writable (%s)", folder, err)
        return False
    return True


def _class_names(folder: Path) -> list[str]:
    path = folder / META_FILE
    if not path.is_file():
        return []
    names = _read_batch(path).get("label_names", [])
    return [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in names]


def load_cifar10(cfg: DataConfig, seed: int, root: Path | None = None) -> FederatedDataset:
    """CIFAR-10's training set split into ``cfg.num_clients`` clients; the global test set is kept whole.

    The data folder is ``root`` if given, else ``cfg.root``. ``cfg.partition`` is any partitioner but
    ``natural`` (``partition.split``: ``iid`` equal random shards, ``dirichlet`` label skew ...); the split draws from
    ``derive_rng(seed, "partition")``. A positive ``cfg.max_samples_per_client`` then keeps a random subset of
    that many samples per client (``derive_rng(seed, "partition_cap")``).
    """
    if root is None:
        if cfg.root is None:
            raise ValueError("load_cifar10 needs a data folder: pass root or set data.root")
        root = Path(cfg.root)
    x_train, y_train, x_test, y_test = load_cifar10_arrays(Path(root), cfg.download)

    if cfg.partition == "natural":
        raise ValueError("CIFAR-10 has no natural users; use data.partition iid, dirichlet, shards, pathological or "
                         "size_skew")  # fmt: skip
    parts = partition.split(
        cfg.partition, y_train, cfg.num_clients, derive_rng(seed, "partition"), alpha=cfg.dirichlet_alpha,
        shards_per_client=cfg.shards_per_client, classes_per_client=cfg.classes_per_client,
    )  # fmt: skip
    parts = partition.cap_per_client(parts, cfg.max_samples_per_client, derive_rng(seed, "partition_cap"))

    width = max(4, len(str(cfg.num_clients - 1)))
    meta: dict[str, object] = {
        "mean": list(CIFAR10_MEAN),
        "std": list(CIFAR10_STD),
        "partition": cfg.partition,
        "layout": "NCHW",
    }
    names = _class_names(_find_folder(Path(root)))
    if names:
        meta["classes"] = names
    if cfg.partition == "dirichlet":
        meta["dirichlet_alpha"] = cfg.dirichlet_alpha
    order = np.concatenate(parts) if parts else np.empty(0, dtype=np.int64)
    sizes = np.array([len(p) for p in parts], dtype=np.int64)
    return FederatedDataset(
        name="cifar10",
        input_kind="image",
        num_classes=NUM_CLASSES,
        x=client_major(x_train, order),  # the memory map read in client-major order (or one gather in memory)
        y=y_train[order],
        offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        x_test=mapped(x_test),
        y_test=y_test,
        client_names=tuple(f"client{c:0{width}d}" for c in range(len(parts))),
        meta=meta,
    )
