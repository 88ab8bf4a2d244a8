"""SplitMix: Efficient Split-Mix Federated Learning for On-Demand and In-Situ Customization.

Hong, Wang, Wang, Zhou, ICLR 2022; authors' code ``illidanlab/SplitMix`` (ALGORITHMS.md section 7). Paper 002 uses it
as a baseline on FedTrans's largest model (its App. A.1).

The model is ``model.name: ensemble`` (``rayfl/models/ensemble.py``): ``members`` independent base models, each the
base network at ``width`` of its channels (the authors' ``atom_slim_ratio``; 8 bases of 1/8 width by default), their
logits averaged. Per round:

1. **Budget to bases.** A client trains the largest number ``n`` of bases whose cost fits its round's budgets (the
   clock's own cost model: peak training memory, bytes down and up, and training FLOPs within the round's deadline
   ``system.compute_limit_s``; ``n`` bases cost ``n`` times one, as they never interact). One base when none fits
   (the clock then fails the client, recorded).
2. **Which bases** (the authors' ``sample_bases``): the first from a round-robin over a shuffled order of the bases
   that carries on across clients and rounds (a new shuffle, from ``(seed, "splitmix-cycle", cycle)``, each time it
   runs out: every base is trained equally often), the other ``n - 1`` drawn at random without replacement from the
   rest (``(seed, "splitmix", round, client)``). The order and position live in the server state (checkpointed).
3. **Local training** (``train_slimmable``): every step, each of the client's bases takes the batch and its own
   cross-entropy; the gradients of their sum are each base's own (the bases share nothing), one optimizer step. The
   reported loss is the mean over the bases.
4. **Aggregation** (``SlimmableModelAccumulator``): each base element is the sample-weighted mean over the clients
   that trained it; a base nobody trained keeps its weights.

Evaluation: the global model is the mix of all bases; with ``eval_widths`` the engine also evaluates the mixes of the
first ``n`` bases (``x{n / members}``) and each device is scored on the mix of as many bases as fit its budgets (the
authors' in-situ customization by budget). With one base this is FedAvg on that base, bit for bit.

How rayfl's system model maps onto the paper's budgets: SplitMix gives each client a width budget (a fraction of the
full model: 1/8 ... 1) fixed per client; rayfl's budgets are resources per client and round, so a client's budget is
the number of bases it can train this round, measured with the same cost model that decides whether it finishes.
Choices where the paper is vague: bases are assigned per round from the budgets at check-in (the authors fix them
per client); the authors' class-absent logit masking (``LocalMaskCrossEntropyLoss``) is not used (rayfl's other
baselines do not mask either unless configured); the authors' ``rescale_init`` is not applied (the base network is
initialised as rayfl initialises it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from rayfl.core.messages import Assignment, ClientView, Params, ServerState
from rayfl.core.rng import derive_rng
from rayfl.fl.api.algorithm import MAIN_EVAL
from rayfl.fl.api.client import ClientContext
from rayfl.fl.common.submodel import SubModelAlgorithm
from rayfl.fl.methods.splitmix.config import SplitMixConfig
from rayfl.models.elastic.spec import Selection
from rayfl.models.ensemble import Ensemble

__all__ = ["SplitMix", "SplitMixState", "bases_that_fit"]


@dataclass(frozen=True)
class SplitMixState:
    """The round-robin over the bases: the current shuffled order, how many of it were handed out, and which
    shuffle it is."""

    order: tuple[int, ...] = ()
    cursor: int = 0
    cycle: int = -1


def bases_that_fit(fits: np.ndarray) -> np.ndarray:
    """Per client (rows of ``fits``, columns ``n = 1 .. members`` bases), the largest ``n`` that fits; 1 if none."""
    counts = np.arange(1, fits.shape[1] + 1)
    best = np.where(fits, counts[None, :], 0).max(axis=1, initial=0)
    out: np.ndarray = np.maximum(best, 1)
    return out


class SplitMix(SubModelAlgorithm):
    """Independent base models, as many per client as fit (module docstring)."""

    name = "splitmix"
    config: SplitMixConfig

    def client_weight(self, num_examples: int) -> float:
        return float(num_examples)  # the authors' accumulator weighs by the client's share of samples

    @property
    def members(self) -> int:
        return self.require_family().space.dims[0].size

    def init_state(self, params: Params) -> ServerState:
        return ServerState(params=params, algo_state=SplitMixState())

    @staticmethod
    def _state(state: ServerState) -> SplitMixState:
        if not isinstance(state.algo_state, SplitMixState):
            raise TypeError("splitmix: the server state carries no SplitMixState (was it made by init_state?)")
        return state.algo_state

    def bases(self, views: Sequence[ClientView]) -> dict[int, int]:
        """How many bases each client trains: the most whose cost fits its budgets (1 when none does)."""
        if not views:
            return {}
        candidates = np.arange(1, self.members + 1, dtype=np.int64).reshape(-1, 1)
        counts = bases_that_fit(self.fit_mask(candidates, views))
        return {v.client_id: int(n) for v, n in zip(views, counts, strict=True)}

    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]:
        return self.assign_with_state(state, round_idx, views)[0]

    def assign_with_state(
        self, state: ServerState, round_idx: int, views: Sequence[ClientView]
    ) -> tuple[dict[int, Assignment], ServerState]:
        """``capabilities.StatefulAssign``: the assignments and the round-robin's new position."""
        fs, k, seed = self._state(state), self.members, self.server.seed
        order, cursor, cycle = list(fs.order), fs.cursor, fs.cycle
        out: dict[int, Assignment] = {}
        counts = self.bases(views)
        for view in views:
            if cursor >= len(order):
                cycle += 1
                order = [int(b) for b in derive_rng(seed, "splitmix-cycle", cycle).permutation(k)]
                cursor = 0
            first = order[cursor]
            cursor += 1
            others = np.array([b for b in range(k) if b != first], dtype=np.int64)
            rng = derive_rng(seed, "splitmix", round_idx, view.client_id)
            rest = rng.choice(others, size=counts[view.client_id] - 1, replace=False) if k > 1 else others[:0]
            chosen = np.sort(np.concatenate([[first], rest]).astype(np.int64))
            out[view.client_id] = self.assignment_for(Selection((len(chosen),), (chosen,)))
        new = SplitMixState(order=tuple(order), cursor=cursor, cycle=cycle)
        return out, dataclasses.replace(state, algo_state=new)

    def device_evals(self, state: ServerState, views: Sequence[ClientView]) -> list[str]:
        """Each device on the mix of as many bases as fit its budgets (``x{n / members}``) when the run evaluates
        that mix (``eval_widths``), else on the main evaluation (all bases)."""
        widths = {float(p) for p in self.server.eval_widths}
        if not widths or not views:
            return super().device_evals(state, views)
        counts = self.bases(views)
        names = []
        for v in views:
            rate = counts[v.client_id] / self.members
            names.append(f"x{rate:g}" if rate in widths else MAIN_EVAL)
        return names

    # ------------------------------------------------------------------------------------------ client side
    def backward_step(self, ctx: ClientContext, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Each base's own cross-entropy, back-propagated as their sum; returns their mean (module docstring)."""
        model = ctx.model
        if not isinstance(model, Ensemble):
            return super().backward_step(ctx, x, y)
        losses = [nn.functional.cross_entropy(logits, y) for logits in model.member_logits(x)]
        total = losses[0]
        for loss in losses[1:]:
            total = total + loss
        total.backward()  # type: ignore[no-untyped-call]
        return total.detach() / len(losses)
