"""FedResCuE: Resilient and Communication-Efficient Federated Learning (Zhu, Hong, Drew, Zhou, ICML 2022; paper
004, ALGORITHMS.md section 11), with its ablations FedSeq and FedRush.

* **Nested widths.** A ``xp`` sub-model keeps the first ``ceil(p x width)`` units of every dimension (first-k, the
  same ``p`` on every layer). Each sampled client gets the largest capacity ``p_k`` of ``config.capacities`` whose
  sub-model fits its memory and bandwidth budgets (``largest_fitting_rate``, the clock's own cost model).
* **Progressive self-distillation** (Algorithm 1, ``train_batch``). Per batch, an ordered list of ``S`` =
  ``num_ratios`` ratios is drawn from ``config.ratios`` (P, relative to the client's own model, so a client's "1" is
  its ``p_k``): ``S - 1`` distinct ratios below 1 uniformly without replacement, sorted, then 1, from
  ``derive_rng(seed, "nested_widths", round, client)`` (the same lists for FedSlim, FedSeq and FedRush). The
  client's model before the batch is the stop-gradient teacher (its logits, computed once). For each ratio ``p_i``:
  loss ``J_i = CE + alpha_i KL(teacher || sub-model p_i)`` with ``alpha_i = alpha`` for ``p_i < 1`` and 0 at 1
  (Eq. 3), and one optimizer step on the columns this ratio adds, ``theta_{p_i} minus theta_{p_{i-1}}`` (Eq. 2):
  the gradient is masked to them before clipping and stepping, and the step (``optim.masked_step``) leaves every
  other element's parameter **and optimizer state** exactly as it was (no momentum spent or decayed, no weight
  decay), as the paper's customised SGD "masks out the gradients of parameters that were not included in the
  specified columns" (Appendix A.6.2). Then one ordinary cross-entropy step on the client's whole model (line 9),
  which moves and accumulates momentum in every column. The sub-model ``p_i`` runs on views of the leading
  slices of the client's tensors (``torch.func.functional_call``, as FjORD), so no copies are made.
* **Aggregation (Eq. 4).** Each uploaded element is averaged, unweighted, over the clients whose upload covers it:
  for nested bands this is exactly "band ``p_i`` = the plain mean over the users whose uploaded ratio reaches
  ``p_i``" (``MaskedWeightedMean`` with weight 1). What was uploaded is decided by the links (``system.links``).
* **Local model padding (Eq. 5)** and **unstable links** are engine capabilities for every method
  (``system/links.py``, ``engine/exec/client_state.py``); FedResCuE needs nothing of its own for them.

Ablations: **FedSeq** (``fedseq``) sets ``alpha = 0`` (no teacher pass); **FedRush** (``fedrush``) does not freeze:
each ratio's step updates its whole sub-model. Both are ``FedResCuE`` itself, run with their config sections
(``FedSeqConfig``, ``FedRushConfig``: the same keys, other defaults), under their own names.

Choices where the paper leaves room:

* **``S = 1``.** The list is ``[1]``: its one step is cross-entropy on the whole model updating every column, which is
  what line 9 does; it is taken once, so that with ``ratios = (1,)`` FedResCuE is FedAvg (count-weighted).
* **Ratios that round to the same units** as the previous one add no columns and are skipped.
* **Tensors outside the searched dimensions** (the classifier's bias, a norm's class-sized part) belong to every
  sub-model, hence to ``theta_{p_1}``: they move in the first step of the list and in the final step only.
* **Reported loss**: the final step's cross-entropy.
* **Optimizer state of frozen columns.** The paper masks the gradients; with momentum (its SGD: 0.9, Nesterov,
  weight decay 1e-4) a masked gradient fed to an ordinary step would still move the frozen columns by their momentum
  and weight decay and decay their buffers, breaking "fix its parameters" (Sec. 3.2, Algorithm 1 line 7). Here a
  frozen element is outside the step altogether (torch.optim's rule for a parameter without a gradient, per
  element): its momentum buffer is not decayed by the steps of larger ratios, so it carries the same momentum into
  the line-9 step whatever ratios were drawn after it. Decaying it (``buf = momentum x buf``) would shrink the
  x0.25 columns' momentum by 0.9^3 every batch at S = 4 through steps that do not train them.
* **Clipping** (``train.grad_clip_norm``; the paper uses none): the norm of ``g_i``, the gradient with respect to the
  new columns only, which is the gradient the step applies (Eq. 2).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from rayfl.config.sections import TrainConfig
from rayfl.fl.api.client import ClientContext
from rayfl.fl.api.optim import ClientOptimizer, masked_step
from rayfl.fl.common.nested import NestedClient, NestedWidthHooks, NestedWidths, distill_loss
from rayfl.fl.common.submodel import SubModelAlgorithm
from rayfl.fl.methods.fedrescue.config import FedResCuEConfig

__all__ = ["FedResCuE", "block_mask"]


def block_mask(shape: Sequence[int], sub_shape: Sequence[int] | None) -> torch.Tensor:
    """Boolean mask of a tensor's leading block of ``sub_shape`` (all False for ``None``)."""
    mask = torch.zeros(tuple(shape), dtype=torch.bool)
    if sub_shape is not None:
        mask[tuple(slice(0, n) for n in sub_shape)] = True
    return mask


class FedResCuE(NestedWidthHooks, SubModelAlgorithm):
    """Progressive self-distillation inside each client's capacity (see module docstring); FedSeq and FedRush with
    their config sections."""

    name = "fedrescue"
    config: FedResCuEConfig

    def __init__(self, config: FedResCuEConfig, train: TrainConfig) -> None:
        super().__init__(config, train)
        self.name = config.name  # fedrescue, fedseq or fedrush
        self.nested = NestedWidths(self.name, config.capacities, config.ratios, config.num_ratios, train.sequence_loss)
        self._masks: dict[
            tuple[str, tuple[int, ...], tuple[int, ...], tuple[int, ...] | None], torch.Tensor | bool | None
        ] = {}

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        state["_masks"] = {}
        return state

    def new_columns(
        self, name: str, tensor: torch.Tensor, units: tuple[int, ...], previous: tuple[int, ...] | None
    ) -> torch.Tensor | bool | None:
        """Mask of ``theta_{units} minus theta_{previous}`` in the client tensor ``name`` (``previous`` None: empty):
        None when it is empty, True when it is the whole tensor, else a bool tensor on the tensor's device. Which it is
        is worked out once per key, on the CPU, so a training step reads no mask back from the device."""
        key = (name, tuple(tensor.shape), units, previous)
        if key not in self._masks:
            space = self.require_family().space
            shape = tuple(tensor.shape)

            def sub(u: tuple[int, ...] | None) -> tuple[int, ...] | None:
                if u is None:
                    return None
                return space.sub_shape(name, u) if name in space.layouts else shape

            mask = block_mask(shape, sub(units)) & ~block_mask(shape, sub(previous))
            self._masks[key] = None if not bool(mask.any()) else True if bool(mask.all()) else mask.to(tensor.device)
        return self._masks[key]

    def train_batch(
        self,
        ctx: ClientContext,
        x: torch.Tensor,
        y: torch.Tensor,
        optimizer: ClientOptimizer,
        params: Sequence[nn.Parameter],
        batch_idx: int,
    ) -> torch.Tensor:
        """Algorithm 1 on one batch: a step per sampled ratio on its new columns, then one step on the whole model."""
        model = ctx.model
        client = ctx.get(NestedClient)
        units_list = self.nested.unit_list(self.require_family(), client)
        alpha = float(self.config.alpha)
        if units_list != [client.own]:
            teacher = None
            if alpha > 0.0:
                with torch.no_grad():
                    teacher = self.nested.logits(model, x).detach()
            previous: tuple[int, ...] | None = None
            by_id = {id(p): n for n, p in model.named_parameters()}
            names = [by_id[id(p)] for p in params]
            for units in units_list:
                self._progressive_step(ctx, x, y, units, previous, teacher, alpha, optimizer, params, names)
                previous = units if self.config.freeze else None
        return super().train_batch(ctx, x, y, optimizer, params, batch_idx)

    def _progressive_step(
        self,
        ctx: ClientContext,
        x: torch.Tensor,
        y: torch.Tensor,
        units: tuple[int, ...],
        previous: tuple[int, ...] | None,
        teacher: torch.Tensor | None,
        alpha: float,
        optimizer: ClientOptimizer,
        params: Sequence[nn.Parameter],
        names: Sequence[str] | None = None,
    ) -> None:
        """One step of ``J_i`` (Eq. 3) that moves only the columns ``units`` adds to ``previous`` (``names``: those of
        ``params`` in the model, which ``train_batch`` looks up once for the batch's steps)."""
        model = ctx.model
        if names is None:
            by_id = {id(p): n for n, p in model.named_parameters()}
            names = [by_id[id(p)] for p in params]
        whole = units == ctx.get(NestedClient).own
        optimizer.zero_grad(set_to_none=True)
        nested = self.nested
        logits = nested.logits(model, x) if whole else nested.sub_forward(self.require_family(), model, units)(x)
        loss = nested.cross_entropy(logits, x, y)
        if teacher is not None and not whole:
            loss = loss + alpha * distill_loss(logits, teacher)
        loss.backward()  # type: ignore[no-untyped-call]  # torch stubs leave backward untyped
        masks: list[torch.Tensor | bool | None] = []
        with torch.no_grad():
            for p, name in zip(params, names, strict=True):
                mask = self.new_columns(name, p, units, previous)
                if p.grad is None or mask is None:
                    masks.append(None)
                    continue
                if isinstance(mask, torch.Tensor):
                    p.grad.masked_fill_(~mask, 0.0)  # g_i of Eq. 2: the gradient with respect to the new columns only
                masks.append(mask)
        if self.train.grad_clip_norm > 0:  # the norm of g_i, the step's own gradient
            nn.utils.clip_grad_norm_(
                [p for p, m in zip(params, masks, strict=True) if m is not None], self.train.grad_clip_norm
            )
        masked_step(optimizer, params, masks)
