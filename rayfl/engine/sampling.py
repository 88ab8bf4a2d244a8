"""Client sampling: which clients check in each round (pure in ``(seed, round_idx)``)."""

from __future__ import annotations

import numpy as np

from rayfl.core.rng import derive_rng

__all__ = ["sample_clients"]


def sample_clients(seed: int, round_idx: int, num_clients: int, per_round: int) -> np.ndarray:
    """``per_round`` distinct client ids, uniformly without replacement, sorted."""
    k = min(per_round, num_clients)
    chosen = derive_rng(seed, "sample", round_idx).choice(num_clients, size=k, replace=False)
    return np.sort(chosen)
