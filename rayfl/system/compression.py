"""Upload compression for any method: QSGD (Alistarh, Grubic, Li, Tomioka, Vojnovic, NeurIPS 2017).

Paper 000 (Appendix G.4) applies QSGD with 64 quantisation levels, sending 8-bit codes instead of 32-bit floats. Here
a client quantises, per uploaded tensor, its *update* ``delta = trained - received`` (``received`` is the gathered
global slice it was sent), and the server receives ``received + dequantised(delta)``:

* ``s = levels``, ``norm = ||delta||_2``; every element becomes ``sign(x) * norm * l / s`` with
  ``l = floor(|x| / norm * s) + Bernoulli(frac(|x| / norm * s))``, so ``l`` lies in ``{0, ..., s}`` and the
  quantiser is unbiased (``E[q(x)] = x``) with variance per element at most ``norm**2 / (4 s**2)`` (a Bernoulli
  variable has variance at most 1/4, scaled by ``(norm / s)**2``).
* Wire format (choices where the papers are vague): one code per element of ``bits`` bits, a sign bit plus
  ``bits - 1`` magnitude bits, so ``levels <= 2**(bits - 1) - 1`` (``l = s`` must be representable), codes packed
  densely per tensor, plus the tensor's norm as one float32. Bytes up per tensor: ``ceil(numel * bits / 8) + 4``.
  QSGD's Elias coding of sparse codes is not modelled (fixed-width codes, as paper 000's "32 bits to 8 bits").
* Every uploaded floating tensor is quantised, batch-norm running statistics included (they are uploaded too).
* Randomness: one generator per client and round, ``derive_torch_generator(seed, "qsgd", round, client)``, used over
  the tensors in sorted name order, so a client's compressed update is the same on every backend and host.

The functions here are pure (no engine state): the host calls ``compress_update`` after ``local_train`` and
``upload_bytes`` for the bytes it reports; the clock's cost oracle calls ``tensor_upload_bytes`` with the same
formula.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

import torch

from rayfl.config.sections import CompressionConfig
from rayfl.core.messages import ClientUpdate, Params
from rayfl.core.rng import derive_torch_generator
from rayfl.models.elastic.family import gather

__all__ = [
    "NORM_BYTES",
    "compress_update",
    "max_levels",
    "qsgd_dequantised",
    "tensor_upload_bytes",
    "upload_bytes",
]

NORM_BYTES = 4  # the per-tensor L2 norm, sent as one float32
_FLOAT_BYTES = 4  # uncompressed uploads are float32


def max_levels(bits: int) -> int:
    """The most quantisation levels ``bits``-bit codes hold: a sign bit and ``bits - 1`` magnitude bits for
    ``l`` in ``{0, ..., levels}``."""
    return (1 << (bits - 1)) - 1


def qsgd_dequantised(delta: torch.Tensor, levels: int, gen: torch.Generator) -> torch.Tensor:
    """The receiver's view of ``delta`` after QSGD with ``levels`` levels: an unbiased stochastic rounding of every
    element to a multiple of ``||delta||_2 / levels`` (same shape and dtype as ``delta``; a zero tensor stays zero).

    Computed in float64, so ``|x| / norm`` never exceeds 1 by rounding; ``l`` is clamped to ``levels`` regardless.
    """
    if levels < 1:
        raise ValueError(f"qsgd: levels must be >= 1, got {levels}")
    x = delta.detach().to(torch.float64)
    norm = float(torch.linalg.vector_norm(x))
    if x.numel() == 0 or norm == 0.0:
        return torch.zeros_like(delta)
    if not math.isfinite(norm):  # a diverged update stays non-finite, so the host rejects it as before
        return delta.detach().clone()
    scaled = x.abs() / norm * levels
    lower = torch.floor(scaled)
    draw = torch.rand(x.shape, generator=gen, dtype=torch.float64)
    level = torch.clamp(lower + (draw < scaled - lower).to(torch.float64), 0.0, float(levels))
    return (torch.sign(x) * level * (norm / levels)).to(delta.dtype)


def compress_update(
    update: ClientUpdate,
    received: Mapping[str, torch.Tensor],
    cfg: CompressionConfig,
    *,
    seed: int,
    round_idx: int,
) -> ClientUpdate:
    """``update`` as the server receives it under ``cfg``: every value replaced by ``received + q(value - received)``
    where the received tensor is the global tensor ``received[name]`` gathered at the update's slice.

    ``cfg.kind == "none"`` returns ``update`` unchanged.
    """
    if cfg.kind == "none":
        return update
    if cfg.levels > max_levels(cfg.bits):
        raise ValueError(f"qsgd: {cfg.levels} levels do not fit {cfg.bits}-bit codes (at most {max_levels(cfg.bits)})")
    gen = derive_torch_generator(seed, "qsgd", round_idx, update.client_id)
    values: Params = {}
    for name in sorted(update.values):
        value = update.values[name]
        tslice = update.slices.get(name)
        sent = received[name] if tslice is None else gather(received[name], tslice)
        if tuple(sent.shape) != tuple(value.shape):
            raise ValueError(f"qsgd: {name} has shape {tuple(value.shape)}, the client received {tuple(sent.shape)}")
        sent = sent.to(value.dtype)
        values[name] = sent + qsgd_dequantised(value - sent, cfg.levels, gen)
    # the update's own order; every other field (metrics included) as the client sent it
    return dataclasses.replace(update, values={name: values[name] for name in update.values})


def tensor_upload_bytes(numel: int, cfg: CompressionConfig, dtype_bytes: int = _FLOAT_BYTES) -> int:
    """Bytes a tensor of ``numel`` elements costs to upload: ``numel * dtype_bytes`` uncompressed; under QSGD its
    densely packed ``bits``-bit codes plus the float32 norm."""
    if cfg.kind == "none":
        return int(numel) * dtype_bytes
    return math.ceil(int(numel) * cfg.bits / 8) + NORM_BYTES


def upload_bytes(numels: Iterable[int], cfg: CompressionConfig, dtype_bytes: int = _FLOAT_BYTES) -> int:
    """Bytes of an upload made of tensors with ``numels`` elements (see ``tensor_upload_bytes``)."""
    return sum(tensor_upload_bytes(n, cfg, dtype_bytes) for n in numels)
