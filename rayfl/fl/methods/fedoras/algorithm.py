"""FedorAS, phase 1: federated supernet training with budget-aware path sampling and OPA aggregation.

Dudziak, Laskaridis, Fernandez-Marques, Leontiadis, Lane et al., "FedorAS: Federated Architecture Search under system
heterogeneity" (paper 003); official ``SamsungLabs/FedorAS`` (ALGORITHMS.md section 10). The model is the supernet
family (``rayfl/models/supernet.py``); the pure sampling functions are in ``fedoras_sampling.py``.

* **Tiers** (App. D.4, App. I). At binding the clients are split into tiers (``tiers``: a seeded shuffle cut at the
  shares, or ranked by compute speed and cut at them) and the tiers' FLOPs brackets are computed from
  ``bracket_paths`` random paths. Both are functions of the seed (and of the clients' speeds at the first check-in),
  so the driver computes them once; clients learn their FLOPs limit from the tier plan the algorithm carries.
* **Subspace** (Eq. 2). Each round one subspace (ops per layer) whose parameters fit ``subspace_params`` is drawn from
  ``derive_rng(seed, "fedoras-subspace", round)`` and sent to every sampled client (as the official code; the paper
  allows one per client). The clients' model is that subspace of the supernet, so bytes moved are the subspace's.
* **Paths** (Eq. 3-4). Every batch trains one path of the subspace whose FLOPs fit the client's tier's upper bracket
  edge, drawn from ``derive_rng(seed, "fedoras-path", round, client, batch)``; the client counts the examples that
  went through each (layer, op).
* **Simulated compute** (``train_flops``): a client's modelled training time counts the FLOPs of the paths it
  trains, batch by batch (the cost model alone would price every op of its subspace).
* **OPA** (Eq. 5). Each op's tensors count with the examples the client pushed through that op
  (``ClientUpdate.tensor_weights``); the engine's element-wise weighted mean then gives every op the average weighted
  by examples through it over all clients; fixed layers (stem, reductions, head) count with all the client's examples
  (FedAvg). An op the client held but never used is not uploaded, so an op nobody used keeps its value. (The paper's
  "at least two clients" rule is off, as the official flag ``remove_single_user_updates=False``.)

The engine evaluates one path of the supernet after every round (``eval_path``: the path with the largest FLOPs, or
the smallest). The tiers and brackets travel to later phases in ``FedorASState``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn

from rayfl.config.sections import TrainConfig
from rayfl.core.messages import Assignment, ClientUpdate, ClientView, ServerState, TrainTask
from rayfl.core.rng import derive_rng
from rayfl.fl.api.algorithm import Algorithm, ServerContext
from rayfl.fl.api.client import ClientContext
from rayfl.fl.api.optim import ClientOptimizer
from rayfl.fl.methods.fedoras.config import FedorASConfig, FedorASTiersConfig
from rayfl.fl.methods.fedoras.sampling import (
    OpTables,
    path_flops,
    path_rng,
    sample_path,
    sample_subspace,
    tier_brackets,
    tiers_by_compute,
    tiers_by_shares,
)
from rayfl.models.elastic.spec import first_k
from rayfl.models.inputs import InputSpec

if TYPE_CHECKING:  # the elastic package imports rayfl.algorithms, so its modules load lazily here
    from rayfl.models.elastic import CostModel, ElasticFamily
    from rayfl.models.supernet import SupernetFamily, SupernetModel

__all__ = ["FedorAS", "FedorASState", "TierPlan", "context_tables", "op_tables", "supernet_family", "tier_plan"]


@dataclass(frozen=True)
class TierPlan:
    """Each client's tier and the tiers' FLOPs edges (tier ``t``: ``[edges[t], edges[t + 1]]``)."""

    client_tier: np.ndarray
    edges: np.ndarray

    @property
    def num_tiers(self) -> int:
        return len(self.edges) - 1


@dataclass(frozen=True)
class FedorASState:
    """What FedorAS's later phases inherit from supernet training."""

    tiers: TierPlan


def supernet_family(family: ElasticFamily | None) -> SupernetFamily:
    from rayfl.models.supernet import SupernetFamily

    if not isinstance(family, SupernetFamily):
        raise ValueError("fedoras needs model.name: supernet")
    if family.path is not None:
        raise ValueError("fedoras trains and searches the whole supernet: leave model.path empty")
    return family


def context_tables(ctx: ServerContext, who: str) -> OpTables:
    """The op tables of the run's supernet, from the cost model the clock uses (every FedorAS phase binds with it)."""
    family = supernet_family(ctx.family)
    if ctx.cost is None:
        raise ValueError(f"{who} needs the supernet's cost model")
    return op_tables(family, ctx.cost)


def op_tables(family: SupernetFamily, cost: CostModel) -> OpTables:
    """Per (layer, op) parameters and FLOPs from the cost model: each op alone minus the empty model."""
    num_dims = len(family.space.dims)
    empty = cost.evaluate(np.zeros(num_dims))
    each = cost.evaluate(np.eye(num_dims))
    shape = (family.num_layers, family.num_ops)
    return OpTables(
        params=(each.params - empty.params[0]).reshape(shape),
        flops=(each.flops - empty.flops[0]).reshape(shape),
        fixed_params=float(empty.params[0]),
        fixed_flops=float(empty.flops[0]),
        identity=family.identity,
    )


def tier_plan(config: FedorASTiersConfig, tables: OpTables, ctx: ServerContext) -> TierPlan:
    """Every client's tier (by the shares, or ranked by compute speed) and the tiers' FLOPs brackets (App. D.4)."""
    rng_tiers = derive_rng(ctx.seed, "fedoras-tiers")
    rng_brackets = derive_rng(ctx.seed, "fedoras-brackets")
    edges = tier_brackets(
        tables, len(config.shares), rng_brackets, config.bracket_paths, config.bracket_low, config.bracket_high
    )
    num_clients = ctx.dataset.num_clients
    if config.by == "shares":
        return TierPlan(tiers_by_shares(num_clients, config.shares, rng_tiers), edges)
    if ctx.compute_flops_per_s_of is None:
        raise ValueError("fedoras: tiers by compute need every client's compute speed from the engine")
    speeds = ctx.compute_flops_per_s_of(np.arange(num_clients))  # a rank among every client: all of them read
    return TierPlan(tiers_by_compute(speeds, config.shares, rng_tiers), edges)


class FedorAS(Algorithm):
    """Supernet training: subspace per round, path per batch within the tier's FLOPs, OPA (module docstring)."""

    name = "fedoras"
    config: FedorASConfig

    def __init__(self, config: FedorASConfig, train: TrainConfig) -> None:
        super().__init__(config, train)
        self.tables: OpTables | None = None
        self.tiers: TierPlan | None = None

    def bind_server(self, ctx: ServerContext) -> None:
        super().bind_server(ctx)
        self.tables = context_tables(ctx, "fedoras")
        self.tiers = tier_plan(self.config.tiers, self.tables, ctx)

    def bind_client(self, family: ElasticFamily | None, input_spec: InputSpec) -> None:
        super().bind_client(family, input_spec)
        supernet_family(family)

    def _ready(self) -> tuple[SupernetFamily, OpTables, TierPlan]:
        if self.tables is None or self.tiers is None:
            raise RuntimeError("fedoras: bind_server must run before the first round")
        return supernet_family(self.family), self.tables, self.tiers

    @property
    def limit_params(self) -> float:
        _, tables, _ = self._ready()
        if self.config.subspace_params:
            return float(self.config.subspace_params)
        return 0.5 * tables.subspace_params(np.ones_like(tables.params, dtype=bool))

    # ------------------------------------------------------------------------------------------ server side
    def init_state(self, params: dict[str, torch.Tensor]) -> ServerState:
        _, _, tiers = self._ready()
        return ServerState(params=params, algo_state=FedorASState(tiers))

    def enter_phase(self, previous: ServerState, round_idx: int) -> ServerState:
        """Hand-over from an earlier phase: keep its parameters, start supernet training's own state."""
        return replace(self.init_state(previous.params), round_idx=round_idx)

    def subspace(self, round_idx: int) -> np.ndarray:
        _, tables, _ = self._ready()
        seed = self.server.seed
        return sample_subspace(tables, self.limit_params, derive_rng(seed, "fedoras-subspace", round_idx))

    def assign(self, state: ServerState, round_idx: int, views: Sequence[ClientView]) -> dict[int, Assignment]:
        if not views:
            return {}
        family, _, _ = self._ready()
        units = family.units_of_mask(self.subspace(round_idx))
        assignment = family.assignment(first_k(units))
        return {v.client_id: assignment for v in views}

    def client_weight(self, num_examples: int) -> float:
        return float(num_examples)

    def eval_units(self, state: ServerState) -> tuple[int, ...] | None:
        family, tables, _ = self._ready()
        pick = np.argmax if self.config.eval_path == "largest" else np.argmin
        return family.units_of_path(pick(tables.flops, axis=1))

    # ------------------------------------------------------------------------------------------ client side
    def client_limit_flops(self, client_id: int) -> float:
        _, _, tiers = self._ready()
        return float(tiers.edges[int(tiers.client_tier[client_id]) + 1])

    def path_for_batch(self, task: TrainTask, batch_idx: int) -> np.ndarray:
        """The path the client of ``task`` trains its batch ``batch_idx`` with: inside the task's subspace and its
        tier's FLOPs, from ``path_rng(seed, round, client, batch)`` alone."""
        family, tables, _ = self._ready()
        units = task.assignment.units
        mask = family.mask_of_units(family.full_units if units is None else units)
        rng = path_rng(task.seed, task.round_idx, task.client_id, batch_idx)
        return sample_path(tables, mask, self.client_limit_flops(task.client_id), rng)

    def train_flops(
        self, round_idx: int, views: Sequence[ClientView], assignments: Mapping[int, Assignment]
    ) -> np.ndarray | None:
        """``capabilities.CountsTrainFlops``: each client's training FLOPs, forward + backward
        (``TRAIN_FLOPS_PER_FORWARD`` x the forward) of every batch on its path, replayed as ``local_train`` draws them
        (the cost model would price every op of the subspace)."""
        from rayfl.system.costs import TRAIN_FLOPS_PER_FORWARD

        _, tables, _ = self._ready()
        out = np.zeros(len(views))
        for i, view in enumerate(views):
            task = TrainTask(
                client_id=view.client_id,
                round_idx=round_idx,
                seed=self.server.seed,
                lr=0.0,
                assignment=assignments[view.client_id],
            )
            sizes = np.asarray(self.batch_sizes(view.num_examples), dtype=np.float64)
            if len(sizes):
                paths = np.array([self.path_for_batch(task, b) for b in range(len(sizes))])
                out[i] = TRAIN_FLOPS_PER_FORWARD * float(sizes @ path_flops(tables, paths))
        return out

    def op_counts(self, task: TrainTask, num_examples: int) -> np.ndarray:
        """(L, O) examples the client of ``task`` puts through each (layer, op): every batch of ``local_train``
        (``batch_sizes``) replayed through ``path_for_batch``."""
        family, _, _ = self._ready()
        counts = np.zeros((family.num_layers, family.num_ops))
        layers = np.arange(family.num_layers)
        for batch_idx, size in enumerate(self.batch_sizes(num_examples)):
            counts[layers, self.path_for_batch(task, batch_idx)] += size
        return counts

    def train_batch(
        self,
        ctx: ClientContext,
        x: torch.Tensor,
        y: torch.Tensor,
        optimizer: ClientOptimizer,
        params: Sequence[nn.Parameter],
        batch_idx: int,
    ) -> torch.Tensor:
        """One batch on one path of the subspace (Eq. 3-4): the base step with the supernet running that path."""
        _supernet_model(ctx.model).path = tuple(int(p) for p in self.path_for_batch(ctx.task, batch_idx))
        return super().train_batch(ctx, x, y, optimizer, params, batch_idx)

    def local_train(self, ctx: ClientContext, x: np.ndarray, y: np.ndarray) -> ClientUpdate:
        """The base loop (a path per batch in ``train_batch``), then OPA's per-op weights from the same paths."""
        family, _, _ = self._ready()
        try:
            update = super().local_train(ctx, x, y)
        finally:
            _supernet_model(ctx.model).path = None  # the host reuses the module; evaluation runs no stale path
        return opa_update(update, family, self.op_counts(ctx.task, len(y)))


def _supernet_model(model: nn.Module) -> SupernetModel:
    from rayfl.models.supernet import SupernetModel

    if not isinstance(model, SupernetModel):
        raise TypeError(f"fedoras trains supernet models, got {type(model).__name__}")
    return model


def opa_update(update: ClientUpdate, family: SupernetFamily, counts: np.ndarray) -> ClientUpdate:
    """The update with each op's tensors weighted by the examples through that op, unused ops left out (Eq. 5)."""
    values: dict[str, torch.Tensor] = {}
    weights: dict[str, float] = {}
    for name, value in update.values.items():
        gate = family.space.layouts[name].gate
        if gate is None:
            values[name] = value
            continue
        layer, op = family.layer_op(gate)
        if counts[layer, op] > 0:
            values[name] = value
            weights[name] = float(counts[layer, op])
    slices = {k: v for k, v in update.slices.items() if k in values}
    return replace(update, values=values, slices=slices, tensor_weights=weights)
