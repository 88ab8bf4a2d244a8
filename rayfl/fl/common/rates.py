"""The uniform-rate part of the sub-model baselines HeteroFL, FedRolex, Federated Dropout and AnyCostFL.

The four methods differ only in *which* channels a client's sub-model keeps (their ``selector``); everything else is
a ``UniformRates`` object each holds (``self.uniform``) and calls from its hooks:

* **Rate.** Each sampled client gets the largest rate of the method's ``rates`` whose uniform sub-model (every
  dimension at that rate, ``ceil(rate x width)`` units) fits both its memory and its bandwidth budget, with the clock's
  own cost model (``SubModelAlgorithm.largest_fitting_rate``). When even the smallest rate does not fit, the client
  gets the smallest rate and the clock fails it (recorded), rather than the method breaking a budget.
* **Channels.** ``selector(round_idx, client_id)`` per method; a residual stream is one dimension of the search space,
  so every selector keeps residual adds aligned.
* **Aggregation.** The count-normalised element-wise mean (every client weighs 1), ``SubModelAlgorithm``'s.
* **Label masking** (the method's ``label_mask``, HeteroFL's ``label_split``): during local training, the logits of
  classes absent from the client's training labels are set to 0 (``masked_fill`` with 0, as official HeteroFL, not
  -inf) before the loss; the classifier tensors (``family.space.classifier``) of the update then carry only the rows of
  the client's labels, so rows of labels a client lacks are neither added nor counted and keep their global value when
  no client of the round holds them. With ``train.sequence_loss == "all"`` (next-character prediction at every
  position) a client's label set is every target character, ``x[:, 1:]`` and ``y``.

* **Clipping** (the method's ``grad_clip_norm``, HeteroFL and FedRolex, default 1 as both official codes): the method's
  local training clips with it in place of ``train.grad_clip_norm`` (``None``: ``train.grad_clip_norm``;
  ``with_clip``).

Choices where the papers leave room: the label set is taken from the client's *whole* local training set (not per
batch), as HeteroFL's ``label_split``; the upload then carries only those classifier rows (so ``bytes_up`` counts only
them). Assignments of equal rate and equal selector are shared between clients of a round (same slices).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

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

if TYPE_CHECKING:
    from rayfl.models.elastic.family import ElasticFamily

__all__ = ["UniformRateHooks", "UniformRates", "classifier_rows", "client_label_set", "uniform_selection", "with_clip"]

# a method's selector: which units of each dimension a client keeps in a round, (round_idx, client_id) -> Selector
RoundSelector = Callable[[int, int], Selector]
# the local training a method runs without label masking (``Algorithm.local_train`` as the method inherits it)
LocalTrain = Callable[[ClientContext, np.ndarray, np.ndarray], ClientUpdate]


def client_label_set(x: np.ndarray, y: np.ndarray, sequence_loss: str) -> np.ndarray:
    """Sorted distinct targets of a client's training data: ``y``, plus ``x[:, 1:]`` when every position is a target."""
    targets = np.asarray(y, dtype=np.int64).reshape(-1)
    if sequence_loss == "all":
        targets = np.concatenate([np.asarray(x, dtype=np.int64)[:, 1:].reshape(-1), targets])
    return np.unique(targets)


def with_clip(train: TrainConfig, grad_clip_norm: float | None) -> TrainConfig:
    """``train`` with the method's own gradient clipping in place of ``train.grad_clip_norm`` (``None``: unchanged)."""
    return train if grad_clip_norm is None else dataclasses.replace(train, grad_clip_norm=float(grad_clip_norm))


def uniform_selection(family: ElasticFamily, state: ServerState, rate: float, selector: Selector) -> Selection:
    """The uniform sub-model at ``rate`` resolved by ``selector`` (TopKNorm scores ``state.params``)."""
    return family.select(SubModelSpec.uniform(family.space, rate, selector), state.params)


@dataclass(frozen=True)
class UniformRates:
    """A uniform-rate method's rate choice, assignment, device evaluations and label masking (module docstring):
    ``method`` names it in errors, ``configured`` are its ``rates``, ``label_mask`` its switch. Holds configuration
    only; the hooks hand it the algorithm (budgets, family, server context) and what they would otherwise inherit."""

    method: str
    configured: tuple[float, ...]
    label_mask: bool = False

    @property
    def rates(self) -> tuple[float, ...]:
        rates = tuple(float(r) for r in self.configured)
        if not rates or any(not 0.0 < r <= 1.0 for r in rates):
            raise ValueError(f"{self.method}: rates must lie in (0, 1], got {list(rates)}")
        return rates

    # ------------------------------------------------------------------------------------------ server side
    def assign(
        self,
        algorithm: SubModelAlgorithm,
        state: ServerState,
        round_idx: int,
        views: Sequence[ClientView],
        selector: RoundSelector,
    ) -> dict[int, Assignment]:
        """Each client the uniform sub-model at its largest fitting rate, its units chosen by ``selector``."""
        if not views:
            return {}
        family = algorithm.require_family()
        rates = algorithm.largest_fitting_rate(views, self.rates)
        made: dict[tuple[float, Selector], Assignment] = {}
        out: dict[int, Assignment] = {}
        for view in views:
            key = (rates[view.client_id], selector(round_idx, view.client_id))
            if key not in made:
                made[key] = algorithm.assignment_for(uniform_selection(family, state, *key))
            out[view.client_id] = made[key]
        return out

    def device_evals(self, algorithm: SubModelAlgorithm, views: Sequence[ClientView]) -> list[str] | None:
        """Each device on the uniform sub-model it trains (its largest fitting rate) when the run evaluates that
        sub-model (``eval_widths``, ``x{rate}``), else on the main evaluation: a low-capacity device of HeteroFL runs
        a small sub-model, and paper 002 scores each client on the model it can run. ``None`` when the run evaluates
        no widths (or there are no views): the method's default then applies."""
        widths = {float(p) for p in algorithm.server.eval_widths}
        if not widths or not views:
            return None
        rates = algorithm.largest_fitting_rate(views, self.rates)
        return [f"x{rates[v.client_id]:g}" if rates[v.client_id] in widths else MAIN_EVAL for v in views]

    # ------------------------------------------------------------------------------------------ client side
    def local_train(
        self,
        algorithm: SubModelAlgorithm,
        ctx: ClientContext,
        x: np.ndarray,
        y: np.ndarray,
        train: LocalTrain,
    ) -> ClientUpdate:
        """``train`` (the method's inherited ``local_train``), with the absent classes' logits masked to 0 and the
        update's classifier rows restricted to the client's labels when ``label_mask`` is on."""
        if not self.label_mask:
            return train(ctx, x, y)
        model = ctx.model
        labels = client_label_set(x, y, algorithm.train.sequence_loss)
        device = module_device(model)
        present = torch.zeros(ctx.input_spec.num_classes, dtype=torch.bool, device=device)
        present[torch.as_tensor(labels, dtype=torch.long, device=device)] = True
        absent = ~present

        def mask_logits(_module: nn.Module, _args: Any, output: torch.Tensor) -> torch.Tensor:
            return output.masked_fill(absent, 0.0)  # absent classes' logits are 0 (last axis = classes)

        handle = model.register_forward_hook(mask_logits)
        try:
            update = train(ctx, x, y)
        finally:
            handle.remove()
        return classifier_rows(update, labels, algorithm.require_family().space.classifier)


if TYPE_CHECKING:  # what the mixin's hooks call: a sub-model method's (it adds no level below Algorithm at run time)
    _SubModelMethod = SubModelAlgorithm
else:
    _SubModelMethod = object


class UniformRateHooks(_SubModelMethod):
    """The three hooks every uniform-rate method (HeteroFL, FedRolex, Federated Dropout, AnyCostFL) hands to its
    ``UniformRates`` (``self.uniform``): assignment at the largest fitting rate with the method's ``selector``, the
    devices' evaluations, local training with label masking. Listed before ``SubModelAlgorithm`` in a method's bases;
    the method gives ``uniform`` and ``selector`` (the one thing that differs between them)."""

    uniform: UniformRates
    selector: RoundSelector  # the method's own ``selector(round_idx, client_id)`` method

    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]:
        return self.uniform.assign(self, state, round_idx, views, self.selector)

    def device_evals(self, state: ServerState, views: Sequence[ClientView]) -> list[str]:
        evals = self.uniform.device_evals(self, views)
        return super().device_evals(state, views) if evals is None else evals

    def local_train(self, ctx: ClientContext, x: np.ndarray, y: np.ndarray) -> ClientUpdate:
        return self.uniform.local_train(self, ctx, x, y, super().local_train)


def classifier_rows(update: ClientUpdate, labels: np.ndarray, classifier: Sequence[str]) -> ClientUpdate:
    """The update with its classifier tensors (``classifier``: their names) restricted to the rows (classes)
    ``labels``."""
    rows = np.asarray(labels, dtype=np.int64)
    index = torch.as_tensor(rows, dtype=torch.long)
    values = dict(update.values)
    slices = dict(update.slices)
    for name in classifier:
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
