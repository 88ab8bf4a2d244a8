"""FedSlim: slimmable training federated with FedAvg, paper 004's baseline (Sec. 5.1 iii, Appendix A.2,
Algorithm 3; ALGORITHMS.md section 11).

Each sampled client gets the largest capacity of ``config.capacities`` that fits its budgets (nested first-k widths,
as FedResCuE). Per batch the same ordered ratio list as FedResCuE is drawn (``num_ratios`` ratios of ``ratios``,
relative to the client's capacity, ending at 1; ``NestedWidths.unit_list``), and the gradients of every
listed sub-model are summed into **one** optimizer step, the sub-models sharing the leading slices of the client's
tensors. The server takes the sample-weighted element-wise mean over the clients covering each element (FedAvg's
weights; uncovered elements keep their value).

The widths' losses (``config.kd``):

* ``true`` (default, the paper's FedSlim): Algorithm 3. The client's whole model takes cross-entropy (line 9); every
  smaller listed width takes only ``KL(f(x; theta_bar) || f(x; theta_p))`` (line 7), the teacher being the whole
  model's output on the same batch, detached (``theta_bar = stop_gradient(theta)``: the same weights, so the same
  logits; in-place distillation as in US-Nets, Yu & Huang 2019). Paper 004 says so twice: FedSlim "learns prunable
  submodels purely by knowledge distillation" (A.4.1) and "solely performing distillation from the teacher (x1.0
  model) to student (submodel), as FedSlim performs" (Sec. 5.4), against which FedResCuE adds the label term.
* ``false``: every width takes hard-label cross-entropy (Yu et al. 2018's slimmable networks, which the paper cites).

Choices where the paper leaves room: slimmable training proper runs every width of its switch list each batch, and
Algorithm 3 draws its S widths from P with replacement and without order; here FedSlim trains the same ``S`` sampled
widths as FedResCuE (distinct, the last the client's own), so both do the same number of sub-model passes (paper 004
compares them at equal ``S``, Sec. 5.6.2). KL at temperature 1, averaged over samples, the same term as FedResCuE's.
With ``ratios = (1,)`` a batch is one cross-entropy step of the client's model (``local_loss``), so at full width
FedSlim is FedAvg bit for bit.
"""

from __future__ import annotations

import torch

from rayfl.config.sections import TrainConfig
from rayfl.fl.api.client import ClientContext
from rayfl.fl.common.nested import NestedClient, NestedWidthHooks, NestedWidths, distill_loss
from rayfl.fl.common.submodel import SubModelAlgorithm
from rayfl.fl.methods.fedslim.config import FedSlimConfig

__all__ = ["FedSlim"]


class FedSlim(NestedWidthHooks, SubModelAlgorithm):
    """The batch's sampled widths' gradients (the whole model's cross-entropy, the others' distillation or
    cross-entropy) summed into one step; sample-weighted mean."""

    name = "fedslim"
    config: FedSlimConfig

    def __init__(self, config: FedSlimConfig, train: TrainConfig) -> None:
        super().__init__(config, train)
        self.nested = NestedWidths(self.name, config.capacities, config.ratios, config.num_ratios, train.sequence_loss)

    def client_weight(self, num_examples: int) -> float:
        return float(num_examples)  # FedAvg aggregation

    def backward_step(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Back-propagate the whole model's cross-entropy, then each smaller listed width's loss (gradients add
        up); returns the whole model's loss."""
        model, client, nested, family = ctx.model, ctx.get(NestedClient), self.nested, self.require_family()
        widths = nested.unit_list(family, client)
        if widths[-1] != client.own:
            raise RuntimeError("fedslim: a ratio list must end at the client's own model")
        logits = nested.logits(model, x)
        loss = nested.cross_entropy(logits, x, y)
        loss.backward()  # type: ignore[no-untyped-call]  # torch stubs leave backward untyped
        teacher = logits.detach()
        for units in widths[:-1]:
            student = nested.sub_forward(family, model, units)(x)
            sub_loss = distill_loss(student, teacher) if self.config.kd else nested.cross_entropy(student, x, y)
            sub_loss.backward()  # type: ignore[no-untyped-call]
        return loss
