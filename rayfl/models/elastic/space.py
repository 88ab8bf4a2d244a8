"""The searchable dimensions of an elastic model family and how every global tensor is laid out over them.

A *dimension* is a set of units (output channels of a conv, hidden units of an MLP, attention heads) whose count a
sub-model may reduce; a residual stream is one dimension, so every tensor that reads or writes the stream uses the same
index set and residual adds stay aligned by construction. A skippable dimension may keep 0 units, which removes the
block it belongs to (its residual branch then adds nothing: the block is the identity).

Every entry of the global ``state_dict`` has a ``TensorLayout``: per tensor axis either ``None`` (never sliced: image
channels, classes, kernel taps) or an ``Axis`` tying it to a dimension, where each unit spans ``group`` consecutive
positions (a head spans ``head_dim`` rows of Q; a conv channel spans ``7 x 7`` inputs of a flattened classifier). A
tensor whose ``gate`` dimension keeps 0 units is not part of the sub-model at all.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rayfl.core.messages import TensorSlice

__all__ = ["Axis", "Dimension", "SearchSpace", "TensorLayout", "units_for"]


@dataclass(frozen=True, slots=True)
class Dimension:
    """One searchable width. ``skippable``: 0 units allowed, removing the block that ``gates`` on it."""

    name: str
    size: int
    skippable: bool = False


@dataclass(frozen=True, slots=True)
class Axis:
    """Tensor axis bound to dimension ``dim`` (an index into ``SearchSpace.dims``); unit ``i`` covers positions
    ``[i * group, (i + 1) * group)``."""

    dim: int
    group: int = 1


@dataclass(frozen=True, slots=True)
class TensorLayout:
    shape: tuple[int, ...]
    axes: tuple[Axis | None, ...]
    gate: int | None = None  # the tensor exists only while this dimension keeps at least one unit


def units_for(dim: Dimension, ratio: float) -> int:
    """Units kept at ``ratio``: ``ceil(ratio * size)`` (HeteroFL's rounding), at least 1, and 0 only when skippable."""
    if ratio <= 0.0:
        if not dim.skippable:
            raise ValueError(f"dimension {dim.name!r} cannot be skipped (ratio {ratio})")
        return 0
    if ratio > 1.0:
        raise ValueError(f"dimension {dim.name!r}: ratio {ratio} is above 1")
    return max(1, min(dim.size, math.ceil(ratio * dim.size - 1e-9)))


@dataclass(frozen=True)
class SearchSpace:
    """Dimensions plus the layout of every global tensor; ``classifier`` names the tensors whose rows are classes."""

    dims: tuple[Dimension, ...]
    layouts: Mapping[str, TensorLayout]
    classifier: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        for name, lay in self.layouts.items():
            if len(lay.shape) != len(lay.axes):
                raise ValueError(f"{name}: layout has {len(lay.axes)} axes for shape {lay.shape}")
            for size, ax in zip(lay.shape, lay.axes, strict=True):
                if ax is not None and self.dims[ax.dim].size * ax.group != size:
                    dim = self.dims[ax.dim]
                    raise ValueError(f"{name}: axis of size {size} does not match {dim.name} ({dim.size} x {ax.group})")

    @property
    def sizes(self) -> np.ndarray:
        return np.array([d.size for d in self.dims], dtype=np.int64)

    @property
    def skippable(self) -> np.ndarray:
        return np.array([d.skippable for d in self.dims], dtype=bool)

    def dim_index(self, name: str) -> int:
        for i, d in enumerate(self.dims):
            if d.name == name:
                return i
        raise KeyError(name)

    def units(self, ratios: Sequence[float]) -> tuple[int, ...]:
        if len(ratios) != len(self.dims):
            raise ValueError(f"spec has {len(ratios)} ratios for {len(self.dims)} dimensions")
        return tuple(units_for(d, float(r)) for d, r in zip(self.dims, ratios, strict=True))

    def present(self, name: str, units: Sequence[int]) -> bool:
        gate = self.layouts[name].gate
        return gate is None or units[gate] > 0

    def tensor_slice(self, name: str, index: Sequence[np.ndarray], rows: np.ndarray | None = None) -> TensorSlice:
        """Global positions covered by a sub-model tensor, given each dimension's kept unit indices.

        ``rows`` (for classifier tensors) restricts axis 0 to those classes, e.g. the labels a client holds.
        """
        lay = self.layouts[name]
        parts: list[np.ndarray | None] = []
        for k, ax in enumerate(lay.axes):
            if ax is None:
                parts.append(rows if (k == 0 and rows is not None) else None)
            elif ax.group == 1:
                parts.append(np.asarray(index[ax.dim], dtype=np.int64))
            else:
                units = np.asarray(index[ax.dim], dtype=np.int64)
                parts.append((units[:, None] * ax.group + np.arange(ax.group)).reshape(-1))
        return TensorSlice(tuple(parts))

    def sub_shape(self, name: str, units: Sequence[int]) -> tuple[int, ...]:
        lay = self.layouts[name]
        return tuple(s if ax is None else units[ax.dim] * ax.group for s, ax in zip(lay.shape, lay.axes, strict=True))

    def num_params(self, units: Sequence[int]) -> int:
        """Exact element count of the sub-model's tensors (the cost model vectorises the same sum)."""
        total = 0
        for name in self.layouts:
            if self.present(name, units):
                total += int(np.prod(self.sub_shape(name, units)))
        return total
