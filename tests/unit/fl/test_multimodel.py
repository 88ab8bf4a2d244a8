"""Flat-dict naming of several global models, and a model added between rounds is reduced like any other."""

from __future__ import annotations

import torch

from rayfl.config.model import CNNConfig
from rayfl.config.sections import TrainConfig
from rayfl.core.messages import Assignment, ServerState, TrainTask
from rayfl.engine.exec.backend import LocalBackend
from rayfl.fl.common.multimodel import (
    add_model,
    initial_model_params,
    model_key,
    model_params,
    split_key,
    with_model_params,
)
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.registry import build_algorithm
from rayfl.models import InputSpec
from tests.helpers import tiny_config, tiny_image_dataset


def test_keys_round_trip_and_model_zero_keeps_its_names() -> None:
    assert model_key(0, "conv.0.weight") == "conv.0.weight"
    assert model_key(3, "conv.0.weight") == "m3/conv.0.weight"
    assert split_key("m3/conv.0.weight") == (3, "conv.0.weight")
    assert split_key("conv.0.weight") == (0, "conv.0.weight")
    params = {"a": torch.zeros(1), "m1/a": torch.ones(1)}
    assert torch.equal(model_params(params, 1)["a"], torch.ones(1))
    replaced = with_model_params(params, 1, {"a": torch.full((1,), 2.0)})
    assert torch.equal(replaced["m1/a"], torch.full((1,), 2.0)) and torch.equal(replaced["a"], torch.zeros(1))


def test_a_model_added_between_rounds_is_trained_and_the_other_kept() -> None:
    ds = tiny_image_dataset()
    cfg = tiny_config(kind="local", num_hosts=2, num_shards=3)
    spec = InputSpec.of(ds.input_kind, ds.num_classes, ds.x, ds.meta)
    small, large = CNNConfig(channels=(8, 16)), CNNConfig(channels=(12, 16))
    algorithm = build_algorithm(FedAvgConfig(), TrainConfig(lr=0.05, batch_size=5))
    zero = initial_model_params(small, spec, 0, 0)
    backend = LocalBackend(
        ds, small, algorithm, cfg.backend, {k: tuple(v.shape) for k, v in zero.items()}, 16, init_seed=1
    )
    state = add_model(ServerState(params=zero, models=(small,)), large, initial_model_params(large, spec, 0, 1))
    assert len(state.models) == 2 and len(backend.shard_of) == len(zero)
    tasks = [
        TrainTask(client_id=c, round_idx=0, seed=0, lr=0.05, assignment=Assignment(model_id=1), model_config=large)
        for c in (0, 1, 2)
    ]
    aggregate, outcomes = backend.train_and_reduce(tasks, state.params)
    assert [o.model_id for o in outcomes] == [1, 1, 1] and len(backend.shard_of) == len(state.params)
    for name, value in zero.items():  # model 0 had no clients: unchanged
        assert torch.equal(aggregate.params[name], value), name
    trained = model_params(aggregate.params, 1)
    before = model_params(state.params, 1)
    assert trained["features.0.weight"].shape[0] == 12
    assert any(not torch.equal(trained[n], before[n]) for n in before)
    result = backend.evaluate(trained, None, large)
    assert result.num_samples == len(ds.y_test) and result.correct_mask is not None
    assert int(result.correct_mask.sum()) == round(result.accuracy * result.num_samples)
