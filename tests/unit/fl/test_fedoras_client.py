"""FedorAS's client side: one path per batch from (seed, round, client, batch), examples counted per (layer, op)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl.core.messages import TrainTask
from rayfl.engine.build import bind_algorithm, build_clock, build_setup
from rayfl.engine.driver import run_experiment
from rayfl.engine.exec.host import ClientHost
from rayfl.fl.api.client import ClientContext
from rayfl.fl.methods.fedoras.algorithm import FedorAS
from rayfl.fl.methods.fedoras.sampling import path_flops
from rayfl.models.elastic.spec import first_k
from rayfl.models.supernet import SupernetFamily, SupernetModel
from tests.helpers import tiny_image_dataset
from tests.helpers_fedoras import fedoras_tiny_config


def test_client_trains_one_budgeted_path_per_batch_and_counts_examples_per_op() -> None:
    """What local training ran (forward hooks on every op) is, batch by batch, the path the sampler gives for
    (seed, round, client, batch), inside the subspace and the tier's FLOPs; the uploaded per-op weights are the
    examples through each op; ops no path used are not uploaded and keep their tensors bit for bit."""
    base = fedoras_tiny_config(kind="local", num_hosts=1)
    # the separable MBConv's FLOPs give the draws below (ops held but unused); the official form's give others
    model = dataclasses.replace(base.model, mbconv="separable")
    cfg = dataclasses.replace(base, phases=(), rounds=1, algorithm=base.phases[0].algorithm, model=model)
    setup = build_setup(cfg, tiny_image_dataset())
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    algorithm = setup.algorithm
    assert isinstance(algorithm, FedorAS) and algorithm.tables is not None and algorithm.tiers is not None
    family = algorithm.family
    assert isinstance(family, SupernetFamily)
    # round 2's subspace holds ops that client 2 (tier 0) never draws: (layer 0, op 1) and (layer 1, op 2)
    mask = algorithm.subspace(round_idx=2)
    assignment = family.assignment(first_k(family.units_of_mask(mask)))
    client_id = 2
    task = TrainTask(client_id=client_id, round_idx=2, seed=cfg.seed, lr=0.05, assignment=assignment)
    x, y = setup.dataset.client_train(client_id)
    host = ClientHost(0, setup.dataset, cfg.model, algorithm, cfg.backend, 0)
    model = host._model_for(assignment, setup.params)
    before = {name: tensor.detach().clone() for name, tensor in model.state_dict().items()}
    ran = _record_ops_run(model)
    update = algorithm.local_train(ClientContext.of(task, model, setup.input_spec), x, y)
    after = model.state_dict()

    # replay the sampler: batch b of size s_b trains path(b); every path lies in the subspace and the tier's FLOPs
    sizes = [len(range(lo, min(lo + cfg.train.batch_size, len(y)))) for lo in range(0, len(y), cfg.train.batch_size)]
    assert algorithm.batch_sizes(len(y)) == sizes
    expected = np.zeros(mask.shape)
    limit = algorithm.client_limit_flops(client_id)
    assert limit == algorithm.tiers.edges[algorithm.tiers.client_tier[client_id] + 1]
    assert len(ran) == len(sizes)  # one forward pass per batch ...
    for b, size in enumerate(sizes):
        path = algorithm.path_for_batch(task, b)
        # ... that ran exactly batch b's path (layers on identity run no op)
        assert ran[b] == {layer: int(op) for layer, op in enumerate(path) if op != family.identity}
        assert np.array_equal(path, algorithm.path_for_batch(dataclasses.replace(task), b))  # from the keys alone
        assert mask[np.arange(len(path)), path].all()
        assert path_flops(algorithm.tables, path)[0] <= limit
        expected[np.arange(len(path)), path] += size
    assert update.num_steps == len(sizes)
    for name in update.values:
        gate = family.space.layouts[name].gate
        if gate is None:
            assert name not in update.tensor_weights  # fixed layers: the client's example count (FedAvg)
            continue
        layer, op = divmod(gate, family.num_ops)
        assert update.tensor_weights[name] == expected[layer, op] > 0
    used = {divmod(family.space.layouts[n].gate or 0, family.num_ops) for n in update.tensor_weights}
    unused = {(int(layer), int(o)) for layer, o in np.argwhere(mask & (expected == 0)) if o != family.identity}
    assert not used & unused  # ops held but never used are not uploaded
    # what training actually touched: exactly the ops on the batches' paths changed; every op of the subspace that
    # no path used kept its tensors bit for bit (no gradient, no momentum or decay step reached it)
    changed: set[tuple[int, int]] = set()
    for name, tensor in after.items():
        gate = family.space.layouts[name].gate
        if gate is None:
            assert not torch.equal(tensor, before[name]), name  # stem, reductions, head: every batch trains them
        elif not torch.equal(tensor, before[name]):
            changed.add(family.layer_op(gate))
    assert changed == used and unused == {(0, 1), (1, 2)}
    for name, tensor in after.items():
        gate = family.space.layouts[name].gate
        if gate is not None and family.layer_op(gate) in unused:
            assert torch.equal(tensor, before[name]), name
    assert expected.sum(axis=1).tolist() == [float(len(y))] * family.num_layers


def _record_ops_run(model: torch.nn.Module) -> list[dict[int, int]]:
    """Per forward pass of ``model`` (a supernet), the op each layer ran; filled by forward hooks as it trains."""
    assert isinstance(model, SupernetModel)
    passes: list[dict[int, int]] = []
    model.stem.register_forward_hook(lambda _m, _a, _o: passes.append({}))
    for layer, ops in enumerate(model.layers):
        for op, module in ops.items():  # type: ignore[operator]  # a ModuleDict
            module.register_forward_hook(lambda _m, _a, _o, key=(layer, int(op)): passes[-1].__setitem__(*key))
    return passes


def test_clock_prices_a_client_by_the_paths_it_trains(tmp_path: Path) -> None:
    """A FedorAS client's modelled compute is forward + backward (3 x forward) FLOPs of the paths it trains: fixed
    layers for every sample plus each op for the examples through it, over the compute speed (1000 GFLOP/s)."""
    base = fedoras_tiny_config(kind="local", num_hosts=1)
    cfg = dataclasses.replace(
        base, phases=(), rounds=1, algorithm=base.phases[0].algorithm, output_dir=str(tmp_path / "runs")
    )
    result = run_experiment(cfg, dataset=tiny_image_dataset())
    assert result.run_dir is not None
    clients = pd.read_csv(result.run_dir / "clients.csv")
    setup = build_setup(cfg, tiny_image_dataset())
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    algorithm = setup.algorithm
    assert isinstance(algorithm, FedorAS) and algorithm.tables is not None
    family = algorithm.family
    assert isinstance(family, SupernetFamily)
    units = family.units_of_mask(algorithm.subspace(round_idx=0))
    for row in clients.itertuples():
        task = TrainTask(
            client_id=int(row.client_id),
            round_idx=0,
            seed=cfg.seed,
            lr=0.05,
            assignment=family.assignment(first_k(units)),
        )
        n = setup.dataset.num_examples(int(row.client_id))
        counts = algorithm.op_counts(task, n)
        forward = algorithm.tables.fixed_flops * n + float((counts * algorithm.tables.flops).sum())
        assert row.compute_s == pytest.approx(3.0 * forward / 1e12, rel=1e-12)
