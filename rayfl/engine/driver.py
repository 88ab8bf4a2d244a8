"""The run: start-up, the loop over rounds, stop signals and how the run ends. Reading ``_run`` explains a run;
the round itself is the round policy's (``engine/policies/``: ``sync.py`` reads top to bottom as one round).

The engine owns the loop and never names an algorithm. A policy's ``round`` is one round as numbered steps (phase,
check-in, assignment, plan, training and reduction, server update, evaluation, records), each one call into a
collaborator: ``engine/steps.py`` holds the steps, ``engine/round_record.py`` builds the round's rows (for
search-only runs too); an asynchronous policy's round is one server step on the simulated clock (``buffered.py``).
``_keep_round`` (step 8) writes the rows and a checkpoint when one is due; ``_run`` around them handles stop
signals and how the run ends. Start-up (what is resolved and checked once, then the parts built in order) is
``engine/startup.py``'s.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from rayfl.core.errors import RunLostError
from rayfl.core.messages import ServerState
from rayfl.data.federated import FederatedDataset, LazyRows
from rayfl.engine.exec.backend import EvalResult
from rayfl.engine.guard import NonFiniteError, all_finite
from rayfl.engine.parts import RunParts
from rayfl.engine.persist.checkpoint import CLIENT_BATCH
from rayfl.engine.persist.export import ModelExporter
from rayfl.engine.persist.records import ClientRecord, EvalRecord, RoundRecord, RunWriter
from rayfl.engine.persist.resume import RunProgress, take_snapshot
from rayfl.engine.persist.tracking import open_trackers
from rayfl.engine.persist.write_errors import RunWriteError
from rayfl.engine.phases import PhaseSchedule
from rayfl.engine.policies import build_policy
from rayfl.engine.round_record import RoundEvaluation
from rayfl.engine.startup import StartPlan, plan_start, start_run
from rayfl.engine.steps import write_round
from rayfl.engine.stop import RunInterrupted, StopRequests
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api import capabilities
from rayfl.models.encoding import InputEncoding

__all__ = ["RunResult", "most_frequent_label_accuracy", "run_experiment"]

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
    plan: StartPlan | None = None,
) -> RunResult:
    """Run one simulation end to end; with ``write`` the records go to a fresh directory under ``output_dir``; with
    ``resume`` (a run directory) the run continues there from its newest checkpoint (``engine/persist/resume.py``).

    SIGINT or SIGTERM stops a written run after the round in progress, with a checkpoint, and raises
    ``RunInterrupted`` (``engine/stop.py``); too many non-finite rounds in a row raise ``NonFiniteError``
    (``engine/guard.py``). However the run ends, its record files and ``summary.json`` agree.

    The driver's own torch work (server updates, distillation, static BN, search, in-process evaluation) runs at
    ``backend.server_threads`` intra-op threads, restored afterwards: a float sum's order depends on the thread
    count, and the records must not depend on the machine or on ``OMP_NUM_THREADS``.

    Start-up is ``engine/startup.py``'s: ``plan_start`` resolves ``backend.kind: auto`` and checks where the run
    writes, once (``plan``: a caller's own plan of this run, ``rayfl run``'s, which ``summary.json`` then records
    and which replaces ``cfg``, ``write`` and ``resume``); ``start_run`` builds the parts."""
    if plan is None:
        plan = plan_start(cfg, write=write, resume=resume)
    log.info("backend: %s", plan.choice.describe())
    given = [dataset]  # handed over, not held here: _run drops the loaded data once the object store has it
    del dataset
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.backend.server_threads)
    # a signal before the first round stops at once (nothing written yet), afterwards after the round in progress
    try:
        with StopRequests(enabled=write, setup=True) as stop:
            return _run(plan, callbacks, given, cache_dir, stop)
    finally:
        torch.set_num_threads(threads)


def _run(
    plan: StartPlan,
    callbacks: Sequence[RoundCallback],
    given: list[FederatedDataset | None],
    cache_dir: Path | None,
    stop: StopRequests,
) -> RunResult:
    cfg = plan.cfg
    parts, run = start_run(plan, given, cache_dir, stop)
    policy = build_policy(cfg)  # when the server aggregates (engine/policies/): sync unless server.policy says
    writer, records = run.writer, run.records
    encoding = InputEncoding.of(parts.dataset.meta, parts.input_spec)  # the vocabulary and names the export carries
    exporter = ModelExporter(cfg, parts.input_spec, writer.run_dir, encoding) if writer is not None else None
    trackers = open_trackers(cfg, writer.run_dir) if writer is not None else None  # TensorBoard, MLflow
    baseline = most_frequent_label_accuracy(parts.dataset)
    status = "finished"
    commit_s: dict[int, float] = {}
    with stop.rounds():
        try:
            for round_idx in range(run.next_round, cfg.rounds):
                record, clients, evaluation = policy.round(parts, run, round_idx)
                if exporter is not None and evaluation is not None:  # the models written at the end (persist/export)
                    algorithm = parts.schedule.algorithm_at(round_idx)
                    exporter.observe(round_idx, run.state, algorithm, [e.accuracy for e in evaluation.models])
                run.next_round = round_idx + 1
                stopping = stop.requested  # decided here, so that a stopping round always writes its checkpoint
                with stop.critical():
                    record = _keep_round(parts, run, record, clients, evaluation, stopping, commit_s)
                for callback in callbacks:
                    callback(record)
                if trackers is not None:
                    trackers.log_round(record, evaluation.structures if evaluation is not None else [])
                run.guard.raise_if_exhausted(round_idx)
                if stopping and run.next_round < cfg.rounds:  # a stop asked for in the last round changes nothing
                    status = "interrupted"
                    break
        except NonFiniteError:
            status = "stopped: non-finite model"
            raise
        except RunLostError as err:  # Ray actors, a node or an in-process worker lost for good
            status = f"error: {type(err).__name__}"
            err.resume_hint(_resume_hint(run))
            raise
        except KeyboardInterrupt:
            status = "interrupted"  # a second signal, or Ctrl-C where no handler could be installed
            raise
        except BaseException as err:
            status = f"error: {type(err).__name__}"
            raise
        finally:
            parts.backend.close()
            if writer is not None:
                with stop.critical():  # the Parquet files and summary.json are written whole, whatever arrives
                    summary = _summary(cfg, parts.schedule, records, run, baseline, status)
                    summary["backend"] = plan.choice.as_dict()
                    writer.finish(summary, failing=status.startswith("error"))
                if trackers is not None:
                    trackers.close(summary)
                _push_at_end(writer, failing=status != "finished" and status != "interrupted")
    if exporter is not None and status in ("finished", "interrupted"):
        exporter.write()
        if writer is not None:
            writer.push()  # the exported models (a run on a storage URI)
    if stop.signum is not None and status == "interrupted":
        saved = run.store.manifests()[-1] if run.store is not None and run.store.manifests() else None
        shown = writer.mirror.remote.shown if writer is not None and writer.mirror is not None else ""
        raise RunInterrupted(stop.signum, run.next_round, writer.run_dir if writer else None, saved, shown)
    run_dir = writer.run_dir if writer else None
    return RunResult(records, run.state, run_dir, run.last_eval, baseline, run.eval_records, parts.startup_s, commit_s)


def _keep_round(
    parts: RunParts,
    run: RunProgress,
    record: RoundRecord,
    clients: list[ClientRecord],
    evaluation: RoundEvaluation | None,
    stopping: bool,
    commit_s: dict[int, float],
) -> RoundRecord:
    """8. The round kept: a checkpoint's state file when one is due (first, so that its size and time are in the
    round's record), the rows in ``run`` and in the record files, then the checkpoint's manifest (it measures the
    record files; its seconds go to ``commit_s``). Returns the record as kept. Called where no signal interrupts."""
    pending = None
    if run.store is not None and _checkpoint_due(parts.cfg, record.round_idx, stopping):
        began = time.perf_counter()  # gathering the snapshot (client memories) counts too
        snapshot = take_snapshot(run, parts.clock, parts.schedule, record.wall_time_s)
        # the clients' memories stream from where they are kept into part files beside the state file
        pending = run.store.write_state(snapshot, parts.backend.client_state_batches(CLIENT_BATCH))
        spent = time.perf_counter() - began
        record = dataclasses.replace(record, checkpoint_bytes=pending.total_bytes, checkpoint_s=spent)
    run.records.append(record)
    if evaluation is not None:
        run.eval_records.extend(evaluation.structures)
    write_round(run.writer, record, clients, evaluation)
    if pending is not None and run.store is not None and run.writer is not None:
        began = time.perf_counter()
        run.store.commit(pending, run.writer.sizes(sync=True))
        run.writer.push()  # a run on a storage URI: the checkpoint and the records so far copied there
        commit_s[record.round_idx] = time.perf_counter() - began
    return record


def _resume_hint(run: RunProgress) -> str:
    """Where a run that Ray gave up on resumes from: its newest checkpoint, if it wrote one."""
    manifests = run.store.manifests() if run.store is not None else []
    if not manifests or run.writer is None:
        return ""
    rounds_done = int(manifests[-1].stem.rsplit("-", 1)[1])
    return (
        f"; resume from its checkpoint after round {rounds_done - 1} on a cluster that can hold the run: "
        f"rayfl run --resume {run.writer.mirror.remote.shown if run.writer.mirror else run.writer.run_dir}"
    )


def _checkpoint_due(cfg: ExperimentConfig, round_idx: int, stopping: bool) -> bool:
    """Every ``checkpoint.every`` rounds, after the last round, and when a signal stops the run."""
    every = cfg.checkpoint.every
    return every > 0 and ((round_idx + 1) % every == 0 or round_idx == cfg.rounds - 1 or stopping)


_BASELINE_ROWS = 8192


def most_frequent_label_accuracy(ds: FederatedDataset) -> float:
    """Test accuracy of always predicting the most frequent training label (the trivial baseline); with labels made
    on demand, the most frequent of the first ``_BASELINE_ROWS`` (labelling every row would undo a lazy set-up)."""
    if len(ds.y_test) == 0:
        return math.nan
    y = ds.y[:_BASELINE_ROWS] if isinstance(ds.y, LazyRows) else ds.y
    top = int(np.bincount(np.asarray(y, dtype=np.int64), minlength=ds.num_classes).argmax())
    return float(np.mean(np.asarray(ds.y_test) == top))


def _push_at_end(writer: RunWriter | None, failing: bool) -> None:
    """The run's last copy to its storage (a run on a storage URI); while the run ends on an error already, a copy
    that fails too is logged (the staging folder keeps the files) rather than hiding that error."""
    if writer is None:
        return
    try:
        writer.push()
    except RunWriteError as err:
        if not failing:
            raise
        log.warning("while ending on an error: %s", err)


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
    extra = capabilities.run_summary(last, run.state)  # the last phase's own figures (FedTrans: the family it grew)
    if extra:
        summary[last.name] = extra
    return summary
