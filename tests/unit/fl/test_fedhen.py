"""FedHeN and NoSide (paper 001): the side objective's gradient, the server's two means on hand tensors, device
types from budgets fixed by client id, NaN devices dropped, and the reductions to HeteroFL-style aggregation and to
FedAvg."""

from __future__ import annotations

import copy
import csv
import dataclasses

import numpy as np
import pytest
import torch
from torch import nn

from rayfl.config.model import ResNetConfig
from rayfl.config.sections import BackendConfig, ResourceConfig, SystemConfig, TrainConfig
from rayfl.core.messages import ClientUpdate, ClientView, ServerState, TrainTask
from rayfl.core.reducers import MaskedWeightedMean
from rayfl.data.federated import FederatedDataset, from_client_arrays
from rayfl.engine.build import bind_algorithm, build_backend, build_clock, build_setup
from rayfl.engine.driver import run_experiment
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api.algorithm import Algorithm
from rayfl.fl.api.client import ClientContext
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.fedhen.algorithm import FedHeN
from rayfl.fl.methods.fedhen.config import FedHeNConfig, NoSideConfig
from rayfl.fl.methods.heterofl.algorithm import HeteroFL
from rayfl.fl.methods.heterofl.config import HeteroFLConfig
from rayfl.fl.registry import build_algorithm
from rayfl.models.elastic import CostModel
from rayfl.models.elastic.resnet import ElasticResNet, ResNetFamily
from rayfl.models.elastic.spec import first_k
from rayfl.models.inputs import InputSpec
from tests.helpers import tiny_image_dataset

MODEL = ResNetConfig(widths=(4, 8, 8, 8), norm="gn", side_exit=2, side_pool=2)
TRAIN = TrainConfig(lr=0.05, batch_size=5, eval_batch_size=16, grad_clip_norm=10.0)
NUM_CLIENTS = 12


pytestmark = pytest.mark.usefixtures("private_cache_one_thread")


def family() -> ResNetFamily:
    return ResNetFamily(MODEL, in_channels=3, num_classes=4, image_size=8)


def memory_levels_mib(fam: ResNetFamily) -> tuple[float, float]:
    """A simple device's memory (between the two models' needs) and a complex device's (above both)."""
    cm = CostModel(fam, batch_size=TRAIN.batch_size, optimizer="sgd", momentum=0.0)
    simple, complex_ = cm.evaluate(np.array([fam.side_exit_units(), fam.full_units])).peak_memory / 2.0**20
    assert simple < complex_
    return float(simple + complex_) / 2, float(complex_) * 2


def fedhen_config(algorithm: object = None, rounds: int = 2, **backend: object) -> ExperimentConfig:
    """12 clients, 4 per round; ids 0-5 simple devices, 6-11 complex (memory levels fixed by id)."""
    low, high = memory_levels_mib(family())
    return ExperimentConfig(
        name="fedhen",
        rounds=rounds,
        clients_per_round=4,
        model=MODEL,
        algorithm=algorithm or FedHeNConfig(),  # type: ignore[arg-type]
        train=TRAIN,
        backend=BackendConfig(**{"kind": "local", "num_hosts": 2, **backend}),  # type: ignore[arg-type]
        system=SystemConfig(memory=ResourceConfig(source="levels", values=(low, high), id_bounds=(6,))),
    )


def bound(cfg: ExperimentConfig, dataset: FederatedDataset | None = None) -> Algorithm:
    setup = build_setup(cfg, dataset or tiny_image_dataset(NUM_CLIENTS))
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    return setup.algorithm


def batch(n: int = 6, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 8, 8, generator=gen), torch.randint(0, 4, (n,), generator=gen)


def complex_model(seed: int = 0) -> ElasticResNet:
    torch.manual_seed(seed)
    model = family().global_model()
    assert isinstance(model, ElasticResNet)
    return model


def grads(model: nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def task(client_id: int = 0) -> TrainTask:
    from rayfl.core.messages import Assignment

    return TrainTask(client_id=client_id, round_idx=0, seed=0, lr=0.05, assignment=Assignment())


def context(model: nn.Module) -> ClientContext:
    """Client 0's context training ``model`` on ``batch()``'s 3x8x8 images of 4 classes."""
    return ClientContext.of(task(), model, InputSpec(input_kind="image", num_classes=4, sample_shape=(3, 8, 8)))


# ------------------------------------------------------------------------------------------- client objective
def test_side_objective_gradient_is_the_sum_of_both_losses_gradients() -> None:
    """Algorithm 2, line 13: one backward through CE(main) + CE(side) = grad f(w) + grad f([w]_M). Checked against
    the two losses back-propagated apart (the side loss on the extracted simple model), and by hand on the two heads'
    biases: d CE / d bias = mean over the batch of softmax(logits) - onehot(y)."""
    x, y = batch()
    x = x.double()  # float64, so that the two summation orders agree to 1e-12
    algo = FedHeN(FedHeNConfig(), TRAIN)
    fam = family()
    algo.bind_client(fam, None)  # type: ignore[arg-type]
    model = complex_model().double()
    algo.backward_step(context(model), x, y)
    total = grads(model)

    main_only = complex_model().double()
    nn.functional.cross_entropy(main_only(x), y).backward()  # type: ignore[no-untyped-call]
    main = grads(main_only)
    simple = fam.extract(complex_model().state_dict(), first_k(fam.side_exit_units())).double()
    nn.functional.cross_entropy(simple(x), y).backward()  # type: ignore[no-untyped-call]
    side = grads(simple)

    assert set(total) == set(main) | set(side)
    assert set(side) < set(main) | set(side) and not set(side) & {"linear.weight", "n4.weight"}
    for name, g in total.items():
        expected = main.get(name, torch.zeros_like(g)) + side.get(name, torch.zeros_like(g))
        torch.testing.assert_close(g, expected, rtol=1e-12, atol=1e-14)
    shared = [n for n in side if n.startswith("layers.0.")]
    assert shared and all(not torch.equal(total[n], main[n]) for n in shared)  # the side loss reaches stage 1

    with torch.no_grad():
        side_logits, main_logits = complex_model().double().forward_exits(x)
    onehot = nn.functional.one_hot(y, 4).to(torch.float64)
    torch.testing.assert_close(total["side.linear.bias"], (side_logits.softmax(1) - onehot).mean(0))
    torch.testing.assert_close(total["linear.bias"], (main_logits.softmax(1) - onehot).mean(0))


def test_noside_trains_on_the_models_own_loss_only() -> None:
    """NoSide's complex devices never touch the side head; its simple devices train the side exit (their only one)."""
    x, y = batch()
    noside = FedHeN(NoSideConfig(), TRAIN)
    model = complex_model()
    noside.backward_step(context(model), x, y)
    assert model.get_parameter("side.linear.weight").grad is None
    reference = complex_model()
    Algorithm(None, TRAIN).backward_step(context(reference), x, y)
    for name, g in grads(reference).items():
        assert torch.equal(grads(model)[name], g), name
    fam = family()
    simple = fam.extract(complex_model().state_dict(), first_k(fam.side_exit_units()))
    loss = noside.local_loss(context(simple), x, y)
    assert torch.equal(loss, nn.functional.cross_entropy(simple(x), y))


# ------------------------------------------------------------------------------------------------- server
def constant_update(fam: ResNetFamily, units: tuple[int, ...], value: float, client_id: int) -> ClientUpdate:
    """A client that trained ``units`` to every weight equal to ``value``."""
    sel = first_k(units)
    model = fam.build(units)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            tensor.fill_(value)
    values, slices = fam.scatter(model, sel)
    return ClientUpdate(client_id, 1.0, values, slices, num_examples=7 * client_id + 3, train_loss=0.0, num_steps=1)


def test_fedhen_aggregation_on_hand_tensors() -> None:
    """Algorithm 1, lines 17-22, with every weight of a device at one value. Simple devices at 1 and 2, complex ones
    at 4 and 10: the simple part M is (1 + 2 + 4 + 10) / 4 = 4.25 (all active devices, unweighted), the rest M' is
    (4 + 10) / 2 = 7 (complex devices only). Without complex devices M' keeps its value (here -3)."""
    fam = family()
    algo = FedHeN(FedHeNConfig(), TRAIN)
    algo.bind_client(fam, None)  # type: ignore[arg-type]
    simple_units, complex_units = fam.side_exit_units(), fam.full_units
    assert algo.client_weight(3) == algo.client_weight(500) == 1.0  # unweighted, whatever the data size
    previous = {k: torch.full_like(v, -3.0) for k, v in fam.global_model().state_dict().items()}
    shapes = {k: v.shape for k, v in previous.items()}
    shared = set(fam.slices(first_k(simple_units)))

    def reduce(updates: list[ClientUpdate]) -> dict[str, torch.Tensor]:
        reducer = algo.reducer
        assert isinstance(reducer, MaskedWeightedMean)
        hosts: list[dict] = [{}, {}]  # two hosts, merged in host order as the shards do
        for i, update in enumerate(updates):
            reducer.accumulate(hosts[i % 2], dataclasses.replace(update, weight=algo.client_weight(9)), shapes)
        new, _ = reducer.finalize(reducer.merge(hosts), previous)
        return new

    new = reduce(
        [
            constant_update(fam, simple_units, 1.0, 0),
            constant_update(fam, simple_units, 2.0, 1),
            constant_update(fam, complex_units, 4.0, 7),
            constant_update(fam, complex_units, 10.0, 8),
        ]
    )
    assert shared and set(new) - shared
    for name, tensor in new.items():
        assert torch.all(tensor == (4.25 if name in shared else 7.0)), name
    only_simple = reduce([constant_update(fam, simple_units, 1.0, 0), constant_update(fam, simple_units, 2.0, 1)])
    for name, tensor in only_simple.items():
        assert torch.all(tensor == (1.5 if name in shared else -3.0)), name


def test_device_types_follow_the_memory_levels_fixed_by_id() -> None:
    """Ids 0-5 have a simple device's memory (the complex model does not fit), ids 6-11 a complex device's."""
    cfg = fedhen_config()
    algo = bound(cfg)
    assert isinstance(algo, FedHeN)
    low, high = cfg.system.memory.values
    views = [ClientView(c, 20, (low if c < 6 else high) * 2.0**20) for c in (0, 5, 6, 11)]
    assignments = algo.assign(ServerState(params={}), 0, views)
    fam = family()
    assert [assignments[c].units for c in (0, 5)] == [fam.side_exit_units()] * 2
    assert [assignments[c].units for c in (6, 11)] == [fam.full_units] * 2
    assert set(assignments[0].slices) < set(assignments[6].slices) and not assignments[0].skip & {"conv1.weight"}
    assert algo.eval_structures(ServerState(params={})) == {"simple": fam.side_exit_units()}


# ----------------------------------------------------------------------------------------- whole runs
def test_a_fedhen_run_records_both_models(tmp_path) -> None:
    """Every round: the complex model in rounds.csv, the simple model in evals.csv (and evals.parquet)."""
    cfg = dataclasses.replace(fedhen_config(), output_dir=str(tmp_path))
    result = run_experiment(cfg, write=True, dataset=tiny_image_dataset(NUM_CLIENTS))
    assert [(e.round_idx, e.name) for e in result.evals] == [(0, "simple"), (1, "simple")]
    assert all(0.0 <= e.test_acc <= 1.0 for e in result.evals)
    assert result.run_dir is not None
    rows = list(csv.DictReader((result.run_dir / "evals.csv").open()))
    assert [(int(r["round_idx"]), r["name"], float(r["test_acc"])) for r in rows] == [
        (e.round_idx, e.name, e.test_acc) for e in result.evals
    ]
    assert (result.run_dir / "evals.parquet").exists()
    assert all(r.clients_failed == 0 for r in result.records)
    # the complex model's main head and the simple model's side head both moved from their initial values
    initial = build_setup(fedhen_config(), tiny_image_dataset(NUM_CLIENTS)).params
    for name in ("linear.weight", "side.linear.weight", "layers.0.0.conv1.weight"):
        assert not torch.equal(result.state.params[name], initial[name]), name


def nan_dataset(bad_client: int) -> FederatedDataset:
    """The tiny data set as float images, with one client's images all NaN (its training diverges at once)."""
    ds = tiny_image_dataset(NUM_CLIENTS)
    train = []
    for c in range(ds.num_clients):
        x, y = ds.client_train(c)
        xf = x.astype(np.float32) / 255.0
        if c == bad_client:
            xf[:] = np.nan
        train.append((xf, y))
    meta = {"mean": [0.5] * 3, "std": [0.25] * 3}
    return from_client_arrays("nan", "image", 4, train, ds.x_test.astype(np.float32) / 255.0, ds.y_test, meta=meta)


def test_a_nan_device_is_dropped_for_the_round_and_counted() -> None:
    """Paper 001: a device whose model turned NaN is left out of that round's aggregate. The aggregate with it equals
    the aggregate of the others, and the run counts it as failed (``nan_update``)."""
    cfg = fedhen_config()
    ds = nan_dataset(bad_client=7)
    setup = build_setup(cfg, ds)
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    fam = family()
    complex_ = fam.assignment(first_k(fam.full_units))
    simple = fam.assignment(first_k(fam.side_exit_units()))
    tasks = [
        TrainTask(client_id=c, round_idx=0, seed=cfg.seed, lr=0.05, assignment=simple if c < 6 else complex_)
        for c in (2, 7, 9)
    ]
    backend = build_backend(cfg, setup)
    with_nan, outcomes = backend.train_and_reduce(tasks, setup.params)
    without, _ = backend.train_and_reduce([t for t in tasks if t.client_id != 7], setup.params)
    assert [o.failure for o in outcomes] == [None, "nan_update", None]
    assert with_nan.num_clients == 2
    for name in with_nan.params:
        assert torch.equal(with_nan.params[name], without.params[name]), name
        assert torch.isfinite(with_nan.params[name]).all()


def test_noside_with_only_complex_devices_is_fedavg_bit_for_bit() -> None:
    """At the full model (every device complex) without the side objective, FedHeN's aggregation is the unweighted
    FedAvg: NoSide equals FedAvg (uniform weights) bit for bit, records and final weights."""
    cfg = dataclasses.replace(fedhen_config(NoSideConfig(), rounds=2), system=SystemConfig())
    ds = tiny_image_dataset(NUM_CLIENTS)
    noside = run_experiment(cfg, write=False, dataset=ds)
    fedavg = run_experiment(
        dataclasses.replace(cfg, algorithm=FedAvgConfig(weighting="uniform")), write=False, dataset=ds
    )
    for a, b in zip(noside.records, fedavg.records, strict=True):
        assert (a.train_loss, a.test_acc, a.test_loss, a.bytes_up) == (
            b.train_loss,
            b.test_acc,
            b.test_loss,
            b.bytes_up,
        )
    for name, value in fedavg.state.params.items():
        assert torch.equal(noside.state.params[name], value), name


def test_noside_is_heterofl_aggregation_without_the_side_loss() -> None:
    """NoSide = HeteroFL's aggregation (count-normalised element-wise mean, every client weighing 1) of updates
    trained without the side loss: its reducer and weights are HeteroFL's, and a round of NoSide equals, bit for bit,
    that mean computed by hand over the same sub-models trained by the plain cross-entropy loop."""
    cfg = fedhen_config(NoSideConfig())
    noside = bound(cfg)
    heterofl = HeteroFL(HeteroFLConfig(label_mask=False, static_bn=False), TRAIN)
    assert type(noside.reducer) is type(heterofl.reducer) and noside.client_weight(13) == heterofl.client_weight(13)
    ds = tiny_image_dataset(NUM_CLIENTS)
    setup = build_setup(cfg, ds)
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    fam = family()
    plain = Algorithm(None, TRAIN)
    plain.bind_client(fam, setup.input_spec)
    low, high = cfg.system.memory.values
    clients = (1, 4, 8, 10)
    views = [ClientView(c, ds.num_examples(c), (low if c < 6 else high) * 2.0**20) for c in clients]
    assignments = setup.algorithm.assign(ServerState(params=setup.params), 0, views)
    tasks = [TrainTask(client_id=c, round_idx=0, seed=cfg.seed, lr=0.05, assignment=assignments[c]) for c in clients]
    aggregate, _ = build_backend(cfg, setup).train_and_reduce(tasks, setup.params)
    shapes = {k: v.shape for k, v in setup.params.items()}
    partial: dict = {}
    reducer = MaskedWeightedMean()
    for t in tasks:
        model = fam.extract(setup.params, first_k(t.assignment.units or fam.full_units))
        x, y = ds.client_train(t.client_id)
        update = plain.local_train(ClientContext.of(t, model, setup.input_spec), x, y)
        reducer.accumulate(partial, dataclasses.replace(update, weight=heterofl.client_weight(len(y))), shapes)
    by_hand, _ = reducer.finalize(partial, setup.params)
    for name, value in by_hand.items():
        assert torch.equal(aggregate.params[name], value), name


def test_build_algorithm_names() -> None:
    fedhen = build_algorithm(FedHeNConfig(), TRAIN)
    assert isinstance(fedhen, FedHeN) and fedhen.side_objective and not fedhen.own_simple_model
    noside = build_algorithm(NoSideConfig(), TRAIN)
    assert isinstance(noside, FedHeN) and not noside.side_objective and not noside.own_simple_model
    assert copy.deepcopy(noside).name == "noside"
