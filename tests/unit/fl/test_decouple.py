"""Decouple (paper 001, Algorithm 3): two independent FedAvgs in one run on the engine's several global models.

The simple model is a stand-alone architecture (``model.exit_only``) with the side-exit sub-model's tensors; the
server's two means on hand tensors; one round equals two FedAvgs computed by hand; in-process equals Ray.
"""

from __future__ import annotations

import csv
import dataclasses

import numpy as np
import pytest
import torch

from rayfl.config.model import ResNetConfig
from rayfl.config.sections import SystemConfig
from rayfl.core.messages import ClientUpdate, ClientView, ServerState
from rayfl.core.reducers import MaskedWeightedMean
from rayfl.engine.build import bind_algorithm, build_backend, build_clock, build_setup
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.engine.multieval import device_accuracy
from rayfl.engine.steps import train_task
from rayfl.fl.api.algorithm import Algorithm
from rayfl.fl.api.client import ClientContext
from rayfl.fl.common.multimodel import model_key, model_params
from rayfl.fl.methods.fedavg.algorithm import FedAvg
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.fedhen.algorithm import FedHeN
from rayfl.fl.methods.fedhen.config import DecoupleConfig, FedHeNConfig, NoSideConfig
from rayfl.fl.methods.independent.algorithm import IndependentFedAvg
from rayfl.fl.methods.independent.config import IndependentConfig
from rayfl.fl.registry import build_algorithm
from rayfl.models import InputSpec, build_model
from rayfl.models.families import build_family
from tests.helpers import tiny_image_dataset
from tests.unit.fl.test_fedhen import MODEL, NUM_CLIENTS, TRAIN, family, fedhen_config

SPEC = InputSpec("image", 4, (3, 8, 8))
SIMPLE = dataclasses.replace(MODEL, exit_only=True)


pytestmark = pytest.mark.usefixtures("private_cache_one_thread")


def test_exit_only_is_the_side_exit_sub_model_as_its_own_architecture() -> None:
    """Same tensor names and shapes as stages 1..k + side head of the complex model, the same outputs on the same
    weights, and the family's full model (and so its cost) is that sub-model."""
    fam, own = family(), build_family(SIMPLE, SPEC)
    sub = fam.build(fam.side_exit_units())
    torch.manual_seed(0)
    alone = build_model(SIMPLE, SPEC)
    assert {k: v.shape for k, v in alone.state_dict().items()} == {k: v.shape for k, v in sub.state_dict().items()}
    sub.load_state_dict(alone.state_dict())
    x = torch.randn(3, 3, 8, 8)
    assert torch.equal(alone(x), sub(x))
    assert own.full_units == own.side_exit_units() == fam.side_exit_units()
    with pytest.raises(ValueError, match="exit_only needs model"):
        build_family(ResNetConfig(widths=(4, 8, 8, 8), exit_only=True), SPEC)


def bound(cfg=None) -> FedHeN:  # type: ignore[no-untyped-def]
    cfg = cfg or fedhen_config(DecoupleConfig())
    setup = build_setup(cfg, tiny_image_dataset(NUM_CLIENTS))
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    assert isinstance(setup.algorithm, FedHeN) and setup.algorithm.own_simple_model
    return setup.algorithm


def test_two_models_simple_devices_on_the_simple_one() -> None:
    """Model 0 is the run's complex model, model 1 the stand-alone simple model, starting from the complex model's
    initial M part; devices 0-5 (simple memory) get model 1, devices 6-11 model 0."""
    cfg = fedhen_config(DecoupleConfig())
    setup = build_setup(cfg, tiny_image_dataset(NUM_CLIENTS))
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    algo = setup.algorithm
    state = algo.init_state(setup.params)
    assert state.models == (MODEL, SIMPLE)
    simple = model_params(state.params, 1)
    assert simple.keys() == build_model(SIMPLE, SPEC).state_dict().keys()
    assert all(torch.equal(v, setup.params[k]) for k, v in simple.items())
    low, high = cfg.system.memory.values
    views = [ClientView(c, 20, (low if c < 6 else high) * 2.0**20) for c in (0, 5, 6, 11)]
    assignments = algo.assign(state, 0, views)
    assert [assignments[c].model_id for c in (0, 5, 6, 11)] == [1, 1, 0, 0]
    assert all(a.units is None and not a.slices for a in assignments.values())
    assert algo.client_weight(3) == algo.client_weight(300) == 1.0  # Algorithm 3: 1/|Z_s| and 1/|Z_c|
    assert algo.eval_structures(state) == {}


def constant_update(config: ResNetConfig, model_id: int, value: float, client_id: int) -> ClientUpdate:
    """A client of model ``model_id`` whose every weight ended at ``value``, named as the flat dict names it."""
    model = build_model(config, SPEC)
    values = {model_key(model_id, k): torch.full_like(v, value) for k, v in model.state_dict().items()}
    return ClientUpdate(client_id, 1.0, values, {}, num_examples=5 * client_id + 1, train_loss=0.0, num_steps=1)


def test_aggregation_is_two_separate_means_on_hand_tensors() -> None:
    """Simple devices at 1 and 2, complex ones at 4 and 10: every simple-model weight is (1 + 2) / 2 = 1.5, every
    complex-model weight (4 + 10) / 2 = 7, shared names included (the two models share nothing). A round with only
    simple devices leaves the complex model as it was (-3)."""
    algo = bound()
    state = algo.init_state(build_setup(fedhen_config(DecoupleConfig()), tiny_image_dataset(NUM_CLIENTS)).params)
    previous = {k: torch.full_like(v, -3.0) for k, v in state.params.items()}
    shapes = {k: v.shape for k, v in previous.items()}
    reducer = algo.reducer
    assert isinstance(reducer, MaskedWeightedMean)

    def reduce(updates: list[ClientUpdate]) -> dict[str, torch.Tensor]:
        hosts: list[dict] = [{}, {}]
        for i, update in enumerate(updates):
            reducer.accumulate(hosts[i % 2], dataclasses.replace(update, weight=algo.client_weight(9)), shapes)
        new, _ = reducer.finalize(reducer.merge(hosts), previous)
        return new

    new = reduce(
        [
            constant_update(SIMPLE, 1, 1.0, 0),
            constant_update(SIMPLE, 1, 2.0, 1),
            constant_update(MODEL, 0, 4.0, 7),
            constant_update(MODEL, 0, 10.0, 8),
        ]
    )
    assert "conv1.weight" in new and "m1/conv1.weight" in new
    for name, tensor in new.items():
        assert torch.all(tensor == (1.5 if name.startswith("m1/") else 7.0)), name
    only_simple = reduce([constant_update(SIMPLE, 1, 1.0, 0), constant_update(SIMPLE, 1, 2.0, 1)])
    for name, tensor in only_simple.items():
        assert torch.all(tensor == (1.5 if name.startswith("m1/") else -3.0)), name


def test_a_round_equals_two_fedavgs_by_hand() -> None:
    """One round through the engine's hosts and reducer equals, bit for bit, the unweighted FedAvg of the simple
    devices' simple models and that of the complex devices' complex models, each trained by the plain loop."""
    cfg = fedhen_config(DecoupleConfig())
    ds = tiny_image_dataset(NUM_CLIENTS)
    setup = build_setup(cfg, ds)
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    algo = setup.algorithm
    state = algo.init_state(setup.params)
    low, high = cfg.system.memory.values
    clients = (1, 4, 8, 10)
    views = [ClientView(c, ds.num_examples(c), (low if c < 6 else high) * 2.0**20) for c in clients]
    assignments = algo.assign(state, 0, views)
    tasks = [train_task(c, 0, cfg.seed, 0.05, assignments[c], state) for c in clients]
    aggregate, outcomes = build_backend(cfg, setup).train_and_reduce(tasks, state.params)
    assert [o.model_id for o in outcomes] == [1, 1, 0, 0]
    new = algo.server_update(state, 0, dataclasses.replace(aggregate, outcomes=tuple(outcomes)))
    plain = Algorithm(None, TRAIN)
    plain.bind_client(family(), SPEC)
    for model_id, config, group in ((1, SIMPLE, (1, 4)), (0, MODEL, (8, 10))):
        trained = []
        for c in group:
            model = build_model(config, SPEC)
            model.load_state_dict(model_params(state.params, model_id))
            x, y = ds.client_train(c)
            task = next(t for t in tasks if t.client_id == c)
            trained.append(plain.local_train(ClientContext.of(task, model, setup.input_spec), x, y).values)
        got = model_params(new.params, model_id)
        for name, value in got.items():
            assert torch.equal(value, (trained[0][name] + trained[1][name]) / 2.0), name
            assert not torch.equal(value, model_params(state.params, model_id)[name]) or name.startswith("side."), name


def test_decouple_with_only_complex_devices_is_fedavg_bit_for_bit() -> None:
    """No budgets, so every device is complex: Decouple's complex model is the unweighted FedAvg of the complex model,
    bit for bit (records and weights, its untrained side head included). The simple model, which no device trains
    then, keeps its start (the complex model's initial M part), and its accuracy is that of the initial simple
    model every round."""
    cfg = dataclasses.replace(fedhen_config(DecoupleConfig(), rounds=2), system=SystemConfig())
    ds = tiny_image_dataset(NUM_CLIENTS)
    decouple = run_experiment(cfg, write=False, dataset=ds)
    fedavg = run_experiment(
        dataclasses.replace(cfg, algorithm=FedAvgConfig(weighting="uniform")), write=False, dataset=ds
    )
    keys = ("train_loss", "test_acc", "test_loss", "clients_run", "clients_failed", "bytes_down", "bytes_up")
    assert [tuple(getattr(r, k) for k in keys) for r in decouple.records] == [
        tuple(getattr(r, k) for k in keys) for r in fedavg.records
    ]
    assert [r.clients_per_model for r in decouple.records] == ["4 0", "4 0"]
    assert set(model_params(decouple.state.params, 0)) == set(fedavg.state.params)
    for name, value in fedavg.state.params.items():
        assert torch.equal(decouple.state.params[name], value), name
    initial = build_setup(cfg, ds).params
    simple = model_params(decouple.state.params, 1)
    assert simple and all(torch.equal(v, initial[k]) for k, v in simple.items())
    assert len({e.test_acc for e in decouple.evals}) == 1  # the same untrained simple model every round


def _run(**backend: object) -> RunResult:
    cfg = fedhen_config(DecoupleConfig(), rounds=2, **backend)
    return run_experiment(cfg, write=False, dataset=tiny_image_dataset(NUM_CLIENTS))


def _assert_identical(a: RunResult, b: RunResult) -> None:
    keys = ("train_loss", "test_acc", "test_loss", "bytes_down", "bytes_up", "model_accs", "clients_per_model")
    assert [tuple(getattr(r, k) for k in keys) for r in a.records] == [
        tuple(getattr(r, k) for k in keys) for r in b.records
    ]
    assert a.state.params.keys() == b.state.params.keys()
    for name in a.state.params:
        assert torch.equal(a.state.params[name], b.state.params[name]), name


def test_a_run_trains_both_models_and_records_them() -> None:
    result = _run()
    assert len(result.state.models) == 2
    for record in result.records:
        accs = [float(a) for a in record.model_accs.split()]
        assert len(accs) == 2 and accs[0] == record.test_acc and 0.0 <= accs[1] <= 1.0
        counts = [int(c) for c in record.clients_per_model.split()]
        assert sum(counts) == record.clients_run - record.clients_failed
    assert np.sum([int(c) for r in result.records for c in r.clients_per_model.split()[1:]]) > 0


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_ray_equals_in_process() -> None:
    local = _run(kind="local", num_hosts=1)
    _assert_identical(local, _run(kind="ray", num_hosts=3, num_shards=2, cpus_per_host=0.25))


def test_build_algorithm_name() -> None:
    decouple = build_algorithm(DecoupleConfig(), TRAIN)
    assert isinstance(decouple, FedHeN) and decouple.name == "decouple"
    assert decouple.own_simple_model and not decouple.side_objective


# --------------------------------------------------------------------------- records: simple, complex, device average
@pytest.mark.parametrize("algorithm", [DecoupleConfig(), FedHeNConfig(), NoSideConfig()])
def test_records_hold_both_models_and_the_device_average(tmp_path, algorithm) -> None:  # type: ignore[no-untyped-def]
    """FedHeN, NoSide and Decouple record alike: the complex model as ``test_acc``, the simple one as ``simple`` in
    evals.csv, and ``device_acc`` = the mean over the 12 devices of their model's accuracy, 6 simple and 6 complex
    (memory levels fixed by id): (6 simple + 6 complex) / 12."""
    cfg = dataclasses.replace(fedhen_config(algorithm), output_dir=str(tmp_path))
    result = run_experiment(cfg, write=True, dataset=tiny_image_dataset(NUM_CLIENTS))
    assert [(e.round_idx, e.name) for e in result.evals] == [(0, "simple"), (1, "simple")]
    for record, simple in zip(result.records, result.evals, strict=True):
        assert record.device_acc == float(np.mean([simple.test_acc] * 6 + [record.test_acc] * 6))
    if isinstance(algorithm, DecoupleConfig):
        assert [float(r.model_accs.split()[1]) for r in result.records] == [e.test_acc for e in result.evals]
    assert result.run_dir is not None
    rows = list(csv.DictReader((result.run_dir / "rounds.csv").open()))
    assert [float(r["device_acc"]) for r in rows] == [r.device_acc for r in result.records]


def test_default_device_evals_follow_client_model_id() -> None:
    """Single-model runs: every device on the main evaluation; several models: the model ``client_model_id`` names."""
    views = [ClientView(c, 10) for c in range(5)]
    fedavg = FedAvg(FedAvgConfig(), TRAIN)
    assert fedavg.device_evals(ServerState(params={}), views) == ["main"] * 5
    independent = IndependentFedAvg(IndependentConfig(num_models=3), TRAIN)
    state = ServerState(params={}, models=(MODEL, MODEL, MODEL))
    assert independent.device_evals(state, views) == ["main", "model1", "model2", "main", "model1"]
    accs = {"main": 0.5, "model1": 0.25, "model2": 1.0}
    assert device_accuracy(accs, independent, state, views) == (0.5 + 0.25 + 1.0 + 0.5 + 0.25) / 5
    with pytest.raises(ValueError, match="model2"):
        device_accuracy({"main": 0.5, "model1": 0.25}, independent, state, views)
