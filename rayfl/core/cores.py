"""The CPU cores this process may run on: what "every core" means for rayfl's own parallel work (the in-process
backend's worker processes, distillation copies, the static-BN pass's threads)."""

from __future__ import annotations

import os

__all__ = ["usable_cores"]


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity where the platform says, else the machine's count)."""
    affinity = getattr(os, "sched_getaffinity", None)
    return len(affinity(0)) if affinity is not None else (os.cpu_count() or 1)
