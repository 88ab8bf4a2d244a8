"""Turning stored sample arrays into model inputs.

Data is stored compactly (uint8 characters, uint8 pixels) so that it is cheap to keep in Ray's object store; this is
the one place that converts it to what a model consumes. Three kinds of input: ``tokens`` (integer ids), ``image``
(``[C, H, W]`` pixels, normalised per channel) and ``features`` (a vector of ``F`` numbers per sample, a table's
numeric columns, normalised per feature). The conversion itself always runs on the CPU and the result
is then moved to the model's device, so a batch holds the same numbers on every device.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
import torch
from torch import nn

__all__ = ["InputSpec", "client_spec", "has_dropout", "module_device", "to_input"]


class _Shaped(Protocol):
    """A sample array as far as a spec needs it: held in full or made on demand (``rayfl.data.federated.Rows``)."""

    @property
    def shape(self) -> tuple[int, ...]: ...


@dataclass(frozen=True)
class InputSpec:
    """What a model is built for, read off a dataset without holding its arrays."""

    input_kind: str  # "tokens" | "image" | "features"
    num_classes: int
    sample_shape: tuple[int, ...]  # (seq_len,) for tokens, (C, H, W) for images, (F,) for features
    mean: tuple[float, ...] = ()
    std: tuple[float, ...] = ()

    @staticmethod
    def of(input_kind: str, num_classes: int, x: _Shaped, meta: Mapping[str, object]) -> InputSpec:
        mean = meta.get("mean", ())
        std = meta.get("std", ())
        return InputSpec(
            input_kind=input_kind,
            num_classes=num_classes,
            sample_shape=tuple(int(d) for d in x.shape[1:]),
            mean=tuple(float(v) for v in mean) if isinstance(mean, Sequence) else (),
            std=tuple(float(v) for v in std) if isinstance(std, Sequence) else (),
        )


def client_spec(spec: InputSpec, x: np.ndarray) -> InputSpec:
    """``spec`` with the channel statistics of one client's samples ``x``, so that ``to_input`` gives that client's
    images zero mean and unit variance per channel, and its feature vectors per feature (``data.normalize: client``);
    token inputs are returned as they are. Statistics are taken on the scale ``to_input`` works on (0-1 for ``uint8``
    pixels), in float64."""
    if spec.input_kind == "tokens" or len(x) == 0:
        return spec
    scale = _scale(x, spec)
    axes = (0, *range(2, x.ndim))
    values = np.asarray(x, dtype=np.float64) * scale
    mean = values.mean(axis=axes)
    std = np.maximum(values.std(axis=axes), 1e-6)  # a constant channel is centred, not blown up
    return replace(spec, mean=tuple(float(v) for v in mean), std=tuple(float(v) for v in std))


def module_device(model: nn.Module) -> torch.device:
    """The device a model's tensors live on (the CPU for a model without any)."""
    for param in model.parameters():
        return param.device
    for buffer in model.buffers():
        return buffer.device
    return torch.device("cpu")


def has_dropout(model: nn.Module) -> bool:
    """Whether ``model`` holds a dropout with a positive rate (its forward in training mode then draws from the
    process-wide generator and differs from one call to the next)."""
    return any(isinstance(m, nn.modules.dropout._DropoutNd) and m.p > 0 for m in model.modules())


def to_input(x: np.ndarray, spec: InputSpec, device: torch.device | None = None) -> torch.Tensor:
    """Convert a batch of stored samples to a model input on ``device`` (default: the CPU); a new tensor, since the
    source may be read-only.

    ``x``: the samples as the data set stores them, ``[batch, *sample_shape]`` (images: uint8 pixels or floats in
    ``[C, H, W]`` layout, scaled to [0, 1] and normalised with ``spec``'s mean and standard deviation; tokens: integer
    ids; features: ``[batch, F]`` numbers, never rescaled, normalised per feature with ``spec``'s mean and standard
    deviation). ``spec``: the model's ``InputSpec`` (an exported model's:
    ``rayfl.export.exported_models(run_dir)[i].input_spec``). Arguments of the wrong kind are refused with one
    ``TypeError`` naming them."""
    if not isinstance(spec, InputSpec):
        raise TypeError(
            f"to_input(x, spec): spec must be the model's InputSpec (an exported model's .input_spec), got "
            f"{type(spec).__name__}; the arguments are (samples, spec, device=None)"
        )
    if not hasattr(x, "shape") or not hasattr(x, "dtype"):
        raise TypeError(f"to_input(x, spec): x must be an array of samples [batch, ...], got {type(x).__name__}")
    return _convert(x, spec) if device is None else _convert(x, spec).to(device)


def _convert(x: np.ndarray, spec: InputSpec) -> torch.Tensor:
    if spec.input_kind == "tokens":
        return torch.from_numpy(np.ascontiguousarray(x, dtype=np.int64))
    out = torch.from_numpy(np.asarray(x, dtype=np.float32) * np.float32(_scale(x, spec)))
    if spec.mean and spec.std:
        shape = (1, len(spec.mean)) + (1,) * (out.dim() - 2)
        mean = torch.tensor(spec.mean, dtype=torch.float32).view(shape)
        std = torch.tensor(spec.std, dtype=torch.float32).view(shape)
        out = (out - mean) / std
    return out


def _scale(x: np.ndarray, spec: InputSpec) -> float:
    """``uint8`` pixels are brought to [0, 1]; feature values are numbers as they are, whatever their dtype."""
    return 1.0 / 255.0 if x.dtype == np.uint8 and spec.input_kind == "image" else 1.0
