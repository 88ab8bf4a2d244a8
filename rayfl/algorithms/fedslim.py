"""FedSlim: slimmable training (Yu et al., ICLR 2019) federated with FedAvg, paper 004's baseline (ALGORITHMS.md
section 11).

Each sampled client gets the largest capacity of ``config.capacities`` that fits its budgets (nested first-k widths,
as FedResCuE). Per batch the same ordered ratio list as FedResCuE is drawn (``num_ratios`` ratios of ``ratios``,
relative to the client's capacity, ending at 1; ``NestedWidthAlgorithm.unit_list``), and the cross-entropy gradients
of every listed sub-model are summed into **one** optimizer step (slimmable networks' accumulated widths), the
sub-models sharing the leading slices of the client's tensors. The server takes the sample-weighted element-wise
mean over the clients covering each element (FedAvg's weights; uncovered elements keep their value).

Choice where the paper leaves room: slimmable training proper runs every width of its switch list each batch; here
FedSlim trains the same ``S`` sampled widths as FedResCuE, so both do the same number of sub-model passes (paper 004
compares them at equal ``S``, Sec. 5.6.2). With ``ratios = (1,)`` a batch is one cross-entropy step of the client's
model (``local_loss``), so at full width FedSlim is FedAvg bit for bit.
"""

from __future__ import annotations

import torch
from torch import nn

from rayfl.algorithms.fedrescue import NestedWidthAlgorithm
from rayfl.algorithms.payloads import TrainTask

__all__ = ["FedSlim"]


class FedSlim(NestedWidthAlgorithm):
    """Summed cross-entropy gradients of the batch's sampled widths, one step; sample-weighted mean."""

    name = "fedslim"

    def client_weight(self, num_examples: int) -> float:
        return float(num_examples)  # FedAvg aggregation

    def backward_step(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, task: TrainTask) -> torch.Tensor:
        """Back-propagate the cross-entropy of every listed sub-model (gradients add up); returns the whole model's."""
        client = self.current_client()
        loss: torch.Tensor | None = None
        for units in self.unit_list(client):
            if units == client.own:
                loss = super().backward_step(model, x, y, task)
                continue
            self.cross_entropy(self.sub_forward(model, units)(x), x, y).backward()  # type: ignore[no-untyped-call]
        if loss is None:
            raise RuntimeError("fedslim: a ratio list must end at the client's own model")
        return loss
