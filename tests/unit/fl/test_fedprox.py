"""FedProx: the proximal term's gradient against a hand computation, the anchor is the weights a client received, and
``mu = 0`` is FedAvg bit for bit (records and final parameters of a real in-process run). Nothing is mocked."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from rayfl.config.sections import TrainConfig
from rayfl.core.errors import ConfigError
from rayfl.core.messages import Assignment, TrainTask
from rayfl.core.rng import derive_torch_generator
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.experiment.loader import load_config
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api.client import ClientContext
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.fedprox.algorithm import Anchor, FedProx
from rayfl.fl.methods.fedprox.config import FedProxConfig
from rayfl.fl.registry import METHODS, algorithm_class
from rayfl.models.inputs import InputSpec
from tests.helpers import tiny_config, tiny_image_dataset
from tests.resume_cases import WALL_CLOCK_COLUMNS, assert_same_object, assert_same_run

MU = 0.5
LR = 0.1
# a linear classifier on 3 features, 2 classes: small enough to write its gradient down
W = np.array([[0.2, -0.1, 0.4], [-0.3, 0.5, 0.1]])
B = np.array([0.05, -0.02])
W_GLOBAL = np.array([[0.1, 0.0, 0.3], [-0.2, 0.4, 0.3]])
B_GLOBAL = np.array([0.0, 0.1])
X = np.array([[1.0, 2.0, -1.0], [0.5, -1.0, 2.0]])
Y = np.array([0, 1])
SPEC = InputSpec(input_kind="image", num_classes=2, sample_shape=(3,))


def _linear(w: np.ndarray, b: np.ndarray) -> nn.Linear:
    model = nn.Linear(3, 2)
    with torch.no_grad():
        model.weight.copy_(torch.tensor(w, dtype=torch.float32))
        model.bias.copy_(torch.tensor(b, dtype=torch.float32))
    return model


def _fedprox(mu: float = MU, batch_size: int = 2) -> FedProx:
    return FedProx(FedProxConfig(mu=mu), TrainConfig(lr=LR, batch_size=batch_size))


def _task() -> TrainTask:
    return TrainTask(client_id=3, round_idx=1, seed=7, lr=LR, assignment=Assignment())


def _ce_and_grads(w: np.ndarray, b: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[float, np.ndarray, np.ndarray]:
    """Mean cross-entropy of the linear model on (x, y) and its gradient, in closed form (float64):
    d/dlogits = (softmax - onehot) / n, dW = that^T x, db = its column sums."""
    logits = x @ w.T + b
    logits = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(logits) / np.exp(logits).sum(axis=1, keepdims=True)
    n = len(y)
    loss = float(-np.log(probs[np.arange(n), y]).mean())
    delta = probs.copy()
    delta[np.arange(n), y] -= 1.0
    delta /= n
    return loss, delta.T @ x, delta.sum(axis=0)


def _prox(w: np.ndarray, b: np.ndarray, w_g: np.ndarray, b_g: np.ndarray) -> float:
    return float(((w - w_g) ** 2).sum() + ((b - b_g) ** 2).sum())


def test_one_sgd_step_adds_mu_times_the_distance_to_the_global_weights_to_the_cross_entropy_gradient() -> None:
    algo = _fedprox()
    model = _linear(W, B)
    anchored = ClientContext.of(_task(), model, SPEC)
    anchored.put(
        Anchor({"weight": torch.tensor(W_GLOBAL, dtype=torch.float32), "bias": torch.tensor(B_GLOBAL).float()})
    )
    params = list(model.parameters())
    x, y = torch.tensor(X, dtype=torch.float32), torch.tensor(Y)
    loss = algo.train_batch(anchored, x, y, algo.make_optimizer(params, LR), params, 0)

    ce, g_w, g_b = _ce_and_grads(W, B, X, Y)
    # h = CE + mu/2 ||w - w_global||^2, so grad h = grad CE + mu (w - w_global); one SGD step of size LR
    assert float(loss.detach()) == pytest.approx(ce + 0.5 * MU * _prox(W, B, W_GLOBAL, B_GLOBAL), rel=1e-6)
    np.testing.assert_allclose(model.weight.detach().numpy(), W - LR * (g_w + MU * (W - W_GLOBAL)), rtol=0, atol=1e-6)
    np.testing.assert_allclose(model.bias.detach().numpy(), B - LR * (g_b + MU * (B - B_GLOBAL)), rtol=0, atol=1e-6)
    # the proximal part is what moves the weights apart from FedAvg's step: it is far above the tolerance
    assert np.abs(LR * MU * (W - W_GLOBAL)).max() > 1e-3


def test_local_train_anchors_the_term_to_the_weights_the_client_received() -> None:
    """Two batches of one example: the first step starts at the anchor (no proximal pull), the second is pulled back
    by mu (w1 - w0); the reported loss is the mean of the two batches' objectives."""
    algo = _fedprox(batch_size=1)
    model = _linear(W, B)
    task = _task()
    update = algo.local_train(ClientContext.of(task, model, SPEC), X.astype(np.float32), Y)

    order = torch.randperm(2, generator=derive_torch_generator(task.seed, "train", task.round_idx, task.client_id))
    w, b, losses = W.copy(), B.copy(), []
    for i in order.tolist():
        ce, g_w, g_b = _ce_and_grads(w, b, X[i : i + 1], Y[i : i + 1])
        losses.append(ce + 0.5 * MU * _prox(w, b, W, B))
        w, b = w - LR * (g_w + MU * (w - W)), b - LR * (g_b + MU * (b - B))
    np.testing.assert_allclose(update.values["weight"].numpy(), w, rtol=0, atol=1e-6)
    np.testing.assert_allclose(update.values["bias"].numpy(), b, rtol=0, atol=1e-6)
    assert update.train_loss == pytest.approx(float(np.mean(losses)), rel=1e-6)
    assert (update.num_steps, update.num_examples, update.weight) == (2, 2, 2.0)  # sample-weighted, as FedAvg
    plain = FedProx(FedProxConfig(mu=0.0), algo.train).local_train(
        ClientContext.of(task, _linear(W, B), SPEC), X.astype(np.float32), Y
    )
    assert np.abs(plain.values["weight"].numpy() - w).max() > 1e-3  # the second step's pull shows


def test_local_loss_outside_local_train_says_where_it_runs() -> None:
    algo = _fedprox()
    ctx = ClientContext.of(_task(), _linear(W, B), SPEC)
    with pytest.raises(RuntimeError, match=r"no Anchor in the client context .*outside the local_train"):
        algo.local_loss(ctx, torch.tensor(X, dtype=torch.float32), torch.tensor(Y))


def test_a_config_names_fedprox_and_its_mu(tmp_path: Path) -> None:
    assert algorithm_class("fedprox") is FedProx and METHODS["fedprox"].config is FedProxConfig
    path = tmp_path / "exp.yaml"
    path.write_text("rounds: 2\nalgorithm:\n  name: fedprox\n", encoding="utf-8")
    assert load_config(path, ()).algorithm == FedProxConfig(mu=0.01)  # the default (config.py says why)
    assert load_config(path, ("algorithm.mu=0.5",)).algorithm == FedProxConfig(mu=0.5)
    with pytest.raises(ConfigError) as info:
        load_config(path, ("algorithm.mu=-0.1",))
    assert info.value.key_path == "algorithm.mu"


def _run(tmp_path: Path, name: str, algorithm: FedAvgConfig | FedProxConfig) -> RunResult:
    cfg: ExperimentConfig = dataclasses.replace(
        tiny_config(kind="local", num_hosts=2), algorithm=algorithm, output_dir=str(tmp_path), name=name
    )
    return run_experiment(cfg, dataset=tiny_image_dataset())


def test_mu_zero_is_fedavg_bit_for_bit(tmp_path: Path) -> None:
    fedavg, fedprox = _run(tmp_path, "fedavg", FedAvgConfig()), _run(tmp_path, "fedprox", FedProxConfig(mu=0.0))
    assert fedavg.run_dir is not None and fedprox.run_dir is not None
    assert fedprox.records[-1].test_acc > 0.0
    # every record, every table on disk and the final state, wall-clock columns aside
    records = [
        [{k: v for k, v in dataclasses.asdict(r).items() if k not in WALL_CLOCK_COLUMNS} for r in run.records]
        for run in (fedavg, fedprox)
    ]
    assert_same_object(records[0], records[1], "records")
    # summary.json names the method: take that key out of both, then the whole run directories must agree
    paths = [fedavg.run_dir / "summary.json", fedprox.run_dir / "summary.json"]
    summaries = [json.loads(path.read_text()) for path in paths]
    assert [summary.pop("algorithm") for summary in summaries] == ["fedavg", "fedprox"]
    for path, summary in zip(paths, summaries, strict=True):
        path.write_text(json.dumps(summary))
    assert_same_run(fedavg.run_dir, fedprox.run_dir, fedavg, fedprox)


def test_a_larger_mu_keeps_the_client_closer_to_the_global_weights() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 3)).astype(np.float32)
    y = (x @ np.array([1.0, -2.0, 0.5]) > 0).astype(np.int64)
    distance = {}
    for mu in (0.0, 0.1, 1.0):
        update = _fedprox(mu, batch_size=4).local_train(ClientContext.of(_task(), _linear(W, B), SPEC), x, y)
        distance[mu] = _prox(update.values["weight"].double().numpy(), update.values["bias"].double().numpy(), W, B)
    assert distance[0.0] > distance[0.1] > distance[1.0] > 0.0
