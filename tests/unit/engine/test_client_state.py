"""Per-client memories and local model padding (paper 004, Eq. 5) on a real client host with a real family."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import numpy as np
import pytest
import torch

from rayfl.config.model import CNNConfig
from rayfl.config.sections import BackendConfig, LinkConfig, ResourceConfig
from rayfl.core.messages import ClientOutcome, LinkDraw, TrainTask
from rayfl.engine.build import bind_algorithm, build_clock, build_setup
from rayfl.engine.driver import run_experiment
from rayfl.engine.exec.client_state import ClientMemory, ClientStateStore, first_values, memory_bytes, own_global
from rayfl.engine.exec.host import ClientHost
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.heterofl.config import HeteroFLConfig
from rayfl.fl.methods.independent.config import IndependentConfig
from rayfl.models.elastic.spec import SubModelSpec, first_k
from rayfl.system.links import column_levels
from tests.helpers import tiny_config, tiny_image_dataset

MODEL = CNNConfig(channels=(8, 16))


def _host() -> tuple[ClientHost, Any]:
    cfg = dataclasses.replace(tiny_config(kind="local"), model=MODEL, algorithm=FedAvgConfig())
    setup = build_setup(cfg, tiny_image_dataset())
    host = ClientHost(0, setup.dataset, MODEL, setup.algorithm, BackendConfig(kind="local"), init_seed=1)
    return host, setup


def _units(host: ClientHost, rate: float) -> tuple[int, ...]:
    assert host.family is not None
    space = host.family.space
    return space.units(SubModelSpec.uniform(space, rate).ratios)


def _block(shape: tuple[int, ...], sub: tuple[int, ...]) -> torch.Tensor:
    mask = torch.zeros(shape, dtype=torch.bool)
    mask[tuple(slice(0, n) for n in sub)] = True
    return mask


INITIAL = 3.0  # the run's initial global model in these tests (what padding falls back to)


def _train_once(
    host: ClientHost, setup: Any, memory: ClientMemory | None, down_run: int, dtype: str = "float32"
) -> ClientMemory:
    """One client at capacity 0.75 whose download stops after ``down_run`` columns; lr 0 keeps the padded model.
    The global model is 1 everywhere, the run's initial model 3; the client remembers at ``dtype``."""
    assert host.family is not None
    assignment = host.family.assignment(first_k(_units(host, 0.75)))
    link = LinkDraw(error_rate=0.1, down_run=down_run, up_run=-1, column_ratio=0.125, padding=True, memory_dtype=dtype)
    task = TrainTask(client_id=3, round_idx=0, seed=0, lr=0.0, assignment=assignment, link=link)
    params = {k: np.ones(tuple(v.shape), dtype=np.float32) for k, v in setup.params.items()}  # global = 1
    initial = {k: np.full(tuple(v.shape), INITIAL, dtype=np.float32) for k, v in setup.params.items()}
    *_, outcomes, after = host.run_round([task], params, {k: 0 for k in params}, 1, initial, memory)
    (outcome,) = cast(list[ClientOutcome], outcomes)
    assert (
        outcome.failure is None and outcome.p_down == (0.75 if down_run < 0 else down_run / 8) and outcome.p_up == 0.75
    )
    return cast(ClientMemory, after)


def test_padding_fills_exactly_the_missing_columns_from_the_clients_previous_parameters() -> None:
    """Two of six columns arrive: the 0.25 block is the global model (1), the rest of the client's 0.75 model its
    previous parameters (2); where its memory (a 0.5 model) lacks a position, the initial global model."""
    host, setup = _host()
    assert host.family is not None
    space = host.family.space
    half = _units(host, 0.5)
    previous = host.family.slices(first_k(half))
    shapes = {k: tuple(v.shape) for k, v in setup.params.items()}
    kept = {k: np.full(space.sub_shape(k, half), 2.0, dtype=np.float32) for k in previous}
    memory = ClientMemory(params=kept, slices=previous)
    after = _train_once(host, setup, memory, down_run=2)
    assert after.params is not None
    quarter, own = _units(host, 0.25), _units(host, 0.75)
    for name, value in after.params.items():
        got = torch.from_numpy(value)
        assert got.shape == space.sub_shape(name, own)
        arrived = _block(got.shape, space.sub_shape(name, quarter))
        remembered = _block(got.shape, space.sub_shape(name, half)) & ~arrived
        fresh = ~(arrived | remembered)
        assert torch.equal(got[arrived], torch.ones_like(got[arrived])), name
        assert torch.equal(got[remembered], torch.full_like(got[remembered], 2.0)), name
        assert torch.equal(got[fresh], torch.full_like(got[fresh], INITIAL)), name
    assert memory_bytes(after) == sum(4 * int(np.prod(space.sub_shape(k, own))) for k in shapes)


def test_a_full_download_needs_no_padding_and_a_first_round_pads_from_the_initial_model() -> None:
    host, setup = _host()
    full = _train_once(host, setup, None, down_run=-1)  # nothing lost
    assert full.params is not None and all(np.all(v == 1.0) for v in full.params.values())
    first = _train_once(host, setup, None, down_run=2)
    assert first.params is not None and host.family is not None
    for name, value in first.params.items():
        got = torch.from_numpy(value)
        arrived = _block(got.shape, host.family.space.sub_shape(name, _units(host, 0.25)))
        assert torch.equal(got[arrived], torch.ones_like(got[arrived])), name
        assert torch.equal(got[~arrived], torch.full_like(got[~arrived], INITIAL)), name
    other = dataclasses.replace(first, model_id=1)  # a memory of another of the run's models is not padded from
    again = _train_once(host, setup, other, down_run=2)
    assert again.params is not None and all(np.array_equal(again.params[k], first.params[k]) for k in first.params)


def test_a_half_precision_memory_takes_half_the_bytes_and_pads_with_its_rounded_values() -> None:
    """``memory_dtype: float16``: the client's memory is float16 (half the bytes of float32); padding from it gives
    the float16-rounded values (0.1 -> 0.0999755859375) back as float32, the arrived columns untouched."""
    host, setup = _host()
    assert host.family is not None
    space = host.family.space
    own = _units(host, 0.75)
    previous = host.family.slices(first_k(own))
    kept = {k: np.full(space.sub_shape(k, own), 0.1, dtype=np.float16) for k in previous}
    half = _train_once(host, setup, ClientMemory(params=kept, slices=previous), down_run=2, dtype="float16")
    full = _train_once(host, setup, ClientMemory(params=kept, slices=previous), down_run=2)
    assert half.params is not None and full.params is not None
    assert all(v.dtype == np.float16 for v in half.params.values())
    assert all(v.dtype == np.float32 for v in full.params.values())
    assert 2 * memory_bytes(half) == memory_bytes(full) > 0
    rounded = float(np.float32(np.float16(0.1)))
    assert rounded != np.float32(0.1)
    for name, value in full.params.items():
        got = torch.from_numpy(value)
        arrived = _block(got.shape, space.sub_shape(name, _units(host, 0.25)))
        assert torch.equal(got[arrived], torch.ones_like(got[arrived])), name
        assert torch.equal(got[~arrived], torch.full_like(got[~arrived], rounded)), name
        assert np.array_equal(half.params[name], value.astype(np.float16)), name


def test_first_values_keeps_a_tensor_from_its_first_padding_round_and_drops_what_the_run_no_longer_holds() -> None:
    """The initial values padding falls back to: a tensor's value from the first round that broadcast it to padding
    clients (later values do not replace it, rounds without padding add nothing), and a tensor of a model the run
    dropped is dropped too (checkpoints keep ``first_values``); an unchanged dict is returned as it is."""
    a0, b0 = torch.zeros(2), torch.ones(3)
    known = first_values({}, {"a": a0}, broadcast=True)
    assert known.keys() == {"a"} and torch.equal(known["a"], a0) and known["a"] is not a0  # a copy
    assert first_values(known, {"a": a0 + 5}, broadcast=True) is known  # nothing new: the same dict
    assert first_values(known, {"a": a0, "b": b0}, broadcast=False) is known  # no padding this round: nothing added
    grown = first_values(known, {"a": a0 + 5, "b": b0}, broadcast=True)
    assert torch.equal(grown["a"], a0) and torch.equal(grown["b"], b0)  # "a" keeps its first value
    dropped = first_values(grown, {"b": b0 + 1}, broadcast=False)
    assert dropped.keys() == {"b"} and torch.equal(dropped["b"], b0)


def test_own_global_copies_only_the_tensors_the_memory_writes_into() -> None:
    """A padding client's own global-shaped tensors: its memory's values over the initial ones, in copies; tensors
    its memory does not hold are the initial tensors themselves (read, never written), not a clone of the model per
    client. The initial tensors are never changed."""
    initial = {"w": torch.zeros(2, 3), "b": torch.zeros(3)}
    memory = ClientMemory(params={"w": np.ones((2, 3), dtype=np.float32)}, slices={})
    own = own_global(initial, memory)
    assert torch.equal(own["w"], torch.ones(2, 3)) and own["w"] is not initial["w"]
    assert own["b"] is initial["b"]
    assert torch.equal(initial["w"], torch.zeros(2, 3))
    assert all(own_global(initial, None)[k] is initial[k] for k in initial)


def test_store_round_trips_and_follows_clients() -> None:
    host, _setup = _host()
    assert host.family is not None
    store = ClientStateStore()
    task = TrainTask(
        client_id=7,
        round_idx=0,
        seed=0,
        lr=0.0,
        assignment=column_levels(host.family, host.family.assignment(first_k(_units(host, 0.5))), 0.5)[0],
    )
    assert store.handles_for([task]) == [None]
    memory = ClientMemory(algo_state={"seen": 1})
    store.update([task], [memory])
    saved = store.client_states()
    fresh = ClientStateStore()
    fresh.load_client_states(saved)
    assert fresh.client_states() == {7: memory} and fresh.handles_for([task]) == [memory]


def test_upload_stops_at_the_first_lost_column_and_only_what_arrived_is_aggregated() -> None:
    """A 0.75 client whose upload loses its second column: the server's partial sums cover exactly the first
    column (x0.125, first-k) of every tensor, with the client's weight; the outcome reports p_up = 0.125."""
    host, setup = _host()
    assert host.family is not None
    space = host.family.space
    assignment = host.family.assignment(first_k(_units(host, 0.75)))
    task = TrainTask(
        client_id=4,
        round_idx=0,
        seed=0,
        lr=0.05,
        assignment=assignment,
        link=LinkDraw(error_rate=0.1, down_run=-1, up_run=1, column_ratio=0.125, padding=True),
    )
    params = {k: v.numpy() for k, v in setup.params.items()}
    partial, outcomes, _after = host.run_round([task], params, {k: 0 for k in params}, 1, None, None)
    (outcome,) = cast(list[ClientOutcome], outcomes)
    assert outcome.failure is None and outcome.p_down == 0.75 and outcome.p_up == 0.125
    first = _units(host, 0.125)
    sums = cast(dict[str, Any], partial)
    assert sums.keys() == params.keys()
    for name, value in params.items():
        covered = torch.from_numpy(np.broadcast_to(sums[name].weight, value.shape) > 0)  # numpy: what shards get
        assert torch.equal(covered, _block(value.shape, space.sub_shape(name, first))), name
        assert float(sums[name].weight.max()) == outcome.num_examples  # FedAvg weighs by samples


@pytest.mark.parametrize(
    "algorithm",
    [
        HeteroFLConfig(rates=(1.0, 0.5), label_mask=False, static_bn=False, official_init=True),
        IndependentConfig(num_models=2),
    ],
    ids=["heterofl-official-init", "two-models"],
)
def test_padding_falls_back_to_the_runs_own_initial_model(algorithm: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """Clients that do not train (their batches take no step) upload exactly their padded models: after one round
    with half of the columns lost, every global tensor is still the run's initial one (``init_state``'s: HeteroFL's
    official initialisation with zeroed biases; model 1's own initial weights beside model 0's), so padding
    filled what did not arrive from the run's initial model, not from a fresh draw of model 0."""
    import rayfl.engine.build as build_module

    build = build_module.build_run_algorithm

    def frozen(cfg: Any) -> Any:
        alg = build(cfg)
        alg.train_batch = lambda ctx, x, y, *_: alg.local_loss(ctx, x, y).detach()  # no step
        return alg

    monkeypatch.setattr(build_module, "build_run_algorithm", frozen)
    links = LinkConfig(error_rate=ResourceConfig(source="constant", low=0.5))
    cfg = dataclasses.replace(tiny_config(kind="local"), algorithm=algorithm, rounds=1, clients_per_round=8)
    cfg = dataclasses.replace(cfg, system=dataclasses.replace(cfg.system, links=links))
    data = tiny_image_dataset()
    setup = build_setup(cfg, data)
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    initial = setup.algorithm.init_state(setup.params).params
    assert any(not torch.equal(initial[k], setup.params[k]) for k in setup.params) or len(initial) > len(setup.params)
    result = run_experiment(cfg, write=False, dataset=data)
    assert result.records[0].bytes_down < sum(4 * v.numel() for v in initial.values()) * 8 / 2  # columns were lost
    assert result.state.params.keys() == initial.keys()
    for name, value in result.state.params.items():
        assert torch.allclose(value, initial[name], rtol=0.0, atol=1e-6), name
