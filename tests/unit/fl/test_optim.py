"""The clients' SGD and Adam equal torch.optim's, bit for bit, step after step, and import no torch._dynamo."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rayfl.fl.api.optim import SGD, Adam, client_optimizer


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


@pytest.mark.parametrize(
    ("kind", "momentum", "weight_decay", "nesterov"),
    [
        ("sgd", 0.0, 0.0, False),
        ("sgd", 0.9, 5e-4, False),
        ("sgd", 0.5, 0.0, False),
        ("sgd", 0.9, 1e-4, True),  # paper 004's optimizer
        ("adam", 0.0, 0.0, False),
        ("adam", 0.0, 1e-3, False),
    ],
)
def test_steps_equal_torch_optim(kind: str, momentum: float, weight_decay: float, nesterov: bool) -> None:
    ours, theirs = _model(0), _model(0)
    lr = 0.05 if kind == "sgd" else 3e-3
    params_a = [p for p in ours.parameters() if p.requires_grad]
    params_b = [p for p in theirs.parameters() if p.requires_grad]
    opt_a = client_optimizer(kind, params_a, lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
    assert isinstance(opt_a, SGD if kind == "sgd" else Adam)
    opt_b: torch.optim.Optimizer = (
        torch.optim.SGD(params_b, lr=lr, momentum=momentum, weight_decay=weight_decay, nesterov=nesterov)
        if kind == "sgd"
        else torch.optim.Adam(params_b, lr=lr, weight_decay=weight_decay)
    )
    gen = torch.Generator().manual_seed(1)
    for step in range(6):
        x = torch.randn(8, 3, 8, 8, generator=gen)
        y = torch.randint(0, 5, (8,), generator=gen)
        for model, opt in ((ours, opt_a), (theirs, opt_b)):
            opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(model(x), y).backward()
            if step == 3:  # a step where one parameter has no gradient: skipped, its state kept
                model[0].weight.grad = None
            opt.step()
        for (name, a), b in zip(ours.state_dict().items(), theirs.state_dict().values(), strict=True):
            assert a.dtype == b.dtype and torch.equal(a, b), (step, name)


@pytest.mark.parametrize("kind", ["sgd", "adam", "torch-sgd", "torch-adam"])
def test_masked_step_is_a_plain_step_inside_the_masks_and_no_step_outside(kind: str) -> None:
    """Two equal models take a plain step (every element gets state), then one takes a plain step and the other
    ``masked_step`` with random masks (one parameter masked out entirely): inside the masks the two agree exactly,
    parameters and state (momentum 0.9 / Adam's moments, weight decay); outside, the masked one is exactly as
    before the step, state included."""
    from rayfl.fl.api.optim import masked_step

    models = [_model(0), _model(0)]
    params = [list(m.parameters()) for m in models]
    opts: list[object] = []
    for group in params:
        if kind == "torch-sgd":
            opts.append(torch.optim.SGD(group, lr=0.05, momentum=0.9, weight_decay=1e-3))
        elif kind == "torch-adam":
            opts.append(torch.optim.Adam(group, lr=0.05, weight_decay=1e-3))
        else:
            opts.append(client_optimizer(kind, group, 0.05, momentum=0.9, weight_decay=1e-3))

    def state(opt: object, i: int, p: nn.Parameter) -> dict[str, torch.Tensor]:
        if isinstance(opt, torch.optim.Optimizer):
            return {k: v.clone() for k, v in opt.state[p].items() if v.shape == p.shape}
        return {k: v.clone() for k, v in opt.tensor_state(i).items()}  # type: ignore[attr-defined]

    gen = torch.Generator().manual_seed(2)
    masks: list[torch.Tensor | None] = [torch.rand(p.shape, generator=gen) < 0.5 for p in params[1]]
    masks[1] = None  # the conv bias: out of the step altogether
    before: list[tuple[torch.Tensor, dict[str, torch.Tensor]]] = []
    for step in range(2):
        x, y = torch.randn(8, 3, 8, 8, generator=gen), torch.randint(0, 5, (8,), generator=gen)
        for model, opt in zip(models, opts, strict=True):
            opt.zero_grad(set_to_none=True)  # type: ignore[attr-defined]
            nn.functional.cross_entropy(model(x), y).backward()
        before = [(p.detach().clone(), state(opts[1], i, p)) for i, p in enumerate(params[1])]
        opts[0].step()  # type: ignore[attr-defined]
        if step == 0:
            opts[1].step()  # type: ignore[attr-defined]
        else:
            masked_step(opts[1], params[1], masks)  # type: ignore[arg-type]
    for i, (a, b) in enumerate(zip(params[0], params[1], strict=True)):
        mask = masks[i]
        inside = torch.zeros(b.shape, dtype=torch.bool) if mask is None else mask
        old, old_state = before[i]
        assert torch.equal(b.detach()[inside], a.detach()[inside]), i
        assert torch.equal(b.detach()[~inside], old[~inside]), i
        got, plain = state(opts[1], i, b), state(opts[0], i, a)
        assert got.keys() == plain.keys() == old_state.keys() and got, i
        for key in got:
            assert torch.equal(got[key][inside], plain[key][inside]), (i, key)
            assert torch.equal(got[key][~inside], old_state[key][~inside]), (i, key)
