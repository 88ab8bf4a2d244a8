"""The steps of a client host's ``_run_client``, each on its own, with a real host, a real elastic family and real
tensors: the model's own tensors, what the links deliver down, the received (padded) model, what the links deliver up,
the client's next memory and the outcome the driver hears."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from rayfl.config.model import CNNConfig
from rayfl.config.sections import BackendConfig
from rayfl.core.messages import Assignment, ClientUpdate, LinkDraw, TrainTask
from rayfl.engine.build import build_setup
from rayfl.engine.exec.client_state import ClientMemory, KeptUpload
from rayfl.engine.exec.host import (
    ClientHost,
    _download,
    _level_bytes,
    _lost_outcome,
    _next_memory,
    _outcome,
    _own_tensors,
    _upload,
)
from rayfl.fl.common.multimodel import model_key
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.models.elastic.family import ElasticFamily
from rayfl.models.elastic.spec import SubModelSpec, first_k
from tests.helpers import tiny_config, tiny_image_dataset

MODEL = CNNConfig(channels=(8, 16))
COLUMN = 0.125  # the links' transfer unit: an eighth of every layer's width


@pytest.fixture(scope="module")
def host() -> ClientHost:
    cfg = dataclasses.replace(tiny_config(kind="local"), model=MODEL, algorithm=FedAvgConfig())
    setup = build_setup(cfg, tiny_image_dataset())
    return ClientHost(0, setup.dataset, MODEL, setup.algorithm, BackendConfig(kind="local"), init_seed=1)


def _family(host: ClientHost) -> ElasticFamily:
    assert host.family is not None
    return host.family


def _units(host: ClientHost, rate: float) -> tuple[int, ...]:
    space = _family(host).space
    return space.units(SubModelSpec.uniform(space, rate).ratios)


def _assignment(host: ClientHost, rate: float) -> Assignment:
    return _family(host).assignment(first_k(_units(host, rate)))


def _global(host: ClientHost, value: float) -> dict[str, torch.Tensor]:
    """The host's model's global tensors, all ``value``."""
    return {k: torch.full_like(v, value) for k, v in host.model.state_dict().items() if v.is_floating_point()}


def _block(shape: tuple[int, ...], sub: tuple[int, ...]) -> torch.Tensor:
    mask = torch.zeros(shape, dtype=torch.bool)
    mask[tuple(slice(0, n) for n in sub)] = True
    return mask


def _update(
    host: ClientHost,
    rate: float,
    value: float,
    client_state: object | None = None,
    metrics: dict[str, float] | None = None,
) -> ClientUpdate:
    """A trained update of the first-k sub-model at ``rate``: every trained element ``value``."""
    assignment = _assignment(host, rate)
    space = _family(host).space
    units = _units(host, rate)
    values = {k: torch.full(space.sub_shape(k, units), value) for k in _global(host, 0.0)}
    return ClientUpdate(
        client_id=3,
        weight=1.0,
        values=values,
        slices=dict(assignment.slices),
        num_examples=20,
        train_loss=0.5,
        num_steps=4,
        client_state=client_state,
        metrics=dict(metrics or {}),
    )


def test_own_tensors_are_the_flat_dicts_in_a_single_model_run_and_the_models_own_names_in_a_multi_model_run() -> None:
    """Model 0 of a single-model run reads the round's dicts as they are (no copy, no renaming); model 1 of a run
    with several reads its ``m1/`` entries under its own names, with their shapes and initial values."""
    weight, other = torch.ones(2, 3), torch.zeros(4)
    flat = {"w": weight, model_key(1, "w"): other}
    shapes = {k: v.shape for k, v in flat.items()}
    single = _own_tensors(
        TrainTask(client_id=0, round_idx=0, seed=0, lr=0.1, assignment=Assignment()), flat, shapes, None
    )
    assert single.model_id == 0 and single.params is flat and single.shapes is shapes and single.initial is None
    task = TrainTask(client_id=0, round_idx=0, seed=0, lr=0.1, assignment=Assignment(model_id=1), model_config=MODEL)
    initial = {model_key(1, "w"): torch.full((4,), 3.0)}
    own = _own_tensors(task, flat, shapes, initial)
    assert own.model_id == 1 and own.params.keys() == {"w"} and own.params["w"] is other
    assert own.shapes == {"w": torch.Size([4])}
    assert own.initial is not None and torch.equal(own.initial["w"], torch.full((4,), 3.0))


def test_perfect_links_deliver_the_assignment_whole(host: ClientHost) -> None:
    assignment = _assignment(host, 0.5)
    down = _download(host.family, None, assignment, _global(host, 1.0))
    assert down.levels == (assignment,) and down.arrived == down.trained == 1 and not down.pads
    assert down.assignment is assignment and down.arrived_level is assignment
    assert math.isnan(down.p_down) and down.bytes is None


def test_a_padding_client_trains_every_level_and_counts_the_bytes_of_those_put_on_the_wire(host: ClientHost) -> None:
    """A 0.75 client (six columns of an eighth) whose download stops after two: it trains all six, padding four;
    the bytes moved are those of the first three columns (the lost one was sent too); p_down is the 0.25 that
    arrived. Without padding it trains the two that arrived."""
    params = _global(host, 1.0)
    assignment = _assignment(host, 0.75)
    link = LinkDraw(error_rate=0.1, down_run=2, up_run=-1, column_ratio=COLUMN, padding=True)
    down = _download(host.family, link, assignment, params)
    assert len(down.levels) == 6 and down.levels[-1] is assignment
    assert (down.arrived, down.trained, down.pads, down.p_down) == (2, 6, True, 0.25)
    assert down.assignment is assignment
    assert down.arrived_level is not None and down.arrived_level.units == _units(host, 0.25)
    assert down.bytes == _level_bytes(params, down.levels[2])
    space = _family(host).space
    assert down.bytes == sum(4 * math.prod(space.sub_shape(k, _units(host, 0.375))) for k in params)
    cut = _download(host.family, dataclasses.replace(link, padding=False), assignment, params)
    assert (cut.arrived, cut.trained, cut.pads) == (2, 2, False)
    assert cut.assignment.units == _units(host, 0.25) and cut.bytes == down.bytes


def test_a_download_lost_at_its_first_column_reports_link_down_with_the_bytes_of_that_column(host: ClientHost) -> None:
    params = _global(host, 1.0)
    link = LinkDraw(error_rate=0.1, down_run=0, up_run=-1, column_ratio=COLUMN, padding=False)
    task = TrainTask(client_id=5, round_idx=2, seed=0, lr=0.1, assignment=_assignment(host, 0.75), link=link)
    down = _download(host.family, link, task.assignment, params)
    assert down.trained == down.arrived == 0 and down.arrived_level is None
    lost = _lost_outcome(task, down)
    assert (lost.client_id, lost.failure, lost.num_examples, lost.num_steps, lost.bytes_up) == (5, "link_down", 0, 0, 0)
    assert lost.bytes_down == _level_bytes(params, down.levels[0]) > 0
    assert lost.p_down == 0.0 and lost.p_up == 0.0 and math.isnan(lost.train_loss) and lost.train_wall_s == 0.0


def test_the_received_model_pads_the_missing_columns_from_the_memory_then_the_initial_model(host: ClientHost) -> None:
    """Two of six columns arrive (global model 1): the 0.25 block is 1, the rest of the 0.5 block the client's
    remembered values (2), everything else of its 0.75 model the run's initial values (3)."""
    space = _family(host).space
    half = _units(host, 0.5)
    kept = {k: np.full(space.sub_shape(k, half), 2.0, dtype=np.float32) for k in _global(host, 0.0)}
    memory = ClientMemory(params=kept, slices=_family(host).slices(first_k(half)))
    link = LinkDraw(error_rate=0.1, down_run=2, up_run=-1, column_ratio=COLUMN, padding=True)
    task = TrainTask(client_id=3, round_idx=1, seed=0, lr=0.0, assignment=_assignment(host, 0.75), link=link)
    base, initial = _global(host, 1.0), _global(host, 3.0)
    own = _own_tensors(task, base, {k: v.shape for k, v in base.items()}, initial)
    down = _download(host.family, link, task.assignment, own.params)
    model = host._received_model(task, down, own, memory)
    state = model.state_dict()
    for name in base:
        got = state[name]
        assert got.shape == space.sub_shape(name, _units(host, 0.75))
        arrived = _block(got.shape, space.sub_shape(name, _units(host, 0.25)))
        remembered = _block(got.shape, space.sub_shape(name, half)) & ~arrived
        fresh = ~(arrived | remembered)
        assert torch.equal(got[arrived], torch.ones_like(got[arrived])), name
        assert torch.equal(got[remembered], torch.full_like(got[remembered], 2.0)), name
        assert torch.equal(got[fresh], torch.full_like(got[fresh], 3.0)), name
    no_initial = dataclasses.replace(own, initial=None)
    with pytest.raises(RuntimeError, match="initial global parameters"):
        host._received_model(task, down, no_initial, memory)


def test_the_upload_delivers_the_columns_before_the_first_loss_and_counts_the_lost_one_sent(
    host: ClientHost,
) -> None:
    """A 0.75 update whose upload loses its second column: the server receives the first column (p_up 0.125), the
    client sent two; an upload lost at once delivers nothing; perfect links deliver the update itself."""
    params = _global(host, 1.0)
    shapes = {k: v.shape for k, v in params.items()}
    assignment = _assignment(host, 0.75)
    update = _update(host, 0.75, 7.0)
    space = _family(host).space

    def delivered(up_run: int) -> tuple[object, ...]:
        link = LinkDraw(error_rate=0.1, down_run=-1, up_run=up_run, column_ratio=COLUMN, padding=True)
        down = _download(host.family, link, assignment, params)
        up = _upload(host.family, link, update, down, shapes)
        return up.received, up.sent, up.p_up, up.lost

    received, sent, p_up, lost = delivered(1)
    assert isinstance(received, ClientUpdate) and isinstance(sent, ClientUpdate)
    assert p_up == COLUMN and not lost
    for name, value in received.values.items():
        assert value.shape == space.sub_shape(name, _units(host, 0.125)), name
        assert torch.equal(value, torch.full_like(value, 7.0)), name
        assert sent.values[name].shape == space.sub_shape(name, _units(host, 0.25)), name
    received, sent, p_up, lost = delivered(0)
    assert isinstance(received, ClientUpdate) and isinstance(sent, ClientUpdate)
    assert lost and p_up == 0.0 and received.values == {} and sent.values.keys() == update.values.keys()
    perfect = _upload(host.family, None, update, _download(host.family, None, assignment, params), shapes)
    assert perfect.received is update and perfect.sent is update and math.isnan(perfect.p_up) and not perfect.lost


def test_the_next_memory_keeps_the_trained_model_only_when_the_links_pad(host: ClientHost) -> None:
    """A padding client remembers its trained sub-model (at the links' precision) with its slices and the
    algorithm's state; its kept upload carries over. A client that needs no memory keeps the one it had."""
    model = host._model_for(_assignment(host, 0.5), _global(host, 0.25))
    assignment = _assignment(host, 0.5)
    upload = KeptUpload.of(_update(host, 0.5, 1.0))
    memory = ClientMemory(algo_state="old", upload=upload)
    update = _update(host, 0.5, 1.0, client_state="new")
    link = LinkDraw(error_rate=0.1, down_run=-1, up_run=-1, column_ratio=COLUMN, padding=True, memory_dtype="float16")
    after = _next_memory(memory, update, model, assignment, link, keeps_state=False)
    assert after is not None and after.params is not None and after.slices is not None
    assert after.params.keys() == _global(host, 0.0).keys()
    assert all(v.dtype == np.float16 and np.all(v == 0.25) for v in after.params.values())
    assert after.slices == dict(assignment.slices) and after.slices is not assignment.slices
    assert after.algo_state == "new" and after.upload is upload and after.model_id == 0
    stateful = _next_memory(memory, update, model, assignment, None, keeps_state=True)
    assert stateful == ClientMemory(algo_state="new", upload=upload)
    unchanged = dataclasses.replace(link, padding=False)
    assert _next_memory(memory, update, model, assignment, unchanged, keeps_state=False) is memory


def test_the_outcome_reports_the_received_updates_numbers_by_name(host: ClientHost) -> None:
    """The outcome of a trained client: the update's counts, loss and metrics (a copy), the task's client and model
    ids, the bytes, failure, time and width ratios it is given; NaN ratios by default (perfect links)."""
    task = TrainTask(client_id=3, round_idx=1, seed=0, lr=0.1, assignment=Assignment(model_id=2))
    update = _update(host, 0.5, 1.0, metrics={"norm": 1.5})
    outcome = _outcome(
        task, update, bytes_down=100, bytes_up=60, failure=None, train_wall_s=0.25, p_down=0.5, p_up=0.375
    )
    assert (outcome.client_id, outcome.model_id, outcome.num_examples, outcome.num_steps) == (3, 2, 20, 4)
    assert (outcome.train_loss, outcome.bytes_down, outcome.bytes_up, outcome.failure) == (0.5, 100, 60, None)
    assert (outcome.train_wall_s, outcome.p_down, outcome.p_up) == (0.25, 0.5, 0.375)
    assert outcome.metrics == {"norm": 1.5} and outcome.metrics is not update.metrics
    failed = _outcome(task, update, bytes_down=100, bytes_up=0, failure="nan_update", train_wall_s=0.0)
    assert failed.failure == "nan_update" and math.isnan(failed.p_down) and math.isnan(failed.p_up)


def test_the_watchdogs_progress_count_moves_with_every_training_step_not_only_each_client(host: ClientHost) -> None:
    """The Ray watchdog takes a host whose count stands still for ``backend.stall_timeout_s`` for stuck: one long
    client must keep the count moving, so every forward pass of the client's model is counted, and the hook that
    counts them is gone once the client is done."""
    params = {k: v.numpy().copy() for k, v in _global(host, 0.01).items()}
    task = TrainTask(client_id=3, round_idx=0, seed=0, lr=0.1, assignment=_assignment(host, 1.0))
    before = host.work_done
    _, (outcome,) = host.run_clients([task], params, None)[0]  # type: ignore[misc]
    assert outcome.failure is None, outcome
    steps = int(outcome.num_steps)
    assert steps > 1, f"a client of {steps} step(s) cannot show counting within a client"
    # one count per forward pass of training (one a step for FedAvg) and one for the client finished
    assert host.work_done - before == steps + 1, (before, host.work_done, steps)
    assert not host.model._forward_pre_hooks, "the counting hook outlived its client"
