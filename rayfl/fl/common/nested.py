"""Nested first-k widths with per-batch ordered ratio lists: the shared machinery of paper 004's FedResCuE, its
baseline FedSlim and its FjORD (capacities, the ratio list of Algorithm 1 line 4, sub-model forwards on views of the
client's leading slices, the KD and cross-entropy terms), as a ``NestedWidths`` object each method holds
(``self.nested``) and calls from its hooks."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from rayfl.core.messages import Assignment, ClientUpdate, ClientView, ServerState, TrainTask
from rayfl.core.rng import derive_rng
from rayfl.fl.api.client import ClientContext
from rayfl.fl.common.submodel import SubModelAlgorithm, WidthModels, sorted_ratios, uniform_units
from rayfl.models.inputs import module_device

if TYPE_CHECKING:
    from rayfl.models.elastic.family import ElasticFamily

__all__ = ["NestedClient", "NestedWidthHooks", "NestedWidths", "distill_loss"]


_Forward = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class NestedClient:
    """The client being trained: its own units and capacity ratio, and the generator of its ratio lists (kept in its
    ``ClientContext`` by the method's ``local_train``, ``NestedWidths.client``)."""

    own: tuple[int, ...]
    capacity: float
    rng: np.random.Generator


@dataclass(frozen=True)
class NestedWidths:
    """A nested-width method's capacities and per-batch widths (module docstring): ``method`` names it in errors,
    ``configured_capacities`` and ``configured_ratios`` are its config's ``capacities`` and ``ratios``, ``num_ratios``
    its S, ``sequence_loss`` the run's ``train.sequence_loss``. Holds configuration and a host's cache of width
    modules (``WidthModels``, never a client's state)."""

    method: str
    configured_capacities: tuple[float, ...]
    configured_ratios: tuple[float, ...]
    num_ratios: int
    sequence_loss: str
    width_models: WidthModels = field(default_factory=WidthModels, compare=False, repr=False)

    @property
    def capacities(self) -> tuple[float, ...]:
        return sorted_ratios(self.method, "capacities", self.configured_capacities)

    @property
    def ratios(self) -> tuple[float, ...]:
        return sorted_ratios(self.method, "ratios", self.configured_ratios)

    def client(self, family: ElasticFamily, task: TrainTask) -> NestedClient:
        """The client of ``task``: its units (the assignment's, the whole model when it has none), its capacity (the
        largest ratio of its units to the full model's) and its ratio generator
        ``derive_rng(seed, "nested_widths", round, client)``."""
        own = family.full_units if task.assignment.units is None else tuple(task.assignment.units)
        sizes = np.asarray(family.full_units, dtype=np.float64)
        capacity = float(np.max(np.asarray(own, dtype=np.float64) / sizes))
        rng = derive_rng(task.seed, "nested_widths", task.round_idx, task.client_id)
        return NestedClient(own, capacity, rng)

    def ratio_list(self, rng: np.random.Generator) -> list[float]:
        """One batch's ordered ratios: ``S - 1`` distinct ratios below 1, sorted, then 1 (Algorithm 1, line 4)."""
        below = [r for r in self.ratios if r < 1.0]
        k = min(len(below), int(self.num_ratios) - 1)
        picked = sorted(below[int(i)] for i in rng.choice(len(below), size=k, replace=False)) if k > 0 else []
        return [*picked, 1.0]

    def units_at(self, family: ElasticFamily, client: NestedClient, ratio: float) -> tuple[int, ...]:
        """The first-k units of the ``ratio`` sub-model relative to the client's capacity, inside its own model."""
        scaled = uniform_units(family, min(1.0, ratio * client.capacity))
        return tuple(min(o, u) for o, u in zip(client.own, scaled, strict=True))

    def unit_list(self, family: ElasticFamily, client: NestedClient) -> list[tuple[int, ...]]:
        """The batch's sub-models as unit tuples inside the client's model, increasing, ending at its own."""
        out: list[tuple[int, ...]] = []
        for r in self.ratio_list(client.rng):
            units = client.own if r >= 1.0 else self.units_at(family, client, r)
            if not out or units != out[-1]:
                out.append(units)
        return out

    def sub_forward(self, family: ElasticFamily, client: nn.Module, units: tuple[int, ...]) -> _Forward:
        """``x -> logits`` of the first-k ``units`` sub-model on views of ``client``'s leading slices."""
        module, _ = self.width_models.get(family, units, module_device(client))
        tensors = {**dict(client.named_parameters()), **dict(client.named_buffers())}
        shared = {
            name: tensors[name][tuple(slice(0, n) for n in target.shape)]
            for name, target in [*module.named_parameters(), *module.named_buffers()]
        }
        kwargs = {"all_positions": True} if self.sequence_loss == "all" else {}

        def forward(x: torch.Tensor) -> torch.Tensor:
            logits: torch.Tensor = functional_call(module, shared, (x,), kwargs)
            return logits

        return forward

    def logits(self, model: nn.Module, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = model(x, all_positions=True) if self.sequence_loss == "all" else model(x)
        return out

    def cross_entropy(self, logits: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Hard-label cross-entropy, as ``Algorithm.local_loss`` forms it from the logits."""
        if self.sequence_loss == "all":
            targets = torch.cat([x[:, 1:], y[:, None]], dim=1)
            return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return nn.functional.cross_entropy(logits, y)


if TYPE_CHECKING:  # what the mixin's hooks call: a sub-model method's (it adds no level below Algorithm at run time)
    _SubModelMethod = SubModelAlgorithm
else:
    _SubModelMethod = object


class NestedWidthHooks(_SubModelMethod):
    """The two hooks every nested-width method (FedResCuE and its variants, FedSlim, FjORD as paper 004 runs it) hands
    to its ``NestedWidths`` (``self.nested``): each client the widest nested width its capacity allows, and local
    training with the client's units and width generator in its context (``NestedClient``) for the batch hooks.
    Listed before ``SubModelAlgorithm`` in a method's bases."""

    nested: NestedWidths

    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]:
        return self.assign_nested_widths(views, self.nested.capacities)

    def local_train(self, ctx: ClientContext, x: np.ndarray, y: np.ndarray) -> ClientUpdate:
        ctx.put(self.nested.client(self.require_family(), ctx.task))
        return super().local_train(ctx, x, y)


def distill_loss(logits: torch.Tensor, teacher: torch.Tensor) -> torch.Tensor:
    """``KL(teacher || student)`` of the softmax outputs, averaged over samples (and positions)."""
    student = nn.functional.log_softmax(logits.flatten(0, -2), dim=-1)
    target = nn.functional.log_softmax(teacher.flatten(0, -2), dim=-1)
    return nn.functional.kl_div(student, target, reduction="batchmean", log_target=True)
