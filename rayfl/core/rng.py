"""Derived random generators: every draw in rayfl comes from ``(seed, purpose, *keys)``.

A run never touches numpy's or torch's global RNG. Each consumer asks for a generator keyed by what it is for
(``"sample"``, ``"train"``, ``"partition"`` ...) and by the round and client it concerns, so results do not depend on
the order in which clients run, on how clients are spread over hosts, or on whether the run was resumed.
"""

from __future__ import annotations

import zlib

import numpy as np
import torch

__all__ = ["derive_rng", "derive_seed", "derive_torch_generator"]


def _purpose_key(purpose: str) -> int:
    return zlib.crc32(purpose.encode("utf-8"))


def derive_seed(seed: int, purpose: str, *keys: int) -> int:
    """A 63-bit integer seed that depends on every argument and on nothing else."""
    entropy = [
        int(seed) & 0xFFFFFFFFFFFFFFFF,
        _purpose_key(purpose),
        *(int(k) & 0xFFFFFFFFFFFFFFFF for k in keys),
    ]
    state = np.random.SeedSequence(entropy).generate_state(2, dtype=np.uint32)
    return (int(state[0]) << 31) ^ int(state[1])


def derive_rng(seed: int, purpose: str, *keys: int) -> np.random.Generator:
    """A numpy generator for ``(seed, purpose, *keys)``; typical keys are ``round_idx`` and ``client_id``."""
    return np.random.default_rng(np.random.SeedSequence([derive_seed(seed, purpose, *keys)]))


def derive_torch_generator(seed: int, purpose: str, *keys: int) -> torch.Generator:
    """A CPU torch generator for ``(seed, purpose, *keys)`` (used for dropout, shuffling and noise)."""
    gen = torch.Generator()
    gen.manual_seed(derive_seed(seed, purpose, *keys))
    return gen
