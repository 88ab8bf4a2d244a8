"""Trained models out of a run (``rayfl/engine/persist/export.py``, ``rayfl.load_model``): every global model is written
as a safetensors file that loads back, from the run directory alone, into a module scoring the run's own final accuracy
(a custom torchvision model, each model of a multi-model run, a sub-model evaluation); the best evaluated state with
``export.best``; a Hugging Face model also as its ``save_pretrained`` directory."""

from __future__ import annotations

import csv
import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import rayfl
from rayfl.config.model import CNNConfig
from rayfl.config.sections import ExportConfig
from rayfl.data import build_federated_dataset
from rayfl.data.federated import FederatedDataset
from rayfl.engine.driver import run_experiment
from rayfl.experiment.loader import load_config
from rayfl.experiment.schema import ExperimentConfig
from rayfl.export import exported_models
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.fedhen.config import DecoupleConfig
from rayfl.fl.methods.heterofl.config import HeteroFLConfig
from rayfl.models import InputSpec, to_input
from tests.helpers import tiny_config, tiny_image_dataset
from tests.unit.fl.test_fedhen import NUM_CLIENTS, fedhen_config

REPO = Path(__file__).resolve().parents[2]


def _accuracy(module: nn.Module, ds: FederatedDataset, spec: InputSpec) -> float:
    with torch.no_grad():
        logits = module(to_input(np.asarray(ds.x_test), spec))
    return float((logits.argmax(dim=1).numpy() == np.asarray(ds.y_test)).mean())


def _summary(run_dir: Path) -> dict[str, object]:
    loaded: dict[str, object] = json.loads((run_dir / "summary.json").read_text())
    return loaded


def _written(cfg: ExperimentConfig, tmp_path: Path, dataset: FederatedDataset | None = None) -> Path:
    cfg = dataclasses.replace(cfg, output_dir=str(tmp_path / "runs"))
    result = run_experiment(cfg, dataset=dataset)
    assert result.run_dir is not None
    return result.run_dir


def test_custom_torchvision_model_loads_back_with_the_runs_final_accuracy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(REPO)  # the factory is imported from the working directory, as `rayfl run` there does
    cfg = load_config(REPO / "examples" / "resnet18_synthetic.yaml", ["rounds=2", "clients_per_round=1"])
    cfg = dataclasses.replace(cfg, export=ExportConfig(best=True))
    run_dir = _written(cfg, tmp_path)
    monkeypatch.chdir(tmp_path)  # loading needs neither the working directory nor the data
    model = rayfl.load_model(run_dir)
    # a Predictor (rayfl/models/predictor.py) calling the module the run built, in eval mode
    assert type(model.module).__module__ == "torchvision.models.resnet" and not model.module.training
    assert model.fc is model.module.fc  # the module's attributes read through the predictor, as before
    (final, best) = exported_models(run_dir)
    assert (final.name, final.round_idx, final.best, final.units) == ("main", 1, False, None)
    assert final.path.name == "model0-main.safetensors"
    ds = build_federated_dataset(cfg.data, cfg.seed)
    assert _accuracy(model, ds, final.input_spec) == _summary(run_dir)["final_test_acc"] == final.accuracy
    # the best evaluated state: the first round reaching the highest accuracy recorded
    with (run_dir / "rounds.csv").open() as f:
        accs = [float(row["test_acc"]) for row in csv.DictReader(f)]
    assert best.best and best.path.name == "best-model0-main.safetensors"
    evaluated = [(i, a) for i, a in enumerate(accs) if not np.isnan(a)]  # rounds without an evaluation are NaN
    top = max(a for _, a in evaluated)
    assert (best.round_idx, best.accuracy) == (min(i for i, a in evaluated if a == top), top)
    best_model = rayfl.load_model(run_dir, best=True)
    assert _accuracy(best_model, ds, best.input_spec) == best.accuracy


def test_every_model_of_a_multi_model_run_loads_back(tmp_path: Path) -> None:
    """Decouple's two global models, each its own architecture (the simple one ends at the side exit)."""
    ds = tiny_image_dataset(NUM_CLIENTS)
    run_dir = _written(fedhen_config(DecoupleConfig()), tmp_path, ds)
    found = exported_models(run_dir)
    assert [(m.model_id, m.name, m.path.name) for m in found] == [
        (0, "main", "model0-main.safetensors"),
        (1, "simple", "model1-simple.safetensors"),
    ]
    assert found[1].model_config["exit_only"] is True and found[0].model_config["exit_only"] is False
    simple = rayfl.load_model(run_dir, model="simple")
    main = rayfl.load_model(run_dir, model=0)
    assert sum(p.numel() for p in simple.parameters()) < sum(p.numel() for p in main.parameters())
    with (run_dir / "evals.csv").open() as f:
        simple_acc = [float(row["test_acc"]) for row in csv.DictReader(f) if row["name"] == "simple"][-1]
    spec = found[0].input_spec
    assert _accuracy(main, ds, spec) == _summary(run_dir)["final_test_acc"] == found[0].accuracy
    assert _accuracy(simple, ds, spec) == pytest.approx(simple_acc) and found[1].accuracy == simple_acc
    with pytest.raises(KeyError, match=r"'tier1' is not among the run's exported models: 0 \(main\), 1 \(simple\)"):
        rayfl.load_model(run_dir, model="tier1")


@pytest.mark.parametrize(
    "algorithm",
    [FedAvgConfig(model="smallest"), HeteroFLConfig()],
    ids=["fedavg-smallest-sub-model", "heterofl-static-bn"],
)
def test_the_evaluated_module_is_what_is_exported(tmp_path: Path, algorithm: object) -> None:
    """FedAvg on the smallest sub-model is evaluated as that sub-model; HeteroFL with static batch norm on a model
    whose batch norms track the statistics it computes: the file holds that module's tensors, and scores alike."""
    ds = tiny_image_dataset()
    cfg = dataclasses.replace(
        tiny_config(kind="local", num_hosts=1),
        algorithm=algorithm,
        rounds=1,
        model=CNNConfig(channels=(8, 16), norm="batch"),
    )
    run_dir = _written(cfg, tmp_path, ds)
    (info,) = exported_models(run_dir)
    model = rayfl.load_model(run_dir)
    assert _accuracy(model, ds, info.input_spec) == _summary(run_dir)["final_test_acc"]
    norms = [m for m in model.modules() if isinstance(m, nn.BatchNorm2d)]
    if isinstance(algorithm, FedAvgConfig):
        assert info.units is not None and not info.track_stats
        assert norms[0].num_features < 8  # the smallest sub-model's first block
    else:
        assert info.units is None and info.track_stats and all(m.track_running_stats for m in norms)


def test_a_hugging_face_model_is_also_saved_for_from_pretrained(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transformers = pytest.importorskip("transformers")
    monkeypatch.chdir(REPO)
    cfg = load_config(REPO / "examples" / "bert_tokens.yaml", ["rounds=1"])
    run_dir = _written(cfg, tmp_path)
    hf_dir = run_dir / "models" / "model0-main-hf"
    assert (hf_dir / "config.json").is_file()
    bert = transformers.BertForSequenceClassification.from_pretrained(str(hf_dir)).eval()
    wrapped = rayfl.load_model(run_dir)
    ds = build_federated_dataset(cfg.data, cfg.seed)
    tokens = torch.from_numpy(np.asarray(ds.x_test, dtype=np.int64))
    with torch.no_grad():
        logits = bert(input_ids=tokens).logits
    assert torch.allclose(logits, wrapped(tokens), atol=1e-6)
    accuracy = float((logits.argmax(dim=1).numpy() == np.asarray(ds.y_test)).mean())
    assert accuracy == _summary(run_dir)["final_test_acc"]


def test_a_run_without_exports_says_how_to_get_them(tmp_path: Path) -> None:
    cfg = dataclasses.replace(tiny_config(kind="local", num_hosts=1), rounds=1, export=ExportConfig(final=False))
    run_dir = _written(cfg, tmp_path, tiny_image_dataset())
    assert not list((run_dir).glob("models/*"))
    with pytest.raises(FileNotFoundError, match="no model exports"):
        rayfl.load_model(run_dir)
