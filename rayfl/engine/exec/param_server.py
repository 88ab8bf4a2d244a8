"""Parameter-server shards: each owns a fixed set of global tensors and reduces the hosts' partial sums for them.

Tensors are balanced over shards by element count (largest first onto the lightest shard), and each shard merges
the hosts' partials in host-id order, so the result is the same for any number of shards and any arrival order.

A shard works on numpy arrays only (``rayfl/core/partials.py``): this module and what it receives import no torch, so a
shard process stays a plain numpy process (measured: 406 MiB PSS with torch, see ``benchmarks/scale.py``).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence

import numpy as np

from rayfl.core.partials import ArrayPartial, ArrayWeightedMean, NumpyParams, Reduced

__all__ = ["ParamServerShard", "plan_shards"]


def plan_shards(shapes: Mapping[str, tuple[int, ...]], num_shards: int) -> dict[str, int]:
    """Assign each tensor to a shard, balancing element counts; deterministic (ties broken by name)."""
    loads = [0] * num_shards
    shard_of: dict[str, int] = {}
    for name in sorted(shapes, key=lambda n: (-int(np.prod(shapes[n])), n)):
        target = min(range(num_shards), key=lambda s: (loads[s], s))
        shard_of[name] = target
        loads[target] += int(np.prod(shapes[name]))
    return shard_of


class ParamServerShard:
    """Reduces one shard's tensors: merge host partials in order, finalize against the previous values."""

    def __init__(self, shard_id: int, names: Sequence[str], reducer: ArrayWeightedMean | None = None) -> None:
        self.shard_id = shard_id
        self.names = tuple(names)
        self.reducer = reducer or ArrayWeightedMean()
        # partial sums merged and reductions finished: the progress the Ray watchdog reads (engine/ray/watchdog.py)
        self.work_done = 0

    def ready(self) -> int:
        return self.shard_id

    def set_names(self, names: Sequence[str]) -> int:
        """Own ``names`` from now on (the shard plan changes when a run adds a global model)."""
        self.names = tuple(names)
        return self.shard_id

    def reduce(self, previous: NumpyParams, *partials: ArrayPartial, names: Sequence[str] | None = None) -> Reduced:
        """New values of this shard's tensors from the hosts' partials (given in host-id order), with each one's
        coverage and, for tensors covered in part, which elements were covered (the server optimizer's mask).
        ``names``, when given, are the shard's tensors from now on (the Ray backend names them in every call, so that
        a shard Ray restarted, whose constructor knows only the first plan, reduces the right ones)."""
        if names is not None:
            self.names = tuple(names)
        merged = self.reducer.merge(self._counted(partials))
        own = {n: previous[n] for n in self.names}
        new, coverage = self.reducer.finalize(merged, own)
        self.work_done += 1
        return new, coverage, self.reducer.covered(merged, own)

    def _counted(self, partials: Sequence[ArrayPartial]) -> Iterator[ArrayPartial]:
        """``partials`` in their order, each counted in ``work_done`` once it has been merged."""
        for partial in partials:
            yield partial
            self.work_done += 1
