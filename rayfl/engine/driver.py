"""The round loop. Reading ``run_experiment`` top to bottom explains the simulator.

The engine owns the loop and never names an algorithm: sampling, assignment, training, reduction, server update,
evaluation and records are each one call into a collaborator.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rayfl.algorithms import round_lr
from rayfl.algorithms.payloads import ClientView, ServerState, TrainTask
from rayfl.config import ExperimentConfig
from rayfl.data.federated import FederatedDataset
from rayfl.engine.backend import EvalResult
from rayfl.engine.build import build_backend, build_setup
from rayfl.engine.records import RoundRecord, RunWriter, make_run_dir
from rayfl.engine.sampling import sample_clients

__all__ = ["RunResult", "run_experiment"]

log = logging.getLogger(__name__)

RoundCallback = Callable[[RoundRecord], None]


@dataclass(frozen=True)
class RunResult:
    """The finished run: its records, final state and where it was written."""

    records: list[RoundRecord]
    state: ServerState
    run_dir: Path | None
    final_eval: EvalResult
    baseline_acc: float


def run_experiment(
    cfg: ExperimentConfig,
    *,
    write: bool = True,
    callbacks: Sequence[RoundCallback] = (),
    dataset: FederatedDataset | None = None,
    cache_dir: Path | None = None,
) -> RunResult:
    """Run one simulation end to end; with ``write`` the records go to a fresh directory under ``output_dir``."""
    start = time.perf_counter()
    setup = build_setup(cfg, dataset, cache_dir)
    ds, algorithm = setup.dataset, setup.algorithm
    if cfg.clients_per_round > ds.num_clients:
        raise ValueError(f"clients_per_round={cfg.clients_per_round} exceeds the {ds.num_clients} clients of the data")
    writer = _open_writer(cfg) if write else None
    backend = build_backend(cfg, setup)
    state = algorithm.init_state(setup.params)
    records: list[RoundRecord] = []
    last_eval = EvalResult(float("nan"), float("nan"), 0)
    try:
        for round_idx in range(cfg.rounds):
            round_start = time.perf_counter()
            # 1. Check-in: who is sampled, and what the algorithm may know about them.
            client_ids = sample_clients(cfg.seed, round_idx, ds.num_clients, cfg.clients_per_round)
            views = [ClientView(int(c), ds.num_examples(int(c))) for c in client_ids]
            # 2. Assignment: which (sub-)model each client trains.
            assignments = algorithm.assign(state, round_idx, views)
            lr = round_lr(cfg.train, round_idx, cfg.rounds)
            tasks = [TrainTask(v.client_id, round_idx, cfg.seed, lr, assignments[v.client_id]) for v in views]
            # 3. Local training on the hosts and sharded reduction.
            aggregate, outcomes = backend.train_and_reduce(tasks, state.params)
            train_done = time.perf_counter()
            # 4. Server update (skipped when every client failed: the global model stays).
            if aggregate.num_clients > 0:
                state = algorithm.server_update(state, round_idx, aggregate)
            # 5. Evaluation of the global model.
            evaluated = (round_idx + 1) % cfg.eval_every == 0 or round_idx == cfg.rounds - 1
            eval_start = time.perf_counter()
            if evaluated:
                last_eval = backend.evaluate(algorithm.eval_params(state))
            now = time.perf_counter()
            # 6. Records.
            ok = [o for o in outcomes if o.failure is None]
            weights = np.array([o.num_examples for o in ok], dtype=np.float64)
            losses = np.array([o.train_loss for o in ok], dtype=np.float64)
            record = RoundRecord(
                round_idx=round_idx,
                sim_time_s=0.0,
                train_loss=float(weights @ losses / weights.sum()) if len(ok) else math.nan,
                test_acc=last_eval.accuracy if evaluated else math.nan,
                test_loss=last_eval.loss if evaluated else math.nan,
                clients_run=len(outcomes),
                clients_failed=len(outcomes) - len(ok),
                bytes_down=sum(o.bytes_down for o in outcomes),
                bytes_up=sum(o.bytes_up for o in ok),
                wall_time_s=now - start,
                round_wall_s=now - round_start,
                train_wall_s=train_done - round_start,
                eval_wall_s=now - eval_start,
                lr=lr,
            )
            records.append(record)
            if writer is not None:
                writer.append(record)
            for callback in callbacks:
                callback(record)
    finally:
        backend.close()
        if writer is not None:
            writer.close()
    baseline = most_frequent_label_accuracy(ds)
    if writer is not None:
        writer.finish(_summary(cfg, records, last_eval, baseline))
    return RunResult(records, state, writer.run_dir if writer else None, last_eval, baseline)


def most_frequent_label_accuracy(ds: FederatedDataset) -> float:
    """Test accuracy of always predicting the most frequent training label (the trivial baseline)."""
    if len(ds.y_test) == 0:
        return math.nan
    top = int(np.bincount(np.asarray(ds.y, dtype=np.int64), minlength=ds.num_classes).argmax())
    return float(np.mean(np.asarray(ds.y_test) == top))


def _open_writer(cfg: ExperimentConfig) -> RunWriter:
    from rayfl.config_loader import config_to_dict

    return RunWriter(make_run_dir(cfg.output_dir, cfg.name), config_to_dict(cfg))


def _summary(
    cfg: ExperimentConfig, records: list[RoundRecord], final: EvalResult, baseline: float
) -> dict[str, object]:
    return {
        "name": cfg.name,
        "algorithm": cfg.algorithm.name,
        "final_test_acc": final.accuracy,
        "final_test_loss": final.loss,
        "baseline_acc": baseline,
        "rounds": len(records),
        "wall_time_s": records[-1].wall_time_s if records else 0.0,
        "sim_time_s": records[-1].sim_time_s if records else 0.0,
    }
