"""``SubModelSpec``: per dimension a width ratio, plus the rule that picks which global units a sub-model keeps.

Selectors (all return sorted unit indices, so a sub-model keeps the global order of what it holds):

* ``FirstK``: the leading ``k`` units (HeteroFL, FjORD, the core method).
* ``Rolling``: FedRolex's window (official ``ResnetServerRoll.split_model``): the index vector is cyclically shifted by
  ``r = round mod size`` and the first ``k`` entries are kept, i.e. ``{(size - r + j) mod size : j < k}``; it wraps
  around, moves by one unit per round, and has the same start for every dimension and client of a round
  (ALGORITHMS.md section 3).
* ``RandomSubset``: ``k`` units drawn without replacement from a generator derived from ``(seed, "dropout", *keys,
  dimension)`` (Federated Dropout). Pass the client id in ``keys`` for per-client draws, leave it out for one draw per
  round shared by all clients (the core paper's FedDropout baseline).
* ``TopKNorm``: the ``k`` units with the largest L2 norm of the weights that write them (AnyCostFL). A residual stream
  is one dimension, so its channels are scored jointly over every tensor writing to the stream and the residual adds
  stay aligned (the per-layer ordering of the Plato port breaks this; ALGORITHMS.md section 6).

A dimension that keeps all its units (or none) is the same under every selector.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from rayfl.core.rng import derive_rng
from rayfl.models.elastic.space import SearchSpace

__all__ = [
    "FirstK",
    "RandomSubset",
    "Rolling",
    "Selection",
    "Selector",
    "SubModelSpec",
    "TopKNorm",
    "first_k",
    "select",
]


@dataclass(frozen=True, slots=True)
class FirstK:
    """The leading ``k`` units of every dimension."""


@dataclass(frozen=True, slots=True)
class Rolling:
    """FedRolex's window, shifted by the round."""

    round_idx: int


@dataclass(frozen=True, slots=True)
class RandomSubset:
    """``k`` units drawn from a generator derived from ``(seed, "dropout", *keys, dimension)``."""

    seed: int
    keys: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class TopKNorm:
    """The ``k`` units with the largest L2 norm of the weights that write them."""


Selector = FirstK | Rolling | RandomSubset | TopKNorm


@dataclass(frozen=True, slots=True)
class SubModelSpec:
    """Width ratio per dimension of the family's ``SearchSpace`` (0 skips, where allowed) and the index rule."""

    ratios: tuple[float, ...]
    selector: Selector = field(default_factory=FirstK)

    @classmethod
    def uniform(cls, space: SearchSpace, ratio: float, selector: Selector | None = None) -> SubModelSpec:
        """Every dimension at ``ratio`` (skippable ones too, so ``ratio`` must be > 0): HeteroFL's model levels."""
        return cls(tuple(float(ratio) for _ in space.dims), selector or FirstK())


@dataclass(frozen=True, slots=True)
class Selection:
    """The resolved spec: units kept per dimension and their global indices (sorted)."""

    units: tuple[int, ...]
    index: tuple[np.ndarray, ...]


def select(space: SearchSpace, spec: SubModelSpec, params: Mapping[str, torch.Tensor] | None = None) -> Selection:
    """Resolve ``spec`` into global unit indices; ``TopKNorm`` needs the global ``params``."""
    units = space.units(spec.ratios)
    sel = spec.selector
    scores = _norm_scores(space, params) if isinstance(sel, TopKNorm) else None
    index: list[np.ndarray] = []
    for d, (dim, k) in enumerate(zip(space.dims, units, strict=True)):
        n = dim.size
        if k == n or k == 0 or isinstance(sel, FirstK):
            index.append(np.arange(k, dtype=np.int64))
        elif isinstance(sel, Rolling):
            start = (n - sel.round_idx % n) % n
            index.append(np.sort((start + np.arange(k)) % n).astype(np.int64))
        elif isinstance(sel, RandomSubset):
            rng = derive_rng(sel.seed, "dropout", *sel.keys, d)
            index.append(np.sort(rng.choice(n, size=k, replace=False)).astype(np.int64))
        else:
            if scores is None:
                raise ValueError("TopKNorm needs the global parameters")
            # stable sort on the negated score: ties keep the lower index, so the result is deterministic
            order = np.argsort(-scores[d], kind="stable")[:k]
            index.append(np.sort(order).astype(np.int64))
    return Selection(units, tuple(index))


def _norm_scores(space: SearchSpace, params: Mapping[str, torch.Tensor] | None) -> list[np.ndarray]:
    """Per dimension, the squared L2 norm of each unit summed over every weight (ndim >= 2) whose axis 0 writes it."""
    if params is None:
        raise ValueError("TopKNorm needs the global parameters")
    scores = [np.zeros(d.size) for d in space.dims]
    for name, lay in space.layouts.items():
        ax = lay.axes[0] if lay.axes else None
        if ax is None or len(lay.shape) < 2 or name in space.classifier:
            continue
        sq = params[name].detach().double().pow(2).reshape(lay.shape[0], -1).sum(dim=1)
        scores[ax.dim] += sq.reshape(-1, ax.group).sum(dim=1).numpy()
    return scores


def first_k(units: Sequence[int]) -> Selection:
    """The leading ``units[d]`` units of every dimension."""
    return Selection(tuple(int(u) for u in units), tuple(np.arange(int(u), dtype=np.int64) for u in units))
