"""FedAvg: Communication-Efficient Learning of Deep Networks from Decentralized Data.

McMahan, Moore, Ramage, Hampson, Agüera y Arcas, AISTATS 2017 (arXiv:1602.05629).

Every client trains the full model; the server averages the updates weighted by sample count. The server step is
the shared server optimizer (``server.optimizer``, ``rayfl/fl/common/server_opt.py``): SGD on the pseudo-gradient
``old - mean`` (Reddi et al., "Adaptive Federated Optimization"), so lr 1 with no momentum is plain averaging, and
FedAvgM, FedAdam, FedYogi and FedAdagrad are config choices. ``algorithm.server_lr`` and ``server_momentum``, FedAvg's
own keys from before the optimizer was shared, still mean ``server.optimizer: {name: sgd, lr, momentum}``, with the
same numbers bit for bit (``server_optimizer``); setting both is refused (``rules.py``).

Paper 000's two FedAvg baselines are config choices of the same class:

* ``model: full`` ("Largest"): everyone trains the global model. With ``budgets: ignore`` every sampled client runs
  even when the model exceeds its memory or bandwidth budget (the clock records it as ``over_budget``), the upper
  bound the paper compares against; with ``budgets: enforce`` such clients fail.
* ``model: smallest`` ("Smallest"): everyone trains the smallest structure of the search space with ratios ``S =
  config.ratios``, first-k units. As in ``rayfl.fl.common.search`` (a choice where the paper is silent): every
  dimension takes its smallest allowed ratio, 0 (block removed) for skippable dimensions when 0 is in ``S``, else the
  smallest positive ratio of ``S``. The global model of this baseline *is* that sub-model (the rest of the global
  tensors are never trained), so ``eval_units`` makes the engine evaluate it rather than the full network. With
  ``smallest_blocks`` the smallest model is a named one instead (``search.named_structure``): every width at the
  smallest positive ratio of ``S`` and only the first ``smallest_blocks[s]`` blocks of stage ``s``, e.g. ``[1]``
  for paper 000's ViT-tiny-tiny where ``S = {0, 1}`` would otherwise remove every block of the ViT.

Clients are weighted by sample count (``weighting``) in both cases; the sub-model's uncovered elements stay as they
are (the reducer keeps them, and the server optimizer moves only covered elements), so the server step only moves the
trained part.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rayfl.config.sections import ServerOptimizerConfig
from rayfl.core.errors import ConfigError
from rayfl.core.messages import Assignment, ClientView, ServerState
from rayfl.fl.api.algorithm import Algorithm, ServerContext
from rayfl.fl.common.search import named_structure
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.fedavg.rules import alias_conflict, uses_alias
from rayfl.models.elastic.spec import first_k

if TYPE_CHECKING:
    from rayfl.models.elastic.family import ElasticFamily

__all__ = ["FedAvg"]


class FedAvg(Algorithm):
    """FedAvg; the server's optimizer is the shared one (``server.optimizer``), its own two keys an alias of it."""

    name = "fedavg"
    config: FedAvgConfig

    def client_weight(self, num_examples: int) -> float:
        return float(num_examples) if self.config.weighting == "samples" else 1.0

    def needs_family(self) -> bool:
        return self.config.model != "full"  # 'smallest' cuts the smallest sub-model out of the family

    def bind_server(self, ctx: ServerContext) -> None:
        super().bind_server(ctx)
        if self.config.model == "smallest" and self.config.smallest_blocks:
            for key, reason in self.family_problems(self.require_family()):
                # a count that does not fit the model: one located line before round 0, not a traceback
                raise ConfigError(reason, ".".join(("algorithm", *key)))

    def family_problems(self, family: ElasticFamily) -> list[tuple[tuple[str, ...], str]]:
        """``smallest_blocks`` that ``family`` cannot hold (more stages, or more blocks in a stage, than it has)."""
        if self.config.model != "smallest" or not self.config.smallest_blocks:
            return []
        positive = [float(r) for r in self.config.ratios if r > 0.0] or [1.0]
        try:
            named_structure(family, min(positive), self.config.smallest_blocks)
        except ValueError as err:
            return [(("smallest_blocks",), str(err))]
        return []

    def smallest_units(self) -> tuple[int, ...]:
        """Units of the smallest structure with ratios ``config.ratios`` (see the module docstring)."""
        space = self.require_family().space
        ratios = [float(r) for r in self.config.ratios]
        positive = [r for r in ratios if r > 0.0]
        if not positive:
            raise ValueError("fedavg: model 'smallest' needs a positive ratio in algorithm.ratios")
        low = min(positive)
        if self.config.smallest_blocks:
            return named_structure(self.require_family(), low, self.config.smallest_blocks)
        zero = 0.0 in ratios
        return space.units([0.0 if (d.skippable and zero) else low for d in space.dims])

    def model_assignment(self) -> Assignment:
        """The one assignment every client gets this run."""
        enforce = self.config.budgets == "enforce"
        if self.config.model == "full":
            return Assignment(enforce_budgets=enforce)
        sub = self.require_family().assignment(first_k(self.smallest_units()))
        return dataclasses.replace(sub, enforce_budgets=enforce)

    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]:
        assignment = self.model_assignment()
        return {v.client_id: assignment for v in views}

    def eval_units(self, state: ServerState) -> tuple[int, ...] | None:
        return None if self.config.model == "full" else self.smallest_units()

    def server_optimizer(self, configured: ServerOptimizerConfig) -> ServerOptimizerConfig:
        """``server_lr`` / ``server_momentum`` set (not 1 and 0): ``sgd`` with them, else ``server.optimizer``."""
        if not uses_alias(self.config):
            return configured
        if alias_conflict(self.config, configured):  # the rules refuse it before a run starts; a direct call too
            raise ConfigError("set the server optimizer in server.optimizer or here, not both", "algorithm.server_lr")
        return ServerOptimizerConfig(name="sgd", lr=self.config.server_lr, momentum=self.config.server_momentum)
