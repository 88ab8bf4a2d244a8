"""The clients' SGD and Adam equal torch.optim's, bit for bit, step after step, and import no torch._dynamo."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from rayfl.algorithms.optim import SGD, Adam, client_optimizer


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU(), nn.Flatten(), nn.Linear(4 * 6 * 6, 5))


@pytest.mark.parametrize(
    ("kind", "momentum", "weight_decay"),
    [("sgd", 0.0, 0.0), ("sgd", 0.9, 5e-4), ("sgd", 0.5, 0.0), ("adam", 0.0, 0.0), ("adam", 0.0, 1e-3)],
)
def test_steps_equal_torch_optim(kind: str, momentum: float, weight_decay: float) -> None:
    ours, theirs = _model(0), _model(0)
    lr = 0.05 if kind == "sgd" else 3e-3
    params_a = [p for p in ours.parameters() if p.requires_grad]
    params_b = [p for p in theirs.parameters() if p.requires_grad]
    opt_a = client_optimizer(kind, params_a, lr, momentum=momentum, weight_decay=weight_decay)
    assert isinstance(opt_a, SGD if kind == "sgd" else Adam)
    opt_b: torch.optim.Optimizer = (
        torch.optim.SGD(params_b, lr=lr, momentum=momentum, weight_decay=weight_decay)
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
