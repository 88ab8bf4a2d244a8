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
It travels to ``local_loss`` inside the task (``AnchoredTask``), not on ``self``, so the hooks stay functions of their
arguments. Buffers (batch-norm statistics) are not optimised, so the term covers only trainable parameters. The
client's reported ``train_loss`` is the mean over its batches of this objective, term included.

Where rayfl differs from the paper's experiments: the paper lets stragglers run fewer local epochs and keeps their
partial work (its gamma-inexact solutions); here every client runs the configured ``train.epochs``/``max_steps`` and
the engine's budgets decide which clients fail, as for every method.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from rayfl.core.messages import ClientUpdate, Params, TrainTask
from rayfl.fl.api.algorithm import Algorithm
from rayfl.fl.methods.fedprox.config import FedProxConfig
from rayfl.models.inputs import InputSpec

__all__ = ["AnchoredTask", "FedProx", "anchor_of", "proximal_term"]


@dataclass(frozen=True, slots=True)
class AnchoredTask(TrainTask):
    """A client's task together with the global weights its local objective is anchored to (``anchor``: trainable
    parameter name → detached tensor, on the model's device)."""

    anchor: Params = field(default_factory=dict)


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

    def local_train(
        self,
        model: nn.Module,
        x: np.ndarray,
        y: np.ndarray,
        task: TrainTask,
        input_spec: InputSpec,
    ) -> ClientUpdate:
        """The base loop on the proximal objective, anchored to the weights ``model`` holds now."""
        fields = {f.name: getattr(task, f.name) for f in dataclasses.fields(TrainTask)}
        anchored = AnchoredTask(**fields, anchor=anchor_of(model))
        return super().local_train(model, x, y, anchored, input_spec)

    def local_loss(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, task: TrainTask) -> torch.Tensor:
        """The paper's ``h(w; w_global)`` on one batch: cross-entropy plus ``mu/2 ||w - w_global||^2``, whose
        gradient adds ``mu (w - w_global)`` to the cross-entropy's."""
        if not isinstance(task, AnchoredTask):
            raise RuntimeError("FedProx.local_loss needs the global weights: it runs inside FedProx.local_train")
        loss = super().local_loss(model, x, y, task)
        return loss + 0.5 * self.config.mu * proximal_term(model, task.anchor)
