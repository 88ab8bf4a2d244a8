"""Data sources, partitions and the federated container.

``build_federated_dataset`` turns a ``DataConfig`` into a ``FederatedDataset``. Loaders are imported only when
called, so importing this package costs nothing beyond numpy.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rayfl.config.sections import DataConfig
from rayfl.data.federated import FederatedDataset, InputKind, from_client_arrays

__all__ = [
    "LOADERS",
    "FederatedDataset",
    "InputKind",
    "build_federated_dataset",
    "from_client_arrays",
    "with_validation",
]


def _cache_dir(cache_dir: Path | None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir)
    from rayfl.data.shakespeare import default_cache_dir

    return Path(default_cache_dir())


def _data_root(cfg: DataConfig, cache_dir: Path | None, folder: str) -> Path:
    """``cfg.root`` when set, else ``<cache_dir>/<folder>``."""
    return Path(cfg.root) if cfg.root is not None else _cache_dir(cache_dir) / folder


def _shakespeare(cfg: DataConfig, seed: int, cache_dir: Path | None) -> FederatedDataset:
    from rayfl.data.shakespeare import load_shakespeare

    return load_shakespeare(cfg, _cache_dir(cache_dir), seed)


def _cifar10(cfg: DataConfig, seed: int, cache_dir: Path | None) -> FederatedDataset:
    from rayfl.data.cifar10 import load_cifar10

    return load_cifar10(cfg, seed, root=_data_root(cfg, cache_dir, "cifar10"))


def _mnist5k(cfg: DataConfig, seed: int, cache_dir: Path | None) -> FederatedDataset:
    from rayfl.data.mnist5k import load_mnist5k

    return load_mnist5k(cfg, seed, _cache_dir(cache_dir))


def _leaf(cfg: DataConfig, seed: int, cache_dir: Path | None) -> FederatedDataset:
    from rayfl.data.leaf import load_leaf

    return load_leaf(_data_root(cfg, cache_dir, "leaf"), None, cfg, seed)


def _synthetic(cfg: DataConfig, seed: int, cache_dir: Path | None) -> FederatedDataset:
    from rayfl.data.synthetic import load_synthetic

    return load_synthetic(cfg, seed)


def _custom(cfg: DataConfig, seed: int, cache_dir: Path | None) -> FederatedDataset:
    from rayfl.data.custom import load_custom

    return load_custom(cfg, seed)


def _parquet(cfg: DataConfig, seed: int, cache_dir: Path | None) -> FederatedDataset:
    from rayfl.data.table import load_parquet

    return load_parquet(cfg, seed)


def _hf(cfg: DataConfig, seed: int, cache_dir: Path | None) -> FederatedDataset:
    from rayfl.data.table import load_hf

    return load_hf(cfg, seed)


# data.name -> loader(cfg, seed, cache_dir)
LOADERS: dict[str, Callable[[DataConfig, int, Path | None], FederatedDataset]] = {
    "shakespeare": _shakespeare,
    "cifar10": _cifar10,
    "leaf": _leaf,
    "mnist5k": _mnist5k,
    "synthetic": _synthetic,
    "custom": _custom,
    "parquet": _parquet,
    "hf": _hf,
}


def build_federated_dataset(cfg: DataConfig, seed: int, cache_dir: Path | None = None) -> FederatedDataset:
    """The federated data set ``cfg`` describes.

    ``cache_dir`` (default: ``rayfl.data.shakespeare.default_cache_dir()``, resolved only when a loader
    needs it) holds downloads; ``cfg.root``, when set, is the data folder of ``cifar10`` and ``leaf`` (else
    ``<cache_dir>/cifar10`` and ``<cache_dir>/leaf``). ``cfg.client_test_fraction`` then holds out part of every
    client's samples as its own test set (``hold_out_client_tests``), and ``cfg.val_fraction`` part of every client's
    remaining training samples as the server's validation set (``with_validation``).

    Numpy's BLAS runs at one thread meanwhile (``blas_threads.py``): the data set is the same in whichever process,
    thread or backend it is built, and building it beside ``ray.init`` (which forks) cannot hang.
    """
    from rayfl.data.blas_threads import one_blas_thread

    try:
        loader = LOADERS[cfg.name]
    except KeyError:
        raise ValueError(f"unknown data.name {cfg.name!r}; known: {', '.join(sorted(LOADERS))}") from None
    with one_blas_thread():
        dataset = loader(cfg, seed, cache_dir)
        if cfg.client_test_fraction > 0:
            from rayfl.core.rng import derive_rng
            from rayfl.data.federated import hold_out_client_tests

            dataset = hold_out_client_tests(dataset, cfg.client_test_fraction, derive_rng(seed, "client-test"))
        return with_validation(dataset, cfg, seed)


def with_validation(dataset: FederatedDataset, cfg: DataConfig, seed: int) -> FederatedDataset:
    """``dataset`` with ``cfg.val_fraction`` of every client's training samples held out as the server's validation
    set (``hold_out_validation``, from ``derive_rng(seed, "validation")``); unchanged when the fraction is 0 or the
    data set has a validation set already (a data set given to a run, built with one)."""
    if cfg.val_fraction <= 0 or dataset.x_val is not None:
        return dataset
    from rayfl.core.rng import derive_rng
    from rayfl.data.federated import hold_out_validation

    return hold_out_validation(dataset, cfg.val_fraction, derive_rng(seed, "validation"))
