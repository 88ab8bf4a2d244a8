"""Initial models as the baselines' official codes build them (HeteroFL's ``init_param``, which FedRolex's models
call too)."""

from __future__ import annotations

import torch
from torch import nn

from rayfl.core.messages import Params
from rayfl.models.elastic.family import ElasticFamily

__all__ = ["official_init"]


def official_init(family: ElasticFamily, params: Params) -> Params:
    """The official code's ``init_param`` on a fresh global model: norm weight 1 and bias 0, linear biases 0; conv
    and linear weights keep PyTorch's default initialisation. HeteroFL's models apply it, and so do FedRolex's, which
    are HeteroFL's (its ResNet and transformer builders call the same ``init_param``). Returns new parameters."""
    with torch.device("meta"):
        model = family.build(family.full_units)
    reset = dict(params)
    for prefix, module in model.named_modules():
        dot = f"{prefix}." if prefix else ""
        if isinstance(module, (nn.BatchNorm2d, nn.GroupNorm)) and module.weight is not None:
            reset[f"{dot}weight"] = torch.ones_like(params[f"{dot}weight"])
            reset[f"{dot}bias"] = torch.zeros_like(params[f"{dot}bias"])
        elif isinstance(module, nn.Linear) and module.bias is not None:
            reset[f"{dot}bias"] = torch.zeros_like(params[f"{dot}bias"])
    return reset
