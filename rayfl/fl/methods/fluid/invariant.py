"""Invariant Dropout's arithmetic (FLuID, Wang et al. NeurIPS 2023, Sec. 3), on plain arrays and tensors.

* ``unit_changes``: per dimension of an elastic family's search space, each unit's largest relative weight change
  ``|after - before| / |before|`` over every trainable tensor with an axis on that dimension (a conv's filters and
  bias for its output channels, the next layer's input columns, a norm's affine vector), the authors' per-neuron
  maximum over its filter, bias and the next layer's weights (``find_min``). A weight that was 0 is left out (its
  relative change is undefined; the authors' models have no norm layers, whose biases start at 0, so they never meet
  one: counted as infinite it would make every unit of a batch-normed model variant).
* ``invariant_units``: the units whose change is at most ``threshold`` for at least ``agreement`` of the clients.
  The authors' code counts the clients per weight and then asks all of a neuron's weights to pass; here a client
  passes a unit when all of the unit's weights pass (each client reports one number per unit, not one per weight),
  so a unit is invariant here only if the authors' code would find it invariant too.
* ``units_to_drop``: which units a straggler drops: first those dropped last round that are still invariant, then the
  other invariant units, then the rest, each group in a random order from the given generator (the authors'
  ``drop_dynamic``, which samples within the same three groups).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch

from rayfl.models.elastic.space import SearchSpace

__all__ = ["invariant_units", "relative_change", "unit_changes", "units_to_drop"]


def relative_change(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """``|after - before| / |before|`` element-wise in float64; 0 where ``before`` is 0 (undefined there: ignored)."""
    b, a = before.detach().cpu().double(), after.detach().cpu().double()
    safe = torch.where(b == 0, torch.ones_like(b), b.abs())
    return torch.where(b == 0, torch.zeros_like(b), (a - b).abs() / safe)


def unit_changes(
    space: SearchSpace, before: Mapping[str, torch.Tensor], after: Mapping[str, torch.Tensor]
) -> list[np.ndarray]:
    """Per dimension of ``space``, every unit's largest relative change over the tensors named in both mappings."""
    out = [np.zeros(d.size) for d in space.dims]
    for name, layout in space.layouts.items():
        if name not in before or name not in after:
            continue
        rel = relative_change(before[name], after[name])
        for position, axis in enumerate(layout.axes):
            if axis is None:
                continue
            per = rel.movedim(position, 0).reshape(rel.shape[position], -1).amax(dim=1)
            per = per.reshape(-1, axis.group).amax(dim=1)
            out[axis.dim] = np.maximum(out[axis.dim], per.numpy())
    return out


def invariant_units(changes: np.ndarray, threshold: float, agreement: float) -> np.ndarray:
    """Sorted ids of the units (columns of ``changes``, one row per client) whose change is at most ``threshold`` for
    at least ``agreement`` of the clients (none without clients)."""
    if changes.shape[0] == 0:
        return np.zeros(0, dtype=np.int64)
    passes = (changes <= threshold).sum(axis=0)
    return np.flatnonzero(passes >= agreement * changes.shape[0]).astype(np.int64)


def units_to_drop(
    size: int, count: int, invariant: Sequence[int], dropped_before: Sequence[int], rng: np.random.Generator
) -> np.ndarray:
    """``count`` of ``size`` units to drop, sorted: still-invariant units dropped last round first, then the other
    invariant units, then any, each group shuffled by ``rng``."""
    inv = set(int(u) for u in invariant)
    first = sorted(inv & {int(u) for u in dropped_before})
    second = sorted(inv - set(first))
    rest = sorted(set(range(size)) - inv)
    order: list[int] = []
    for group in (first, second, rest):
        order.extend(int(u) for u in rng.permutation(np.asarray(group, dtype=np.int64)))
        if len(order) >= count:
            break
    return np.sort(np.asarray(order[:count], dtype=np.int64))
