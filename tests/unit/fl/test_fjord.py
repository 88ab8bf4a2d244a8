"""FjORD: largest fitting width, per-batch ordered dropout with shared weights, self-distillation, sample-weighted
nested aggregation. Everything trains real (tiny) models through the real engine pieces; nothing is mocked."""

from __future__ import annotations

import dataclasses
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from rayfl.config.model import CNNConfig
from rayfl.core.messages import Assignment, ClientView, Params, ServerState, TensorSlice, TrainTask
from rayfl.core.rng import derive_rng, derive_torch_generator
from rayfl.engine.build import Setup, bind_algorithm, build_backend, build_clock, build_setup
from rayfl.engine.driver import run_experiment
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api.client import ClientContext
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.fjord.algorithm import FjORD
from rayfl.fl.methods.fjord.config import FjORDConfig
from rayfl.fl.registry import algorithm_class
from rayfl.models.elastic import ElasticFamily
from rayfl.models.elastic.spec import first_k
from rayfl.models.inputs import to_input
from tests.helpers import tiny_config, tiny_image_dataset

CNN_BN = CNNConfig(channels=(8, 16), norm="batch")
WIDTHS = (0.25, 0.5, 1.0)
INF = float("inf")
LR = 0.05


def _cfg(algorithm: Any, **changes: Any) -> ExperimentConfig:
    return dataclasses.replace(tiny_config(kind="local"), algorithm=algorithm, model=CNN_BN, **changes)


def _bound(kd: bool = False, **train: Any) -> tuple[FjORD, Setup, ExperimentConfig]:
    """FjORD bound to its real family, cost model (the clock's) and data, as the driver binds it."""
    cfg = _cfg(FjORDConfig(widths=WIDTHS, kd=kd))
    cfg = dataclasses.replace(cfg, train=dataclasses.replace(cfg.train, **train))
    setup = build_setup(cfg, tiny_image_dataset())
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    return cast(FjORD, setup.algorithm), setup, cfg


def _family(alg: FjORD) -> ElasticFamily:
    assert alg.family is not None
    return alg.family


def _task(alg: FjORD, client: int, p_max: float, round_idx: int = 0) -> TrainTask:
    units = alg.uniform_units(p_max)
    assignment = Assignment() if p_max == 1.0 else alg.assignment_for(first_k(units))
    return TrainTask(client_id=client, round_idx=round_idx, seed=0, lr=LR, assignment=assignment)


def _client_model(alg: FjORD, setup: Setup, task: TrainTask) -> nn.Module:
    """The client's sub-model loaded with its part of the global weights (what the host builds)."""
    units = task.assignment.units or _family(alg).full_units
    return _family(alg).extract(setup.params, first_k(units))


def _train(alg: FjORD, setup: Setup, task: TrainTask) -> Params:
    x, y = setup.dataset.client_train(task.client_id)
    return alg.local_train(ClientContext.of(task, _client_model(alg, setup, task), setup.input_spec), x, y).values


def _block(tslice: TensorSlice) -> tuple[slice, ...]:
    """The leading block a first-k slice addresses (every kept index set is ``0 .. k-1``)."""
    return tuple(slice(None) if idx is None else slice(0, len(idx)) for idx in tslice.index)


def _in_block(alg: FjORD, width: float, name: str, shape: torch.Size) -> torch.Tensor:
    """Mask of the elements of a tensor of ``shape`` inside the width's leading block."""
    mask = torch.zeros(shape, dtype=torch.bool)
    mask[_block(_family(alg).slices(first_k(alg.uniform_units(width)))[name])] = True
    return mask


def _changed(a: Params, b: Params, masks: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(a[k][masks[k]], b[k][masks[k]]) for k in a)


def _first_batch(setup: Setup, task: TrainTask) -> tuple[torch.Tensor, torch.Tensor]:
    """The base loop's first batch of the task's client (the permutation of ``derive_torch_generator``)."""
    x, y = setup.dataset.client_train(task.client_id)
    gen = derive_torch_generator(task.seed, "train", task.round_idx, task.client_id)
    idx = torch.randperm(len(y), generator=gen)[:5]
    return to_input(x, setup.input_spec)[idx], torch.as_tensor(y, dtype=torch.long)[idx]


# --------------------------------------------------------------------------------------------- (1) FedAvg limit
def test_full_width_equals_sample_weighted_fedavg_bit_for_bit() -> None:
    assert algorithm_class("fjord") is FjORD
    data = tiny_image_dataset()
    fedavg = run_experiment(_cfg(FedAvgConfig(weighting="samples"), rounds=2), write=False, dataset=data)
    ours = run_experiment(_cfg(FjORDConfig(widths=(1.0,), kd=True), rounds=2), write=False, dataset=data)
    assert set(ours.state.params) == set(fedavg.state.params)  # no per-width BN statistics appear
    for name, value in fedavg.state.params.items():
        assert torch.equal(ours.state.params[name], value), name
    assert [r.train_loss for r in ours.records] == [r.train_loss for r in fedavg.records]


# --------------------------------------------------------------------------------------------- (2) width sequence
def test_per_batch_widths_follow_the_derived_generator_and_stay_below_p_max() -> None:
    alg, setup, cfg = _bound(epochs=2)  # client 0: 20 samples in batches of 5 -> 8 batches
    task = _task(alg, client=0, p_max=0.5, round_idx=1)
    assert alg.allowed_widths(task.assignment.units) == (0.25, 0.5)
    rng = derive_rng(0, "fjord", 1, 0)  # by hand: one uniform draw over (0.25, 0.5) per batch
    expected = [(0.25, 0.5)[int(rng.integers(2))] for _ in range(8)]
    assert alg.width_sequence(task, 8) == expected
    assert set(expected) == {0.25, 0.5}

    # observe each batch's width from training itself: the first k batches against the first k - 1
    runs = [dict(_client_model(alg, setup, task).state_dict())]
    runs += [_train(_bound(epochs=2, max_steps=k)[0], setup, task) for k in range(1, 9)]
    small = {k: _in_block(alg, 0.25, k, v.shape) for k, v in runs[0].items()}
    band = {k: ~m for k, m in small.items()}  # inside the client's p_max = 0.5 block, outside the 0.25 block
    observed = [0.5 if _changed(runs[k - 1], runs[k], band) else 0.25 for k in range(1, 9)]
    assert observed == expected
    assert all(_changed(runs[k - 1], runs[k], small) for k in range(1, 9))  # the 0.25 block trains at every width

    # through a host and the reducer: elements outside the p_max block are untouched, inside are the client's
    aggregate, (outcome,) = build_backend(cfg, setup).train_and_reduce([task], setup.params)
    assert outcome.failure is None and outcome.num_steps == 8
    for name, value in setup.params.items():
        inside = _in_block(alg, 0.5, name, value.shape)
        assert torch.equal(aggregate.params[name][~inside], value[~inside]), name
        torch.testing.assert_close(aggregate.params[name][inside], runs[8][name].flatten(), rtol=0, atol=1e-6)


# ------------------------------------------------------------------------------------------ (3) one batch below p_max
def _client_drawing_small_first(alg: FjORD) -> TrainTask:
    for client in range(12):
        task = _task(alg, client, p_max=0.5)
        if alg.width_sequence(task, 1) == [0.25]:
            return task
    raise AssertionError("no client draws 0.25 first")


def test_one_batch_below_p_max_trains_exactly_the_shared_p_block() -> None:
    alg, setup, _ = _bound(kd=False, max_steps=1)
    task = _client_drawing_small_first(alg)
    start = dict(_client_model(alg, setup, task).state_dict())
    trained = _train(alg, setup, task)
    small = {k: _in_block(alg, 0.25, k, v.shape) for k, v in start.items()}
    for name, value in start.items():
        assert torch.equal(trained[name][~small[name]], value[~small[name]]), name  # only the 0.25 block moves
    # by hand: one SGD step of the separately extracted 0.25 sub-model on the same batch
    sub = _family(alg).extract(setup.params, first_k(alg.uniform_units(0.25)))
    xb, yb = _first_batch(setup, task)
    nn.functional.cross_entropy(sub(xb), yb).backward()  # type: ignore[no-untyped-call]
    for name, p in sub.named_parameters():
        assert p.grad is not None
        expected = (p - LR * p.grad).detach()
        torch.testing.assert_close(trained[name][_block_of(alg, 0.25, name)], expected, rtol=0, atol=1e-6)
        assert not torch.equal(expected, p.detach()) or name.endswith("bias"), name  # conv biases before BN: 0


def _block_of(alg: FjORD, width: float, name: str) -> tuple[slice, ...]:
    return _block(_family(alg).slices(first_k(alg.uniform_units(width)))[name])


def test_self_distillation_also_trains_p_max_against_its_own_soft_targets() -> None:
    alg, setup, _ = _bound(kd=True, max_steps=1)
    task = _client_drawing_small_first(alg)
    start = dict(_client_model(alg, setup, task).state_dict())
    trained = _train(alg, setup, task)
    band = {k: ~_in_block(alg, 0.25, k, v.shape) for k, v in start.items()}
    assert _changed(start, trained, band)  # the p_max block moves beyond the sampled 0.25 block
    plain = _train(_bound(kd=False, max_steps=1)[0], setup, task)
    assert any(not torch.equal(plain[k], trained[k]) for k in trained)
    # by hand: CE of the p_max model with the labels, plus the 0.25 sub-model's CE against softmax(p_max logits)
    teacher = _client_model(alg, setup, task)
    student = _family(alg).extract(setup.params, first_k(alg.uniform_units(0.25)))
    xb, yb = _first_batch(setup, task)
    logits = teacher(xb)
    nn.functional.cross_entropy(logits, yb).backward()  # type: ignore[no-untyped-call]
    soft = torch.softmax(logits.detach(), dim=-1)
    nn.functional.cross_entropy(student(xb), soft).backward()  # type: ignore[no-untyped-call]
    student_grads = dict(student.named_parameters())
    for name, p in teacher.named_parameters():
        assert p.grad is not None
        grad = p.grad.clone()
        s_grad = student_grads[name].grad
        assert s_grad is not None
        grad[_block_of(alg, 0.25, name)] += s_grad
        torch.testing.assert_close(trained[name], (p - LR * grad).detach(), rtol=0, atol=1e-6)


# --------------------------------------------------------------------------------------------- (4) assignment
def test_assign_picks_the_largest_fitting_width() -> None:
    alg, setup, _ = _bound()
    units = [alg.uniform_units(w) for w in WIDTHS]
    costs = alg.cost.evaluate(np.array(units, dtype=np.int64))
    peak = dict(zip(WIDTHS, costs.peak_memory.tolist(), strict=True))
    comm = dict(zip(WIDTHS, (costs.bytes_down + costs.bytes_up).tolist(), strict=True))
    views = [
        ClientView(0, 20),  # unconstrained: the full model
        ClientView(1, 20, memory_budget=peak[0.5]),  # exactly the 0.5 model's need
        ClientView(2, 20, memory_budget=(peak[0.25] + peak[0.5]) / 2),
        ClientView(3, 20, memory_budget=peak[0.25] - 1),  # nothing fits: the smallest width (the clock fails it)
        ClientView(4, 20, bandwidth_budget=comm[0.5]),  # bandwidth binds
        ClientView(5, 20, memory_budget=peak[1.0] - 1),
    ]
    out = alg.assign(ServerState(params=setup.params), 0, views)
    assert out[0] == Assignment()
    want = {1: 0.5, 2: 0.25, 3: 0.25, 4: 0.5, 5: 0.5}
    for client, width in want.items():
        a = out[client]
        assert a.units == alg.uniform_units(width), client
        conv1 = a.slices["features.0.weight"].index[0]
        assert conv1 is not None and np.array_equal(conv1, np.arange(a.units[0]))  # first-k
    assert alg.client_weight(21) == 21.0


# --------------------------------------------------------------------------------------------- aggregation
def test_reducer_equals_flowers_nested_per_width_average() -> None:
    alg, setup, cfg = _bound(kd=True, max_steps=2)
    tasks = [_task(alg, 0, 0.25), _task(alg, 1, 0.5), _task(alg, 2, 1.0), _task(alg, 3, 0.5)]
    p_max = {0: 0.25, 1: 0.5, 2: 1.0, 3: 0.5}
    values = {t.client_id: _train(alg, setup, t) for t in tasks}
    sizes = {t.client_id: setup.dataset.num_examples(t.client_id) for t in tasks}
    assert len(set(sizes.values())) > 1
    # Flower's fjord_average: widths from largest to smallest, each block overwritten by the sample-weighted mean
    # over the clients whose p_max reaches it
    nested = {k: v.clone().double() for k, v in setup.params.items()}
    for width in sorted(WIDTHS, reverse=True):
        members = [c for c in values if p_max[c] >= width]
        total = sum(sizes[c] for c in members)
        for name in nested:
            block = _block_of(alg, width, name)
            nested[name][block] = sum(values[c][name][block].double() * sizes[c] for c in members) / total
    aggregate, _ = build_backend(cfg, setup).train_and_reduce(tasks, setup.params)
    for name, value in nested.items():
        torch.testing.assert_close(aggregate.params[name], value.float(), rtol=0, atol=1e-6)
