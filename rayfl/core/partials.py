"""The parameter-server half of the element-wise weighted mean, on numpy arrays alone.

``rayfl.core.reducers.MaskedWeightedMean`` accumulates clients into float64 partial sums on the client hosts
(torch, next to training). What a shard does with them, merging the hosts' partials in host order and dividing, needs
nothing but numpy, so this module imports nothing else: a parameter-server shard that only reduces never loads torch
(about 400 MiB less per shard process, and a faster start). The arithmetic is the torch half's, operation for
operation (float64 additions in host order, one division, the cast back to the tensor's dtype), so results are bit for
bit the same as ``MaskedWeightedMean.merge`` and ``finalize``; ``tests/unit/core/test_reducers.py`` checks it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import numpy as np

__all__ = ["ArrayPartial", "ArraySums", "ArrayWeightedMean", "NumpyParams", "Reduced"]

NumpyParams = dict[str, np.ndarray]
# a shard's reduction: the new tensors, each one's coverage, and which elements were covered of those covered in part
Reduced = tuple[NumpyParams, dict[str, float], NumpyParams]


@dataclass(slots=True)
class ArraySums:
    """``sum w·x`` and ``sum w`` of one tensor (float64); ``weight`` is 0-d while every update covered it whole."""

    weighted: np.ndarray
    weight: np.ndarray


ArrayPartial = dict[str, ArraySums]


class ArrayWeightedMean:
    """Merge host partials and finalize against the previous values: the shard side of ``MaskedWeightedMean``."""

    def merge(self, partials: Iterable[ArrayPartial]) -> ArrayPartial:
        """Sum partials in the order given (hosts in id order, so results do not depend on timing)."""
        out: ArrayPartial = {}
        for partial in partials:
            for name, sums in partial.items():
                acc = out.get(name)
                if acc is None:
                    out[name] = ArraySums(np.array(sums.weighted, copy=True), np.array(sums.weight, copy=True))
                    continue
                acc.weighted += sums.weighted
                if acc.weight.ndim == 0 and sums.weight.ndim > 0:
                    acc.weight = np.broadcast_to(acc.weight, sums.weight.shape).copy()
                acc.weight += sums.weight
        return out

    def finalize(
        self, partial: ArrayPartial, previous: Mapping[str, np.ndarray]
    ) -> tuple[NumpyParams, dict[str, float]]:
        """Divide where covered, keep ``previous`` elsewhere; returns the new arrays and each one's coverage."""
        new: NumpyParams = {}
        coverage: dict[str, float] = {}
        for name, prev in previous.items():
            sums = partial.get(name)
            if sums is None:
                new[name] = np.array(prev, copy=True)
                coverage[name] = 0.0
                continue
            covered = sums.weight > 0
            mean = sums.weighted / np.where(covered, sums.weight, np.ones_like(sums.weight))
            new[name] = np.where(covered, mean, prev.astype(np.float64)).astype(prev.dtype)
            coverage[name] = float(covered.mean(dtype=np.float64)) if covered.ndim else float(covered)
        return new, coverage

    def covered(self, partial: ArrayPartial, previous: Mapping[str, np.ndarray]) -> NumpyParams:
        """Which elements some update covered (bool), for each tensor of ``previous`` that the updates covered only
        in part: ``MaskedWeightedMean.covered`` on arrays."""
        out: NumpyParams = {}
        for name in previous:
            sums = partial.get(name)
            if sums is None or sums.weight.ndim == 0:
                continue
            mask = sums.weight > 0
            if mask.any() and not mask.all():
                out[name] = mask
        return out
