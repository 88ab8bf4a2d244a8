"""Shared base of the uniform-rate sub-model baselines: HeteroFL, FedRolex, Federated Dropout and AnyCostFL.

The four methods differ only in *which* channels a client's sub-model keeps (its ``Selector``); everything else is
here:

* **Rate.** Each sampled client gets the largest rate of ``config.rates`` whose uniform sub-model (every dimension at
  that rate, ``ceil(rate x width)`` units) fits both its memory and its bandwidth budget, with the clock's own cost
  model (``SubModelAlgorithm.largest_fitting_rate``). When even the smallest rate does not fit, the client gets the
  smallest rate and the clock fails it (recorded), rather than the method breaking a budget.
* **Channels.** ``selector(round_idx, client_id)`` per method; a residual stream is one dimension of the search space,
  so every selector keeps residual adds aligned.
* **Aggregation.** The count-normalised element-wise mean (every client weighs 1), inherited.
* **Label masking** (``config.label_mask``, HeteroFL's ``label_split``): during local training, the logits of classes
  absent from the client's training labels are set to 0 (``masked_fill`` with 0, as official HeteroFL, not -inf)
  before the loss; the classifier tensors (``family.space.classifier``) of the update then carry only the rows of the
  client's labels, so rows of labels a client lacks are neither added nor counted and keep their global value when no
  client of the round holds them. With ``train.sequence_loss == "all"`` (next-character prediction at every position)
  a client's label set is every target character, ``x[:, 1:]`` and ``y``.

* **Clipping** (``config.grad_clip_norm``, HeteroFL and FedRolex, default 1 as both official codes): the method's
  local training clips with it in place of ``train.grad_clip_norm`` (``None``: ``train.grad_clip_norm``).

Choices where the papers leave room: the label set is taken from the client's *whole* local training set (not per
batch), as HeteroFL's ``label_split``; the upload then carries only those classifier rows (so ``bytes_up`` counts only
them). Assignments of equal rate and equal selector are shared between clients of a round (same slices).
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from rayfl.config.sections import TrainConfig
from rayfl.core.messages import Assignment, ClientUpdate, ClientView, ServerState, TensorSlice
from rayfl.fl.api.algorithm import MAIN_EVAL
from rayfl.fl.api.client import ClientContext
from rayfl.fl.common.submodel import SubModelAlgorithm
from rayfl.models.elastic.spec import Selection, Selector, SubModelSpec
from rayfl.models.inputs import module_device

__all__ = ["UniformRateAlgorithm", "client_label_set"]


def client_label_set(x: np.ndarray, y: np.ndarray, sequence_loss: str) -> np.ndarray:
    """Sorted distinct targets of a client's training data: ``y``, plus ``x[:, 1:]`` when every position is a target."""
    targets = np.asarray(y, dtype=np.int64).reshape(-1)
    if sequence_loss == "all":
        targets = np.concatenate([np.asarray(x, dtype=np.int64)[:, 1:].reshape(-1), targets])
    return np.unique(targets)


class UniformRateAlgorithm(SubModelAlgorithm, abc.ABC):
    """Largest fitting uniform rate, a per-method channel selector, optional label masking (see module docstring).
    Abstract: each method (HeteroFL, FedRolex, FedDropout, AnyCostFL) says which channels a client keeps."""

    def __init__(self, config: Any, train: TrainConfig) -> None:
        clip = getattr(config, "grad_clip_norm", None)  # the method's own clipping (see module docstring)
        super().__init__(config, train if clip is None else dataclasses.replace(train, grad_clip_norm=float(clip)))

    @abc.abstractmethod
    def selector(self, round_idx: int, client_id: int) -> Selector:
        """Which units of each dimension a client keeps this round."""

    @property
    def rates(self) -> tuple[float, ...]:
        rates = tuple(float(r) for r in self.config.rates)
        if not rates or any(not 0.0 < r <= 1.0 for r in rates):
            raise ValueError(f"{self.name}: rates must lie in (0, 1], got {list(rates)}")
        return rates

    @property
    def label_mask(self) -> bool:
        return bool(getattr(self.config, "label_mask", False))

    # ------------------------------------------------------------------------------------------ server side
    def selection(self, state: ServerState, rate: float, selector: Selector) -> Selection:
        """The uniform sub-model at ``rate`` resolved by ``selector`` (TopKNorm scores ``state.params``)."""
        family = self.require_family()
        return family.select(SubModelSpec.uniform(family.space, rate, selector), state.params)

    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]:
        if not views:
            return {}
        rates = self.largest_fitting_rate(views, self.rates)
        made: dict[tuple[float, Selector], Assignment] = {}
        out: dict[int, Assignment] = {}
        for view in views:
            key = (rates[view.client_id], self.selector(round_idx, view.client_id))
            if key not in made:
                made[key] = self.assignment_for(self.selection(state, *key))
            out[view.client_id] = made[key]
        return out

    def device_evals(self, state: ServerState, views: Sequence[ClientView]) -> list[str]:
        """Each device on the uniform sub-model it trains (its largest fitting rate) when the run evaluates that
        sub-model (``eval_widths``, ``x{rate}``), else on the main evaluation: a low-capacity device of HeteroFL runs
        a small sub-model, and paper 002 scores each client on the model it can run."""
        widths = {float(p) for p in self.server.eval_widths}
        if not widths or not views:
            return super().device_evals(state, views)
        rates = self.largest_fitting_rate(views, self.rates)
        return [f"x{rates[v.client_id]:g}" if rates[v.client_id] in widths else MAIN_EVAL for v in views]

    # ------------------------------------------------------------------------------------------ client side
    def local_train(self, ctx: ClientContext, x: np.ndarray, y: np.ndarray) -> ClientUpdate:
        if not self.label_mask:
            return super().local_train(ctx, x, y)
        model = ctx.model
        labels = client_label_set(x, y, self.train.sequence_loss)
        device = module_device(model)
        present = torch.zeros(ctx.input_spec.num_classes, dtype=torch.bool, device=device)
        present[torch.as_tensor(labels, dtype=torch.long, device=device)] = True
        absent = ~present

        def mask_logits(_module: nn.Module, _args: Any, output: torch.Tensor) -> torch.Tensor:
            return output.masked_fill(absent, 0.0)  # absent classes' logits are 0 (last axis = classes)

        handle = model.register_forward_hook(mask_logits)
        try:
            update = super().local_train(ctx, x, y)
        finally:
            handle.remove()
        return self.classifier_rows(update, labels)

    def classifier_rows(self, update: ClientUpdate, labels: np.ndarray) -> ClientUpdate:
        """The update with its classifier tensors restricted to the rows (classes) ``labels``."""
        rows = np.asarray(labels, dtype=np.int64)
        index = torch.as_tensor(rows, dtype=torch.long)
        values = dict(update.values)
        slices = dict(update.slices)
        for name in self.require_family().space.classifier:
            value = values.get(name)
            if value is None:
                continue
            old = slices.get(name)
            if old is not None and old.index[0] is not None:
                raise ValueError(f"{name}: classifier rows are already sliced; cannot restrict them to labels")
            rest = old.index[1:] if old is not None else (None,) * (value.dim() - 1)
            values[name] = value.index_select(0, index.to(value.device)).clone()
            slices[name] = TensorSlice((rows, *rest))
        return dataclasses.replace(update, values=values, slices=slices)
