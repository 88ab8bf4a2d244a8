"""Client state lives in the client context, not on the algorithm (issue 43, item 1): two clients of a stateful method
trained interleaved on one algorithm object, batch by batch (client A's ``local_train`` starts, runs a batch, then
client B's starts and runs one, then A's next, ...), give exactly the updates of training them one after the other.
State kept on ``self`` between hooks (FjORD's widths, the nested-width methods' ratio generator) would be clobbered by
the other client. Real tiny models and the real hooks; nothing is mocked."""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn

from rayfl.config.model import CNNConfig
from rayfl.core.messages import Assignment, ClientUpdate, TrainTask
from rayfl.engine.build import Setup, bind_algorithm, build_clock, build_setup
from rayfl.fl.api.algorithm import Algorithm
from rayfl.fl.api.client import ClientContext
from rayfl.fl.api.optim import ClientOptimizer
from rayfl.fl.common.submodel import SubModelAlgorithm
from rayfl.fl.methods.fedprox.config import FedProxConfig
from rayfl.fl.methods.fedrescue.config import FedResCuEConfig
from rayfl.fl.methods.fedslim.config import FedSlimConfig
from rayfl.fl.methods.fjord.config import FjORDConfig
from rayfl.fl.methods.fjord004.config import FjORD004Config
from rayfl.models.elastic.spec import first_k
from rayfl.models.inputs import InputSpec
from tests.helpers import tiny_config, tiny_image_dataset

CNN_BN = CNNConfig(channels=(8, 16), norm="batch")
RATIOS = (0.25, 0.5, 0.75, 1.0)
METHODS: dict[str, Any] = {
    "fjord": FjORDConfig(widths=RATIOS, kd=True),
    "fedrescue": FedResCuEConfig(capacities=RATIOS, ratios=RATIOS, num_ratios=3),
    "fedslim": FedSlimConfig(capacities=RATIOS, ratios=RATIOS, num_ratios=3),
    "fjord004": FjORD004Config(capacities=RATIOS, ratios=RATIOS, num_ratios=2),
    "fedprox": FedProxConfig(mu=0.5),
}
# client id -> the width it trains (its p_max / capacity): two different sub-models (FedProx: two different anchors,
# client 2 starting from halved weights, as one whose download was padded), so swapped state shows
CLIENTS = {1: 1.0, 2: 0.5}


def _bound(method: Any) -> Setup:
    cfg = dataclasses.replace(tiny_config(kind="local"), algorithm=method, model=CNN_BN)
    setup = build_setup(cfg, tiny_image_dataset())
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    return setup


def _task(alg: Algorithm, client: int) -> TrainTask:
    width = CLIENTS[client]
    assignment = Assignment()
    if isinstance(alg, SubModelAlgorithm) and width < 1.0:
        assignment = alg.assignment_for(first_k(alg.uniform_units(width)))
    return TrainTask(client_id=client, round_idx=3, seed=11, lr=0.05, assignment=assignment)


def _context(setup: Setup, task: TrainTask) -> ClientContext:
    """The client's context on its (sub-)model loaded with its part of the global weights, as a host builds it."""
    family = setup.algorithm.family
    assert family is not None
    units = task.assignment.units or family.full_units
    model = family.extract(setup.params, first_k(units))
    if not isinstance(setup.algorithm, SubModelAlgorithm) and task.client_id == 2:
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(0.5)
    return ClientContext.of(task, model, setup.input_spec)


def _train(setup: Setup, ctx: ClientContext) -> ClientUpdate:
    x, y = setup.dataset.client_train(ctx.task.client_id)
    return setup.algorithm.local_train(ctx, x, y)


class _Turns:
    """Strict alternation between the clients' threads: one runs at a time, and after each batch hands over to the
    next client still training (a deterministic interleaving, not a race)."""

    def __init__(self, order: Sequence[int]) -> None:
        self.order = list(order)
        self.live = set(order)
        self.now = order[0]
        self.cond = threading.Condition()
        self.trace: list[int] = []

    def wait(self, client: int) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.now == client, timeout=60):
                raise TimeoutError(f"client {client} never got its turn")

    def hand_over(self, client: int, done: bool = False) -> None:
        with self.cond:
            if done:
                self.live.discard(client)
            i = self.order.index(client)
            for step in range(1, len(self.order) + 1):
                nxt = self.order[(i + step) % len(self.order)]
                if nxt in self.live:
                    self.now = nxt
                    break
            self.cond.notify_all()


def _interleaved(setup: Setup, contexts: Sequence[ClientContext]) -> dict[int, ClientUpdate]:
    """Every client's ``local_train`` on the one algorithm object, their batches interleaved one by one."""
    alg = setup.algorithm
    turns = _Turns([ctx.task.client_id for ctx in contexts])
    inner: Callable[..., torch.Tensor] = alg.train_batch

    def train_batch(
        ctx: ClientContext,
        x: torch.Tensor,
        y: torch.Tensor,
        optimizer: ClientOptimizer,
        params: Sequence[nn.Parameter],
        batch_idx: int,
    ) -> torch.Tensor:
        loss = inner(ctx, x, y, optimizer, params, batch_idx)
        turns.trace.append(ctx.task.client_id)
        turns.hand_over(ctx.task.client_id)  # the other client's next batch (or its start) runs now
        turns.wait(ctx.task.client_id)
        return loss

    alg.train_batch = train_batch  # type: ignore[method-assign]  # the real hook, with a hand-over after each batch
    out: dict[int, ClientUpdate] = {}
    errors: list[BaseException] = []

    def run(ctx: ClientContext) -> None:
        client = ctx.task.client_id
        turns.wait(client)
        try:
            out[client] = _train(setup, ctx)
        except BaseException as err:  # reported by the test's thread
            errors.append(err)
        finally:
            turns.hand_over(client, done=True)

    threads = [threading.Thread(target=run, args=(ctx,)) for ctx in contexts]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        del alg.train_batch  # back to the class's hook
    if errors:
        raise errors[0]
    ids = [ctx.task.client_id for ctx in contexts]
    assert turns.trace[: 2 * len(ids)] == ids + ids, "the clients' batches did not alternate"
    return out


@pytest.mark.parametrize("name", list(METHODS))
def test_interleaved_clients_train_as_one_after_the_other(name: str) -> None:
    setup = _bound(METHODS[name])
    tasks = [_task(setup.algorithm, c) for c in CLIENTS]
    if isinstance(setup.algorithm, SubModelAlgorithm):
        assert tasks[0].assignment != tasks[1].assignment
    sequential = {t.client_id: _train(setup, _context(setup, t)) for t in tasks}
    interleaved = _interleaved(setup, [_context(setup, t) for t in tasks])
    for client, want in sequential.items():
        got = interleaved[client]
        assert want.num_steps == got.num_steps > 2  # several batches each, so the interleaving mattered
        assert got.train_loss == want.train_loss
        assert want.values.keys() == got.values.keys()
        for key, value in want.values.items():
            assert torch.equal(got.values[key], value), f"{name}: client {client}'s {key} differs"


def test_a_batch_hook_outside_local_train_says_so() -> None:
    """A method's batch hook that reads state its ``local_train`` puts fails clearly without it."""
    setup = _bound(METHODS["fjord"])
    ctx = _context(setup, _task(setup.algorithm, 2))
    x, y = setup.dataset.client_train(2)
    with pytest.raises(RuntimeError, match="no _ClientWidths in the client context"):
        setup.algorithm.backward_step(ctx, torch.as_tensor(x[:4], dtype=torch.float32), torch.as_tensor(y[:4]))


def test_context_memory_and_kept_state() -> None:
    task = TrainTask(client_id=4, round_idx=0, seed=1, lr=0.1, assignment=Assignment(), client_state={"seen": 2})
    ctx = ClientContext.of(task, nn.Linear(2, 2), InputSpec(input_kind="image", num_classes=2, sample_shape=(2,)))
    assert ctx.memory == {"seen": 2}
    ctx.put(np.float64(3.0))
    assert ctx.get(np.float64) == 3.0
    with pytest.raises(RuntimeError, match="no int"):
        ctx.get(int)
