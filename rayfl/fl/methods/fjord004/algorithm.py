"""FjORD as paper 004 compares against it (Zhu et al., ICML 2022, Appendix A.2, Algorithm 4; ALGORITHMS.md sections
4 and 11), beside rayfl's Flower-style ``fjord``.

* **Capacities.** As FedResCuE and FedSlim (``nested.NestedWidths``): each sampled client trains the largest of
  ``capacities`` whose nested first-k sub-model fits its budgets; widths inside it are relative to its capacity.
* **One batch** (``backward_step``), Algorithm 4: S = ``num_ratios`` widths ``p_i`` are drawn from ``ratios``; the
  teacher ``theta_bar = stop_gradient(theta)`` is the client model's output on the batch (detached); for each
  ``p_i`` the sub-model's loss ``CE(f(x; theta_p_i), y) + alpha x KL(f(x; theta_bar) || f(x; theta_p_i))`` is
  back-propagated into the leading slices it shares with the client model (line 7); then the client model's own
  cross-entropy (line 9, "loss backpropagation through the teacher model", which the paper applies); one optimizer
  step on the sum of all gradients (line 10). The sub-models run on views of the client's tensors
  (``torch.func.functional_call``), so their gradients add into the client's.
* **Aggregation.** Sample-weighted element-wise mean over the clients covering each element (FjORD's
  ``fjord_average``, as ``fjord``).

Against the other two in this comparison: FedSlim (Algorithm 3) gives the smaller widths KL only, no labels;
rayfl's ``fjord`` (Flower's baseline) draws one width per batch and gives it the soft targets only. This one gives
every sampled width labels and distillation at once.

Choices where the paper leaves room:

* **Which widths.** "p_i ~ P" with "S < |P|": here S distinct widths (without replacement) among the ratios below
  the client's own, uniformly, from ``derive_rng(seed, "nested_widths", round, client)`` (the stream FedResCuE and
  FedSlim draw their lists from). A draw of the client's own width would only repeat line 9 (its KL to its own
  detached output has zero gradient), so it is not drawn. Widths that round to the same units count once (their
  gradients would be the same pass twice). With ``num_ratios: 0`` or ``ratios: [1]`` a batch is the client
  model's cross-entropy alone, FedAvg bit for bit at full width.
* **alpha.** The paper's Algorithm 4 weights CE and KL equally; ``alpha`` (default 1) scales the KL term.
* **KL** at temperature 1, averaged over samples: the term FedResCuE and FedSlim use.
* **Reported loss**: the client model's cross-entropy (line 9).
"""

from __future__ import annotations

import torch

from rayfl.config.sections import TrainConfig
from rayfl.fl.api.client import ClientContext
from rayfl.fl.common.nested import NestedClient, NestedWidthHooks, NestedWidths, distill_loss
from rayfl.fl.common.submodel import SubModelAlgorithm
from rayfl.fl.methods.fjord004.config import FjORD004Config

__all__ = ["FjORD004"]


class FjORD004(NestedWidthHooks, SubModelAlgorithm):
    """S sampled widths per batch, each CE + KL to the detached client model, plus the client model's CE, one step."""

    name = "fjord004"
    config: FjORD004Config

    def __init__(self, config: FjORD004Config, train: TrainConfig) -> None:
        super().__init__(config, train)
        self.nested = NestedWidths(self.name, config.capacities, config.ratios, config.num_ratios, train.sequence_loss)

    def client_weight(self, num_examples: int) -> float:
        return float(num_examples)  # fjord_average weights by examples

    def sampled_units(self, client: NestedClient) -> list[tuple[int, ...]]:
        """The batch's S sub-models below the client's own (distinct unit tuples, in increasing width)."""
        below = [r for r in self.nested.ratios if r < 1.0]
        k = min(len(below), int(self.config.num_ratios))
        if k == 0:
            return []
        picked = sorted(below[int(i)] for i in client.rng.choice(len(below), size=k, replace=False))
        family = self.require_family()
        out: list[tuple[int, ...]] = []
        for r in picked:
            units = self.nested.units_at(family, client, r)
            if units != client.own and units not in out:
                out.append(units)
        return out

    def backward_step(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Algorithm 4 lines 4-9: each sampled width's CE + alpha KL, then the client model's CE; gradients add up."""
        model, client, nested = ctx.model, ctx.get(NestedClient), self.nested
        subs = self.sampled_units(client)
        alpha = float(self.config.alpha)
        logits = nested.logits(model, x)
        teacher = logits.detach()  # theta_bar = stop_gradient(theta): the same weights, so the same output
        for units in subs:
            student = nested.sub_forward(self.require_family(), model, units)(x)
            sub_loss = nested.cross_entropy(student, x, y)
            if alpha > 0.0:
                sub_loss = sub_loss + alpha * distill_loss(student, teacher)
            sub_loss.backward()  # type: ignore[no-untyped-call]  # torch stubs leave backward untyped
        loss = nested.cross_entropy(logits, x, y)
        loss.backward()  # type: ignore[no-untyped-call]
        return loss
