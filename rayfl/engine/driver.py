"""The round loop. Reading ``run_experiment`` top to bottom explains the simulator.

The engine owns the loop and never names an algorithm: sampling, assignment, training, reduction, server update,
evaluation and records are each one call into a collaborator.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rayfl.algorithms.base import Algorithm, RoundStats
from rayfl.algorithms.payloads import Aggregate, Assignment, ClientOutcome, LinkDraw, ServerState, TrainTask
from rayfl.config import ExperimentConfig
from rayfl.config_loader import check_clients_per_round, check_output_dir
from rayfl.data.federated import FederatedDataset
from rayfl.engine.backend import Backend, EvalResult
from rayfl.engine.backend_choice import BackendChoice, resolve_backend
from rayfl.engine.build import bind_algorithm, build_backend, build_clock, prepare_run
from rayfl.engine.checkpoint import CheckpointStore
from rayfl.engine.client_state import first_values, pads
from rayfl.engine.export import ModelExporter
from rayfl.engine.guard import NonFiniteError, NonFiniteGuard, all_finite
from rayfl.engine.multieval import (
    client_accuracies,
    device_accuracy,
    evaluate_all_devices,
    evaluate_models,
    model_fields,
    named_evaluations,
    width_structures,
)
from rayfl.engine.phases import PhaseSchedule
from rayfl.engine.records import ClientAccRecord, ClientRecord, EvalRecord, RoundRecord, RunWriter, make_run_dir
from rayfl.engine.resume import RunProgress, load_resume_point, resume_progress, take_snapshot
from rayfl.engine.sampling import sample_clients
from rayfl.engine.server_tasks import build_task_pool
from rayfl.engine.stop import RunInterrupted, StopRequests
from rayfl.engine.tracking import check_tracking, open_trackers
from rayfl.system.clock import ClientPlan, SimClock

__all__ = ["RunResult", "client_records", "mean_finite", "open_run_writer", "run_experiment"]

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
    evals: list[EvalRecord] = field(default_factory=list)  # the algorithm's further evaluated structures
    # wall seconds of start-up: ray_start_s, setup_s (data, algorithm, initial model), put_s, backend_s (actors)
    startup_s: dict[str, float] = field(default_factory=dict)
    # wall seconds of each checkpoint's commit by round (the record files flushed to disk, the manifest, pruning):
    # it follows the round's record, so the record's ``checkpoint_s`` (snapshot and state file) cannot hold it
    checkpoint_commit_s: dict[int, float] = field(default_factory=dict)

    @property
    def model_finite(self) -> bool:
        """Every tensor of the final global state is finite (the CLI exits non-zero otherwise)."""
        return all_finite(self.state.params) and all_finite(self.state.opt_state)


def run_experiment(
    cfg: ExperimentConfig,
    *,
    write: bool = True,
    callbacks: Sequence[RoundCallback] = (),
    dataset: FederatedDataset | None = None,
    cache_dir: Path | None = None,
    resume: Path | None = None,
    backend_choice: BackendChoice | None = None,
) -> RunResult:
    """Run one simulation end to end; with ``write`` the records go to a fresh directory under ``output_dir``; with
    ``resume`` (a run directory) the run continues there from its newest checkpoint (``engine/resume.py``).

    SIGINT or SIGTERM stops a written run after the round in progress, with a checkpoint, and raises
    ``RunInterrupted`` (``engine/stop.py``); too many non-finite rounds in a row raise ``NonFiniteError``
    (``engine/guard.py``). However the run ends, its record files and ``summary.json`` agree.

    The driver's own torch work (server updates, distillation, static BN, search, in-process evaluation) runs at
    ``backend.server_threads`` intra-op threads, restored afterwards: a float sum's order depends on the thread
    count, and the records must not depend on the machine or on ``OMP_NUM_THREADS``.

    ``backend.kind: auto`` is resolved first (``engine/backend_choice.py``; ``backend_choice``: a caller's own
    resolution of it, which ``summary.json`` then records)."""
    if backend_choice is None or cfg.backend.kind == "auto":
        cfg, backend_choice = resolve_backend(cfg)
    log.info("backend: %s", backend_choice.describe())
    given = [dataset]  # handed over, not held here: _run drops the loaded data once the object store has it
    del dataset
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.backend.server_threads)
    try:
        return _run(cfg, write, callbacks, given, cache_dir, resume, backend_choice)
    finally:
        torch.set_num_threads(threads)


def _run(
    cfg: ExperimentConfig,
    write: bool,
    callbacks: Sequence[RoundCallback],
    given: list[FederatedDataset | None],
    cache_dir: Path | None,
    resume: Path | None,
    backend_choice: BackendChoice,
) -> RunResult:
    start = time.perf_counter()
    point = load_resume_point(cfg, resume) if resume is not None else None  # refused before anything starts
    if write and point is None:
        check_output_dir(cfg.output_dir)  # its run directory is made later, once data and backend are ready
    if write:
        check_tracking(cfg)  # a tracker asked for by name has its package
    # on Ray the run keeps the object store's view (setup.dataset), not a reference to the data set given
    setup = prepare_run(cfg, given.pop(), cache_dir)  # with Ray: started meanwhile, data in the object store
    ds, algorithm = setup.dataset, setup.algorithm
    try:
        check_clients_per_round(cfg, ds.num_clients)
        clock = build_clock(cfg, setup)
        bind_algorithm(cfg, setup, clock)
        backend_start = time.perf_counter()
        backend = build_backend(cfg, setup)
    except BaseException:
        if setup.pool is not None:  # the Ray actors prepare_run started (build_backend releases them itself)
            setup.pool.release()
        raise
    startup_s = {**setup.startup_s, "backend_s": time.perf_counter() - backend_start}
    schedule = PhaseSchedule(algorithm, cfg.rounds)  # one phase unless cfg.phases (engine/phases.py)
    pool = build_task_pool(cfg.backend)
    # The run directory appears only once data, traces and backend are ready: bad input leaves nothing behind.
    try:
        if point is not None:
            run = resume_progress(cfg, point, clock, backend, schedule)
        else:
            writer = open_run_writer(cfg) if write else None
            store = CheckpointStore(writer.run_dir, cfg.checkpoint.keep) if writer and cfg.checkpoint.every else None
            guard = NonFiniteGuard(cfg.max_nonfinite_rounds)
            run = RunProgress(0, algorithm.init_state(setup.params), guard, writer, store)
    except BaseException:
        backend.close()
        raise
    writer, records, eval_records = run.writer, run.records, run.eval_records
    exporter = ModelExporter(cfg, setup.input_spec, writer.run_dir) if writer is not None else None
    trackers = open_trackers(cfg, writer.run_dir) if writer is not None else None  # TensorBoard, MLflow
    baseline = most_frequent_label_accuracy(ds)
    status = "finished"
    commit_s: dict[int, float] = {}
    with StopRequests(enabled=writer is not None) as stop:
        try:
            for round_idx in range(run.next_round, cfg.rounds):
                round_start = time.perf_counter()
                backend.begin_round(round_idx)
                # 0. The phase's algorithm; hand-over at a phase's start; a server phase's work (search).
                algorithm, state, phase_server_s = schedule.begin_round(round_idx, run.state, pool)
                # 1. Check-in: who is sampled, their data sizes and their budgets at the round's simulated start.
                per_round = schedule.clients_per_round(round_idx, cfg.clients_per_round)
                client_ids = sample_clients(cfg.seed, round_idx, ds.num_clients, per_round)
                views = clock.check_in(round_idx, client_ids, [ds.num_examples(int(c)) for c in client_ids])
                # 2. Assignment: which (sub-)model each client trains (and state it grows, e.g. a search pool).
                assignments, state = algorithm.assign_with_state(state, round_idx, views)
                server_s = time.perf_counter() - round_start
                # 3. Plan: who fits, who fails, how long each takes; only clients that can finish are run.
                work = algorithm.train_flops(round_idx, views, assignments)  # None: the model's FLOPs x samples
                train = schedule.train(cfg.train, round_idx)  # a phase may train with its own epochs
                plan = clock.plan(round_idx, views, assignments, state.models, train, work)
                lr = schedule.lr(cfg.train, round_idx)
                tasks = [
                    train_task(
                        v.client_id, round_idx, cfg.seed, lr, assignments[v.client_id], state, plan.link(i)
                    ).keeping_upload(cfg.eval_all_devices)
                    for i, (v, runs) in enumerate(zip(views, plan.runs, strict=True))
                    if runs
                ]
                # 4. Local training on the hosts and sharded reduction. Clients that pad what their links lost fall
                # back, where they remember nothing, to each global tensor's value when it was first broadcast.
                if pads(tasks):
                    run.initial_params = first_values(run.initial_params, state.params)
                aggregate, outcomes = (
                    backend.train_and_reduce(tasks, state.params, run.initial_params) if tasks else (_NOTHING, [])
                )
                train_done = time.perf_counter()
                plan = clock.measured_compute(plan, {o.client_id: o.train_wall_s for o in outcomes})
                # 5. Server update (skipped when every client failed: the global model stays), refused when it is not
                # finite (the round is rolled back, engine/guard.py); the clock moves on.
                rolled_back = False
                if aggregate.num_clients > 0:
                    aggregate = dataclasses.replace(aggregate, outcomes=tuple(outcomes))
                    # no server step runs on a non-finite aggregate (None: the guard rolls the round back)
                    new = algorithm.server_update(state, round_idx, aggregate) if all_finite(aggregate.params) else None
                    checked = run.guard.check(round_idx, state, new)
                    rolled_back, state = checked is not new, checked
                run.state = state
                server_s += time.perf_counter() - train_done
                sim_duration = clock.advance(plan, server_s, phase_server_s)
                # 6. Evaluation of the global model (of every global model when the run holds several).
                evaluated = (round_idx + 1) % cfg.eval_every == 0 or round_idx == cfg.rounds - 1
                eval_start = time.perf_counter()
                evals: list[EvalResult] | None = None
                structure_evals: list[EvalRecord] = []
                client_accs: list[ClientAccRecord] = []
                device_fields: dict[str, Any] = {}  # the device averages, the all-device model's main figures
                if evaluated:
                    run.last_eval, evals, structure_evals, device_fields, client_accs = evaluate_round(
                        cfg, backend, algorithm, state, clock, ds, round_idx
                    )
                    if exporter is not None:  # the models written at the end (engine/export.py)
                        exporter.observe(round_idx, state, algorithm, [e.accuracy for e in evals])
                now = time.perf_counter()
                # 7. Records, and a checkpoint when one is due (its state file first, so its size and time are in the
                # round's record; its manifest after the record files, which it measures).
                ok = [o for o in outcomes if o.failure is None]
                clients = client_records(plan, outcomes, assignments)
                stats = algorithm.round_stats()
                weights = np.array([o.num_examples for o in ok], dtype=np.float64)
                losses = np.array([o.train_loss for o in ok], dtype=np.float64)
                record = RoundRecord(
                    round_idx=round_idx,
                    sim_time_s=clock.now,
                    train_loss=float(weights @ losses / weights.sum()) if len(ok) else math.nan,
                    test_acc=run.last_eval.accuracy if evaluated else math.nan,
                    test_loss=run.last_eval.loss if evaluated else math.nan,
                    clients_run=len(outcomes),
                    clients_failed=len(client_ids) - len(ok),
                    bytes_down=sum(o.bytes_down for o in outcomes),
                    bytes_up=sum(o.bytes_up for o in outcomes if o.failure in (None, "link_up")),  # lost uploads
                    wall_time_s=run.wall_offset_s + now - start,
                    round_wall_s=now - round_start,
                    train_wall_s=train_done - round_start,
                    eval_wall_s=now - eval_start,
                    lr=lr,
                    sim_duration_s=sim_duration,
                    clients_sampled=len(client_ids),
                    **system_fields(plan.memory_util[plan.runs], plan.bandwidth_util[plan.runs], clients, stats),
                    server_train_s=stats.server_train_s,
                    phase=schedule.phase_at(round_idx).name,
                    **model_fields(evals, state, outcomes, client_accs),
                    **device_fields,
                    train_macs=float(plan.train_flops[plan.runs].sum()) / 2.0 if len(plan.train_flops) else 0.0,
                    faults=backend.take_faults(),
                    rolled_back=int(rolled_back),
                )
                run.next_round = round_idx + 1
                stopping = stop.requested  # decided here, so that a stopping round always writes its checkpoint
                with stop.critical():
                    pending = None
                    if run.store is not None and _checkpoint_due(cfg, round_idx, stopping):
                        began = time.perf_counter()  # gathering the snapshot (client memories) counts too
                        snapshot = take_snapshot(run, clock, backend, schedule, record.wall_time_s)
                        pending = run.store.write_state(snapshot)
                        spent = time.perf_counter() - began
                        record = dataclasses.replace(record, checkpoint_bytes=pending.state_bytes, checkpoint_s=spent)
                    records.append(record)
                    eval_records.extend(structure_evals)
                    if writer is not None:
                        writer.append_evals(structure_evals)
                        writer.append_client_accs(client_accs)
                        writer.append_clients(clients)
                        writer.append(record)
                        if pending is not None and run.store is not None:
                            began = time.perf_counter()
                            run.store.commit(pending, writer.sizes(sync=True))
                            commit_s[round_idx] = time.perf_counter() - began
                for callback in callbacks:
                    callback(record)
                if trackers is not None:
                    trackers.log_round(record, structure_evals)
                run.guard.raise_if_exhausted(round_idx)
                if stopping and run.next_round < cfg.rounds:  # a stop asked for in the last round changes nothing
                    status = "interrupted"
                    break
        except NonFiniteError:
            status = "stopped: non-finite model"
            raise
        except KeyboardInterrupt:
            status = "interrupted"  # a second signal, or Ctrl-C where no handler could be installed
            raise
        except BaseException as err:
            status = f"error: {type(err).__name__}"
            raise
        finally:
            backend.close()
            if writer is not None:
                with stop.critical():  # the Parquet files and summary.json are written whole, whatever arrives
                    summary = _summary(cfg, schedule, records, run, baseline, status)
                    summary["backend"] = backend_choice.as_dict()
                    writer.finish(summary)
                if trackers is not None:
                    trackers.close(summary)
    if exporter is not None and status in ("finished", "interrupted"):
        exporter.write()
    if stop.signum is not None and status == "interrupted":
        saved = run.store.manifests()[-1] if run.store is not None and run.store.manifests() else None
        raise RunInterrupted(stop.signum, run.next_round, writer.run_dir if writer else None, saved)
    run_dir = writer.run_dir if writer else None
    return RunResult(records, run.state, run_dir, run.last_eval, baseline, eval_records, startup_s, commit_s)


def _checkpoint_due(cfg: ExperimentConfig, round_idx: int, stopping: bool) -> bool:
    """Every ``checkpoint.every`` rounds, after the last round, and when a signal stops the run."""
    every = cfg.checkpoint.every
    return every > 0 and ((round_idx + 1) % every == 0 or round_idx == cfg.rounds - 1 or stopping)


def evaluate_round(
    cfg: ExperimentConfig,
    backend: Backend,
    algorithm: Algorithm,
    state: ServerState,
    clock: SimClock,
    ds: FederatedDataset,
    round_idx: int,
) -> tuple[EvalResult, list[EvalResult], list[EvalRecord], dict[str, float], list[ClientAccRecord]]:
    """An evaluated round: the main evaluation, every global model's, the named structures' (``evals.csv`` rows),
    the average over devices' models (``device_acc``; with ``eval_all_devices`` the all-device model's figures and
    rows too) and, with per-client test data, each client's accuracy on its model."""
    eval_params = algorithm.eval_params(state)
    main = backend.evaluate(eval_params, algorithm.eval_units(state))
    evals = evaluate_models(backend, algorithm, state, main)
    wanted = algorithm.eval_structures(state)
    for name, units in width_structures(clock.oracle.family, cfg.eval_widths).items():
        if name in wanted:
            raise ValueError(f"eval_widths: {name!r} is also a structure {algorithm.name} evaluates")
        wanted = {**wanted, name: units}
    structures = {name: backend.evaluate(eval_params, units) for name, units in wanted.items()}
    named_evals = named_evaluations(algorithm, state, evals, structures)
    accs = {name: e.accuracy for name, e in named_evals.items()}
    named = [*structures.items(), *zip(algorithm.model_names(state)[1:], evals[1:], strict=True)]
    structure_evals = [EvalRecord(round_idx, n, e.accuracy, e.loss) for n, e in named]
    # every device of the run, with its budgets now, for the average over devices' models
    everyone = np.arange(ds.num_clients)
    census = clock.check_in(round_idx, everyone, [ds.num_examples(int(c)) for c in everyone])
    client_accs = client_accuracies(ds, named_evals, algorithm, state, census, round_idx)
    fields = {"device_acc": device_accuracy(accs, algorithm, state, census)}
    if cfg.eval_all_devices:
        all_fields, all_rows = evaluate_all_devices(backend, algorithm, state, wanted, census, round_idx)
        fields.update(all_fields)
        structure_evals.extend(all_rows)
    return main, evals, structure_evals, fields, client_accs


_NOTHING = Aggregate(params={}, coverage={}, num_clients=0)
_MIB, _MB = 2.0**20, 1e6


def system_fields(
    memory_util: np.ndarray, bandwidth_util: np.ndarray, clients: Sequence[ClientRecord], stats: RoundStats
) -> dict[str, Any]:
    """A round record's system columns, shared by training and search-only runs: mean utilisation of the clients
    that ran, failures by cause, over-budget clients and the algorithm's search statistics."""
    causes = [r.failure for r in clients]
    return {
        "memory_util": mean_finite(memory_util),
        "bandwidth_util": mean_finite(bandwidth_util),
        "failed_memory": causes.count("memory"),
        "failed_bandwidth": causes.count("bandwidth"),
        "failed_memory_dip": causes.count("memory_dip"),
        "failed_other": sum(1 for c in causes if c not in ("", "memory", "bandwidth", "memory_dip")),
        "over_budget": sum(1 for r in clients if r.over_budget and not r.failure),
        "search_s": stats.search_s,
        "distinct_structures": stats.distinct_structures,
        "hit_rate": stats.hit_rate,
    }


def mean_finite(values: np.ndarray) -> float:
    """The mean of the finite entries (NaN when there are none): utilisation over clients with finite budgets."""
    finite = values[np.isfinite(values)]
    return float(finite.mean()) if len(finite) else math.nan


def client_records(
    plan: ClientPlan, outcomes: Sequence[ClientOutcome], assignments: Mapping[int, Assignment]
) -> list[ClientRecord]:
    """One row per sampled client: the plan's numbers, and the failure the plan or the training produced."""
    trained = {o.client_id: o.failure for o in outcomes}
    links = {o.client_id: (o.p_down, o.p_up) for o in outcomes}
    over = plan.over_budget or ("",) * len(plan.client_id)
    return [
        ClientRecord(
            round_idx=plan.round_idx,
            client_id=int(c),
            memory_budget_mib=float(plan.memory_budget[i] / _MIB),
            memory_need_mib=float(plan.memory_need[i] / _MIB),
            memory_util=float(plan.memory_util[i]),
            bandwidth_budget_mb=float(plan.bandwidth_budget[i] / _MB),
            bandwidth_need_mb=float(plan.bandwidth_need[i] / _MB),
            bandwidth_util=float(plan.bandwidth_util[i]),
            download_s=float(plan.download_s[i]),
            compute_s=float(plan.compute_s[i]),
            upload_s=float(plan.upload_s[i]),
            failure=plan.failure[i] or trained.get(int(c)) or "",
            over_budget=over[i],
            units=_units_text(assignments[int(c)].units),
            p_down=links.get(int(c), (math.nan, math.nan))[0],
            p_up=links.get(int(c), (math.nan, math.nan))[1],
            model_id=assignments[int(c)].model_id,
            train_macs=float(plan.train_flops[i]) / 2.0 if plan.failure[i] is None and len(plan.train_flops) else 0.0,
        )
        for i, c in enumerate(plan.client_id)
    ]


def train_task(
    client_id: int,
    round_idx: int,
    seed: int,
    lr: float,
    assignment: Assignment,
    state: ServerState,
    link: LinkDraw | None = None,
) -> TrainTask:
    """A client's task; in a multi-model run it carries the architecture of the model it was assigned, under unstable
    links what this round's transfers deliver."""
    config = state.models[assignment.model_id] if state.models else None
    return TrainTask(client_id, round_idx, seed, lr, assignment, link=link, model_config=config)


def _units_text(units: tuple[int, ...] | None) -> str:
    return "" if units is None else " ".join(str(u) for u in units)


def most_frequent_label_accuracy(ds: FederatedDataset) -> float:
    """Test accuracy of always predicting the most frequent training label (the trivial baseline)."""
    if len(ds.y_test) == 0:
        return math.nan
    top = int(np.bincount(np.asarray(ds.y, dtype=np.int64), minlength=ds.num_classes).argmax())
    return float(np.mean(np.asarray(ds.y_test) == top))


def open_run_writer(cfg: ExperimentConfig) -> RunWriter:
    """A writer on a fresh run directory ``output_dir/name`` holding the resolved config."""
    from rayfl.config_loader import config_to_dict

    return RunWriter(make_run_dir(cfg.output_dir, cfg.name), config_to_dict(cfg))


def _summary(
    cfg: ExperimentConfig,
    schedule: PhaseSchedule,
    records: list[RoundRecord],
    run: RunProgress,
    baseline: float,
    status: str,
) -> dict[str, object]:
    """``summary.json``: the run's outcome from the rounds recorded so far, however it ended (``status``)."""
    final = run.last_eval
    summary: dict[str, object] = {
        "name": cfg.name,
        "algorithm": cfg.algorithm_label,
        "final_test_acc": final.accuracy,
        "final_test_loss": final.loss,
        "baseline_acc": baseline,
        "rounds": len(records),
        "wall_time_s": records[-1].wall_time_s if records else 0.0,
        "sim_time_s": records[-1].sim_time_s if records else 0.0,
        "status": status,
        "rounds_rolled_back": sum(r.rolled_back for r in records),
        "rounds_all_failed": sum(1 for r in records if r.clients_sampled > 0 and r.clients_failed == r.clients_sampled),
        "final_model_finite": all_finite(run.state.params) and all_finite(run.state.opt_state),
    }
    if cfg.phases:
        try:
            summary["phases"] = schedule.summary(records, run.state)
        except Exception:  # an error in a phase's own report must not hide the run's outcome
            if status == "finished":
                raise
            log.exception("the phases' summary could not be made")
    last = schedule.algorithm_at(min(max(run.next_round - 1, 0), cfg.rounds - 1))
    extra = last.run_summary(run.state)  # the last phase's own figures under its name (FedTrans: the family it grew)
    if extra:
        summary[last.name] = extra
    return summary
