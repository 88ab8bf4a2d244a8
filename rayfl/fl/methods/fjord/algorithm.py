"""FjORD: Fair and Accurate Federated Learning under heterogeneous targets with Ordered Dropout.

Horváth, Laskaridis, Almeida, Leontiadis, Venieris, Lane, NeurIPS 2021 (arXiv:2102.13451). Reference: the authors'
Flower baseline (``baselines/fjord``; ALGORITHMS.md section 4).

* **Maximum width.** Each sampled client's ``p_max`` is the largest of ``config.widths`` whose uniform first-k
  sub-model (every dimension at ``ceil(p x size)`` units) fits both its memory and its bandwidth budget, with the
  clock's own cost model (``largest_fitting_rate``); the smallest width when none fits (the clock then fails the
  client, which is recorded). The client receives that first-k sub-model (``Assignment()`` when it is the full model).
* **Ordered dropout** (``local_train``). For every batch one width ``p`` is drawn uniformly from the widths ``<= p_max``
  (Flower's ``ODSampler.width_sampler``), from ``derive_rng(seed, "fjord", round, client)``, and the first-k
  ``p``-sub-model is trained *sharing weights* with the client's ``p_max`` model: the ``p`` model (built once per unit
  tuple and cached) is run with ``torch.func.functional_call`` on the leading slices of the client model's tensors.
  Those slices are views, so autograd adds the ``p`` model's gradients into the leading slices of the client model's
  gradients; this is the same as loading the ``p`` model with the leading slices, back-propagating and adding its
  gradients back, without the copies. One optimizer step per batch on the client model (a fresh optimizer per round,
  ``make_optimizer``), with the base loop's batches, ``epochs``, ``max_steps``, ``grad_clip_norm`` and
  ``sequence_loss``.
* **Self-distillation** (``kd``, Flower's ``fjord_kd``). Per batch: forward at ``p_max``, cross-entropy with the
  labels, backward; targets = softmax of the detached ``p_max`` logits; forward at ``p``, cross-entropy against these
  soft targets only (no temperature, no hard-label term), backward; one step for both accumulated gradients. The
  teacher is the larger model and the student the sampled one (the Plato port's reversed MSE is not repeated).
* **Aggregation.** Sample-weighted element-wise mean (``client_weight`` = number of examples). Flower's
  ``fjord_average`` walks the widths from the largest to the smallest and overwrites the width-``p`` block with the
  sample-weighted mean over the clients whose ``p_max >= p``. The blocks are nested (first-k in every dimension, with
  ``ceil``), so an element ``e`` is last overwritten for the smallest width ``p*(e)`` whose block contains it, and its
  final value is the sample-weighted mean over the clients with ``p_max >= p*(e)``. A client's ``p_max`` block contains
  ``e`` exactly when ``p_max >= p*(e)``, so these are exactly the clients covering ``e``: the nested average equals
  ``MaskedWeightedMean`` with sample weights, element by element (entries no client covers keep their previous
  value in both). Non-OD tensors (the classifier's class rows, its bias) are covered by every client.

Choices where the paper and the reference leave room:

* **``p == p_max``.** When the drawn width has the client model's own units (the top width, or a smaller width that
  rounds to the same units), the batch runs only the plain cross-entropy pass of the client model (``local_loss``).
  With ``kd`` the reference would add a pass of cross-entropy of the same logits against their own detached softmax;
  its gradient ``softmax(z) - softmax(z)`` is exactly zero in exact arithmetic, and skipping it keeps a full-width run
  bit-for-bit equal to FedAvg (sample weighting).
* **Per-width batch norm.** Flower's ``ODBatchNorm2d`` keeps separate running statistics per width plus one shared
  first-k affine. This project's families build batch norms with batch statistics only
  (``track_running_stats=False``, HeteroFL's static BN setting): every width normalises with its own batch's
  statistics in training (and in evaluation), so the statistics are per-width by construction, and there are no
  running statistics to keep, send or average; the affine weight and bias are ordinary first-k sliced tensors shared
  by all widths, as in Flower.
* **Reported loss.** ``train_loss`` is the mean over batches of the hard-label cross-entropy: of the sampled width
  without ``kd``, of ``p_max`` with ``kd``.
* **Evaluation.** The engine evaluates the global (full-width) model; Flower also reports every width of ``p_s``.
* **Scaler.** The families' HeteroFL scaler (``Scaler``, divide by the width rate in training) is a property of the
  model config, not of the method; Flower's FjORD has none (``ResNetConfig.scaler: false`` matches it).
* **Weight decay** (``train.weight_decay``) acts on the client's ``p_max`` sub-model only, since the client holds no
  more (Flower's clients hold the full model, whose elements outside ``p_max`` get zero gradients but still decay).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from rayfl.config.sections import TrainConfig
from rayfl.core.messages import Assignment, ClientUpdate, ClientView, ServerState, TensorSlice, TrainTask
from rayfl.core.rng import derive_rng
from rayfl.fl.api.client import ClientContext
from rayfl.fl.common.submodel import SubModelAlgorithm, WidthModels, sorted_ratios
from rayfl.fl.methods.fjord.config import FjORDConfig
from rayfl.models.inputs import module_device

__all__ = ["FjORD"]

_Forward = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class _ClientWidths:
    """The widths one client trains at this round: its own ``p_max`` units, the allowed widths and their units, and
    the generator that draws one width per batch (kept in the client's context by ``FjORD.local_train``)."""

    own: tuple[int, ...]
    allowed: tuple[float, ...]
    units: dict[float, tuple[int, ...]]
    rng: np.random.Generator


class FjORD(SubModelAlgorithm):
    """Ordered dropout below each client's largest fitting width, optional self-distillation (see module docstring)."""

    name = "fjord"
    config: FjORDConfig

    def __init__(self, config: FjORDConfig, train: TrainConfig) -> None:
        super().__init__(config, train, distill=config.distill, distill_space=config.widths)
        self._width_models = WidthModels()

    @property
    def widths(self) -> tuple[float, ...]:
        """The widths ``p_s``, sorted ascending and distinct."""
        return sorted_ratios("fjord", "widths", self.config.widths)

    # ------------------------------------------------------------------------------------------ server side
    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]:
        return self.assign_nested_widths(views, self.widths)

    def client_weight(self, num_examples: int) -> float:
        return float(num_examples)  # Flower's fjord_average weights by examples

    # ------------------------------------------------------------------------------------------ client side
    def allowed_widths(self, units: tuple[int, ...] | None) -> tuple[float, ...]:
        """The widths a client whose model has ``units`` (``None``: the full model) samples from: those ``<= p_max``,
        where ``p_max`` is the largest width whose uniform units are the client model's."""
        family = self.require_family()
        own = family.full_units if units is None else tuple(units)
        widths = self.widths
        matching = [w for w in widths if self.uniform_units(w) == own]
        if not matching:
            raise ValueError(f"fjord: the client model's units {own} are no uniform width of {list(widths)}")
        p_max = max(matching)
        return tuple(w for w in widths if w <= p_max)

    def width_sequence(self, task: TrainTask, num_batches: int) -> list[float]:
        """The widths the client of ``task`` trains its first ``num_batches`` batches at (the sampler alone)."""
        allowed = self.allowed_widths(task.assignment.units)
        rng = derive_rng(task.seed, "fjord", task.round_idx, task.client_id)
        return [allowed[int(rng.integers(len(allowed)))] for _ in range(num_batches)]

    def _width_model(self, units: tuple[int, ...], device: torch.device) -> tuple[nn.Module, dict[str, TensorSlice]]:
        """The module of the ``units`` sub-model and its first-k slices, built once per host and unit tuple on the
        client model's device (the module's own weights are never used: ``functional_call`` replaces them)."""
        return self._width_models.get(self.require_family(), units, device)

    def _sub_forward(self, client: nn.Module, units: tuple[int, ...]) -> _Forward:
        """``x -> logits`` of the first-k ``units`` sub-model whose tensors are views of ``client``'s leading slices."""
        module, slices = self._width_model(units, module_device(client))
        tensors = {**dict(client.named_parameters()), **dict(client.named_buffers())}
        shared: dict[str, torch.Tensor] = {}
        for name, target in [*module.named_parameters(), *module.named_buffers()]:
            source = tensors[name]
            tslice = slices.get(name)
            if tslice is not None:
                prefix: list[slice] = []
                for idx in tslice.index:
                    if idx is None:
                        prefix.append(slice(None))
                        continue
                    if not np.array_equal(idx, np.arange(len(idx))):
                        raise ValueError(f"fjord: {name} is not a leading slice")
                    prefix.append(slice(0, len(idx)))
                source = source[tuple(prefix)]
            if source.shape != target.shape:
                raise ValueError(f"fjord: {name} has shape {tuple(source.shape)}, the width model wants {target.shape}")
            shared[name] = source
        kwargs = {"all_positions": True} if self.train.sequence_loss == "all" else {}

        def forward(x: torch.Tensor) -> torch.Tensor:
            logits: torch.Tensor = functional_call(module, shared, (x,), kwargs)
            return logits

        return forward

    def _logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = model(x, all_positions=True) if self.train.sequence_loss == "all" else model(x)
        return logits

    def _cross_entropy(self, logits: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Hard-label cross-entropy, as ``Algorithm.local_loss`` forms it from the logits."""
        if self.train.sequence_loss == "all":
            targets = torch.cat([x[:, 1:], y[:, None]], dim=1)
            return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return nn.functional.cross_entropy(logits, y)

    def _soft_cross_entropy(self, logits: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        """Cross-entropy against the soft targets ``softmax(teacher)`` (no temperature), per position."""
        soft = torch.softmax(teacher.detach(), dim=-1)
        return nn.functional.cross_entropy(logits.flatten(0, -2), soft.flatten(0, -2))

    def local_train(self, ctx: ClientContext, x: np.ndarray, y: np.ndarray) -> ClientUpdate:
        """Ordered-dropout training of the client's ``p_max`` model (see module docstring): the base loop's batches,
        each trained at a width drawn from ``derive_rng(seed, "fjord", round, client)`` (``width_sequence``) in
        ``backward_step``, which reads the client's widths from its context."""
        family = self.require_family()
        task = ctx.task
        allowed = self.allowed_widths(task.assignment.units)
        widths = _ClientWidths(
            own=family.full_units if task.assignment.units is None else tuple(task.assignment.units),
            allowed=allowed,
            units={w: self.uniform_units(w) for w in allowed},
            rng=derive_rng(task.seed, "fjord", task.round_idx, task.client_id),
        )
        ctx.put(widths)
        return super().local_train(ctx, x, y)

    def backward_step(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """One batch at one width: ``p_max`` trains on the labels; a smaller width trains its leading block on the
        labels, or (``kd``) ``p_max`` on the labels plus the smaller width on ``p_max``'s soft targets."""
        model, widths = ctx.model, ctx.get(_ClientWidths)
        units = widths.units[widths.allowed[int(widths.rng.integers(len(widths.allowed)))]]
        if units == widths.own:
            return super().backward_step(ctx, x, y)
        forward = self._sub_forward(model, units)  # fresh views of the client's current tensors
        if self.config.kd:
            teacher = self._logits(model, x)
            loss = self._cross_entropy(teacher, x, y)
            loss.backward()  # type: ignore[no-untyped-call]  # torch stubs leave backward untyped
            self._soft_cross_entropy(forward(x), teacher).backward()  # type: ignore[no-untyped-call]
            return loss
        loss = self._cross_entropy(forward(x), x, y)
        loss.backward()  # type: ignore[no-untyped-call]
        return loss
