"""Turning stored sample arrays into model inputs.

Data is stored compactly (uint8 characters, uint8 pixels) so that it is cheap to keep in Ray's object store; this is
the one place that converts it to what a model consumes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["InputSpec", "to_input"]


@dataclass(frozen=True)
class InputSpec:
    """What a model is built for, read off a dataset without holding its arrays."""

    input_kind: str  # "tokens" | "image"
    num_classes: int
    sample_shape: tuple[int, ...]  # (seq_len,) for tokens, (C, H, W) for images
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()

    @staticmethod
    def of(input_kind: str, num_classes: int, x: np.ndarray, meta: Mapping[str, object]) -> InputSpec:
        mean = meta.get("mean", ())
        std = meta.get("std", ())
        return InputSpec(
            input_kind=input_kind,
            num_classes=num_classes,
            sample_shape=tuple(int(d) for d in x.shape[1:]),
            mean=tuple(float(v) for v in mean) if isinstance(mean, Sequence) else (),
            std=tuple(float(v) for v in std) if isinstance(std, Sequence) else (),
        )


def to_input(x: np.ndarray, spec: InputSpec) -> torch.Tensor:
    """Convert a batch of stored samples to a model input (a new tensor; the source may be read-only)."""
    if spec.input_kind == "tokens":
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64))
    scale = 1.0 / 255.0 if x.dtype == np.uint8 else 1.0
    out = torch.from_numpy(np.asarray(x, dtype=np.float32) * np.float32(scale))
    if spec.mean and spec.std:
        shape = (1, len(spec.mean)) + (1,) * (out.dim() - 2)
        mean = torch.tensor(spec.mean, dtype=torch.float32).view(shape)
        std = torch.tensor(spec.std, dtype=torch.float32).view(shape)
        out = (out - mean) / std
    return out
