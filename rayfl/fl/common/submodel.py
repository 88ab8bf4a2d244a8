"""Shared base of the methods that train sub-models of an elastic global model.

HeteroFL, FedRolex, Federated Dropout, AnyCostFL, FjORD and the core method (paper 000) differ in *which* sub-model a
client gets and *which* global units it covers; they share everything else, which lives here:

* **Fit.** ``fit_mask`` tells which candidate structures fit which clients, with the same cost model the clock uses
  (peak training memory, runtime overhead included, against the memory budget; bytes down plus bytes up against the
  bandwidth budget, exact for uncompressed transfers and conservative under upload compression; the round's training
  FLOPs against the compute budget when ``system.compute_limit_s`` sets one).
* **Uniform rates.** ``largest_fitting_rate``: per client, the largest of a list of width rates whose uniform
  sub-model fits (every dimension at that rate), falling back to the smallest rate (the clock then fails the client,
  which is recorded, rather than the method silently breaking a budget).
* **Aggregation.** The count-normalised element-wise mean (``MaskedWeightedMean``) with every client weighing 1, as
  HeteroFL's ``combine`` (ALGORITHMS.md section 1); subclasses that weight by samples override ``client_weight``.
* **In-place distillation** (paper 000, Algorithm 1) after aggregation when the method hands its ``distill`` section
  to the constructor and it is enabled: any sub-model method can add it, as the paper adds it to HeteroFL.

A method is one subclass of ``SubModelAlgorithm`` (two levels below ``Algorithm`` at most); what several methods share
beyond this lives in objects they hold (``rates.UniformRates``, ``nested.NestedWidths``), not in further base
classes. The constructor takes what this shared code needs from the method's config as typed arguments (its
distillation section and search space), so nothing here reads a method's config by key.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import nn

from rayfl.config.sections import TrainConfig
from rayfl.core.messages import Aggregate, Assignment, ClientView, ServerState, TensorSlice
from rayfl.fl.api.algorithm import Algorithm, RoundStats, round_lr
from rayfl.fl.common.distill.config import DistillConfig
from rayfl.fl.common.distill.server import OPT_KEYS, inplace_distill
from rayfl.models.elastic.spec import Selection, SubModelSpec, first_k
from rayfl.system.work import TRAIN_FLOPS_PER_FORWARD, samples_per_round

if TYPE_CHECKING:
    from rayfl.models.elastic.cost import CostModel
    from rayfl.models.elastic.family import ElasticFamily

__all__ = ["SubModelAlgorithm", "WidthModels", "sorted_ratios", "uniform_units"]


def uniform_units(family: ElasticFamily, rate: float) -> tuple[int, ...]:
    """Unit counts of ``family``'s sub-model with every dimension at ``rate`` (skippable ones too: they keep >= 1
    unit)."""
    space = family.space
    return space.units(SubModelSpec.uniform(space, rate).ratios)


def sorted_ratios(method: str, key: str, values: Sequence[float]) -> tuple[float, ...]:
    """``values`` sorted ascending and distinct, each in ``(0, 1]`` (a width ratio list of a method's config)."""
    ratios = tuple(sorted({float(v) for v in values}))
    if not ratios or any(not 0.0 < r <= 1.0 for r in ratios):
        raise ValueError(f"{method}: {key} must lie in (0, 1], got {list(values)}")
    return ratios


class WidthModels:
    """A host's first-k width sub-model modules and their slices, built once per unit tuple on a device (FjORD's and
    the nested-width methods' per-width forward passes: their own weights are never used, ``functional_call``
    replaces them). Pickles empty: each host rebuilds what it needs."""

    def __init__(self) -> None:
        self._built: dict[tuple[int, ...], tuple[nn.Module, dict[str, TensorSlice]]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {"_built": {}}

    def get(
        self, family: ElasticFamily, units: tuple[int, ...], device: torch.device
    ) -> tuple[nn.Module, dict[str, TensorSlice]]:
        """The ``units`` sub-model (in training mode, no gradients) and its first-k slices of the global tensors."""
        cached = self._built.get(units)
        if cached is None:
            with torch.random.fork_rng(devices=[]):  # the init draws must not touch the global generator
                module = family.build(units)
            module.requires_grad_(False).to(device)
            cached = self._built[units] = (module, family.slices(first_k(units)))
        cached[0].train()
        return cached


class SubModelAlgorithm(Algorithm):
    """Base class: budgets, uniform-rate choice, count-normalised aggregation and optional in-place distillation.

    ``distill``: the method's in-place distillation section (``None``: a method without one); ``distill_space``: the
    search space S it distils into when ``distill.ratios`` is empty (the method's ratios, rates or widths; empty:
    the whole model alone)."""

    def __init__(
        self,
        config: Any,
        train: TrainConfig,
        *,
        distill: DistillConfig | None = None,
        distill_space: Sequence[float] = (),
    ) -> None:
        super().__init__(config, train)
        self.distill = distill
        self._distill_space = tuple(float(v) for v in distill_space)
        self._server_train_s = math.nan

    def needs_family(self) -> bool:
        return True

    # ------------------------------------------------------------------------------------------ budgets
    @property
    def cost(self) -> CostModel:
        cost = self.server.cost
        if cost is None:
            raise ValueError(f"algorithm {self.name!r} assigns sub-models, so the model needs an elastic family")
        return cost

    def fit_mask(self, units: np.ndarray, views: Sequence[ClientView]) -> np.ndarray:
        """``(clients, candidates)``: candidate structure ``units[k]`` fits client ``views[i]``'s budgets."""
        costs = self.cost.evaluate(np.asarray(units, dtype=np.int64).reshape(-1, len(self.require_family().space.dims)))
        memory = np.array([v.memory_budget for v in views], dtype=np.float64)
        bandwidth = np.array([v.bandwidth_budget for v in views], dtype=np.float64)
        comm = costs.bytes_down + costs.bytes_up
        fits: np.ndarray = (costs.peak_memory[None, :] <= memory[:, None]) & (comm[None, :] <= bandwidth[:, None])
        compute = np.array([v.compute_budget for v in views], dtype=np.float64)
        if np.isfinite(compute).any():  # system.compute_limit_s: the round's training FLOPs fit the compute budget
            samples = np.array([samples_per_round(self.train, v.num_examples) for v in views], dtype=np.float64)
            need = TRAIN_FLOPS_PER_FORWARD * costs.flops[None, :] * samples[:, None]
            fits &= need <= compute[:, None]
        return fits

    def uniform_units(self, rate: float) -> tuple[int, ...]:
        """Unit counts of the sub-model with every dimension at ``rate`` (skippable ones too: they keep >= 1 unit)."""
        return uniform_units(self.require_family(), rate)

    def largest_fitting_rate(self, views: Sequence[ClientView], rates: Sequence[float]) -> dict[int, float]:
        """Per client, the largest rate of ``rates`` whose uniform sub-model fits; the smallest rate when none does."""
        ordered = sorted({float(r) for r in rates}, reverse=True)
        units = np.array([self.uniform_units(r) for r in ordered], dtype=np.int64)
        fits = self.fit_mask(units, views)
        first = np.where(fits.any(axis=1), fits.argmax(axis=1), len(ordered) - 1)
        return {v.client_id: ordered[int(k)] for v, k in zip(views, first, strict=True)}

    def assign_nested_widths(self, views: Sequence[ClientView], widths: Sequence[float]) -> dict[int, Assignment]:
        """Each client the first-k sub-model of the largest of ``widths`` that fits its budgets (the same ratio on every
        layer; the whole model at width 1); one ``Assignment`` per distinct width, shared by its clients."""
        if not views:
            return {}
        full = self.require_family().full_units
        chosen = self.largest_fitting_rate(views, widths)
        made: dict[float, Assignment] = {}
        out: dict[int, Assignment] = {}
        for view in views:
            width = chosen[view.client_id]
            if width not in made:
                units = self.uniform_units(width)
                made[width] = Assignment() if units == full else self.assignment_for(first_k(units))
            out[view.client_id] = made[width]
        return out

    def assignment_for(self, selection: Selection) -> Assignment:
        return self.require_family().assignment(selection)

    # ------------------------------------------------------------------------------------------ aggregation
    def client_weight(self, num_examples: int) -> float:
        return 1.0  # count-normalised, unweighted (HeteroFL / FedRolex / paper 000)

    def distill_ratios(self) -> tuple[float, ...]:
        """The search space's S for in-place distillation when ``distill.ratios`` is empty: the method's ratios,
        rates or widths (``distill_space``). Algorithm 1 draws every dimension from S independently, so a uniform-rate
        method (HeteroFL "w/ distillation") distils into mixed-width sub-nets its clients never train; paper 000
        applies its module unchanged to HeteroFL (Sec. 4.5), and so does rayfl."""
        return self._distill_space or (1.0,)

    def server_update(self, state: ServerState, round_idx: int, aggregate: Aggregate) -> ServerState:
        new = super().server_update(state, round_idx, aggregate)
        distill = self.distill
        if distill is None or not distill.enabled:
            self._server_train_s = math.nan
            return new
        began = time.perf_counter()
        ctx = self.server
        if distill.lr_schedule == "clients":  # the server's steps shrink with the clients' (an ablation)
            factor = round_lr(self.train, round_idx, ctx.rounds) / self.train.lr
            distill = dataclasses.replace(distill, lr=distill.lr * factor)
        result = inplace_distill(
            self.require_family(),
            new.params,
            distill,
            distill.ratios or self.distill_ratios(),
            num_subnets=distill.subnets or ctx.clients_per_round,
            seed=ctx.seed,
            round_idx=round_idx,
            input_spec=ctx.input_spec,
            opt_state=new.opt_state,
            pool=ctx.dataset.x if distill.noise == "data" else None,  # the control on real inputs only
        )
        self._server_train_s = time.perf_counter() - began
        # the distillation's optimizer state (optimizer_state: run) lives in ServerState so checkpoints carry it
        opt_state = {k: v for k, v in new.opt_state.items() if k not in OPT_KEYS} | result.opt_state
        return dataclasses.replace(new, params=result.params, opt_state=opt_state)

    def round_stats(self) -> RoundStats:
        # read once per round: a round whose clients all failed skips server_update and must not repeat the last time
        stats = RoundStats(server_train_s=self._server_train_s)
        self._server_train_s = math.nan
        return stats
