"""FedProx: Federated Optimization in Heterogeneous Networks.

Li, Sahu, Zaheer, Sanjabi, Talwalkar, Smith, MLSys 2020 (arXiv:1812.06127).

Each client minimises the proximal objective of the paper's Eq. 2,

    h(w; w_global) = f(w) + mu/2 ||w - w_global||^2,

where ``f`` is the usual cross-entropy (``Algorithm.local_loss``) and ``w_global`` the weights the client received this
round. The term pulls local training back towards the global model, which bounds how far clients with different data
drift apart over their local steps; ``mu = 0`` is FedAvg. Everything else is FedAvg's: every client trains the full
model (budgets enforced, as FedAvg's ``model: full``), the server adopts the sample-weighted mean of the updates.

The anchor ``w_global`` is a detached copy of the trainable parameters taken when ``local_train`` starts (the engine
hands the model over already loaded with the client's global weights: under unstable links, what arrived, padded).
It travels to ``local_loss`` in the client's context (``Anchor``, ``ClientContext.put``), not on ``self``, so the hooks
stay functions of their arguments. Buffers (batch-norm statistics) are not optimised, so the term covers only
trainable parameters. The client's reported ``train_loss`` is the mean over its batches of this objective, term
included.

Where rayfl differs from the paper's experiments: the paper lets stragglers run fewer local epochs and keeps their
partial work (its gamma-inexact solutions); here every client runs the configured ``train.epochs``/``max_steps`` and
the engine's budgets decide which clients fail, as for every method.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rayfl.core.messages import ClientUpdate, Params
from rayfl.fl.api.algorithm import Algorithm
from rayfl.fl.api.client import ClientContext
from rayfl.fl.methods.fedprox.config import FedProxConfig

__all__ = ["Anchor", "FedProx", "anchor_of", "proximal_term"]


@dataclass(frozen=True, slots=True)
class Anchor:
    """The global weights a client's local objective is anchored to (``params``: trainable parameter name → detached
    tensor, on the model's device), kept in its ``ClientContext``."""

    params: Params


def anchor_of(model: nn.Module) -> Params:
    """Detached copies of ``model``'s trainable parameters: the ``w_global`` of the proximal term."""
    return {name: p.detach().clone() for name, p in model.named_parameters() if p.requires_grad}


def proximal_term(model: nn.Module, anchor: Params) -> torch.Tensor:
    """``||w - anchor||^2`` over the parameters named in ``anchor``, summed in the model's parameter order."""
    terms = [(p - anchor[name]).square().sum() for name, p in model.named_parameters() if name in anchor]
    return torch.stack(terms).sum() if terms else torch.zeros(())


class FedProx(Algorithm):
    """FedAvg with the proximal term in every client's objective (see module docstring)."""

    name = "fedprox"
    config: FedProxConfig

    def local_train(self, ctx: ClientContext, x: np.ndarray, y: np.ndarray) -> ClientUpdate:
        """The base loop on the proximal objective, anchored to the weights ``ctx.model`` holds now."""
        ctx.put(Anchor(anchor_of(ctx.model)))
        return super().local_train(ctx, x, y)

    def local_loss(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The paper's ``h(w; w_global)`` on one batch: cross-entropy plus ``mu/2 ||w - w_global||^2``, whose
        gradient adds ``mu (w - w_global)`` to the cross-entropy's (the anchor from ``local_train``, in ``ctx``)."""
        anchor = ctx.get(Anchor)
        loss = super().local_loss(ctx, x, y)
        return loss + 0.5 * self.config.mu * proximal_term(ctx.model, anchor.params)
