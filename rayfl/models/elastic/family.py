"""``ElasticFamily``: builds real sub-models from a ``SubModelSpec`` and maps their weights back to global indices.

A family subclass only says two things: its ``SearchSpace`` (dimensions and tensor layouts) and ``build(units)``, which
constructs the model with that many units per dimension, naming its tensors exactly as the global model does
(skipped blocks simply have no tensors). Everything else here is generic over families and selectors:

* ``extract``: gather the covered global elements into the sub-model (a client really trains a smaller model);
* ``scatter``: turn a trained sub-model into ``(values, slices)`` for the element-wise reducer;
* ``assignment``: the same slices as an ``Assignment`` for the engine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import numpy as np
import torch
from torch import nn

from rayfl.core.messages import Assignment, TensorSlice
from rayfl.models.elastic.space import SearchSpace
from rayfl.models.elastic.spec import Selection, SubModelSpec, select

__all__ = ["CostUnit", "ElasticFamily", "MultiExit", "Scaler", "gather"]


@runtime_checkable
class MultiExit(Protocol):
    """A model with early exits: one forward pass gives every exit's logits, early exits first, the last being what
    ``forward`` returns (the ResNet family's side exit; FedHeN trains on all of them)."""

    def forward_exits(self, x: torch.Tensor) -> list[torch.Tensor]: ...


@dataclass(frozen=True)
class CostUnit:
    """One piece of the model for the cost model (``models/elastic/cost.py``): a stem, a block, a head.

    The pieces, run one after another, are the whole model; each owns the tensors autograd saves inside it (a piece
    must not save its own output when the next piece saves its input). ``make(widths)`` builds the piece alone with
    ``widths[i]`` units in dimension ``dims[i]`` and returns it with a function giving an input batch of a size on a
    device. Its costs must be multilinear in those widths (true for convs, norms, linears and attention with a fixed
    sequence length), so the cost model measures each distinct ``key`` at a few widths once and caches the fit.
    """

    key: Hashable  # everything about the piece's shape except the widths in ``dims``
    dims: tuple[int, ...]
    gate: int | None  # the piece is absent when this dimension keeps 0 units
    make: Callable[[tuple[int, ...]], tuple[nn.Module, Callable[[int, torch.device], torch.Tensor]]]


class Scaler(nn.Module):
    """HeteroFL's scaler: divides activations by the layer's width rate in training, identity in evaluation."""

    def __init__(self, rate: float) -> None:
        super().__init__()
        self.rate = float(rate)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x / self.rate if self.training and self.rate != 1.0 else x

    def extra_repr(self) -> str:
        return f"rate={self.rate:.4g}"


def gather(tensor: torch.Tensor, tslice: TensorSlice) -> torch.Tensor:
    """``tensor[np.ix_(*index)]`` with ``None`` meaning the whole axis, as a new contiguous tensor."""
    out = tensor
    for axis, idx in enumerate(tslice.index):
        if idx is None or (len(idx) == out.shape[axis] and np.array_equal(idx, np.arange(len(idx)))):
            continue
        out = out.index_select(axis, torch.as_tensor(idx, dtype=torch.long))
    return out.clone() if out is tensor else out


class ElasticFamily(ABC):
    """A model family with searchable widths and skippable blocks."""

    space: SearchSpace

    @abstractmethod
    def build(self, units: Sequence[int]) -> nn.Module:
        """The model with ``units[d]`` units in dimension ``d``; tensor names equal the global model's."""

    @abstractmethod
    def cost_units(self) -> list[CostUnit]:
        """The model as a sequence of cost pieces (see ``CostUnit``)."""

    # --- generic machinery -------------------------------------------------------------------------------------
    @property
    def full_units(self) -> tuple[int, ...]:
        return tuple(d.size for d in self.space.dims)

    def global_model(self) -> nn.Module:
        return self.build(self.full_units)

    def layer_groups(self) -> tuple[tuple[int, ...], ...]:
        """The dimensions that one of paper 000's per-layer ratios covers together (Definition 3.1), each group a
        tuple of dimension indices, every dimension in exactly one. By default every dimension is a layer; the
        transformer families make each block one layer (its heads and MLP width together)."""
        return tuple((d,) for d in range(len(self.space.dims)))

    def stage_blocks(self) -> tuple[tuple[tuple[int, ...], ...], ...]:
        """Per stage, per block (in order), the block's own dimensions, the one whose 0 removes it first: what "the
        first n blocks of each stage" means for a named smaller model (ResNet18 inside ResNet34). Families without
        removable blocks have none."""
        return ()

    def side_exit_units(self) -> tuple[int, ...]:
        """Units of the sub-model that ends at the family's early-exit side head (FedHeN's simple model: an index
        subset of the global model). Families that can have one override this; the rest have none."""
        raise ValueError(f"{type(self).__name__} has no side exit (FedHeN's simple model needs one)")

    def select(self, spec: SubModelSpec, params: Mapping[str, torch.Tensor] | None = None) -> Selection:
        return select(self.space, spec, params)

    def slices(self, selection: Selection, rows: np.ndarray | None = None) -> dict[str, TensorSlice]:
        """Global coverage of every tensor the sub-model has; ``rows`` restricts classifier tensors to those classes."""
        out: dict[str, TensorSlice] = {}
        for name in self.space.layouts:
            if self.space.present(name, selection.units):
                r = rows if name in self.space.classifier else None
                out[name] = self.space.tensor_slice(name, selection.index, r)
        return out

    def assignment(self, selection: Selection, model_id: int = 0) -> Assignment:
        slices = self.slices(selection)
        skip = frozenset(n for n in self.space.layouts if n not in slices)
        return Assignment(model_id=model_id, slices=slices, skip=skip, units=selection.units)

    def extract(self, params: Mapping[str, torch.Tensor], selection: Selection) -> nn.Module:
        """A real sub-model holding the covered global elements (gradients flow only into the sub-model)."""
        model = self.build(selection.units)
        slices = self.slices(selection)
        state = model.state_dict()
        with torch.no_grad():
            for name, target in state.items():
                if name in slices:
                    target.copy_(gather(params[name], slices[name]))
        return model

    def scatter(
        self, model: nn.Module, selection: Selection, rows: np.ndarray | None = None
    ) -> tuple[dict[str, torch.Tensor], dict[str, TensorSlice]]:
        """Trained sub-model → (values, global slices) for the reducer. With ``rows``, classifier tensors contribute
        only those classes (HeteroFL's label-split aggregation)."""
        slices = self.slices(selection)
        values: dict[str, torch.Tensor] = {}
        out_slices: dict[str, TensorSlice] = {}
        state = model.state_dict()
        for name, tslice in slices.items():
            value = state[name].detach()
            if rows is not None and name in self.space.classifier:
                value = value.index_select(0, torch.as_tensor(rows, dtype=torch.long))
                tslice = self.space.tensor_slice(name, selection.index, np.asarray(rows, dtype=np.int64))
            values[name] = value.clone()
            out_slices[name] = tslice
        return values, out_slices
