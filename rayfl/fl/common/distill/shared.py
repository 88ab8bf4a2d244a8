"""In-place distillation on the global model's own weights (paper 000, Eq. 2 read as an update rule, Appendix B):
``distill.update: shared``, an ablation since issue 40 (the default, ``copies``, trains copies as Algorithm 1 does;
``fl/common/distill/server.py``). Teacher and students share these weights, so they can settle on an output that
ignores the input.

The sub-nets are not copies: sub-net ``i`` *is* the first-k part of the global weights ``W``, so its parameters are
views of ``W``'s tensors and its KD loss has a gradient with respect to ``W``. Per iteration (``T_SKD`` of them):

1. for each of the ``n`` sub-nets, ``K`` fresh Gaussian inputs (Algorithm 1, line 5), the teacher's soft labels from
   the current global model ``W^{t-1}`` (its full structure, in evaluation mode, no gradient) and one forward and
   backward pass of the sub-net's KD loss on the shared weights, the gradients adding up in one flat buffer;
2. Eq. (2): the summed gradient divided, element by element, by the number of sub-nets that contain the element
   (``coverage``; the paper's ``1/n`` where all ``n`` contain it), and one step of the server's Adam on ``W``.

Vectorised: ``W``, its gradient and Adam's moments are flat tensors; every global tensor is a view of the flat
parameter buffer and every sub-net tensor a (first-k) view of those, built once per round, so an iteration is ``n``
forward/backward passes plus a handful of flat tensor operations, with no Python loop over parameters.

Choices where the paper is open:

* **Adam on sparse coverage** ("lazy" Adam). Elements that no sub-net of the round contains take no step and their
  moments stay as they are; the bias correction uses each element's own count of steps taken. With the optimizer
  state kept for one round (the default) this is exactly ``torch.optim.Adam`` on the covered elements, since an
  uncovered element's gradient and moments stay 0. Betas and epsilon are PyTorch's defaults (0.9, 0.999, 1e-8).
* **Optimizer state lifetime** (``distill.optimizer_state``): the paper does not say. ``round`` (default) starts Adam
  afresh every round: Algorithm 1 is a self-contained procedure run after each aggregation, and between two of its
  calls the clients replace the weights the moments describe. ``run`` keeps the moments and step counts in
  ``ServerState.opt_state`` (``distill/exp_avg``, ``distill/exp_avg_sq``, ``distill/steps``, flat over the model's
  parameters in ``state_dict`` order), so checkpoints carry them.
* **Teacher** (``distill.teacher``): ``step`` (default) is Eq. (2)'s ``W^{t-1}``, the global weights before each
  step, so the teacher moves with the weights it shares with the students; ``round`` keeps the aggregated model of
  the round as a frozen teacher (an ablation, as the ``copies`` variant's teacher).
* **Optimizer** (``distill.optimizer``): ``adam`` is the paper's; ``sgd`` (an ablation) steps the covered elements
  by ``lr`` times Eq. (2)'s gradient, without momentum or state, so a step is as large as the KD gradient where an
  Adam step is about ``lr`` per element whatever the gradient's size.
* **Non-finite gradients.** An iteration whose summed gradient is not finite takes no step (logged): one diverging
  sub-net must not poison the global model.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn
from torch.func import functional_call

from rayfl.core.messages import Params, TensorSlice
from rayfl.core.rng import derive_seed
from rayfl.data.federated import Rows
from rayfl.fl.common.distill.config import DistillConfig
from rayfl.fl.common.distill.kd import (
    copy_noise_generator,
    empty_model,
    kd_loss,
    model_logits,
    noise_source,
    teacher_model,
)
from rayfl.models.elastic.family import ElasticFamily
from rayfl.models.elastic.spec import first_k
from rayfl.models.inputs import InputSpec

__all__ = ["OPT_KEYS", "FlatLayout", "SharedDistillation", "lazy_adam_step", "shared_distill", "sub_view"]

log = logging.getLogger(__name__)

OPT_KEYS = ("distill/exp_avg", "distill/exp_avg_sq", "distill/steps")
BETAS = (0.9, 0.999)
EPS = 1e-8


@dataclass(frozen=True)
class FlatLayout:
    """Where each named tensor lives in one flat buffer (names in the given order, each tensor contiguous)."""

    names: tuple[str, ...]
    shapes: tuple[torch.Size, ...]
    sizes: tuple[int, ...]

    @classmethod
    def of(cls, params: Mapping[str, torch.Tensor], names: Sequence[str]) -> FlatLayout:
        dtypes = {params[n].dtype for n in names}
        if len(dtypes) > 1:
            raise ValueError(f"in-place distillation needs one floating dtype for the trained tensors, got {dtypes}")
        return cls(tuple(names), tuple(params[n].shape for n in names), tuple(params[n].numel() for n in names))

    @property
    def numel(self) -> int:
        return sum(self.sizes)

    def flatten(self, params: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """A new flat tensor holding ``params``' tensors in layout order."""
        return torch.cat([params[n].reshape(-1) for n in self.names])

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each named tensor as a view of ``flat`` (writing one writes the other)."""
        parts = torch.split(flat, list(self.sizes))
        return {n: p.view(s) for n, p, s in zip(self.names, parts, self.shapes, strict=True)}


def sub_view(tensor: torch.Tensor, tslice: TensorSlice | None) -> torch.Tensor:
    """The part of a global tensor a sub-net holds: a view when every axis keeps a leading range (first-k), else a
    gathered copy (``index_select``); gradients flow back into ``tensor`` either way."""
    if tslice is None:
        return tensor
    out = tensor
    for axis, idx in enumerate(tslice.index):
        if idx is None:
            continue
        k = len(idx)
        if np.array_equal(idx, np.arange(k)):
            out = out.narrow(axis, 0, k)
        else:
            out = out.index_select(axis, torch.as_tensor(idx, dtype=torch.long))
    return out


class _FromHidden(nn.Module):
    """Runs a token model from its hidden states (the noise enters after the embeddings), every position's logits."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return model_logits(self.inner, h, tokens=True)


@dataclass
class _Net:
    """A module and the tensors ``functional_call`` runs it with (views of the shared weights)."""

    module: nn.Module
    tensors: dict[str, torch.Tensor]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = functional_call(self.module, self.tensors, (x,), strict=True)
        return out


def _net(
    family: ElasticFamily, units: Sequence[int], shared: Mapping[str, torch.Tensor], tokens: bool, prefix: str
) -> tuple[_Net, dict[str, TensorSlice | None]]:
    """The ``units`` sub-net running on views of ``shared`` and the slice of every global tensor it holds."""
    module = empty_model(family, units)
    slices = family.slices(first_k(units)) if tuple(units) != family.full_units else {}
    held = {name: slices.get(name) for name in module.state_dict()}
    missing = [name for name in held if name not in shared]
    if missing:
        raise ValueError(f"global parameters lack {missing[0]!r}, which the sub-net needs")
    wrapped: nn.Module = _FromHidden(module) if tokens else module
    tensors = {prefix + name: sub_view(shared[name], tslice) for name, tslice in held.items()}
    return _Net(wrapped, tensors), held


def lazy_adam_step(
    param: torch.Tensor,
    grad: torch.Tensor,
    covered: torch.Tensor,
    state: Mapping[str, torch.Tensor],
    lr: float,
) -> None:
    """One Adam step, in place, on the ``covered`` elements of the flat ``param`` (see module docstring); ``state``
    holds the flat moments and per-element step counts under ``OPT_KEYS``, updated in place."""
    exp_avg, exp_avg_sq, steps = (state[k] for k in OPT_KEYS)
    beta1, beta2 = BETAS
    steps.add_(covered.to(steps.dtype))
    exp_avg.copy_(torch.where(covered, exp_avg.lerp(grad, 1.0 - beta1), exp_avg))
    exp_avg_sq.copy_(torch.where(covered, exp_avg_sq * beta2 + (1.0 - beta2) * grad * grad, exp_avg_sq))
    taken = steps.clamp(min=1.0)
    bias1 = 1.0 - torch.pow(beta1, taken)
    bias2 = 1.0 - torch.pow(beta2, taken)
    update = (exp_avg / bias1) / ((exp_avg_sq / bias2).sqrt() + EPS)
    param.sub_(torch.where(covered, lr * update, torch.zeros((), dtype=param.dtype)))


class SharedDistillation:
    """One round of Eq. (2) on ``params``: the flat global weights with the teacher and the sub-nets
    ``structures`` running on views of them, the sub-nets' coverage, and the Adam state (taken from ``opt_state``
    under ``OPT_KEYS`` when ``cfg.optimizer_state`` is ``run`` and present there, else fresh)."""

    def __init__(
        self,
        family: ElasticFamily,
        params: Params,
        cfg: DistillConfig,
        structures: Sequence[tuple[int, ...]],
        *,
        input_spec: InputSpec,
        opt_state: Mapping[str, torch.Tensor],
        pool: Rows | None = None,
    ) -> None:
        self.cfg = cfg
        self.params = params
        tokens = input_spec.input_kind == "tokens"
        full = empty_model(family, family.full_units)
        self.layout = FlatLayout.of(params, [n for n, _ in full.named_parameters() if n in params])
        self.flat = self.layout.flatten(params)
        self.grad = torch.zeros_like(self.flat)
        leaves = {n: v.detach().requires_grad_(True) for n, v in self.layout.views(self.flat).items()}
        for name, g in self.layout.views(self.grad).items():
            leaves[name].grad = g  # backward adds into the flat gradient buffer
        shared: dict[str, torch.Tensor] = {**params, **leaves}
        prefix = "inner." if tokens else ""
        # step: the teacher runs on the live weights (W^{t-1} at each step); round: on the aggregated model, frozen
        teacher_weights = shared if cfg.teacher == "step" else {n: v.detach().clone() for n, v in params.items()}
        self.teacher, _ = _net(family, family.full_units, teacher_weights, tokens, prefix)
        self.teacher.module.eval()
        # the embedding statistics (token models, distill.noise: embedding) are the aggregated model's
        self.noise_source = noise_source(
            teacher_model(family, params) if tokens else full, input_spec, cfg.batch_size, cfg.noise, pool
        )
        count = torch.zeros_like(self.flat)
        counts = self.layout.views(count)
        self.students: list[_Net] = []
        for units in structures:
            student, held = _net(family, units, shared, tokens, prefix)
            student.module.train()
            self.students.append(student)
            for name, tslice in held.items():
                if name in counts:
                    target = counts[name]
                    target[tslice.torch_index(tuple(target.shape)) if tslice is not None else ...] += 1.0
        self.covered = count > 0
        self.inverse = torch.where(self.covered, 1.0 / count.clamp(min=1.0), torch.zeros((), dtype=count.dtype))
        previous = opt_state if cfg.optimizer_state == "run" else {}
        self.state = _opt_state(self.layout, previous, self.flat)

    def gradient(self, batches: Sequence[torch.Tensor]) -> torch.Tensor:
        """Eq. (2) at the current weights: every sub-net's KD gradient on its noise batch (``batches[i]``) against
        the current global model's soft labels, averaged per element over the sub-nets holding it (flat)."""
        self.grad.zero_()
        for student, x in zip(self.students, batches, strict=True):
            with torch.no_grad():
                soft = self.teacher(x)  # teacher step: W^{t-1}, the global weights before this iteration's step
            loss = kd_loss(student(x), soft, self.cfg.temperature)
            loss.backward()  # type: ignore[no-untyped-call]  # torch stubs leave backward untyped
        return self.grad * self.inverse

    def step(self, grad: torch.Tensor) -> None:
        """One step of the global weights with the flat gradient ``grad`` (zero where no sub-net holds an element):
        Adam on the covered elements, or plain SGD (``distill.optimizer``)."""
        with torch.no_grad():
            if self.cfg.optimizer == "sgd":
                self.flat.sub_(self.cfg.lr * grad)
            else:
                lazy_adam_step(self.flat, grad, self.covered, self.state, self.cfg.lr)

    def named(self, flat: torch.Tensor) -> Params:
        """A flat tensor in the layout as copies named like the global parameters."""
        return {n: v.detach().clone() for n, v in self.layout.views(flat).items()}

    def result(self) -> tuple[Params, Params]:
        """The global parameters now and the optimizer state to keep (empty unless ``optimizer_state: run``)."""
        keep = self.state if self.cfg.optimizer_state == "run" else {}
        return {**self.params, **self.named(self.flat)}, keep


def _opt_state(layout: FlatLayout, previous: Mapping[str, torch.Tensor], like: torch.Tensor) -> Params:
    if all(k in previous for k in OPT_KEYS):
        sizes = {int(previous[k].numel()) for k in OPT_KEYS}
        if sizes != {layout.numel}:
            raise ValueError(f"distillation optimizer state holds {sizes} elements, the model {layout.numel}")
        return {k: previous[k].detach().clone() for k in OPT_KEYS}
    return {k: torch.zeros_like(like) for k in OPT_KEYS}


def shared_distill(
    family: ElasticFamily,
    params: Params,
    cfg: DistillConfig,
    structures: Sequence[tuple[int, ...]],
    *,
    seed: int,
    round_idx: int,
    input_spec: InputSpec,
    opt_state: Mapping[str, torch.Tensor],
    pool: Rows | None = None,
) -> tuple[Params, Params]:
    """``cfg.iterations`` Eq. (2) steps on ``params`` with the sub-nets ``structures``; returns the new parameters and
    the optimizer state to keep (empty unless ``cfg.optimizer_state`` is ``run``)."""
    run = SharedDistillation(family, params, cfg, structures, input_spec=input_spec, opt_state=opt_state, pool=pool)
    # sub-net i reads its batches from its own generator, as the copies do, so both rules see the same inputs
    noise = [copy_noise_generator(seed, round_idx, i) for i in range(len(run.students))]
    skipped = 0
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(derive_seed(seed, "distill-dropout", round_idx))
        for _ in range(cfg.iterations):
            grad = run.gradient([run.noise_source.draw(g) for g in noise])
            if not bool(torch.isfinite(grad).all()):
                skipped += 1
                continue
            run.step(grad)
    if skipped:
        log.warning(
            "in-place distillation, round %d: %d of %d steps skipped (non-finite gradient)",
            round_idx,
            skipped,
            cfg.iterations,
        )
    return run.result()
