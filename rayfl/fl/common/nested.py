"""Nested first-k widths with per-batch ordered ratio lists: the shared machinery of paper 004's FedResCuE and its
baseline FedSlim (capacities, the ratio list of Algorithm 1 line 4, sub-model forwards on views of the client's
leading slices, the KD and cross-entropy terms)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from rayfl.config.sections import TrainConfig
from rayfl.core.messages import Assignment, ClientUpdate, ClientView, ServerState, TensorSlice
from rayfl.core.rng import derive_rng
from rayfl.fl.api.client import ClientContext
from rayfl.fl.common.submodel import SubModelAlgorithm, WidthModels, sorted_ratios
from rayfl.models.inputs import module_device

__all__ = ["NestedClient", "NestedWidthAlgorithm"]


_Forward = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class NestedClient:
    """The client being trained: its own units and capacity ratio, and the generator of its ratio lists (kept in its
    ``ClientContext`` by ``NestedWidthAlgorithm.local_train``)."""

    own: tuple[int, ...]
    capacity: float
    rng: np.random.Generator


class NestedWidthAlgorithm(SubModelAlgorithm):
    """Shared base of FedResCuE and FedSlim: capacities, nested first-k widths, per-batch ordered ratio lists."""

    def __init__(self, config: Any, train: TrainConfig) -> None:
        super().__init__(config, train)
        self._width_models = WidthModels()

    @property
    def capacities(self) -> tuple[float, ...]:
        return sorted_ratios(self.name, "capacities", self.config.capacities)

    @property
    def ratios(self) -> tuple[float, ...]:
        return sorted_ratios(self.name, "ratios", self.config.ratios)

    # ------------------------------------------------------------------------------------------ server side
    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]:
        return self.assign_nested_widths(views, self.capacities)

    # ------------------------------------------------------------------------------------------ client side
    def ratio_list(self, rng: np.random.Generator) -> list[float]:
        """One batch's ordered ratios: ``S - 1`` distinct ratios below 1, sorted, then 1 (Algorithm 1, line 4)."""
        below = [r for r in self.ratios if r < 1.0]
        k = min(len(below), int(self.config.num_ratios) - 1)
        picked = sorted(below[int(i)] for i in rng.choice(len(below), size=k, replace=False)) if k > 0 else []
        return [*picked, 1.0]

    def unit_list(self, client: NestedClient) -> list[tuple[int, ...]]:
        """The batch's sub-models as unit tuples inside the client's model, increasing, ending at its own."""
        out: list[tuple[int, ...]] = []
        for r in self.ratio_list(client.rng):
            units = tuple(
                min(o, u) for o, u in zip(client.own, self.uniform_units(min(1.0, r * client.capacity)), strict=True)
            )
            if r >= 1.0:
                units = client.own
            if not out or units != out[-1]:
                out.append(units)
        return out

    def local_train(self, ctx: ClientContext, x: np.ndarray, y: np.ndarray) -> ClientUpdate:
        """The base loop, with the client's units and ratio generator in its context (``NestedClient``) for the batch
        hooks."""
        family = self.require_family()
        task = ctx.task
        own = family.full_units if task.assignment.units is None else tuple(task.assignment.units)
        sizes = np.asarray(family.full_units, dtype=np.float64)
        capacity = float(np.max(np.asarray(own, dtype=np.float64) / sizes))
        rng = derive_rng(task.seed, "nested_widths", task.round_idx, task.client_id)
        ctx.put(NestedClient(own, capacity, rng))
        return super().local_train(ctx, x, y)

    def _width_model(self, units: tuple[int, ...], device: torch.device) -> tuple[nn.Module, dict[str, TensorSlice]]:
        return self._width_models.get(self.require_family(), units, device)

    def sub_forward(self, client: nn.Module, units: tuple[int, ...]) -> _Forward:
        """``x -> logits`` of the first-k ``units`` sub-model on views of ``client``'s leading slices."""
        module, _ = self._width_model(units, module_device(client))
        tensors = {**dict(client.named_parameters()), **dict(client.named_buffers())}
        shared = {
            name: tensors[name][tuple(slice(0, n) for n in target.shape)]
            for name, target in [*module.named_parameters(), *module.named_buffers()]
        }
        kwargs = {"all_positions": True} if self.train.sequence_loss == "all" else {}

        def forward(x: torch.Tensor) -> torch.Tensor:
            logits: torch.Tensor = functional_call(module, shared, (x,), kwargs)
            return logits

        return forward

    def logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = model(x, all_positions=True) if self.train.sequence_loss == "all" else model(x)
        return out

    def distill_loss(self, logits: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
        """``KL(teacher || student)`` of the softmax outputs, averaged over samples (and positions)."""
        student = nn.functional.log_softmax(logits.flatten(0, -2), dim=-1)
        target = nn.functional.log_softmax(teacher.flatten(0, -2), dim=-1)
        return nn.functional.kl_div(student, target, reduction="batchmean", log_target=True)

    def cross_entropy(self, logits: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Hard-label cross-entropy, as ``Algorithm.local_loss`` forms it from the logits."""
        if self.train.sequence_loss == "all":
            targets = torch.cat([x[:, 1:], y[:, None]], dim=1)
            return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return nn.functional.cross_entropy(logits, y)
