"""Search-only runs: the resource-constrained assignment over the budgets, round after round, without training.

Paper 000, Appendix E.1 (Figure 10) picks epsilon and T_max this way: the server assigns a model to every sampled
client under its memory and bandwidth budgets for R rounds and measures how well the assigned models use the budgets
(utilisation = need / budget) and how often the search runs up to T_max draws (the hit rate); nothing is trained.

A round here is a round policy of its own, ``PlannedRounds`` (``engine/policies/planned.py``): a sync round's
check-in, assignment and plan, the clock advanced by the planned round, and the round's end every policy shares
(``policies/round_end.py``), so the rows are built as in training runs and ``rayfl report`` reads a search-only run
directory like any other. This module is the run around those rounds, which differs from ``run_experiment``'s: a
weightless model, no backend (``_NoTraining``: nothing trains or evaluates), no checkpoint, model export, tracker or
stop signal, and a summary of utilisation and hit rate.

Choices:

* The global model is built on the meta device: its tensors have shapes and no storage, so the cost oracle, the
  search space and the sub-model slices are exact while BERT-large costs no memory and no initialisation time. The
  parameters are never read, so an assignment that ranks units by weight values (AnyCostFL's norms) cannot run
  here and fails with a message saying so.
* ``clients_run`` counts the clients whose plan lets them train (their model fits and they finish), and the
  utilisation of a round is the mean over those clients, as in training runs; ``clients_failed`` counts the rest.
  Accuracy and loss columns are NaN, bytes are the planned transfers.
* The algorithm's server update never runs; the state changes only by what assignment grows (model search's pool).
* The runs' round loops stay two (here and ``driver.py``), each a few lines around its policy's ``round``: the
  driver's checkpoints, exports and stop handling need a trained model, and every one of them would be a branch for
  this kind of run.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from rayfl.config.model import ModelConfig
from rayfl.core.messages import Aggregate, ClientOutcome, Params, TrainTask
from rayfl.data.federated import FederatedDataset
from rayfl.engine.build import Setup, bind_algorithm, build_clock
from rayfl.engine.exec.backend import EvalResult
from rayfl.engine.exec.client_state import KeptUpload
from rayfl.engine.guard import NonFiniteGuard
from rayfl.engine.parts import RunParts
from rayfl.engine.persist.records import RoundRecord
from rayfl.engine.persist.resume import RunProgress
from rayfl.engine.phases import PhaseSchedule
from rayfl.engine.policies import PlannedRounds
from rayfl.engine.round_record import mean_finite
from rayfl.engine.startup import open_run_writer
from rayfl.engine.steps import write_round
from rayfl.experiment.loader import check_clients_per_round
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api.tasks import LocalTaskPool
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

        dataset = build_federated_dataset(cfg.data, cfg.data_seed, cache_dir)
    check_clients_per_round(cfg, dataset.num_clients)
    spec = InputSpec.of(dataset.input_kind, dataset.num_classes, dataset.x, dataset.meta)
    params = meta_params(cfg, spec)
    setup = Setup(dataset=dataset, input_spec=spec, algorithm=build_algorithm(cfg.algorithm, cfg.train), params=params)
    algorithm = setup.algorithm
    clock = build_clock(cfg, setup)
    bind_algorithm(cfg, setup, clock)
    writer = open_run_writer(cfg) if write else None
    schedule = PhaseSchedule(algorithm, cfg.rounds)
    parts = RunParts(cfg, dataset, clock, _NoTraining(), schedule, LocalTaskPool(), start, {}, spec)
    run = RunProgress(0, algorithm.init_state(params), NonFiniteGuard(cfg.max_nonfinite_rounds), writer)
    policy = PlannedRounds()  # the round: engine/policies/planned.py
    try:
        for round_idx in range(cfg.rounds):
            record, clients, _ = policy.round(parts, run, round_idx)
            run.records.append(record)
            write_round(writer, record, clients)
            for callback in callbacks:
                callback(record)
    finally:
        if writer is not None:
            writer.close()
    records = run.records
    result = SearchOnlyResult(records, writer.run_dir if writer is not None else None)
    if writer is not None:
        writer.finish(_summary(cfg, result))
        writer.push()  # a run on a storage URI: its files copied there
    log.info("search-only %s: %d rounds in %.1f s", cfg.name, len(records), time.perf_counter() - start)
    return result


class _NoTraining:
    """The backend of a run that trains and evaluates nothing (``RunParts`` holds one): a call to train or evaluate
    is a bug and says so; there are no faults and no client memories."""

    def _refuse(self) -> RuntimeError:
        return RuntimeError("a search-only run trains and evaluates nothing")

    def begin_round(self, round_idx: int) -> None:
        return None

    def train_and_reduce(
        self, tasks: Sequence[TrainTask], params: Params, initial: Params | None = None
    ) -> tuple[Aggregate, list[ClientOutcome]]:
        raise self._refuse()

    def train_each(
        self, tasks: Sequence[TrainTask], params: Params, initial: Params | None = None
    ) -> tuple[dict[int, KeptUpload], list[ClientOutcome]]:
        raise self._refuse()

    def reduce_uploads(self, params: Params) -> Aggregate:
        raise self._refuse()

    def evaluate(
        self, params: Params, units: tuple[int, ...] | None = None, model_config: ModelConfig | None = None
    ) -> EvalResult:
        raise self._refuse()

    def take_faults(self) -> int:
        return 0

    def client_states(self) -> dict[int, object]:
        return {}

    def client_state_batches(self, size: int) -> Iterator[dict[int, object]]:
        return iter(())

    def load_client_states(self, states: dict[int, object]) -> None:
        raise self._refuse()

    def close(self) -> None:
        return None


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
