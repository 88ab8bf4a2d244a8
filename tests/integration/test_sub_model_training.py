"""Hosts train real sub-models: extraction from the global weights, training, scatter-back through the reducer."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from rayfl.core.messages import Assignment, TrainTask
from rayfl.engine.build import build_backend, build_setup
from rayfl.fl.api.client import ClientContext
from rayfl.models.elastic import SubModelSpec
from rayfl.models.elastic.family import gather
from rayfl.models.families import build_family
from tests.helpers import tiny_config, tiny_image_dataset


def _setup(kind: str = "local", **backend: object):  # type: ignore[no-untyped-def]
    cfg = tiny_config(kind=kind, **backend)
    setup = build_setup(cfg, tiny_image_dataset())
    return cfg, setup, build_family(cfg.model, setup.input_spec)


def _tasks(cfg, family, params, ratio: float, clients=(0, 1, 2)) -> list[TrainTask]:  # type: ignore[no-untyped-def]
    sel = family.select(SubModelSpec.uniform(family.space, ratio))
    return [
        TrainTask(client_id=c, round_idx=0, seed=cfg.seed, lr=0.05, assignment=family.assignment(sel)) for c in clients
    ]


def test_full_width_sub_model_assignment_equals_the_full_model_bit_for_bit() -> None:
    cfg, setup, family = _setup()
    backend = build_backend(cfg, setup)
    full = [TrainTask(client_id=c, round_idx=0, seed=cfg.seed, lr=0.05, assignment=Assignment()) for c in (0, 1, 2)]
    a, _ = backend.train_and_reduce(full, setup.params)
    b, outcomes = backend.train_and_reduce(_tasks(cfg, family, setup.params, 1.0), setup.params)
    for name in a.params:
        assert torch.equal(a.params[name], b.params[name]), name
    assert all(o.failure is None for o in outcomes)


def test_a_half_width_client_updates_exactly_its_slice() -> None:
    cfg, setup, family = _setup()
    backend = build_backend(cfg, setup)
    (task,) = _tasks(cfg, family, setup.params, 0.5, clients=(4,))
    aggregate, (outcome,) = backend.train_and_reduce([task], setup.params)
    # the same client trained by hand on the extracted sub-model
    sel = family.select(SubModelSpec.uniform(family.space, 0.5))
    model = family.extract(setup.params, sel)
    x, y = setup.dataset.client_train(4)
    update = setup.algorithm.local_train(ClientContext.of(task, model, setup.input_spec), x, y)
    sub_params = sum(v.numel() for v in update.values.values())
    assert outcome.bytes_down == outcome.bytes_up == 4 * sub_params < 4 * sum(p.numel() for p in setup.params.values())
    for name, global_value in setup.params.items():
        tslice = task.assignment.slices[name]
        covered = torch.zeros_like(global_value, dtype=torch.bool)
        covered[tslice.torch_index(tuple(global_value.shape))] = True
        new = aggregate.params[name]
        assert torch.equal(new[~covered], global_value[~covered]), name  # untouched outside the sub-model
        torch.testing.assert_close(gather(new, tslice), update.values[name], rtol=0, atol=1e-6)
        assert not torch.equal(gather(new, tslice), gather(global_value, tslice)) or name.endswith("bias")


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_sub_models_on_ray_equal_in_process() -> None:
    cfg, setup, family = _setup()
    mixed = _tasks(cfg, family, setup.params, 0.5, clients=(0, 3)) + _tasks(cfg, family, setup.params, 1.0, (5,))
    local, _ = build_backend(cfg, setup).train_and_reduce(mixed, setup.params)
    ray_cfg = dataclasses.replace(
        cfg, backend=dataclasses.replace(cfg.backend, kind="ray", num_hosts=2, cpus_per_host=0.25)
    )
    backend = build_backend(ray_cfg, setup)
    try:
        remote, _ = backend.train_and_reduce(mixed, setup.params)
    finally:
        backend.close()
    for name in local.params:
        np.testing.assert_array_equal(local.params[name].numpy(), remote.params[name].numpy())
