"""HeteroFL, FedRolex, Federated Dropout and AnyCostFL: rate choice, channel selectors, label masking, static BN.

Everything trains real (tiny) models through the real engine pieces; nothing is mocked.
"""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, cast

import numpy as np
import pytest
import torch
from torch import nn

from rayfl.config.model import CNNConfig, ResNetConfig
from rayfl.config.sections import ExportConfig, ResourceConfig, SystemConfig
from rayfl.core.messages import ClientUpdate, ClientView, Params, ServerState, TensorSlice, TrainTask
from rayfl.core.rng import derive_rng
from rayfl.data.federated import FederatedDataset, from_client_arrays
from rayfl.engine.build import Setup, bind_algorithm, build_backend, build_clock, build_setup
from rayfl.engine.driver import run_experiment
from rayfl.engine.persist.export import exported_models
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api.algorithm import ServerContext
from rayfl.fl.api.client import ClientContext
from rayfl.fl.common.rates import UniformRates, client_label_set, uniform_selection
from rayfl.fl.methods.anycostfl.algorithm import AnyCostFL
from rayfl.fl.methods.anycostfl.config import AnyCostFLConfig
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.feddropout.algorithm import FedDropout
from rayfl.fl.methods.feddropout.config import FedDropoutConfig
from rayfl.fl.methods.fedrolex.algorithm import FedRolex
from rayfl.fl.methods.fedrolex.config import FedRolexConfig
from rayfl.fl.methods.heterofl.algorithm import (
    STATIC_BN_CHUNK,
    HeteroFL,
    _PerBatchNorm,
    _same_size_runs,
    static_bn_batches,
    static_bn_statistics,
    static_bn_statistics_sequential,
    tracked_global_model,
)
from rayfl.fl.methods.heterofl.config import HeteroFLConfig
from rayfl.models import InputSpec, to_input
from rayfl.models.elastic import ResNetFamily
from tests.helpers import tiny_config, tiny_image_dataset

# the uniform-rate methods (each holds a ``UniformRates``)
RateMethod = HeteroFL | FedRolex | FedDropout | AnyCostFL

CNN = CNNConfig(channels=(8, 16))
CNN_BN = CNNConfig(channels=(8, 16), norm="batch")
INF = float("inf")
R = (1.0, 0.5, 0.25)


def _cfg(algorithm: Any, model: Any = CNN, **changes: Any) -> ExperimentConfig:
    return dataclasses.replace(tiny_config(kind="local"), algorithm=algorithm, model=model, **changes)


def _bound(cfg: ExperimentConfig, dataset: FederatedDataset | None = None) -> tuple[RateMethod, Setup]:
    """The run's algorithm bound to its real family, cost model (the clock's) and data, as the driver binds it."""
    setup = build_setup(cfg, dataset if dataset is not None else tiny_image_dataset())
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    return cast(RateMethod, setup.algorithm), setup


def _views(client_ids: range | list[int], memory: float = INF, bandwidth: float = INF) -> list[ClientView]:
    return [ClientView(c, 20, memory, bandwidth) for c in client_ids]


Rows = dict[int, tuple[tuple[int, ...], tuple[int, ...]]]


def _axis(tslice: TensorSlice, k: int) -> np.ndarray:
    """The global indices a slice keeps on axis ``k`` (which must be sliced)."""
    index = tslice.index[k]
    assert index is not None
    return index


def _rows_index(alg: RateMethod, state: ServerState, round_idx: int, views: list[ClientView]) -> Rows:
    """Per client, the global output channels its conv1 (features.0) and conv2 (features.4) keep."""
    out: Rows = {}
    for cid, a in alg.assign(state, round_idx, views).items():
        conv1, conv2 = a.slices["features.0.weight"], a.slices["features.4.weight"]
        assert np.array_equal(_axis(conv2, 1), _axis(conv1, 0))  # conv2 reads what conv1 writes
        out[cid] = (tuple(int(i) for i in _axis(conv1, 0)), tuple(int(i) for i in _axis(conv2, 0)))
    return out


# --------------------------------------------------------------------------------------------- (1) FedAvg limit
@pytest.fixture(scope="module")
def fedavg_params() -> Params:
    cfg = _cfg(FedAvgConfig(weighting="uniform"), CNN_BN, rounds=2)
    return run_experiment(cfg, write=False, dataset=tiny_image_dataset()).state.params


@pytest.mark.parametrize(
    "algorithm",
    [
        # static_bn on: it must not touch training; no official clipping (FedAvg trains with train.grad_clip_norm)
        HeteroFLConfig(rates=(1.0,), label_mask=False, official_init=False, grad_clip_norm=None),
        FedRolexConfig(rates=(1.0,), label_mask=False, official_init=False, grad_clip_norm=None),
        FedDropoutConfig(rates=(1.0,), label_mask=False),
        AnyCostFLConfig(rates=(1.0,), label_mask=False),
    ],
    ids=lambda a: a.name,
)
def test_full_width_equals_uniform_fedavg_bit_for_bit(algorithm: Any, fedavg_params: Params) -> None:
    result = run_experiment(_cfg(algorithm, CNN_BN, rounds=2), write=False, dataset=tiny_image_dataset())
    assert set(result.state.params) == set(fedavg_params)  # no running statistics entered the global model
    for name, value in fedavg_params.items():
        assert torch.equal(result.state.params[name], value), name
    assert all(np.isfinite(r.test_acc) for r in result.records)


@pytest.mark.parametrize("algorithm", [HeteroFLConfig(), FedRolexConfig()], ids=lambda a: a.name)
def test_official_clipping_reaches_local_training(algorithm: Any, fedavg_params: Params) -> None:
    """At full width with the default clipping (norm 1, the official codes'), HeteroFL and FedRolex equal, bit for
    bit, FedAvg trained with ``train.grad_clip_norm=1``, and differ from unclipped FedAvg: the method's clipping
    replaces the run's in the hosts' local training. ``null`` leaves the run's own."""
    full = dataclasses.replace(algorithm, rates=(1.0,), label_mask=False, official_init=False)
    base = _cfg(full, CNN_BN, rounds=2)
    assert base.train.grad_clip_norm == 0.0
    clipped = _cfg(FedAvgConfig(weighting="uniform"), CNN_BN, rounds=2)
    clipped = dataclasses.replace(clipped, train=dataclasses.replace(clipped.train, grad_clip_norm=1.0))
    want = run_experiment(clipped, write=False, dataset=tiny_image_dataset()).state.params
    got = run_experiment(base, write=False, dataset=tiny_image_dataset()).state.params
    for name, value in want.items():
        assert torch.equal(got[name], value), name
    assert any(not torch.equal(got[n], v) for n, v in fedavg_params.items())  # clipping changed the training
    method = HeteroFL if isinstance(algorithm, HeteroFLConfig) else FedRolex
    train = dataclasses.replace(base.train, grad_clip_norm=0.5)
    assert method(dataclasses.replace(full, grad_clip_norm=None), train).train.grad_clip_norm == 0.5
    assert method(dataclasses.replace(full, grad_clip_norm=0.0), train).train.grad_clip_norm == 0.0
    assert FedDropout(FedDropoutConfig(), train).train.grad_clip_norm == 0.5  # the other rate methods: the run's


# ------------------------------------------------------------------------------------------ (2) FedRolex window
def test_fedrolex_window_rolls_one_unit_per_round_and_wraps() -> None:
    alg, setup = _bound(_cfg(FedRolexConfig(rates=(0.5,))))
    state = alg.init_state(setup.params)
    # {(n - r + j) mod n : j < k}, n = 8, k = 4 (conv1) and n = 16, k = 8 (conv2), written out by hand
    expected = {
        0: ((0, 1, 2, 3), (0, 1, 2, 3, 4, 5, 6, 7)),
        1: ((0, 1, 2, 7), (0, 1, 2, 3, 4, 5, 6, 15)),
        5: ((3, 4, 5, 6), (0, 1, 2, 11, 12, 13, 14, 15)),
        7: ((1, 2, 3, 4), (0, 9, 10, 11, 12, 13, 14, 15)),
        8: ((0, 1, 2, 3), (8, 9, 10, 11, 12, 13, 14, 15)),  # conv1 wrapped all the way round, conv2 half way
    }
    for round_idx, want in expected.items():
        got = _rows_index(alg, state, round_idx, _views([0, 3, 7]))
        assert set(got.values()) == {want}, round_idx  # the same window for every client of the round


# ----------------------------------------------------------------------------------------------- (3) rate choice
def test_the_rate_is_the_largest_that_fits_both_budgets() -> None:
    alg, setup = _bound(_cfg(HeteroFLConfig(rates=(1.0, 0.5, 0.25))))
    state = alg.init_state(setup.params)
    units = {r: alg.uniform_units(r) for r in (1.0, 0.5, 0.25)}
    costs = alg.cost.evaluate(np.array([units[r] for r in (1.0, 0.5, 0.25)]))
    memory = dict(zip((1.0, 0.5, 0.25), costs.peak_memory.tolist(), strict=True))
    comm = dict(zip((1.0, 0.5, 0.25), (costs.bytes_down + costs.bytes_up).tolist(), strict=True))
    assert memory[0.25] < memory[0.5] < memory[1.0] and comm[0.25] < comm[0.5] < comm[1.0]

    between_memory = _views([0], memory=(memory[0.5] + memory[1.0]) / 2)
    between_comm = _views([1], bandwidth=(comm[0.5] + comm[1.0]) / 2)
    exact = _views([2], memory=memory[0.5], bandwidth=comm[0.5])
    assigned = alg.assign(state, 0, between_memory + between_comm + exact)
    assert {c: a.units for c, a in assigned.items()} == {0: units[0.5], 1: units[0.5], 2: units[0.5]}

    rng = np.random.default_rng(0)
    views = [
        ClientView(
            c, 20, float(rng.uniform(memory[0.25], 1.2 * memory[1.0])), float(rng.uniform(comm[0.25], 1.2 * comm[1.0]))
        )
        for c in range(40)
    ]
    order = (0.25, 0.5, 1.0)
    for view in views:
        rate = next(r for r in order if alg.assign(state, 0, [view])[view.client_id].units == units[r])
        assert memory[rate] <= view.memory_budget and comm[rate] <= view.bandwidth_budget  # it fits
        for larger in order[order.index(rate) + 1 :]:  # and no larger rate would
            assert memory[larger] > view.memory_budget or comm[larger] > view.bandwidth_budget
    # nothing fits: the smallest rate (the clock then fails the client)
    assert alg.assign(state, 0, _views([9], memory=memory[0.25] / 2))[9].units == units[0.25]


def test_the_rate_fits_the_compute_budget_and_devices_are_scored_on_their_rate() -> None:
    """``system.compute_limit_s``: the round's training FLOPs (3 x forward x samples) fit the compute budget; with
    ``eval_widths`` listing the rates, each device is scored on the x rate sub-model it trains."""
    alg, setup = _bound(_cfg(HeteroFLConfig(rates=R), eval_widths=(0.25, 0.5)))
    state = alg.init_state(setup.params)
    units = {r: alg.uniform_units(r) for r in R}
    flops = dict(zip(R, (3.0 * alg.cost.evaluate(np.array([units[r] for r in R])).flops * 20).tolist(), strict=True))
    assert flops[0.25] < flops[0.5] < flops[1.0]
    views = [
        ClientView(0, 20, INF, INF, (flops[0.5] + flops[1.0]) / 2),
        ClientView(1, 20, INF, INF, flops[0.25]),
        ClientView(2, 20, INF, INF, INF),
    ]
    assigned = alg.assign(state, 0, views)
    assert [assigned[c].units for c in (0, 1, 2)] == [units[0.5], units[0.25], units[1.0]]
    assert alg.device_evals(state, views) == ["x0.5", "x0.25", "main"]  # 1 is not among eval_widths: the main one


@pytest.mark.parametrize(
    "algorithm",
    [HeteroFLConfig(rates=R), FedRolexConfig(rates=R), FedDropoutConfig(rates=R), AnyCostFLConfig(rates=R)],
    ids=lambda a: a.name,
)
def test_mixed_budgets_run_without_failures(algorithm: Any) -> None:
    """Memory budgets between the 0.25 and the 1.0 sub-models' needs: every client gets a fitting rate."""
    memory = ResourceConfig(source="uniform", low=0.02, high=0.07)  # MiB; needs: 0.018 (0.25), 0.031, 0.062 (1.0)
    cfg = _cfg(algorithm, CNN_BN, rounds=2, system=SystemConfig(memory=memory))
    records = run_experiment(cfg, write=False, dataset=tiny_image_dataset()).records
    assert all(r.clients_failed == 0 and r.over_budget == 0 and r.clients_run == 5 for r in records)
    assert all(0.0 < r.memory_util <= 1.0 and np.isfinite(r.test_acc) for r in records)


# --------------------------------------------------------------------------------------------- (4) label masking
def _three_label_dataset(num_clients: int = 6, per_client: int = 16) -> FederatedDataset:
    """4 classes, but no client holds class 3; client 0 holds only classes 0 and 2 (each class a colour shift)."""
    rng = np.random.default_rng(1)
    shift = rng.integers(-60, 60, size=(4, 3, 1, 1))

    def make(n: int, keep: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
        y = np.array([keep[i % len(keep)] for i in range(n)], dtype=np.int64)
        x = np.clip(rng.integers(60, 196, size=(n, 3, 8, 8)) + shift[y], 0, 255).astype(np.uint8)
        return x, y

    train = [make(per_client, (0, 2) if c == 0 else (0, 1, 2)) for c in range(num_clients)]
    x_test, y_test = make(30, (0, 1, 2))
    return from_client_arrays("three", "image", 4, train, x_test, y_test, meta={"mean": [0.5] * 3, "std": [0.25] * 3})


def _train_client(alg: RateMethod, setup: Setup, client: int, rate: float) -> tuple[ClientUpdate, nn.Module, Params]:
    """One client's local training on its extracted sub-model: the update, the trained model, its start weights."""
    assert alg.family is not None
    selection = uniform_selection(alg.family, alg.init_state(setup.params), rate, alg.selector(0, client))
    model = alg.family.extract(setup.params, selection)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    task = TrainTask(client_id=client, round_idx=0, seed=0, lr=0.1, assignment=alg.family.assignment(selection))
    x, y = setup.dataset.client_train(client)
    return alg.local_train(ClientContext.of(task, model, setup.input_spec), x, y), model, start


def test_label_mask_uploads_only_the_clients_classifier_rows_and_masks_absent_logits() -> None:
    dataset = _three_label_dataset()
    alg, setup = _bound(_cfg(HeteroFLConfig(rates=(0.5,))), dataset)
    update, model, start = _train_client(alg, setup, 0, 0.5)
    rows = update.slices["head.weight"]
    assert np.array_equal(_axis(rows, 0), [0, 2]) and np.array_equal(_axis(rows, 1), np.arange(8))  # first-k inputs
    assert np.array_equal(_axis(update.slices["head.bias"], 0), [0, 2])
    trained = model.state_dict()
    assert torch.equal(update.values["head.weight"], trained["head.weight"][[0, 2]])
    assert torch.equal(update.values["head.bias"], trained["head.bias"][[0, 2]])
    # absent classes' logits are 0 in the loss: their rows get no gradient and stay as extracted
    assert torch.equal(trained["head.weight"][[1, 3]], start["head.weight"][[1, 3]])
    assert torch.equal(trained["head.bias"][[1, 3]], start["head.bias"][[1, 3]])
    assert not torch.equal(trained["head.weight"][[0, 2]], start["head.weight"][[0, 2]])

    unmasked, _ = _bound(_cfg(HeteroFLConfig(rates=(0.5,), label_mask=False)), dataset)
    plain, plain_model, _ = _train_client(unmasked, setup, 0, 0.5)
    assert plain.values["head.weight"].shape[0] == 4 and plain.slices["head.weight"].index[0] is None
    assert not torch.equal(plain_model.state_dict()["head.weight"][[1, 3]], start["head.weight"][[1, 3]])


def test_rows_of_labels_no_client_holds_keep_their_global_value() -> None:
    dataset = _three_label_dataset()
    cfg = _cfg(HeteroFLConfig(rates=(1.0, 0.5)), rounds=1, clients_per_round=4)
    cfg = dataclasses.replace(cfg, system=SystemConfig(memory=ResourceConfig(source="binary", low=0.04, high=1.0)))
    initial = build_setup(cfg, dataset).params
    result = run_experiment(cfg, write=False, dataset=dataset)
    assert result.records[0].clients_failed == 0
    new = result.state.params
    assert torch.equal(new["head.weight"][3], initial["head.weight"][3])
    assert float(new["head.bias"][3]) == 0.0  # HeteroFL's official initial classifier bias, kept
    for c in (0, 1, 2):
        assert not torch.equal(new["head.weight"][c], initial["head.weight"][c])


def test_label_set_of_next_character_prediction_is_every_target() -> None:
    x = np.array([[5, 1, 2], [7, 3, 3]], dtype=np.uint8)
    y = np.array([4, 9])
    assert client_label_set(x, y, "all").tolist() == [1, 2, 3, 4, 9]  # x[:, 0] is never a target
    assert client_label_set(x, y, "last").tolist() == [4, 9]


# ----------------------------------------------------------------------------------- (5) random and top-k norm
def test_feddropout_draws_differ_per_client_and_replay_from_the_seed() -> None:
    alg, setup = _bound(_cfg(FedDropoutConfig(rates=(0.5,))))
    state = alg.init_state(setup.params)
    first = _rows_index(alg, state, 3, _views(range(6)))
    assert len(set(first.values())) > 1  # clients of a round differ
    again, _ = _bound(_cfg(FedDropoutConfig(rates=(0.5,))))
    assert _rows_index(again, state, 3, _views(range(6))) == first  # replayed from the seed
    assert _rows_index(again, state, 4, _views(range(6))) != first  # a new draw each round
    other, _ = _bound(dataclasses.replace(_cfg(FedDropoutConfig(rates=(0.5,))), seed=1))
    assert _rows_index(other, state, 3, _views(range(6))) != first
    assert all(len(a) == 4 and len(b) == 8 for a, b in first.values())

    shared, _ = _bound(_cfg(FedDropoutConfig(rates=(0.5,), per_client=False)))
    per_round = [_rows_index(shared, state, r, _views(range(6))) for r in (3, 4)]
    assert all(len(set(d.values())) == 1 for d in per_round)  # one draw shared by the round
    assert per_round[0][0] != per_round[1][0]


def test_anycostfl_keeps_the_channels_with_the_largest_norm() -> None:
    alg, setup = _bound(_cfg(AnyCostFLConfig(rates=(0.5,))))
    params = {k: v.clone() for k, v in setup.params.items()}
    norms1 = torch.tensor([0.1, 0.9, 0.2, 0.8, 0.7, 0.3, 0.6, 0.05])
    params["features.0.weight"] = norms1.view(8, 1, 1, 1).expand(8, 3, 3, 3).clone()
    odd = torch.arange(16) % 2 == 1
    norms2 = torch.where(odd, torch.arange(16, dtype=torch.float32) + 1.0, torch.full((16,), 0.1))
    params["features.4.weight"] = norms2.view(16, 1, 1, 1).expand(16, 8, 3, 3).clone()
    params["features.0.bias"] = torch.full((8,), 100.0)  # 1-D tensors are not scored
    got = _rows_index(alg, ServerState(params=params), 0, _views([0, 1]))
    assert set(got.values()) == {((1, 3, 4, 6), (1, 3, 5, 7, 9, 11, 13, 15))}
    params["features.0.weight"][7] = 5.0
    assert _rows_index(alg, ServerState(params=params), 0, _views([0]))[0][0] == (1, 3, 4, 7)


@pytest.mark.parametrize("method", ["feddropout", "anycostfl"])
def test_identity_blocks_write_the_residual_streams_channels(method: str) -> None:
    family = ResNetFamily(ResNetConfig(depth=18, widths=(4, 8, 8, 8)), in_channels=3, num_classes=4, image_size=8)
    spec = InputSpec("image", 4, (3, 8, 8))
    alg: RateMethod
    if method == "feddropout":
        alg = FedDropout(FedDropoutConfig(rates=(0.5,)), tiny_config().train)
    else:
        alg = AnyCostFL(AnyCostFLConfig(rates=(0.5,)), tiny_config().train)
    alg.bind_server(ServerContext(3, 1, 1, spec, family, None, tiny_image_dataset()))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        params = {k: v.detach().clone() for k, v in family.global_model().state_dict().items()}
    selection = uniform_selection(family, ServerState(params=params), 0.5, alg.selector(2, 5))
    slices = family.slices(selection)
    streams: list[np.ndarray] = []
    for plan in family.plans:
        p = plan.prefix
        stream_in = _axis(slices[f"{p}conv1.weight"], 1)
        conv2_out = _axis(slices[f"{p}conv2.weight"], 0)
        assert np.array_equal(_axis(slices[f"{p}n1.weight"], 0), stream_in)
        if plan.projection:
            assert np.array_equal(_axis(slices[f"{p}shortcut.weight"], 0), conv2_out)
            assert np.array_equal(_axis(slices[f"{p}shortcut.weight"], 1), stream_in)
        else:
            assert np.array_equal(conv2_out, stream_in)  # the residual add is aligned
            streams.append(stream_in)
    assert len(streams) == 5  # ResNet-18: eight blocks, three of them projections
    assert any(not np.array_equal(s, np.arange(len(s))) for s in streams)  # not simply first-k
    model = family.extract(params, selection)
    assert model(torch.randn(4, 3, 8, 8)).shape == (4, 4)


# --------------------------------------------------------------------------------------------- (6) static BN
def test_static_bn_statistics_are_the_cumulative_mean_over_the_training_set() -> None:
    cfg = _cfg(HeteroFLConfig(static_bn_batch_size=50), CNN_BN)  # 252 samples
    alg, setup = _bound(cfg)
    state = alg.init_state(setup.params)
    params = alg.eval_params(state)
    assert set(params) - set(state.params) == {
        f"features.{i}.{s}" for i in (1, 5) for s in ("running_mean", "running_var")
    }
    assert "features.1.running_mean" not in state.params

    # the first norm sees conv1's output: recompute its statistics by hand (scaler = identity at full width)
    x = to_input(setup.dataset.x, setup.input_spec)
    with torch.no_grad():
        h = nn.functional.conv2d(x, state.params["features.0.weight"], state.params["features.0.bias"], padding=1)
    channels = h.transpose(0, 1).flatten(1).double()
    torch.testing.assert_close(params["features.1.running_mean"].double(), channels.mean(1), rtol=0, atol=1e-5)
    n, var = len(x), torch.zeros(8, dtype=torch.float64)
    shuffled = derive_rng(cfg.seed, "static_bn", 0).permutation(n)  # the pool, shuffled with the run's derived seed
    for rows in np.array_split(shuffled, n // 50):  # batches of 51, 51, 50, 50, 50, weighted by sample count
        part = h[rows].transpose(0, 1).flatten(1).double()
        var += part.var(dim=1, unbiased=True) * len(rows) / n
    torch.testing.assert_close(params["features.1.running_var"].double(), var, rtol=1e-5, atol=1e-6)

    # hosts evaluate with those statistics: the engine's figures equal a hand-run tracked copy in eval mode
    assert alg.family is not None
    reference = tracked_global_model(alg.family)
    assert reference is not None
    reference.load_state_dict(params, strict=False)
    reference.eval()
    ds = setup.dataset
    with torch.no_grad():
        logits = reference(to_input(ds.x_test, setup.input_spec))
    labels = torch.as_tensor(ds.y_test, dtype=torch.long)
    backend = build_backend(cfg, setup)
    result = backend.evaluate(params)
    assert result.accuracy == pytest.approx(float((logits.argmax(1) == labels).double().mean()), abs=1e-12)
    assert result.loss == pytest.approx(float(nn.functional.cross_entropy(logits, labels)), rel=1e-5)
    untracked = alg.family.global_model()  # what evaluation without static BN uses: test-batch statistics
    untracked.load_state_dict(state.params)
    untracked.eval()
    with torch.no_grad():
        assert (untracked(to_input(ds.x_test, setup.input_spec)) - logits).abs().max() > 1e-3


@pytest.mark.parametrize(("n", "batch"), [(95, 10), (1000, 10), (257, 64), (40, 40)])
def test_static_bn_in_chunks_gives_the_batch_by_batch_statistics(n: int, batch: int) -> None:
    """Issue 41: the static-BN pass runs many batches per forward (each batch norm normalising every batch of the
    chunk with that batch's own statistics) and gives the statistics of the batch-by-batch pass through the model's
    own batch norms, on a ResNet with HeteroFL's scalers and projection shortcuts, with batches of two sizes."""
    spec = InputSpec("image", 4, (3, 8, 8))
    family = ResNetFamily(
        ResNetConfig(depth=18, widths=(4, 8, 8, 8), norm="bn", scaler=True), in_channels=3, num_classes=4, image_size=8
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        weights = {k: v for k, v in family.global_model().state_dict().items() if not k.endswith("_tracked")}
    gen = np.random.default_rng(1)
    x = gen.normal(1.0, 2.0, size=(n, 3, 8, 8)).astype(np.float32)

    def stats(fn: Any, *args: Any) -> Params:
        model = tracked_global_model(family)
        assert model is not None
        model.load_state_dict(weights, strict=False)
        return cast(Params, fn(model, x, spec, *args))

    rng = derive_rng(3, "static_bn", 0)
    chunked = stats(static_bn_statistics, batch, rng, 100)
    reference = stats(static_bn_statistics_sequential, static_bn_batches(n, batch, derive_rng(3, "static_bn", 0)))
    assert chunked.keys() == reference.keys() and len(chunked) >= 2 * 17  # every norm of the ResNet18
    for k in reference:
        torch.testing.assert_close(chunked[k], reference[k], rtol=2e-5, atol=2e-6, msg=k)
    # chunks on three threads at once (each at one intra-op thread, sums added in chunk order): the same bits
    model = tracked_global_model(family)
    assert model is not None
    model.load_state_dict(weights, strict=False)
    ran_on: set[str] = set()
    model.register_forward_pre_hook(lambda module, args: ran_on.add(threading.current_thread().name))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the driver's default (backend.server_threads 1), where the pass may use threads
    try:
        threaded = static_bn_statistics(model, x, spec, batch, derive_rng(3, "static_bn", 0), 100, 3)
        one = stats(static_bn_statistics, batch, derive_rng(3, "static_bn", 0), 100, 1)
    finally:
        torch.set_num_threads(threads)
    unequal = [k for k in one if not torch.equal(threaded[k], one[k])]
    assert not unequal, f"threaded pass differs from one thread in {unequal}"
    assert n <= 100 or len(ran_on) > 1, f"the chunks ran on {ran_on} only"
    if n // batch == 1:
        return
    # not simply the statistics of the whole set: the per-batch variances differ from the pooled one
    pooled = stats(static_bn_statistics, n, None, n)
    assert any(not torch.allclose(pooled[k], reference[k], rtol=1e-3) for k in reference if k.endswith("var"))


def test_per_batch_norm_reads_a_sample_major_chunk_in_place() -> None:
    """Issue 41: the chunk's rows are sample-major (row ``s * k + g``: sample ``s`` of batch ``g``), so each batch
    norm of the pass hands the native kernel its input itself, not a reordered copy, and still normalises every
    batch with that batch's own statistics, as the norm does the batch alone."""
    k, b = 3, 4
    norm = nn.BatchNorm2d(5)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-1.0, 1.0)
    x = torch.randn(b * k, 5, 3, 3, generator=torch.Generator().manual_seed(0))
    per_batch = _PerBatchNorm("norm", norm)
    _PerBatchNorm.local.batch, _PerBatchNorm.local.sums = b, {}
    read: list[int] = []
    kernel = nn.functional.batch_norm

    def batch_norm(input: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        read.append(input.data_ptr())
        return kernel(input, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch, torch.inference_mode():
        patch.setattr(nn.functional, "batch_norm", batch_norm)
        y = per_batch(x)
    assert read == [x.data_ptr()]  # one call, on the chunk's own memory
    for g in range(k):
        batch = x[g::k].contiguous()  # batch g alone, as the batch-by-batch pass gives it to the norm
        alone = kernel(batch, None, None, norm.weight, norm.bias, training=True, eps=norm.eps)
        assert torch.equal(y[g::k], alone), g
    means = torch.stack([x[g::k].double().mean(dim=(0, 2, 3)) for g in range(k)])
    torch.testing.assert_close(_PerBatchNorm.local.sums["norm"][0], means.sum(0) * b, rtol=1e-6, atol=1e-6)


def test_static_bn_pass_runs_once_per_evaluated_state(tmp_path: Any) -> None:
    """One static-BN pass per evaluated round, on one tracked copy built once, one forward per chunk: the end-of-run
    export of the last evaluated state (``export.final``, which asks ``eval_params`` again) reuses that round's
    statistics instead of a second pass over the training set. Counted with a forward pre-hook on every module."""
    cfg = dataclasses.replace(
        _cfg(HeteroFLConfig(), CNN_BN, rounds=2, eval_every=1, output_dir=str(tmp_path)),
        export=ExportConfig(final=True),
    )
    ds = tiny_image_dataset()
    calls: list[nn.Module] = []

    def hook(module: nn.Module, args: Any) -> None:
        if isinstance(module, _PerBatchNorm):
            calls.append(module.norm)

    handle = nn.modules.module.register_module_forward_pre_hook(hook)
    try:
        result = run_experiment(cfg, write=True, dataset=ds)
    finally:
        handle.remove()
    assert result.run_dir is not None
    assert [(m.name, m.round_idx, m.track_stats) for m in exported_models(result.run_dir)] == [("main", 1, True)]
    norms = len({id(m) for m in calls})
    assert norms == 2  # the CNN's two batch norms, of one tracked copy for every pass
    evaluated = [r for r in result.records if r.test_acc == r.test_acc]
    batches = static_bn_batches(len(ds.x), HeteroFLConfig().static_bn_batch_size, None)  # sizes do not depend on order
    forwards = len(_same_size_runs(batches, STATIC_BN_CHUNK))  # of the tracked copy, per pass
    assert len(evaluated) == 2 and len(calls) == norms * forwards * 2  # two passes: none more for the export


def test_static_bn_is_a_no_op_without_batch_norm() -> None:
    alg, setup = _bound(_cfg(HeteroFLConfig()))
    state = alg.init_state(setup.params)
    assert alg.eval_params(state) is state.params and alg.eval_model() is None
    off, setup_bn = _bound(_cfg(HeteroFLConfig(static_bn=False), CNN_BN))
    state_bn = off.init_state(setup_bn.params)
    assert off.eval_params(state_bn) is state_bn.params and off.eval_model() is None
    assert isinstance(FedRolex(FedRolexConfig(), tiny_config().train).uniform, UniformRates)
    assert HeteroFL.name == "heterofl"


@pytest.mark.parametrize("algorithm", [HeteroFLConfig(), FedRolexConfig()], ids=lambda a: a.name)
def test_official_initial_model_has_zero_linear_bias_and_unit_norms(algorithm: Any) -> None:
    """HeteroFL's ``init_param``, which FedRolex's official code applies to its models too; off, the fresh model
    stays as the family drew it."""
    off, setup_off = _bound(_cfg(dataclasses.replace(algorithm, official_init=False), CNN_BN))
    assert off.init_state(setup_off.params).params == setup_off.params
    alg, setup = _bound(_cfg(algorithm, CNN_BN))
    params = alg.init_state(setup.params).params
    assert alg.family is not None
    with torch.device("meta"):
        model = alg.family.build(alg.family.full_units)
    norms = [n for n, m in model.named_modules() if isinstance(m, torch.nn.BatchNorm2d)]
    linears = [n for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)]
    assert norms and linears
    for n in norms:
        assert torch.equal(params[f"{n}.weight"], torch.ones_like(params[f"{n}.weight"]))
        assert torch.equal(params[f"{n}.bias"], torch.zeros_like(params[f"{n}.bias"]))
    for n in linears:
        assert torch.equal(params[f"{n}.bias"], torch.zeros_like(params[f"{n}.bias"]))
        assert torch.equal(params[f"{n}.weight"], setup.params[f"{n}.weight"])  # weights keep PyTorch's init


def test_static_bn_batches_are_a_seeded_shuffle_in_batches_of_ten() -> None:
    def batches(seed: int) -> list[list[int]]:
        return [b.tolist() for b in static_bn_batches(95, 10, derive_rng(seed, "static_bn", 0))]

    first = batches(1)
    assert first == batches(1)  # same seed, same batches
    assert first != batches(2)
    assert [len(b) for b in first] == [11, 11, 11, 11, 11, 10, 10, 10, 10]  # 95 // 10 nearly equal batches, none < 10
    assert sorted(i for b in first for i in b) == list(range(95))  # a permutation of the pool
    assert first[0] != list(range(11))  # not client-major order
    assert [b.tolist() for b in static_bn_batches(25, 10, None)] == [list(range(13)), list(range(13, 25))]
    with pytest.raises(ValueError, match="static_bn_batch_size"):
        static_bn_batches(25, 0, None)
