"""Users' own data: ``data.name: custom`` with ``factory: "package.module:function"``.

The factory is called on the driver with ``data.kwargs`` (plus ``seed`` and ``num_clients`` when it takes them and
``kwargs`` does not set them). It returns either

- a ``FederatedDataset`` (its clients as they are), or
- a mapping of centralised arrays ``x``, ``y``, ``x_test``, ``y_test`` (optional ``num_classes``, default
  ``max(label) + 1``, and ``input_kind``, default ``"image"`` for 4-d ``x`` and ``"tokens"`` for 2-d; ``"features"``
  for float32 feature vectors), which
  ``data.partition`` (any partitioner but ``natural``: ``partition.split``) splits into ``data.num_clients`` clients
  with a generator derived from the seed. Arrays the factory memory-maps (``np.load(path, mmap_mode="r")``) stay
  memory maps, read in client order per client (``federated.client_major``), so a large data set is not copied
  into the driver.

Either way the result is checked before anything runs: images are ``uint8`` or ``float32`` ``[N, C, H, W]``, tokens
integer ``[N, T]``, feature vectors ``float32 [N, F]``, labels integer ``[N]`` in ``[0, num_classes)``, and the test
set has the training samples' shape.
Every fault is a ``ConfigError`` on ``data.factory`` naming the path and what is wrong (``models/custom.py`` says where
the path is imported from).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from rayfl.config.sections import DataConfig
from rayfl.core.errors import ConfigError
from rayfl.core.rng import derive_rng
from rayfl.data import partition
from rayfl.data.federated import FederatedDataset, client_major, mapped

__all__ = ["check_data_factory", "check_dataset", "load_custom"]

_ARRAYS = ("x", "y", "x_test", "y_test")
_SAMPLE_NDIM = {"image": 4, "tokens": 2, "features": 2}
_LAYOUT = {"image": "[N, C, H, W]", "tokens": "[N, T]", "features": "[N, F]"}


def load_custom(cfg: DataConfig, seed: int) -> FederatedDataset:
    """The data set the user's factory gives, partitioned when it gives arrays, and checked."""
    from rayfl.models.custom import call_factory, resolve_factory  # resolution is shared with custom models

    factory = resolve_factory(cfg.factory, "data.factory")
    out = call_factory(factory, cfg.kwargs, {"seed": seed, "num_clients": cfg.num_clients}, "data.factory")
    if isinstance(out, FederatedDataset):  # its memory maps as IndexedRows, which Ray's object store maps once
        dataset = dataclasses.replace(
            out, x=mapped(out.x), x_test=mapped(out.x_test), x_val=None if out.x_val is None else mapped(out.x_val)
        )
    elif isinstance(out, Mapping):
        dataset = _from_arrays(out, cfg, seed)
    else:
        raise _fault(
            cfg.factory,
            f"returned a {type(out).__module__}.{type(out).__name__}, expected a rayfl.data.FederatedDataset or a "
            f"mapping with keys {', '.join(_ARRAYS)}",
        )
    check_dataset(dataset, cfg.factory)
    return dataset


def check_data_factory(cfg: DataConfig) -> None:
    """What ``rayfl validate`` checks without loading the data: the factory imports and is callable."""
    from rayfl.models.custom import resolve_factory

    resolve_factory(cfg.factory, "data.factory")


def _fault(factory: str, reason: str) -> ConfigError:
    return ConfigError(f"{factory!r}: {reason}", "data.factory")


def _from_arrays(out: Mapping[str, Any], cfg: DataConfig, seed: int) -> FederatedDataset:
    factory = cfg.factory
    missing = [k for k in _ARRAYS if k not in out]
    if missing:
        raise _fault(factory, f"the returned mapping lacks {', '.join(missing)} (needs {', '.join(_ARRAYS)})")
    # a memory map (np.load(..., mmap_mode="r")) stays one: read in client order per client, never copied whole
    x, x_test = (out[k] if isinstance(out[k], np.memmap) else np.asarray(out[k]) for k in ("x", "x_test"))
    y, y_test = np.asarray(out["y"]), np.asarray(out["y_test"])
    if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
        raise _fault(factory, f"y must be integer labels of shape [N], got {y.dtype} {y.shape}")
    kind = out.get("input_kind", "image" if x.ndim == 4 else "tokens")
    num_classes = int(out.get("num_classes", int(max(y.max(initial=0), y_test.max(initial=0))) + 1))
    if cfg.partition == "natural":
        raise _fault(
            factory,
            "returned arrays, which a data.partition other than 'natural' splits (iid, dirichlet, shards, "
            "pathological, size_skew); 'natural' needs the factory to return a FederatedDataset with its own clients",
        )
    try:
        parts = partition.split(
            cfg.partition, y, cfg.num_clients, derive_rng(seed, "partition"), alpha=cfg.dirichlet_alpha,
            shards_per_client=cfg.shards_per_client, classes_per_client=cfg.classes_per_client,
        )  # fmt: skip
    except ValueError as err:
        raise ConfigError(str(err), "data.partition") from None
    order = np.concatenate(parts)
    offsets = np.concatenate([[0], np.cumsum([len(p) for p in parts])]).astype(np.int64)
    return FederatedDataset(
        name="custom",
        input_kind=kind,
        num_classes=num_classes,
        x=client_major(x, order),
        y=y[order].astype(np.int64),
        offsets=offsets,
        x_test=mapped(x_test),
        y_test=y_test.astype(np.int64),
        meta={"partition": cfg.partition},
    )


def _dtype_ok(kind: str, dtype: np.dtype) -> bool:
    if kind == "image":
        return dtype in (np.uint8, np.float32)
    if kind == "features":
        return dtype == np.float32
    return bool(np.issubdtype(dtype, np.integer))


def check_dataset(ds: FederatedDataset, factory: str) -> None:
    """A ``ConfigError`` on ``data.factory`` naming ``factory`` and the array at fault unless ``ds`` (what ``factory``
    gave) holds what the engine can train on."""
    if ds.input_kind not in _SAMPLE_NDIM:
        raise _fault(factory, f"input_kind must be 'image', 'tokens' or 'features', got {ds.input_kind!r}")
    ndim = _SAMPLE_NDIM[ds.input_kind]
    layout = _LAYOUT[ds.input_kind]
    for name, x in (("x", ds.x), ("x_test", ds.x_test)):
        if x.ndim != ndim:
            raise _fault(factory, f"{ds.input_kind} {name} must be {layout}, got shape {x.shape}")
        want = {"image": "uint8 or float32", "tokens": "an integer dtype", "features": "float32"}[ds.input_kind]
        if not _dtype_ok(ds.input_kind, x.dtype):
            raise _fault(factory, f"{ds.input_kind} {name} must be {want}, got {x.dtype}")
    if ds.x.shape[1:] != ds.x_test.shape[1:]:
        raise _fault(factory, f"x_test samples are {ds.x_test.shape[1:]}, but x samples are {ds.x.shape[1:]}")
    if ds.num_classes < 2:
        raise _fault(factory, f"num_classes must be at least 2, got {ds.num_classes}")
    for name, y in (("y", ds.y), ("y_test", ds.y_test)):
        if y.ndim != 1 or not np.issubdtype(y.dtype, np.integer):
            raise _fault(factory, f"{name} must be integer labels of shape [N], got {y.dtype} {y.shape}")
        if isinstance(y, np.ndarray) and len(y) and (int(y.min()) < 0 or int(y.max()) >= ds.num_classes):
            raise _fault(
                factory, f"{name} has labels in [{int(y.min())}, {int(y.max())}], outside [0, {ds.num_classes})"
            )
    if len(ds.x_test) == 0:
        raise _fault(factory, "the test set is empty")
