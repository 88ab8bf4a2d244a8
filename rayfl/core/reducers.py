"""The count-weighted element-wise mean that every sub-model method aggregates with.

For each element ``e`` of a global tensor: ``new[e] = sum_c w_c x_c[e] / sum_c w_c [e covered by c]`` over the
clients ``c`` whose update covers ``e``; an element that no client covered keeps its previous value (HeteroFL's
``combine``; ALGORITHMS.md section 1). Full-model updates are the special case where every client covers everything,
so FedAvg uses the same code. A client's update may weigh single tensors differently (``ClientUpdate.tensor_weights``):
FedorAS's OPA (paper 003 Eq. 5) weighs each op's tensors by the examples the client pushed through that op, which makes
the element-wise mean exactly OPA's per-op average.

The reduction is split in two associative halves so it can be sharded and pre-aggregated: client hosts
``accumulate`` their clients into float64 partial sums, parameter-server shards ``merge`` partials from the hosts in
host order and ``finalize`` against the previous global tensors. Products of integer weights and float32 values are
exact in float64, so sums are exact (and the result independent of how clients were grouped) unless an element's
terms span more than 2^53 in magnitude.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch

from rayfl.core.messages import ClientUpdate, Params
from rayfl.core.partials import ArrayPartial, ArraySums

__all__ = ["MaskedWeightedMean", "Partial", "PartialSums", "as_arrays", "params_bytes", "split_partial"]


@dataclass(slots=True)
class PartialSums:
    """``sum w·x`` and ``sum w`` for one tensor; ``weight`` is a 0-d tensor while every update covered it whole."""

    weighted: torch.Tensor
    weight: torch.Tensor


Partial = dict[str, PartialSums]


class MaskedWeightedMean:
    """Default reducer: element-wise weighted mean over the clients covering each element."""

    def accumulate(self, partial: Partial, update: ClientUpdate, shapes: Mapping[str, torch.Size]) -> None:
        """Add one client's update into ``partial`` in place."""
        for name, value in update.values.items():
            w = float(update.tensor_weights.get(name, update.weight))
            shape = tuple(shapes[name])
            sums = partial.get(name)
            if sums is None:
                sums = PartialSums(torch.zeros(shape, dtype=torch.float64), torch.zeros((), dtype=torch.float64))
                partial[name] = sums
            tslice = update.slices.get(name)
            v = value.detach().to(torch.float64)
            if tslice is None:
                sums.weighted.add_(v, alpha=w)
                sums.weight.add_(w)
                continue
            if sums.weight.dim() == 0:
                sums.weight = sums.weight.expand(shape).clone()
            idx = tslice.torch_index(shape)
            sums.weighted[idx] += v * w
            sums.weight[idx] += w

    def merge(self, partials: Iterable[Partial]) -> Partial:
        """Sum partials (in the order given: hosts in id order, so results do not depend on timing)."""
        out: Partial = {}
        for partial in partials:
            for name, sums in partial.items():
                acc = out.get(name)
                if acc is None:
                    out[name] = PartialSums(sums.weighted.clone(), sums.weight.clone())
                    continue
                acc.weighted.add_(sums.weighted)
                if acc.weight.dim() == 0 and sums.weight.dim() > 0:
                    acc.weight = acc.weight.expand(sums.weight.shape).clone()
                acc.weight.add_(sums.weight)
        return out

    def finalize(self, partial: Partial, previous: Params) -> tuple[Params, dict[str, float]]:
        """Divide where covered, keep ``previous`` elsewhere; returns the new tensors and each one's coverage."""
        new: Params = {}
        coverage: dict[str, float] = {}
        for name, prev in previous.items():
            sums = partial.get(name)
            if sums is None:
                new[name] = prev.clone()
                coverage[name] = 0.0
                continue
            covered = sums.weight > 0
            mean = sums.weighted / torch.where(covered, sums.weight, torch.ones_like(sums.weight))
            new[name] = torch.where(covered, mean, prev.to(torch.float64)).to(prev.dtype)
            coverage[name] = float(covered.to(torch.float64).mean()) if covered.dim() else float(covered)
        return new, coverage

    def covered(self, partial: Partial, previous: Params) -> Params:
        """Which elements some update covered (bool), for each tensor of ``previous`` that the updates covered only
        in part (``Aggregate.covered``); a tensor covered whole or not at all is left out (its coverage says which)."""
        out: Params = {}
        for name in previous:
            sums = partial.get(name)
            if sums is None or sums.weight.dim() == 0:
                continue
            mask = sums.weight > 0
            if bool(mask.any()) and not bool(mask.all()):
                out[name] = mask
        return out


def split_partial(partial: Partial, shard_of: Mapping[str, int], num_shards: int) -> list[Partial]:
    """Split a host's partial sums by parameter-server shard."""
    out: list[Partial] = [{} for _ in range(num_shards)]
    for name, sums in partial.items():
        out[shard_of[name]][name] = sums
    return out


def as_arrays(partial: Partial) -> ArrayPartial:
    """The partial sums as numpy arrays (no copy), the form parameter-server shards reduce
    (``rayfl/core/partials.py``)."""
    return {name: ArraySums(s.weighted.numpy(), s.weight.numpy()) for name, s in partial.items()}


def params_bytes(params: Params) -> int:
    """Bytes of a set of tensors as sent over the wire (dtype aware)."""
    return sum(t.numel() * t.element_size() for t in params.values())
