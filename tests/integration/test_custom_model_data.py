"""Users' own model and data by import path (``model.name: custom``, ``data.name: custom``): the examples under
``examples/`` train end to end on both backends with identical results, and a wrong factory is one clear error."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch

from rayfl.config import CustomModelConfig, DataConfig, ExperimentConfig, HeteroFLConfig
from rayfl.config_loader import load_config
from rayfl.data import build_federated_dataset
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.models import InputSpec, build_model

REPO = Path(__file__).resolve().parents[2]


def _example(name: str, *overrides: str) -> ExperimentConfig:
    return load_config(REPO / "examples" / name, list(overrides))


def _assert_identical(a: RunResult, b: RunResult) -> None:
    keys = ("train_loss", "test_acc", "test_loss", "clients_run", "bytes_down", "bytes_up")
    assert [tuple(getattr(r, k) for k in keys) for r in a.records] == [
        tuple(getattr(r, k) for k in keys) for r in b.records
    ]
    for name in a.state.params:
        assert torch.equal(a.state.params[name], b.state.params[name]), name


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_custom_bert_and_data_train_the_same_on_both_backends() -> None:
    pytest.importorskip("transformers")
    local = run_experiment(_example("bert_tokens.yaml"), write=False)
    cfg = _example("bert_tokens.yaml", "backend.kind=ray", "backend.num_hosts=2", "backend.cpus_per_host=0.25")
    remote = run_experiment(cfg, write=False)
    assert len(local.records) == 2 and all(r.clients_run == 4 for r in local.records)
    assert np.isfinite(local.records[-1].train_loss)
    _assert_identical(local, remote)


def test_torchvision_resnet18_on_custom_arrays_trains() -> None:
    cfg = _example("resnet18_synthetic.yaml", "rounds=1", "clients_per_round=2")
    result = run_experiment(cfg, write=False)
    record = result.records[-1]
    assert record.clients_run == 2 and np.isfinite(record.train_loss)
    assert "fc.weight" in result.state.params and result.state.params["fc.weight"].shape == (4, 512)


def _spec() -> InputSpec:
    return InputSpec(input_kind="image", num_classes=4, sample_shape=(3, 32, 32))


@pytest.mark.parametrize(
    ("factory", "kwargs", "message"),
    [
        ("no_such_pkg.models:net", {}, r"model.factory='no_such_pkg.models:net': cannot import module 'no_such_pkg"),
        ("examples.resnet_synthetic", {}, r"expected an import path 'package.module:function'"),
        ("examples.resnet_synthetic:resnet99", {}, r"has no attribute 'resnet99'"),
        ("examples.resnet_synthetic:__doc__", {}, r"'__doc__' is a str, not a callable"),
        ("collections:OrderedDict", {}, r"returned a collections.OrderedDict, expected a torch.nn.Module"),
        (
            "examples.resnet_synthetic:resnet18",
            {"num_classes": 3},
            r"forward returned .* \(2, 3\), expected .*\(2, 4\)",
        ),
        ("examples.resnet_synthetic:resnet18", {"depth": 3}, r"calling the factory with \['depth', 'num_classes'\]"),
    ],
)
def test_a_bad_model_factory_is_one_clear_error(factory: str, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_model(CustomModelConfig(factory=factory, kwargs=kwargs), _spec())


@pytest.mark.parametrize(
    ("factory", "kwargs", "message"),
    [
        ("examples.resnet_synthetic:nothing", {}, r"data.factory=.*has no attribute 'nothing'"),
        ("examples.resnet_synthetic:resnet18", {"num_classes": 2}, r"returned a torchvision.*ResNet, expected a rayfl"),
        ("tests.integration.test_custom_model_data:_labels_out_of_range", {}, r"y has labels in \[0, 7\], outside"),
        ("tests.integration.test_custom_model_data:_flat_images", {}, r"x must be \[N, T\]|must be an integer dtype"),
    ],
)
def test_a_bad_data_factory_is_one_clear_error(factory: str, kwargs: dict[str, object], message: str) -> None:
    cfg = DataConfig(name="custom", factory=factory, kwargs=kwargs, partition="iid", num_clients=2)
    with pytest.raises(ValueError, match=message):
        build_federated_dataset(cfg, seed=0)


def _labels_out_of_range() -> dict[str, np.ndarray]:
    x = np.zeros((8, 3, 4, 4), dtype=np.uint8)
    return {"x": x, "y": np.arange(8), "x_test": x[:2], "y_test": np.zeros(2, dtype=np.int64), "num_classes": 4}


def _flat_images() -> dict[str, np.ndarray]:
    x = np.zeros((8, 5), dtype=np.float32)
    return {"x": x, "y": np.zeros(8, dtype=np.int64), "x_test": x[:2], "y_test": np.zeros(2, dtype=np.int64)}


def test_a_sub_model_method_refuses_a_custom_model_and_points_to_the_recipe() -> None:
    cfg = dataclasses.replace(_example("resnet18_synthetic.yaml"), algorithm=HeteroFLConfig())
    with pytest.raises(ValueError, match=r"ElasticFamily \(README: 'Your own model with sub-model methods'\)"):
        run_experiment(cfg, write=False)
