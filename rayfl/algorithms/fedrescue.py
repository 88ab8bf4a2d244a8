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
  (``system/links.py``, ``engine/client_state.py``); FedResCuE needs nothing of its own for them.

Ablations: **FedSeq** (``fedseq``) sets ``alpha = 0`` (no teacher pass); **FedRush** (``fedrush``) does not freeze:
each ratio's step updates its whole sub-model.

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

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from rayfl.algorithms.optim import ClientOptimizer, masked_step
from rayfl.algorithms.payloads import Assignment, ClientUpdate, ClientView, ServerState, TensorSlice, TrainTask
from rayfl.algorithms.submodel import SubModelAlgorithm, WidthModels, sorted_ratios
from rayfl.config import TrainConfig
from rayfl.models.inputs import InputSpec, module_device
from rayfl.rng import derive_rng

__all__ = ["FedResCuE", "FedRush", "FedSeq", "NestedWidthAlgorithm"]

_Forward = Callable[[torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class _Client:
    """The client being trained: its own units and capacity ratio, and the generator of its ratio lists."""

    own: tuple[int, ...]
    capacity: float
    rng: np.random.Generator


class NestedWidthAlgorithm(SubModelAlgorithm):
    """Shared base of FedResCuE and FedSlim: capacities, nested first-k widths, per-batch ordered ratio lists."""

    def __init__(self, config: Any, train: TrainConfig) -> None:
        super().__init__(config, train)
        self._width_models = WidthModels()
        self._client: _Client | None = None  # set while local_train runs

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

    def unit_list(self, client: _Client) -> list[tuple[int, ...]]:
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

    def local_train(
        self,
        model: nn.Module,
        x: np.ndarray,
        y: np.ndarray,
        task: TrainTask,
        input_spec: InputSpec,
    ) -> ClientUpdate:
        """The base loop, with the client's units and ratio generator on ``self`` while it runs (a host trains its
        clients one after another)."""
        family = self.require_family()
        own = family.full_units if task.assignment.units is None else tuple(task.assignment.units)
        sizes = np.asarray(family.full_units, dtype=np.float64)
        capacity = float(np.max(np.asarray(own, dtype=np.float64) / sizes))
        self._client = _Client(own, capacity, derive_rng(task.seed, "nested_widths", task.round_idx, task.client_id))
        try:
            return super().local_train(model, x, y, task, input_spec)
        finally:
            self._client = None

    def current_client(self) -> _Client:
        if self._client is None:
            raise RuntimeError(f"{type(self).__name__}: a batch hook ran outside local_train")
        return self._client

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


def block_mask(shape: Sequence[int], sub_shape: Sequence[int] | None) -> torch.Tensor:
    """Boolean mask of a tensor's leading block of ``sub_shape`` (all False for ``None``)."""
    mask = torch.zeros(tuple(shape), dtype=torch.bool)
    if sub_shape is not None:
        mask[tuple(slice(0, n) for n in sub_shape)] = True
    return mask


class FedResCuE(NestedWidthAlgorithm):
    """Progressive self-distillation inside each client's capacity (see module docstring)."""

    name = "fedrescue"

    def __init__(self, config: Any, train: TrainConfig) -> None:
        super().__init__(config, train)
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
        model: nn.Module,
        x: torch.Tensor,
        y: torch.Tensor,
        task: TrainTask,
        optimizer: ClientOptimizer,
        params: Sequence[nn.Parameter],
        batch_idx: int,
    ) -> torch.Tensor:
        """Algorithm 1 on one batch: a step per sampled ratio on its new columns, then one step on the whole model."""
        client = self.current_client()
        units_list = self.unit_list(client)
        alpha = float(self.config.alpha)
        if units_list != [client.own]:
            teacher = None
            if alpha > 0.0:
                with torch.no_grad():
                    teacher = self.logits(model, x).detach()
            previous: tuple[int, ...] | None = None
            by_id = {id(p): n for n, p in model.named_parameters()}
            names = [by_id[id(p)] for p in params]
            for units in units_list:
                self._progressive_step(model, x, y, units, previous, teacher, alpha, optimizer, params, names)
                previous = units if self.config.freeze else None
        return super().train_batch(model, x, y, task, optimizer, params, batch_idx)

    def _progressive_step(
        self,
        model: nn.Module,
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
        if names is None:
            by_id = {id(p): n for n, p in model.named_parameters()}
            names = [by_id[id(p)] for p in params]
        client = self.current_client()
        whole = units == client.own
        optimizer.zero_grad(set_to_none=True)
        logits = self.logits(model, x) if whole else self.sub_forward(model, units)(x)
        loss = self.cross_entropy(logits, x, y)
        if teacher is not None and not whole:
            loss = loss + alpha * self.distill_loss(logits, teacher)
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


class FedSeq(FedResCuE):
    """FedResCuE without distillation (``alpha = 0``), paper 004's ablation."""

    name = "fedseq"


class FedRush(FedResCuE):
    """FedResCuE without freezing earlier columns (``freeze = False``), paper 004's baseline."""

    name = "fedrush"
