"""A run's start-up, in one place: what is decided and checked once (``plan_start``), then the parts built in order
(``start_run``). ``rayfl run``, ``run_experiment`` and a sweep's trials all go through ``plan_start``; the parts it
builds come from the factories of ``engine/build.py``, each called once here.

``plan_start`` resolves ``backend.kind: auto`` (``engine/backend_choice.py``) and checks where the run writes: the
output directory (a bucket that is missing, unreachable or read-only refused now) and its trackers' packages. The
``StartPlan`` it returns carries the resolved config, so nothing later resolves the backend again: the factories
take the kind the plan chose (``build.prepare_run`` and ``build.build_backend`` refuse ``auto``).

``start_run`` then builds, in this order: the data, algorithm and initial model (with Ray: Ray and the actors started
meanwhile, ``build.prepare_run``), the simulated clock, the algorithm's server side, the check that someone can train,
the backend, the round schedule and the server-side task pool, and last the run directory (or the resumed run's
progress), so that bad input leaves nothing behind.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from rayfl.engine.backend_choice import BackendChoice, resolve_backend
from rayfl.engine.persist.records import RunWriter, make_run_dir
from rayfl.engine.persist.storage import check_storage, is_storage_uri, open_storage
from rayfl.engine.persist.tracking import check_tracking
from rayfl.experiment.loader import check_clients_per_round, check_output_dir
from rayfl.experiment.schema import ExperimentConfig

if TYPE_CHECKING:
    from rayfl.data.federated import FederatedDataset
    from rayfl.engine.parts import RunParts
    from rayfl.engine.persist.resume import RunProgress
    from rayfl.engine.stop import StopRequests

__all__ = ["StartPlan", "open_run_writer", "plan_start", "start_run"]


@dataclass(frozen=True)
class StartPlan:
    """What a run's start decided once: the config with ``backend.kind`` resolved (never ``auto``), the backend
    choice and its reason, whether the run writes records, and the run directory it resumes (if any)."""

    cfg: ExperimentConfig
    choice: BackendChoice
    write: bool = True
    resume: Path | None = None


def plan_start(cfg: ExperimentConfig, *, write: bool = True, resume: Path | None = None) -> StartPlan:
    """Resolve the backend and check where the run writes, before Ray starts or the data loads. A resumed run writes
    into its own directory (``persist/resume.py`` checks it), so only a new run's output directory is checked."""
    if write and resume is None:
        check_output_dir(cfg.output_dir)  # its run directory is made last, once data and backend are ready
        if is_storage_uri(cfg.output_dir):  # a bucket that is missing, unreachable or read-only: refused now
            check_storage(open_storage(cfg.output_dir))
    if write:
        check_tracking(cfg)  # a tracker asked for by name has its package
    resolved, choice = resolve_backend(cfg)
    return StartPlan(resolved, choice, write, resume)


def start_run(
    plan: StartPlan, dataset: list[FederatedDataset | None], cache_dir: Path | None, stop: StopRequests
) -> tuple[RunParts, RunProgress]:
    """The run's parts and where it starts: round 0 with the algorithm's initial state, or a checkpoint's progress
    (the module docstring gives the order). ``dataset`` holds a caller's data set, popped here so that on Ray the run
    keeps the object store's view of it, not a reference to the one given."""
    # imported here, not above: ``rayfl run`` plans its start before torch is imported (it imports the engine while
    # Ray starts, ``engine/ray/session.py``'s ``prestart``)
    from rayfl.engine.build import bind_algorithm, build_backend, build_clock, build_task_pool, prepare_run
    from rayfl.engine.guard import NonFiniteGuard
    from rayfl.engine.parts import RunParts
    from rayfl.engine.persist.checkpoint import CheckpointStore
    from rayfl.engine.persist.resume import RunProgress, load_resume_point, resume_progress
    from rayfl.engine.phases import PhaseSchedule
    from rayfl.engine.preflight import check_someone_can_train

    cfg = plan.cfg
    start = time.perf_counter()
    point = load_resume_point(cfg, plan.resume) if plan.resume is not None else None  # refused before anything starts
    setup = prepare_run(cfg, dataset.pop(), cache_dir)  # with Ray: started meanwhile, data in the object store
    ds, algorithm = setup.dataset, setup.algorithm
    try:
        check_clients_per_round(cfg, ds.num_clients)
        clock = build_clock(cfg, setup)
        bind_algorithm(cfg, setup, clock)
        if point is None:
            check_someone_can_train(cfg, setup, clock)  # refused now, not after every round failed all its clients
        backend_start = time.perf_counter()
        backend = build_backend(cfg, setup)
    except BaseException:
        if setup.pool is not None:  # the Ray actors prepare_run started (build_backend releases them itself)
            setup.pool.release()
        raise
    startup_s = {**setup.startup_s, "backend_s": time.perf_counter() - backend_start}
    schedule = PhaseSchedule(algorithm, cfg.rounds)  # one phase unless cfg.phases (engine/phases.py)
    pool = build_task_pool(cfg.backend)
    parts = RunParts(cfg, ds, clock, backend, schedule, pool, start, startup_s, setup.input_spec)
    # A signal while the run directory is made (or a resumed run's records are cut back) takes effect once that is
    # done; from then on a signal stops after the round in progress, with a checkpoint.
    try:
        with stop.critical():
            if point is not None:
                run = resume_progress(cfg, point, clock, backend, schedule)
            else:
                writer = open_run_writer(cfg) if plan.write else None
                keep = cfg.checkpoint.keep
                store = CheckpointStore(writer.run_dir, keep) if writer and cfg.checkpoint.every else None
                guard = NonFiniteGuard(cfg.max_nonfinite_rounds)
                run = RunProgress(0, algorithm.init_state(setup.params), guard, writer, store)
            stop.begin_rounds()
        return parts, run
    except BaseException:
        backend.close()
        raise


def open_run_writer(cfg: ExperimentConfig) -> RunWriter:
    """A writer on a fresh run directory ``output_dir/name`` holding the resolved config."""
    from rayfl.experiment.loader import config_to_dict

    writer = RunWriter(make_run_dir(cfg.output_dir, cfg.name), config_to_dict(cfg))
    writer.push()  # on a storage URI, the run's name is taken there by its config.yaml
    return writer
