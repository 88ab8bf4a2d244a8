"""Pieces both in-place distillation variants share (paper 000, Sec. 3.3, Algorithm 1): the sub-nets' structures,
their first-k weights, the Gaussian inputs and the KD loss. ``fl/common/distill/server.py`` documents the method."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from rayfl.core.rng import derive_torch_generator
from rayfl.data.federated import Rows
from rayfl.fl.common.distill.config import NoiseMode
from rayfl.models.elastic.cost import units_from_ratios
from rayfl.models.elastic.family import ElasticFamily, gather
from rayfl.models.elastic.space import SearchSpace
from rayfl.models.elastic.spec import first_k
from rayfl.models.inputs import InputSpec, to_input

__all__ = [
    "HiddenStateModel",
    "NoiseSource",
    "allowed_ratios",
    "copy_noise_generator",
    "kd_loss",
    "load_sub_model",
    "model_logits",
    "noise_shape",
    "noise_source",
    "sample_structures",
    "teacher_model",
]


@runtime_checkable
class HiddenStateModel(Protocol):
    """A token model that can run from its embedding output (the noise enters there) and say, without data, what its
    embedding output looks like over uniformly random tokens."""

    embed_dim: int
    vocab_size: int

    def forward_hidden(self, h: torch.Tensor, all_positions: bool = False) -> torch.Tensor: ...

    def embedding_statistics(self) -> tuple[torch.Tensor, torch.Tensor]: ...


def allowed_ratios(space: SearchSpace, ratios: Sequence[float]) -> list[tuple[float, ...]]:
    """Per dimension, the ratios of ``S`` it may take, ascending: all of them where the dimension is skippable, the
    positive ones elsewhere."""
    s = sorted({float(r) for r in ratios})
    if not s or s[0] < 0.0 or s[-1] > 1.0 or s[-1] <= 0.0:
        raise ValueError(f"ratios must lie in [0, 1] and include a positive value, got {list(ratios)}")
    positive = tuple(r for r in s if r > 0.0)
    return [tuple(s) if d.skippable else positive for d in space.dims]


def sample_structures(
    space: SearchSpace, ratios: Sequence[float], num: int, rng: np.random.Generator
) -> list[tuple[int, ...]]:
    """``num`` structures (unit counts per dimension), every dimension uniformly from its allowed ratios."""
    allowed = allowed_ratios(space, ratios)
    counts = np.array([len(a) for a in allowed], dtype=np.int64)
    pick = rng.integers(0, counts, size=(num, len(allowed)))
    chosen = np.array([[allowed[d][k] for d, k in enumerate(row)] for row in pick], dtype=np.float64)
    units = units_from_ratios(chosen.reshape(num, len(allowed)), space.sizes, space.skippable)
    return [tuple(int(u) for u in row) for row in units]


def empty_model(family: ElasticFamily, units: Sequence[int]) -> nn.Module:
    """The ``units`` model with uninitialised CPU tensors (built on the meta device: no wasted random
    initialisation, and the global generator is not touched)."""
    with torch.device("meta"):
        model = family.build(tuple(int(u) for u in units))
    return model.to_empty(device="cpu")


def load_sub_model(family: ElasticFamily, params: Mapping[str, torch.Tensor], units: Sequence[int]) -> nn.Module:
    """The first-k sub-model with ``units`` loaded from the global ``params`` (a copy: training it leaves ``params``
    alone). Equal to ``family.extract(params, first_k(units))``, built without a random initialisation."""
    slices = family.slices(first_k(units))
    model = empty_model(family, units)
    with torch.no_grad():
        for name, target in model.state_dict().items():
            if name not in params:
                raise ValueError(f"global parameters lack {name!r}, which the sub-model needs")
            tslice = slices.get(name)
            target.copy_(params[name] if tslice is None else gather(params[name], tslice))
    return model


def copy_noise_generator(seed: int, round_idx: int, index: int) -> torch.Generator:
    """Sub-net ``index``'s noise generator in round ``round_idx``: both update rules read sub-net ``index``'s
    batches from it, so a sub-net's inputs depend on ``(seed, round, index)`` only."""
    return derive_torch_generator(seed, "distill-noise", round_idx, index)


def kd_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T^2 * KL(softmax(teacher / T) || softmax(student / T))``, averaged over the rows (all leading axes)."""
    t = float(temperature)
    log_p = nn.functional.log_softmax(student.flatten(0, -2) / t, dim=-1)
    q = nn.functional.softmax(teacher.flatten(0, -2) / t, dim=-1)
    loss: torch.Tensor = nn.functional.kl_div(log_p, q, reduction="batchmean") * (t * t)
    return loss


@dataclass(frozen=True)
class NoiseSource:
    """Where the distillation's inputs come from (``distill.noise``; see ``DistillConfig``).

    ``kind``: ``images`` (``N(0, 1)`` in the model's normalised input space, as clients normalise theirs), ``hidden``
    (Gaussian hidden states at a token model's embedding output, ``mean + std * N(0, 1)`` per position and dimension),
    ``tokens`` (uniformly random token ids of ``vocab`` symbols, fed through the model's own embedding) or ``data``
    (``shape[0]`` samples of the pooled training set ``pool``, drawn uniformly with replacement and converted as the
    clients convert theirs: the control ``distill.noise: data``, not paper 000's data-free method)."""

    kind: Literal["images", "hidden", "tokens", "data"]
    shape: tuple[int, ...]
    mean: torch.Tensor | None = None
    std: torch.Tensor | None = None
    vocab: int = 0
    pool: Rows | None = None
    spec: InputSpec | None = None

    def draw(self, generator: torch.Generator) -> torch.Tensor:
        """One batch, read from ``generator`` (the same number of draws per batch whatever the model's weights)."""
        if self.kind == "tokens":
            return torch.randint(0, self.vocab, self.shape, generator=generator)
        if self.kind == "data":
            assert self.pool is not None and self.spec is not None  # noise_source sets both for this kind
            rows = torch.randint(0, len(self.pool), (self.shape[0],), generator=generator).numpy()
            return to_input(self.pool[np.sort(rows)], self.spec)
        x = torch.randn(self.shape, generator=generator)
        if self.mean is not None and self.std is not None:
            x = x * self.std + self.mean
        return x


def noise_source(
    model: nn.Module, input_spec: InputSpec, batch: int, mode: NoiseMode = "embedding", pool: Rows | None = None
) -> NoiseSource:
    """The noise for ``model`` (the round's global model, whose embedding statistics ``embedding`` mode reads);
    ``mode`` ``data`` draws from ``pool``, the pooled training samples (the engine's ``ServerContext.dataset.x``)."""
    if mode == "data":
        if pool is None or len(pool) == 0:
            raise ValueError(
                "distill.noise: data draws the distillation's inputs from the training set, and none was given"
            )
        return NoiseSource("data", (batch,), pool=pool, spec=input_spec)
    shape = noise_shape(model, input_spec, batch)
    if input_spec.input_kind != "tokens":
        return NoiseSource("images", shape)
    assert isinstance(model, HiddenStateModel)  # noise_shape refused the others
    if mode == "tokens":
        return NoiseSource("tokens", shape[:2], vocab=int(model.vocab_size))
    if mode == "unit":
        return NoiseSource("hidden", shape)
    mean, std = model.embedding_statistics()
    return NoiseSource("hidden", shape, mean=mean[: shape[1]], std=std)


def noise_shape(model: nn.Module, input_spec: InputSpec, batch: int) -> tuple[int, ...]:
    """The shape of a batch of ``batch`` Gaussian inputs: images in the model's input space; for tokens, hidden states
    at the embedding output (characters are discrete)."""
    if input_spec.input_kind == "tokens":
        if not isinstance(model, HiddenStateModel):
            raise ValueError(
                f"in-place distillation on token inputs needs a model with forward_hidden; {type(model).__name__} "
                "has none"
            )
        return (batch, input_spec.sample_shape[0], model.embed_dim)
    return (batch, *input_spec.sample_shape)


def model_logits(model: nn.Module, x: torch.Tensor, tokens: bool) -> torch.Tensor:
    """The model's logits on a noise batch; a token model's at every position, run from its hidden states (a
    floating ``x``) or from token ids (an integer ``x``: ``distill.noise: tokens``)."""
    if tokens and isinstance(model, HiddenStateModel):
        if x.is_floating_point():
            return model.forward_hidden(x, all_positions=True)
        logits: torch.Tensor = model(x, all_positions=True)
        return logits
    out: torch.Tensor = model(x)
    return out


def teacher_model(family: ElasticFamily, params: Mapping[str, torch.Tensor]) -> nn.Module:
    """The global model loaded from ``params``, in evaluation mode, without gradients (the copies' frozen teacher)."""
    teacher = load_sub_model(family, params, family.full_units)
    teacher.eval()
    teacher.requires_grad_(False)
    return teacher
