"""Search-only runs: the resource-constrained assignment over the budgets, round after round, without training.

Paper 000, Appendix E.1 (Figure 10) picks epsilon and T_max this way: the server assigns a model to every sampled
client under its memory and bandwidth budgets for R rounds and measures how well the assigned models use the budgets
(utilisation = need / budget) and how often the search runs up to T_max draws (the hit rate); nothing is trained.

A round here is the first half of ``run_experiment``'s round, built from the same steps (``engine/steps.py``):
check-in (budgets at the simulated time), the algorithm's ``assign_with_state`` and the clock's plan; then the clock
advances by the planned round (slowest client that fits: its download, modelled compute and upload) and the round's
rows are built by ``round_record`` as in training runs, so ``rayfl report`` reads a search-only run directory like
any other.

Choices:

* The global model is built on the meta device: its tensors have shapes and no storage, so the cost oracle, the
  search space and the sub-model slices are exact while BERT-large costs no memory and no initialisation time. The
  parameters are never read, so an assignment that ranks units by weight values (AnyCostFL's norms) cannot run
  here and fails with a message saying so.
* ``clients_run`` counts the clients whose plan lets them train (their model fits and they finish), and the
  utilisation of a round is the mean over those clients, as in training runs; ``clients_failed`` counts the rest.
  Accuracy and loss columns are NaN, bytes are the planned transfers.
* The algorithm's server update never runs; the state changes only by what assignment grows (model search's pool).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rayfl.core.messages import Params
from rayfl.data.federated import FederatedDataset
from rayfl.engine.build import Setup, bind_algorithm, build_clock
from rayfl.engine.persist.records import RoundRecord
from rayfl.engine.round_record import WallTimes, client_records, mean_finite, planned, round_record
from rayfl.engine.startup import open_run_writer
from rayfl.engine.steps import check_in, plan_clients, write_round
from rayfl.experiment.loader import check_clients_per_round
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api import capabilities
from rayfl.fl.registry import build_algorithm
from rayfl.models import InputSpec, build_model

__all__ = ["SearchOnlyResult", "meta_params", "run_search_only"]

log = logging.getLogger(__name__)

RoundCallback = Callable[[RoundRecord], None]


@dataclass(frozen=True)
class SearchOnlyResult:
    """The rounds of a search-only run and where they were written."""

    records: list[RoundRecord]
    run_dir: Path | None

    def mean(self, column: str) -> float:
        """The mean of a round column over the rounds where it is finite (NaN when it never is)."""
        return mean_finite(np.array([getattr(r, column) for r in self.records], dtype=np.float64))


def meta_params(cfg: ExperimentConfig, spec: InputSpec) -> Params:
    """The global model's floating-point tensors on the meta device: shapes only, no storage, no initialisation."""
    with torch.device("meta"):
        model = build_model(cfg.model, spec)
    return {k: v.detach() for k, v in model.state_dict().items() if v.is_floating_point()}


def run_search_only(
    cfg: ExperimentConfig,
    *,
    write: bool = True,
    callbacks: Sequence[RoundCallback] = (),
    dataset: FederatedDataset | None = None,
    cache_dir: Path | None = None,
) -> SearchOnlyResult:
    """Assign and plan ``cfg.rounds`` rounds without training; with ``write`` the records go to a new run directory."""
    start = time.perf_counter()
    if cfg.phases:
        raise ValueError("search-only runs take one algorithm; remove 'phases' (multi-phase runs train)")
    if dataset is None:
        from rayfl.data import build_federated_dataset

        dataset = build_federated_dataset(cfg.data, cfg.seed, cache_dir)
    check_clients_per_round(cfg, dataset.num_clients)
    spec = InputSpec.of(dataset.input_kind, dataset.num_classes, dataset.x, dataset.meta)
    params = meta_params(cfg, spec)
    setup = Setup(dataset=dataset, input_spec=spec, algorithm=build_algorithm(cfg.algorithm, cfg.train), params=params)
    algorithm = setup.algorithm
    clock = build_clock(cfg, setup)
    bind_algorithm(cfg, setup, clock)
    state = algorithm.init_state(params)
    writer = open_run_writer(cfg) if write else None
    records: list[RoundRecord] = []
    try:
        for round_idx in range(cfg.rounds):
            round_start = time.perf_counter()
            # 1. Check-in.
            views = check_in(cfg.seed, dataset, clock, round_idx, cfg.clients_per_round)
            # 2. Assignment, on a model without weights.
            try:
                assignments, state = capabilities.assign_with_state(algorithm, state, round_idx, views)
            except (NotImplementedError, RuntimeError, TypeError) as err:  # e.g. a meta tensor read as numbers
                raise ValueError(
                    f"search-only: algorithm {cfg.algorithm.name!r} could not assign sub-models without weights (the "
                    f"global model lives on the meta device and is never trained): {err}"
                ) from err
            assign_s = time.perf_counter() - round_start
            # 3. Plan; the clock moves on by the planned round (steps 4 to 6 train, update and evaluate: none here).
            plan = plan_clients(clock, algorithm, state, round_idx, views, assignments, cfg.train)
            sim_duration_s = clock.advance(plan, assign_s)
            # 7. Records.
            clients = client_records(plan, [], assignments)
            stats = algorithm.round_stats()
            now = time.perf_counter()
            record = round_record(
                round_idx=round_idx,
                sim_time_s=clock.now,
                sim_duration_s=sim_duration_s,
                plan=plan,
                clients=clients,
                tally=planned(plan),
                stats=stats,
                state=state,
                wall=WallTimes(start, round_start, round_start, now, now),
            )
            records.append(record)
            write_round(writer, record, clients)
            for callback in callbacks:
                callback(record)
    finally:
        if writer is not None:
            writer.close()
    result = SearchOnlyResult(records, writer.run_dir if writer is not None else None)
    if writer is not None:
        writer.finish(_summary(cfg, result))
        writer.push()  # a run on a storage URI: its files copied there
    log.info("search-only %s: %d rounds in %.1f s", cfg.name, len(records), time.perf_counter() - start)
    return result


def _summary(cfg: ExperimentConfig, result: SearchOnlyResult) -> dict[str, object]:
    records = result.records
    return {
        "name": cfg.name,
        "algorithm": cfg.algorithm.name,
        "mode": "search_only",
        "final_test_acc": math.nan,
        "final_test_loss": math.nan,
        "rounds": len(records),
        "wall_time_s": records[-1].wall_time_s if records else 0.0,
        "sim_time_s": records[-1].sim_time_s if records else 0.0,
        "memory_util": result.mean("memory_util"),
        "bandwidth_util": result.mean("bandwidth_util"),
        "hit_rate": result.mean("hit_rate"),
        "search_s": result.mean("search_s"),
        "distinct_structures": records[-1].distinct_structures if records else math.nan,
    }
