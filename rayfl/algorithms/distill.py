"""Federated in-place distillation (paper 000, Sec. 3.3, Algorithm 1, Appendices B and E.2).

After aggregation the server, holding no data, distils the global model into its own sub-nets on Gaussian noise and
merges the sub-nets back:

1. draw ``n`` structures uniformly from the search space (every dimension uniformly from its allowed ratios of ``S``;
   0, which removes a block, only for skippable dimensions) with ``derive_rng(seed, "distill", round)``;
2. every sub-net starts as the first-k extraction of the global parameters and gets its own, fresh Adam (``lr``);
   the teacher is the global model itself, frozen at the aggregated parameters;
3. for ``T_SKD`` iterations, for each sub-net in turn: draw ``K`` inputs from ``N(0, 1)`` (clients normalise their
   data to zero mean and unit variance, so this is the data's scale), take the teacher's soft labels
   ``softmax(teacher / T)`` and make one Adam step on ``T^2 * KL(soft labels || softmax(student / T))`` (batch mean);
4. merge the sub-nets into the global model with the count-weighted element-wise mean.

None of the bugs of the Plato prototype (ALGORITHMS.md section 12): the merged result is kept, the loss compares
probability distributions (``kl_div`` of the student's log-softmax against the teacher's softmax), gradients are
cleared before every step, and every sub-net takes ``T_SKD`` steps (not ``T_SKD / K``).

Choices this implementation makes where the paper is open:

* **Merge.** The sub-nets are averaged among themselves, each with weight 1, with ``MaskedWeightedMean`` against the
  global parameters: an element covered by ``c`` sub-nets becomes the mean of those ``c`` values (the global model's
  own value does not enter the mean), and an element that no sub-net covers keeps its value.
* **Modes.** The teacher runs in evaluation mode (no dropout: clean soft labels). The sub-nets run in training mode,
  as clients train them, so HeteroFL scalers divide by the width rate exactly as in local training; dropout, where a
  model has it, draws from the global torch generator, which is forked and seeded with
  ``derive_seed(seed, "distill-dropout", round)`` for the duration (the caller's generator state is untouched). The
  families build batch norms without running statistics, so both modes normalise with the batch's statistics.
* **Noise.** A fresh batch per sub-net and iteration (Algorithm 1, line 5), from one torch generator
  ``derive_torch_generator(seed, "distill-noise", round)`` read in loop order. Images: ``(K, C, H, W)`` in the
  model's normalised input space. Tokens (CharBert): characters are discrete, so the noise ``(K, seq_len, hidden)``
  replaces the embedding output (``ElasticCharBert.forward_hidden``) and the loss covers the logits at every position
  (the KL is averaged over the ``K x seq_len`` positions); the embeddings get no gradient and keep their values.
* **Seeds.** Everything depends on ``(seed, round)`` only, so a round's distillation is reproducible.
* **Device.** The server distils on the CPU, in float32, with the process's torch threads.
* **Sub-net construction.** Sub-nets are built on the meta device and loaded with the first-k slices of the global
  tensors, which is ``family.extract(params, first_k(units))`` without a wasted random initialisation (and without
  touching the global generator).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from rayfl.algorithms.payloads import ClientUpdate, Params
from rayfl.algorithms.reducers import MaskedWeightedMean, Partial
from rayfl.algorithms.submodel import first_k
from rayfl.config import DistillConfig
from rayfl.models.elastic.cost import units_from_ratios
from rayfl.models.elastic.family import ElasticFamily, gather
from rayfl.models.elastic.space import SearchSpace
from rayfl.models.inputs import InputSpec
from rayfl.rng import derive_rng, derive_seed, derive_torch_generator

__all__ = [
    "HiddenStateModel",
    "allowed_ratios",
    "distillation_gap",
    "inplace_distill",
    "kd_loss",
    "load_sub_model",
    "sample_structures",
]

log = logging.getLogger(__name__)


@runtime_checkable
class HiddenStateModel(Protocol):
    """A token model that can run from its embedding output (the noise enters there)."""

    embed_dim: int

    def forward_hidden(self, h: torch.Tensor, all_positions: bool = False) -> torch.Tensor: ...


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


def load_sub_model(family: ElasticFamily, params: Mapping[str, torch.Tensor], units: Sequence[int]) -> nn.Module:
    """The first-k sub-model with ``units`` loaded from the global ``params`` (a copy: training it leaves ``params``
    alone). Equal to ``family.extract(params, first_k(units))``, built without a random initialisation."""
    selection = first_k(units)
    slices = family.slices(selection)
    with torch.device("meta"):
        model = family.build(selection.units)
    model = model.to_empty(device="cpu")
    with torch.no_grad():
        for name, target in model.state_dict().items():
            if name not in params:
                raise ValueError(f"global parameters lack {name!r}, which the sub-model needs")
            tslice = slices.get(name)
            target.copy_(params[name] if tslice is None else gather(params[name], tslice))
    return model


def kd_loss(student: torch.Tensor, teacher: torch.Tensor, temperature: float) -> torch.Tensor:
    """``T^2 * KL(softmax(teacher / T) || softmax(student / T))``, averaged over the rows (all leading axes)."""
    t = float(temperature)
    log_p = nn.functional.log_softmax(student.flatten(0, -2) / t, dim=-1)
    q = nn.functional.softmax(teacher.flatten(0, -2) / t, dim=-1)
    loss: torch.Tensor = nn.functional.kl_div(log_p, q, reduction="batchmean") * (t * t)
    return loss


def _noise_shape(model: nn.Module, input_spec: InputSpec, batch: int) -> tuple[int, ...]:
    if input_spec.input_kind == "tokens":
        if not isinstance(model, HiddenStateModel):
            raise ValueError(
                f"in-place distillation on token inputs needs a model with forward_hidden; {type(model).__name__} "
                "has none"
            )
        return (batch, input_spec.sample_shape[0], model.embed_dim)
    return (batch, *input_spec.sample_shape)


def _logits(model: nn.Module, x: torch.Tensor, tokens: bool) -> torch.Tensor:
    if tokens and isinstance(model, HiddenStateModel):
        return model.forward_hidden(x, all_positions=True)
    out: torch.Tensor = model(x)
    return out


def _teacher(family: ElasticFamily, params: Mapping[str, torch.Tensor]) -> nn.Module:
    teacher = load_sub_model(family, params, family.full_units)
    teacher.eval()
    teacher.requires_grad_(False)
    return teacher


def inplace_distill(
    family: ElasticFamily,
    params: Params,
    cfg: DistillConfig,
    ratios: Sequence[float],
    *,
    num_subnets: int,
    seed: int,
    round_idx: int,
    input_spec: InputSpec,
) -> Params:
    """Algorithm 1 on the global ``params`` (see module docstring); returns the new global parameters.

    ``T_SKD = 0`` (``cfg.iterations``) or ``num_subnets = 0`` returns the parameters unchanged.
    """
    if cfg.iterations == 0 or num_subnets <= 0:
        return dict(params)
    structures = sample_structures(family.space, ratios, num_subnets, derive_rng(seed, "distill", round_idx))
    teacher = _teacher(family, params)
    students = [load_sub_model(family, params, units) for units in structures]
    optimizers = [torch.optim.Adam([p for p in s.parameters() if p.requires_grad], lr=cfg.lr) for s in students]
    tokens = input_spec.input_kind == "tokens"
    shape = _noise_shape(teacher, input_spec, cfg.batch_size)
    noise = derive_torch_generator(seed, "distill-noise", round_idx)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "distill-dropout", round_idx))
        for student in students:
            student.train()
        for _ in range(cfg.iterations):
            for student, opt in zip(students, optimizers, strict=True):
                x = torch.randn(shape, generator=noise)
                with torch.no_grad():
                    soft = _logits(teacher, x, tokens)
                opt.zero_grad(set_to_none=True)
                loss = kd_loss(_logits(student, x, tokens), soft, cfg.temperature)
                loss.backward()  # type: ignore[no-untyped-call]  # torch stubs leave backward untyped
                opt.step()
    return _merge(family, params, structures, students)


def _merge(
    family: ElasticFamily, params: Params, structures: Sequence[tuple[int, ...]], students: Sequence[nn.Module]
) -> Params:
    """Count-weighted element-wise mean of the sub-nets (weight 1 each); uncovered elements keep their value."""
    reducer = MaskedWeightedMean()
    shapes = {k: v.shape for k, v in params.items()}
    partial: Partial = {}
    for i, (units, student) in enumerate(zip(structures, students, strict=True)):
        values, slices = family.scatter(student, first_k(units))
        values = {k: v for k, v in values.items() if k in shapes}
        if not all(bool(torch.isfinite(v).all()) for v in values.values()):
            log.warning("in-place distillation: sub-net %d %s diverged (non-finite weights); left out", i, units)
            continue
        update = ClientUpdate(
            client_id=i,
            weight=1.0,
            values=values,
            slices={k: s for k, s in slices.items() if k in values},
            num_examples=0,
            train_loss=math.nan,
            num_steps=0,
        )
        reducer.accumulate(partial, update, shapes)
    merged, _ = reducer.finalize(partial, params)
    return merged


def distillation_gap(
    family: ElasticFamily,
    params: Params,
    structures: Sequence[Sequence[int]],
    *,
    input_spec: InputSpec,
    batch_size: int,
    temperature: float = 1.0,
    seed: int = 0,
) -> float:
    """Mean distillation loss (``kd_loss``) between the global model of ``params`` and its first-k sub-nets
    ``structures`` on fresh Gaussian inputs (one batch of ``batch_size`` per sub-net from
    ``derive_torch_generator(seed, "distill-gap")``), in the modes the distillation uses; a diagnostic."""
    teacher = _teacher(family, params)
    tokens = input_spec.input_kind == "tokens"
    shape = _noise_shape(teacher, input_spec, batch_size)
    noise = derive_torch_generator(seed, "distill-gap")
    total = 0.0
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        torch.manual_seed(derive_seed(seed, "distill-gap-dropout"))
        for units in structures:
            student = load_sub_model(family, params, units)
            student.train()
            x = torch.randn(shape, generator=noise)
            total += float(kd_loss(_logits(student, x, tokens), _logits(teacher, x, tokens), temperature))
    return total / max(1, len(structures))
