"""rayfl: a Ray-based simulator for system-heterogeneous federated learning.

The public functions below are imported on first use, so ``import rayfl`` stays free of torch and Ray.
"""

from __future__ import annotations

from typing import Any

__all__ = ["load_model"]


def __getattr__(name: str) -> Any:
    if name == "load_model":
        from rayfl.export import load_model

        return load_model
    raise AttributeError(f"module 'rayfl' has no attribute {name!r}")
