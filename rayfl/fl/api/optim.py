"""The clients' optimizers: SGD and Adam as torch.optim computes them on the CPU, without torch.optim's dynamo import.

Every ``torch.optim.Optimizer`` method is wrapped by ``torch._disable_dynamo``, which imports ``torch._dynamo`` (and
with it the inductor) on its first call: measured here 82 MiB more memory in every process that trains and 1-4 s in
its first round. A client host only needs ``zero_grad`` and ``step`` of a fresh optimizer per client and round, so
these classes do exactly what ``torch.optim.SGD`` and ``torch.optim.Adam`` do on CPU tensors (their single-tensor
code path, torch's default there: the same tensor operations in the same order, and Adam's step count as a float32
tensor read back as a Python float), bit for bit (``tests/unit/fl/test_optim.py`` checks it against torch.optim
step by step). On other devices torch.optim picks its multi-tensor kernels, so ``client_optimizer`` returns torch.optim
itself there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch
from torch import nn

__all__ = ["SGD", "Adam", "ClientOptimizer", "client_optimizer", "masked_step"]


class ClientOptimizer(Protocol):
    """What local training uses of an optimizer."""

    def zero_grad(self, set_to_none: bool = True) -> None: ...

    def step(self) -> None: ...


class _Plain:
    """Shared parts: the parameters and ``zero_grad``."""

    def __init__(self, params: Sequence[nn.Parameter]) -> None:
        self.params = list(params)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if p.grad is None:
                continue
            if set_to_none:
                p.grad = None
            else:
                p.grad.detach_()
                p.grad.zero_()


class SGD(_Plain):
    """``torch.optim.SGD(params, lr, momentum, weight_decay, nesterov=nesterov)`` (no dampening), CPU single-tensor
    path."""

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        lr: float,
        momentum: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ):
        super().__init__(params)
        if nesterov and momentum <= 0:
            raise ValueError("Nesterov momentum needs momentum > 0")
        self.lr, self.momentum, self.weight_decay, self.nesterov = lr, momentum, weight_decay, nesterov
        self.buffers: list[torch.Tensor | None] = [None] * len(self.params)

    @torch.no_grad()
    def step(self) -> None:
        for i, param in enumerate(self.params):
            grad = param.grad
            if grad is None:  # torch.optim skips parameters without a gradient, and keeps no buffer for them
                continue
            if self.weight_decay != 0:
                grad = grad.add(param, alpha=self.weight_decay)
            if self.momentum != 0:
                buf = self.buffers[i]
                if buf is None:
                    buf = self.buffers[i] = grad.detach().clone()
                else:
                    buf.mul_(self.momentum).add_(grad, alpha=1.0)  # 1 - dampening, dampening 0
                grad = grad.add(buf, alpha=self.momentum) if self.nesterov else buf
            param.add_(grad, alpha=-self.lr)

    def tensor_state(self, index: int) -> dict[str, torch.Tensor]:
        """Parameter ``index``'s per-element state (its momentum buffer, once a step made one), live."""
        buf = self.buffers[index]
        return {} if buf is None else {"momentum_buffer": buf}


class Adam(_Plain):
    """``torch.optim.Adam(params, lr, weight_decay)`` with the default betas (0.9, 0.999) and eps 1e-8, no amsgrad,
    CPU single-tensor path (not capturable, not differentiable)."""

    def __init__(
        self,
        params: Sequence[nn.Parameter],
        lr: float,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
    ) -> None:
        super().__init__(params)
        self.lr, self.weight_decay, self.betas, self.eps = lr, weight_decay, betas, eps
        self.state: dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}

    @torch.no_grad()
    def step(self) -> None:
        beta1, beta2 = self.betas
        for i, param in enumerate(self.params):
            grad = param.grad
            if grad is None:
                continue
            state = self.state.get(i)
            if state is None:  # as torch.optim's _init_group: a float32 step on the CPU, zeroed moments
                state = self.state[i] = (
                    torch.tensor(0.0, dtype=torch.float32),
                    torch.zeros_like(param, memory_format=torch.preserve_format),
                    torch.zeros_like(param, memory_format=torch.preserve_format),
                )
            step_t, exp_avg, exp_avg_sq = state
            step_t += 1
            if self.weight_decay != 0:
                grad = grad.add(param, alpha=self.weight_decay)
            exp_avg.lerp_(grad, 1 - beta1)
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
            step = step_t.item()
            bias_correction1 = 1 - beta1**step
            bias_correction2 = 1 - beta2**step
            step_size = self.lr / bias_correction1
            bias_correction2_sqrt = bias_correction2**0.5
            denom = (exp_avg_sq.sqrt() / bias_correction2_sqrt).add_(self.eps)
            param.addcdiv_(exp_avg, denom, value=-step_size)

    def tensor_state(self, index: int) -> dict[str, torch.Tensor]:
        """Parameter ``index``'s per-element state (its two moments, once a step made them), live; the step count
        is per tensor and not in it."""
        state = self.state.get(index)
        return {} if state is None else {"exp_avg": state[1], "exp_avg_sq": state[2]}


def client_optimizer(
    kind: str,
    params: Sequence[nn.Parameter],
    lr: float,
    momentum: float = 0.0,
    weight_decay: float = 0.0,
    nesterov: bool = False,
) -> ClientOptimizer:
    """A fresh optimizer of ``kind`` (``sgd`` or ``adam``): these classes for CPU parameters, torch.optim elsewhere
    (see the module docstring)."""
    on_cpu = all(p.device.type == "cpu" and not p.is_complex() for p in params)
    if kind == "adam":
        return Adam(params, lr, weight_decay) if on_cpu else torch.optim.Adam(params, lr=lr, weight_decay=weight_decay)
    if kind != "sgd":
        raise ValueError(f"unknown optimizer {kind!r}")
    if on_cpu:
        return SGD(params, lr, momentum, weight_decay, nesterov)
    return torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)


def _tensor_state(optimizer: ClientOptimizer, index: int, param: nn.Parameter) -> dict[str, torch.Tensor]:
    """The live per-element state tensors ``optimizer`` keeps for ``param`` (its ``index``-th parameter): ours by
    index, torch.optim's (off the CPU) from its state dict, those shaped like the parameter."""
    if isinstance(optimizer, SGD | Adam):
        return optimizer.tensor_state(index)
    if isinstance(optimizer, torch.optim.Optimizer):
        found = optimizer.state.get(param, {})
        return {k: v for k, v in found.items() if isinstance(v, torch.Tensor) and v.shape == param.shape}
    raise TypeError(f"masked_step: cannot read the state of {type(optimizer).__name__}")


@torch.no_grad()
def masked_step(
    optimizer: ClientOptimizer, params: Sequence[nn.Parameter], masks: Sequence[torch.Tensor | bool | None]
) -> None:
    """One step of ``optimizer`` (built on ``params``, in this order) that changes only the elements where
    ``masks`` is True, as if the others were not in the optimizer: outside the masks the parameters **and** the
    optimizer's per-element state (SGD's momentum buffer, Adam's moments) are exactly what they were, so no momentum
    is spent or decayed and no weight decay is applied there. A parameter whose mask is ``None`` takes no part at
    all (its gradient is dropped, which torch.optim skips); one whose mask is ``True`` steps whole, as does one whose
    mask tensor is all True (a caller that knows which masks are full passes ``True`` and spares a device sync). This
    is torch.optim's rule for a parameter without a gradient, applied per element; the caller masks the gradients
    first (before any clipping), so a step's clipping norm counts only what it updates. Adam's step count is per
    tensor: it advances when any element of the tensor steps.

    The elements outside a mask are put back after an ordinary step (a state tensor the step created is put back to
    zero there, which is what a first step from an absent state makes of it), so the elements inside see exactly the
    arithmetic of an unmasked step, bit for bit, on every optimizer."""
    if len(masks) != len(params):
        raise ValueError(f"masked_step: {len(masks)} masks for {len(params)} parameters")
    kept: list[tuple[int, nn.Parameter, torch.Tensor, torch.Tensor, dict[str, torch.Tensor]]] = []
    for i, (param, mask) in enumerate(zip(params, masks, strict=True)):
        if mask is None:
            param.grad = None
        elif param.grad is not None and isinstance(mask, torch.Tensor) and not bool(mask.all()):
            state = {k: v.clone() for k, v in _tensor_state(optimizer, i, param).items()}
            kept.append((i, param, mask, param.detach().clone(), state))
    optimizer.step()
    for i, param, mask, old, state in kept:
        param.copy_(torch.where(mask, param, old))
        for key, tensor in _tensor_state(optimizer, i, param).items():
            before = state.get(key)
            tensor.copy_(torch.where(mask, tensor, torch.zeros_like(tensor) if before is None else before))
