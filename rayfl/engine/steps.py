"""The steps of one round, each a function; a round policy (``engine/policies/``) calls them in order, a
search-only round (``policies/planned.py``) the first three, and every policy ends its round (steps 6 and 7) through
``policies/round_end.py``.

1. ``check_in``: who is sampled, their data sizes and budgets at the round's simulated start.
2. assignment: one call of the algorithm (in the loop itself, so that the hook is visible where it is called).
3. ``plan_clients``: who fits, who fails, how long each takes (before anything runs); ``train_tasks``: the work of
   the clients that can finish.
4. ``train_clients``: local training on the hosts and the sharded reduction.
5. ``update_server``: the server optimizer and the algorithm's server step on the aggregate
   (``fl/common/server_opt.py:server_step``), refused by the guard when not finite.
6. ``evaluate_round``: every evaluation of an evaluated round.
7. ``round_record.round_record``: the round's rows; ``write_round`` appends them to the run directory.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from rayfl.config.model import as_model_configs
from rayfl.config.sections import ServerOptimizerConfig, TrainConfig
from rayfl.core.messages import (
    Aggregate,
    Assignment,
    ClientOutcome,
    ClientView,
    LinkDraw,
    Params,
    ServerState,
    TrainTask,
)
from rayfl.data.federated import FederatedDataset
from rayfl.engine.exec.backend import Backend
from rayfl.engine.guard import NonFiniteGuard, all_finite
from rayfl.engine.multieval import (
    client_accuracies,
    device_accuracy,
    evaluate_all_devices,
    evaluate_models,
    named_evaluations,
    uniform_device_accuracy,
    uniform_device_eval,
    width_structures,
)
from rayfl.engine.persist.records import ClientAccRecord, ClientRecord, EvalRecord, RoundRecord, RunWriter
from rayfl.engine.round_record import RoundEvaluation
from rayfl.engine.sampling import sample_clients
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api import capabilities
from rayfl.fl.api.algorithm import Algorithm
from rayfl.fl.common.server_opt import server_step
from rayfl.system.clock import ClientPlan, SimClock

__all__ = [
    "check_in",
    "evaluate_round",
    "evaluation_due",
    "plan_clients",
    "train_clients",
    "train_task",
    "train_tasks",
    "update_server",
    "write_round",
]

_NOTHING = Aggregate(params={}, coverage={}, num_clients=0)


def check_in(seed: int, dataset: FederatedDataset, clock: SimClock, round_idx: int, per_round: int) -> list[ClientView]:
    """Step 1: the round's sample of ``per_round`` clients (a function of the seed and the round) as the server sees
    them at check-in: data size and budgets at the round's simulated start."""
    client_ids = sample_clients(seed, round_idx, dataset.num_clients, per_round)
    return clock.check_in(round_idx, client_ids, [dataset.num_examples(int(c)) for c in client_ids])


def plan_clients(
    clock: SimClock,
    algorithm: Algorithm,
    state: ServerState,
    round_idx: int,
    views: Sequence[ClientView],
    assignments: Mapping[int, Assignment],
    train: TrainConfig,
    at: float | None = None,
) -> ClientPlan:
    """Step 3: the clock's plan of the round before anything runs (``train``: the round's local training, a phase's
    own epochs; ``at``: the clients' start when it is not the round's, in an asynchronous run)."""
    work = capabilities.train_flops(algorithm, round_idx, views, assignments)  # None: FLOPs x samples
    return clock.plan(round_idx, views, assignments, as_model_configs(state.models), train, work, at=at)


def train_tasks(
    plan: ClientPlan,
    assignments: Mapping[int, Assignment],
    state: ServerState,
    seed: int,
    lr: float,
    keep_upload: bool,
) -> list[TrainTask]:
    """Step 3: a task for every client whose plan lets it finish, with what its links deliver."""
    return [
        train_task(int(c), plan.round_idx, seed, lr, assignments[int(c)], state, plan.link(i), keep_upload)
        for i, (c, runs) in enumerate(zip(plan.client_id, plan.runs, strict=True))
        if runs
    ]


def train_task(
    client_id: int,
    round_idx: int,
    seed: int,
    lr: float,
    assignment: Assignment,
    state: ServerState,
    link: LinkDraw | None = None,
    keep_upload: bool = False,
) -> TrainTask:
    """A client's task; in a multi-model run it carries the architecture of the model it was assigned, under unstable
    links what this round's transfers deliver, under ``eval_all_devices`` the request to keep its upload."""
    config = state.models[assignment.model_id] if state.models else None
    return TrainTask(
        client_id=client_id,
        round_idx=round_idx,
        seed=seed,
        lr=lr,
        assignment=assignment,
        link=link,
        model_config=config,
        keep_upload=keep_upload,
    )


def train_clients(
    backend: Backend, tasks: Sequence[TrainTask], params: Params, initial: Params
) -> tuple[Aggregate, list[ClientOutcome]]:
    """Step 4: local training on the hosts and the sharded reduction (nothing when no client can finish).
    ``initial``: each global tensor's value when first broadcast to padding clients (``client_state.first_values``)."""
    if not tasks:
        return _NOTHING, []
    return backend.train_and_reduce(tasks, params, initial)


def update_server(
    algorithm: Algorithm,
    guard: NonFiniteGuard,
    state: ServerState,
    round_idx: int,
    aggregate: Aggregate,
    outcomes: Sequence[ClientOutcome],
    optimizer: ServerOptimizerConfig,
) -> tuple[ServerState, bool]:
    """Step 5: the server update, skipped when every client failed (the global model stays), refused when it is not
    finite (the round is rolled back, ``engine/guard.py``). The server optimizer (``server.optimizer``) turns the
    aggregate into the new parameters, then the method's ``server_update`` runs on them (``server_step``). Returns
    the new state and whether it was rolled back."""
    if aggregate.num_clients == 0:
        return state, False
    aggregate = dataclasses.replace(aggregate, outcomes=tuple(outcomes))
    # no server step runs on a non-finite aggregate (None: the guard rolls the round back)
    new = server_step(algorithm, optimizer, state, round_idx, aggregate) if all_finite(aggregate.params) else None
    checked = guard.check(round_idx, state, new)
    return checked, checked is not new


def evaluation_due(cfg: ExperimentConfig, round_idx: int) -> bool:
    """Step 6 runs every ``eval_every`` rounds and after the last."""
    return (round_idx + 1) % cfg.eval_every == 0 or round_idx == cfg.rounds - 1


def evaluate_round(
    cfg: ExperimentConfig,
    backend: Backend,
    algorithm: Algorithm,
    state: ServerState,
    clock: SimClock,
    ds: FederatedDataset,
    round_idx: int,
) -> RoundEvaluation:
    """Step 6: the main evaluation, every global model's, the named structures' (``evals.csv`` rows), the average
    over devices' models (``device_acc``; with ``eval_all_devices`` the all-device model's figures and rows too)
    and, with per-client test data, each client's accuracy on its model."""
    eval_params = capabilities.eval_params(algorithm, state)
    main = backend.evaluate(eval_params, algorithm.eval_units(state))
    evals = evaluate_models(backend, algorithm, state, main)
    wanted = capabilities.eval_structures(algorithm, state)
    for name, units in width_structures(clock.oracle.family, cfg.eval_widths).items():
        if name in wanted:
            raise ValueError(f"eval_widths: {name!r} is also a structure {algorithm.name} evaluates")
        wanted = {**wanted, name: units}
    structures = {name: backend.evaluate(eval_params, units) for name, units in wanted.items()}
    named_evals = named_evaluations(algorithm, state, evals, structures)
    accs = {name: e.accuracy for name, e in named_evals.items()}
    named = [*structures.items(), *zip(algorithm.model_names(state)[1:], evals[1:], strict=True)]
    structure_evals = [EvalRecord(round_idx, n, e.accuracy, e.loss) for n, e in named]
    uniform = uniform_device_eval(algorithm, state)
    census: Sequence[ClientView] | int
    client_accs: list[ClientAccRecord] = []
    if uniform is not None and uniform in accs and ds.test_offsets is None:
        # every device uses the one model (the all-device model's too): the same means (bit for bit) without a census
        # of the whole population; per-client test sets need every client's own figure, so they keep the census
        census = ds.num_clients
        fields = {"device_acc": uniform_device_accuracy(accs[uniform], census)}
    else:
        # every device of the run, with its budgets now, for the average over devices' models
        census = clock.check_in(round_idx, np.arange(ds.num_clients), ds.client_sizes().tolist())
        client_accs = client_accuracies(ds, named_evals, algorithm, state, census, round_idx)
        fields = {"device_acc": device_accuracy(accs, algorithm, state, census)}
    if cfg.eval_all_devices:
        all_fields, all_rows = evaluate_all_devices(backend, algorithm, state, wanted, census, round_idx)
        fields.update(all_fields)
        structure_evals.extend(all_rows)
    return RoundEvaluation(main, evals, structure_evals, fields, client_accs)


def write_round(
    writer: RunWriter | None,
    record: RoundRecord,
    clients: Sequence[ClientRecord],
    evaluation: RoundEvaluation | None = None,
) -> None:
    """Step 7: the round's rows appended to the run directory's record files, the round's own row last (a
    checkpoint's record sizes are read after it)."""
    if writer is None:
        return
    with writer.round_rows():  # a write error leaves every record file without the round
        if evaluation is not None:
            writer.append_evals(evaluation.structures)
            writer.append_client_accs(evaluation.client_accs)
        writer.append_clients(list(clients))
        writer.append(record)
