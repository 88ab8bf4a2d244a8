"""CIFAR-10 from its Python-pickle release, split into clients IID or by a Dirichlet label skew.

The files are read here with ``pickle`` and numpy (torchvision is imported only to download them). Images
stay ``uint8`` in ``[N, 3, 32, 32]`` (channel, row, column) layout; models scale them by 1/255 and normalise
them with ``meta["mean"]`` and ``meta["std"]``.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from rayfl.config import DataConfig
from rayfl.config_loader import ConfigError
from rayfl.data import partition
from rayfl.data.federated import FederatedDataset
from rayfl.rng import derive_rng

__all__ = ["CIFAR10_MEAN", "CIFAR10_STD", "FOLDER", "load_cifar10", "load_cifar10_arrays"]

FOLDER = "cifar-10-batches-py"
TRAIN_BATCHES = tuple(f"data_batch_{i}" for i in range(1, 6))
TEST_BATCH = "test_batch"
META_FILE = "batches.meta"
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
    train = [_batch_arrays(folder / name) for name in TRAIN_BATCHES]
    x_test, y_test = _batch_arrays(folder / TEST_BATCH)
    x_train = np.concatenate([x for x, _ in train])
    y_train = np.concatenate([y for _, y in train])
    for name, labels in (("train", y_train), ("test", y_test)):
        if len(labels) and (labels.min() < 0 or labels.max() >= NUM_CLASSES):
            raise ValueError(f"CIFAR-10 {name} labels outside 0..{NUM_CLASSES - 1} in {folder}")
    return x_train, y_train, x_test, y_test


def _class_names(folder: Path) -> list[str]:
    path = folder / META_FILE
    if not path.is_file():
        return []
    names = _read_batch(path).get("label_names", [])
    return [n.decode("utf-8") if isinstance(n, bytes) else str(n) for n in names]


def load_cifar10(cfg: DataConfig, seed: int, root: Path | None = None) -> FederatedDataset:
    """CIFAR-10's training set split into ``cfg.num_clients`` clients; the global test set is kept whole.

    The data folder is ``root`` if given, else ``cfg.root``. ``cfg.partition`` is ``"iid"`` (equal random
    shards) or ``"dirichlet"`` (label skew with ``cfg.dirichlet_alpha``); the split draws from
    ``derive_rng(seed, "partition")``. A positive ``cfg.max_samples_per_client`` then keeps a random subset of
    that many samples per client (``derive_rng(seed, "partition_cap")``).
    """
    if root is None:
        if cfg.root is None:
            raise ValueError("load_cifar10 needs a data folder: pass root or set data.root")
        root = Path(cfg.root)
    x_train, y_train, x_test, y_test = load_cifar10_arrays(Path(root), cfg.download)

    rng = derive_rng(seed, "partition")
    if cfg.partition == "iid":
        parts = partition.iid(len(y_train), cfg.num_clients, rng)
    elif cfg.partition == "dirichlet":
        parts = partition.dirichlet(y_train, cfg.num_clients, cfg.dirichlet_alpha, rng)
    else:
        raise ValueError(
            f"CIFAR-10 has no natural users; use data.partition 'iid' or 'dirichlet' (got {cfg.partition!r})"
        )
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
        x=x_train[order],  # one gather into client-major order
        y=y_train[order],
        offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
        x_test=x_test,
        y_test=y_test,
        client_names=tuple(f"client{c:0{width}d}" for c in range(len(parts))),
        meta=meta,
    )
