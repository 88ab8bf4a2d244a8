"""The shared server optimizer (``server.optimizer``, ``rayfl/fl/common/server_opt.py``): each optimizer's step on a
hand-built aggregate against Reddi et al.'s Algorithm 2 written out element by element, sub-models' uncovered elements
left alone with their state, FedAvg's old keys and old server step bit for bit, HeteroFL with FedAdam through the
engine, and a resumed FedAdam run equal to the uninterrupted one."""

from __future__ import annotations

import dataclasses
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl.config.sections import CheckpointConfig, ServerConfig, ServerOptimizerConfig
from rayfl.core.errors import ConfigError
from rayfl.core.messages import Aggregate, ClientUpdate, Params, ServerState, TensorSlice
from rayfl.core.reducers import MaskedWeightedMean, Partial
from rayfl.data.federated import FederatedDataset
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.experiment.loader import load_config
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.common.server_opt import PREFIX, optimizer_step
from rayfl.fl.methods.fedavg.algorithm import FedAvg
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.heterofl.config import HeteroFLConfig
from tests.helpers import tiny_config, tiny_image_dataset
from tests.resume_cases import WALL_CLOCK_COLUMNS, assert_same_run, assert_same_state, case, keep_checkpoints_up_to

B1, B2, TAU, LR = 0.9, 0.99, 1e-3, 0.1


@pytest.fixture(scope="module")
def data() -> FederatedDataset:
    return tiny_image_dataset()


# ----------------------------------------------------------------------------------- closed forms, by hand
def _by_hand(name: str, xs: list[float], aggregates: list[list[float]]) -> tuple[list[float], list[float], list[float]]:
    """Algorithm 2 for one element at a time, in plain Python floats: x, m and v after every aggregate."""
    out_x, out_m, out_v = [], [], []
    for k, x in enumerate(xs):
        m, v = 0.0, 0.0
        for agg in aggregates:
            delta = agg[k] - x
            m = B1 * m + (1.0 - B1) * delta
            if name == "adagrad":
                v = v + delta * delta
            elif name == "yogi":
                v = v - (1.0 - B2) * delta * delta * math.copysign(1.0, v - delta * delta) * (v != delta * delta)
            else:
                v = B2 * v + (1.0 - B2) * delta * delta
            x = x + LR * m / (math.sqrt(v) + TAU)
        out_x.append(x)
        out_m.append(m)
        out_v.append(v)
    return out_x, out_m, out_v


def _steps(cfg: ServerOptimizerConfig, x: Params, aggregates: list[Aggregate]) -> tuple[Params, Params]:
    state: Params = {}
    for aggregate in aggregates:
        x, state = optimizer_step(cfg, x, state, aggregate)
    return x, state


def _whole(values: list[float]) -> Aggregate:
    return Aggregate({"w": torch.tensor(values, dtype=torch.float64)}, {"w": 1.0}, 2)


@pytest.mark.parametrize("name", ["adam", "yogi", "adagrad"])
def test_each_adaptive_step_is_algorithm_2(name: str) -> None:
    """Three rounds on four elements (pseudo-gradients of both signs, one round where Yogi's v exceeds Delta^2 and
    one where it does not): x, m and v equal Algorithm 2 computed element by element in Python floats."""
    xs = [0.5, -1.0, 2.0, 0.0]
    aggregates = [[0.7, -1.5, 2.0, 0.3], [0.6, -1.2, 1.9, 0.31], [1.5, -1.25, 1.95, -0.2]]
    cfg = ServerOptimizerConfig(name=name, lr=LR, beta1=B1, beta2=B2, tau=TAU)  # type: ignore[arg-type]
    x, state = _steps(cfg, {"w": torch.tensor(xs, dtype=torch.float64)}, [_whole(a) for a in aggregates])
    want_x, want_m, want_v = _by_hand(name, xs, aggregates)
    torch.testing.assert_close(x["w"], torch.tensor(want_x, dtype=torch.float64), rtol=1e-14, atol=0)
    torch.testing.assert_close(state[f"{PREFIX}m/w"], torch.tensor(want_m, dtype=torch.float64), rtol=1e-14, atol=0)
    torch.testing.assert_close(state[f"{PREFIX}v/w"], torch.tensor(want_v, dtype=torch.float64), rtol=1e-14, atol=0)
    assert sorted(state) == [f"{PREFIX}m/w", f"{PREFIX}v/w"]


def test_the_first_adam_step_moves_by_about_lr_times_one_minus_beta1_over_its_root() -> None:
    """A sanity anchor of the closed form: one step with v_-1 = 0 moves x by lr (1 - b1) |D| / (sqrt(1 - b2) |D| +
    tau) in the direction of the aggregate, about lr (1 - b1) / sqrt(1 - b2) = 0.1 for |D| >> tau."""
    cfg = ServerOptimizerConfig(name="adam", lr=LR)
    x, _ = optimizer_step(cfg, {"w": torch.zeros(2, dtype=torch.float64)}, {}, _whole([1.0, -1.0]))
    step = LR * (1 - B1) / (math.sqrt(1 - B2) + TAU)
    torch.testing.assert_close(x["w"], torch.tensor([step, -step], dtype=torch.float64), rtol=1e-15, atol=0)


def test_sgd_with_momentum_is_heavy_ball_on_the_old_minus_the_mean() -> None:
    """b = g, then b = mu b + g with g = x - a; x <- x - lr b (FedAvgM), by hand on one element."""
    cfg = ServerOptimizerConfig(name="sgd", lr=0.5, momentum=0.8)
    x, state = _steps(cfg, {"w": torch.tensor([1.0], dtype=torch.float64)}, [_whole([0.0]), _whole([1.0])])
    # round 0: g = 1, b = 1, x = 0.5; round 1: g = -0.5, b = 0.8 - 0.5 = 0.3, x = 0.5 - 0.15 = 0.35
    torch.testing.assert_close(x["w"], torch.tensor([0.35], dtype=torch.float64), rtol=1e-15, atol=0)
    torch.testing.assert_close(state[f"{PREFIX}momentum/w"], torch.tensor([0.3], dtype=torch.float64))


# ----------------------------------------------------------------------------------- sub-models
def _reduced(previous: Params, updates: list[ClientUpdate]) -> Aggregate:
    """The real reducer's aggregate of ``updates`` (``MaskedWeightedMean``, as client hosts and shards run it)."""
    reducer = MaskedWeightedMean()
    partial: Partial = {}
    for update in updates:
        reducer.accumulate(partial, update, {k: v.shape for k, v in previous.items()})
    params, coverage = reducer.finalize(partial, previous)
    return Aggregate(params, coverage, len(updates), covered=reducer.covered(partial, previous))


def _sub(client_id: int, rows: list[int], value: torch.Tensor) -> ClientUpdate:
    """A sub-model's update of the first rows of ``w`` (a HeteroFL-style first-k slice) and nothing of ``b``."""
    return ClientUpdate(client_id, 1.0, {"w": value}, {"w": TensorSlice((np.array(rows), None))}, 1, 0.0, 1)


@pytest.mark.parametrize("name", ["sgd", "adam", "yogi", "adagrad"])
def test_elements_no_client_covered_keep_their_value_and_their_state(name: str) -> None:
    """Round 0 covers the whole of ``w`` (every element gets a state); round 1's sub-models cover only its first row
    and nothing of ``b``: the second row and ``b`` keep their values and their ``m``/``v`` (or momentum buffer)
    bit for bit, while the first row takes exactly the step the whole-tensor optimizer takes there."""
    cfg = ServerOptimizerConfig(name=name, lr=0.5 if name == "sgd" else LR, momentum=0.9 if name == "sgd" else 0.0)  # type: ignore[arg-type]
    x0 = {"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([0.5, -0.5])}
    full = [
        ClientUpdate(
            0, 1.0, {"w": torch.tensor([[1.5, 1.0], [2.0, 4.5]]), "b": torch.tensor([1.0, 0.0])}, {}, 1, 0.0, 1
        )
    ]
    x1, state1 = optimizer_step(cfg, x0, {}, _reduced(x0, full))
    partial = _reduced(x1, [_sub(1, [0], torch.tensor([[0.0, 3.0]])), _sub(2, [0], torch.tensor([[2.0, 1.0]]))])
    assert partial.coverage == {"w": 0.5, "b": 0.0} and list(partial.covered) == ["w"]
    x2, state2 = optimizer_step(cfg, x1, state1, partial)
    assert torch.equal(x2["w"][1], x1["w"][1]) and torch.equal(x2["b"], x1["b"])
    assert state2.keys() == state1.keys()
    for key in state1:
        rows = slice(None) if key.endswith("/b") else 1
        assert torch.equal(state2[key][rows], state1[key][rows]), key
    # the covered row: the step of the same optimizer on a whole-covered aggregate with those values
    whole = Aggregate({"w": partial.params["w"], "b": x1["b"]}, {"w": 1.0, "b": 1.0}, 2)
    x_whole, state_whole = optimizer_step(cfg, x1, state1, whole)
    assert torch.equal(x2["w"][0], x_whole["w"][0])
    for key in state1:
        if key.endswith("/w"):
            assert torch.equal(state2[key][0], state_whole[key][0]), key


def test_a_first_step_on_a_part_leaves_the_rest_at_the_initial_state() -> None:
    """Adam with v_-1 > 0: elements never covered keep v = initial_accumulator (not b2 x it) and m = 0."""
    cfg = ServerOptimizerConfig(name="adam", initial_accumulator=0.25)
    x0 = {"w": torch.zeros(2, 2)}
    _, state = optimizer_step(cfg, x0, {}, _reduced(x0, [_sub(0, [1], torch.tensor([[1.0, -1.0]]))]))
    assert torch.equal(state[f"{PREFIX}v/w"][0], torch.full((2,), 0.25))
    assert torch.equal(state[f"{PREFIX}m/w"][0], torch.zeros(2))
    assert bool((state[f"{PREFIX}v/w"][1] != 0.25).all())


# ----------------------------------------------------------------------------------- FedAvg's alias, through runs
class _FedAvgBefore(FedAvg):
    """FedAvg's server step as it was before the optimizer was shared (copied from rayfl at 1bb6350), with the shared
    optimizer off: the oracle the alias must equal bit for bit."""

    def server_optimizer(self, configured: ServerOptimizerConfig) -> ServerOptimizerConfig:
        return ServerOptimizerConfig()

    def server_update(self, state: ServerState, round_idx: int, aggregate: Aggregate) -> ServerState:
        cfg = self.config
        if cfg.server_lr == 1.0 and cfg.server_momentum == 0.0:
            return super().server_update(state, round_idx, aggregate)
        new_params = {}
        momentum = dict(state.opt_state)
        for name, old in state.params.items():
            grad = old - aggregate.params[name]  # pseudo-gradient
            if cfg.server_momentum > 0.0:
                buf = momentum.get(name)
                buf = grad.clone() if buf is None else buf.mul(cfg.server_momentum).add_(grad)
                momentum[name] = buf
                grad = buf
            new_params[name] = old - cfg.server_lr * grad
        return ServerState(new_params, round_idx + 1, momentum, state.algo_state, state.models)


def _written(cfg: ExperimentConfig, tmp_path: Path, name: str, data: FederatedDataset) -> RunResult:
    result = run_experiment(dataclasses.replace(cfg, name=name, output_dir=str(tmp_path / name)), dataset=data)
    assert result.run_dir is not None
    return result


def _same_records(a: RunResult, b: RunResult) -> None:
    """rounds.csv and clients.csv equal bit for bit (wall-clock columns aside), and the final parameters."""
    dirs = [r.run_dir for r in (a, b) if r.run_dir is not None]
    assert len(dirs) == 2
    for table in ("rounds", "clients"):
        x, y = (pd.read_csv(d / f"{table}.csv", keep_default_na=False) for d in dirs)
        x, y = (f.drop(columns=[c for c in WALL_CLOCK_COLUMNS if c in f.columns]) for f in (x, y))
        pd.testing.assert_frame_equal(x, y, check_exact=True)
    assert_same_state(a.state.params, b.state.params)


def test_sgd_at_lr_1_without_momentum_is_plain_fedavg_bit_for_bit(data: FederatedDataset, tmp_path: Path) -> None:
    cfg = dataclasses.replace(tiny_config(kind="local", num_hosts=2), rounds=3)
    plain = _written(cfg, tmp_path, "plain", data)
    explicit = ServerConfig(optimizer=ServerOptimizerConfig(name="sgd", lr=1.0, momentum=0.0))
    sgd = _written(dataclasses.replace(cfg, server=explicit), tmp_path, "sgd", data)
    _same_records(plain, sgd)
    assert sgd.state.opt_state == {}


def test_fedavg_server_lr_and_momentum_are_the_old_numbers_and_server_optimizer_sgd(
    data: FederatedDataset, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``algorithm.server_lr`` / ``server_momentum`` (the alias), ``server.optimizer: sgd`` with the same lr and
    momentum, and FedAvg's own server step from before (the oracle): the same records and models, bit for bit."""
    from rayfl.fl.registry import METHODS

    cfg = dataclasses.replace(tiny_config(kind="local", num_hosts=2), rounds=3)
    heavy_ball, lr_only = FedAvgConfig(server_lr=0.9, server_momentum=0.5), FedAvgConfig(server_lr=1.5)
    alias = _written(dataclasses.replace(cfg, algorithm=heavy_ball), tmp_path, "alias", data)
    alias_lr = _written(dataclasses.replace(cfg, algorithm=lr_only), tmp_path, "alias_lr", data)
    shared = ServerConfig(optimizer=ServerOptimizerConfig(name="sgd", lr=0.9, momentum=0.5))
    sgd = _written(dataclasses.replace(cfg, server=shared), tmp_path, "sgd", data)
    oracle = dataclasses.replace(METHODS["fedavg"], algorithm=f"{__name__}:_FedAvgBefore")
    monkeypatch.setitem(METHODS, "fedavg", oracle)
    before = _written(dataclasses.replace(cfg, algorithm=heavy_ball), tmp_path, "before", data)
    before_lr = _written(dataclasses.replace(cfg, algorithm=lr_only), tmp_path, "before_lr", data)
    _same_records(before, alias)
    _same_records(before, sgd)
    _same_records(before_lr, alias_lr)
    renamed = {f"{PREFIX}momentum/{k}": v for k, v in before.state.opt_state.items()}
    assert_same_state(renamed, alias.state.opt_state)
    assert_same_state(alias.state.opt_state, sgd.state.opt_state)
    assert before_lr.state.opt_state == {} == alias_lr.state.opt_state


def test_fedavgs_keys_and_server_optimizer_are_not_both_set(tmp_path: Path) -> None:
    base = "rounds: 2\nclients_per_round: 4\ndata: {name: synthetic, num_clients: 8}\nmodel: {name: cnn}\n"
    path = tmp_path / "run.yaml"
    path.write_text(base + "algorithm: {name: fedavg, server_momentum: 0.9}\nserver: {optimizer: {name: adam}}\n")
    with pytest.raises(ConfigError, match=r"algorithm\.server_momentum: .*server\.optimizer"):
        load_config(path)
    path.write_text(base + "server: {optimizer: {name: adam, momentum: 0.9}}\n")
    with pytest.raises(ConfigError, match=r"server\.optimizer\.momentum: 'adam' does not use it"):
        load_config(path)
    path.write_text(base + "server: {optimizer: {name: yogi, lr: 0.03, beta2: 0.999}}\n")
    assert load_config(path).server.optimizer == ServerOptimizerConfig(name="yogi", lr=0.03, beta2=0.999)


# ----------------------------------------------------------------------------------- HeteroFL with FedAdam
def _heterofl_adam(data: FederatedDataset | None, rounds: int = 3) -> ExperimentConfig:
    """HeteroFL (sub-models of several widths: budgets from a quarter-width model's need up) with FedAdam."""
    cfg = case("heterofl", data, rounds=rounds)
    return dataclasses.replace(cfg, server=ServerConfig(optimizer=ServerOptimizerConfig(name="adam", lr=0.03)))


def test_heterofl_runs_with_fedadam_and_keeps_a_moment_for_every_tensor(data: FederatedDataset, tmp_path: Path) -> None:
    cfg = dataclasses.replace(_heterofl_adam(data), algorithm=HeteroFLConfig(), checkpoint=CheckpointConfig(every=0))
    adam = run_experiment(cfg, write=False, dataset=data)
    plain = run_experiment(dataclasses.replace(cfg, server=ServerConfig()), write=False, dataset=data)
    params = adam.state.params
    assert adam.model_finite and any(not torch.equal(params[n], plain.state.params[n]) for n in params)
    for key in ("m", "v"):
        moments = {k.removeprefix(f"{PREFIX}{key}/") for k in adam.state.opt_state if k.startswith(f"{PREFIX}{key}/")}
        assert moments == params.keys()


def test_a_resumed_fedadam_run_equals_the_uninterrupted_one(data: FederatedDataset, tmp_path: Path) -> None:
    """HeteroFL with FedAdam and the shared distillation's own Adam kept across rounds (both in ``opt_state``, the
    method's step after the optimizer's), resumed after round 2 of 4: records and state bit for bit."""
    cfg = _heterofl_adam(data, rounds=4)
    distill = dataclasses.replace(cfg.algorithm.distill, update="shared", optimizer_state="run")
    algorithm = dataclasses.replace(cfg.algorithm, distill=distill)
    cfg = dataclasses.replace(cfg, algorithm=algorithm, output_dir=str(tmp_path))
    full = run_experiment(cfg, dataset=data)
    assert full.run_dir is not None
    keys = {k.split("/")[0] for k in full.state.opt_state}
    assert keys == {"server_opt", "distill"}, keys
    copy = tmp_path / "resumed"
    shutil.copytree(full.run_dir, copy)
    keep_checkpoints_up_to(copy, 2)
    resumed = run_experiment(cfg, dataset=data, resume=copy)
    assert_same_run(full.run_dir, copy, full, resumed)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_heterofl_with_fedadam_is_the_same_on_ray_and_in_process(data: FederatedDataset) -> None:
    cfg = dataclasses.replace(_heterofl_adam(data), algorithm=HeteroFLConfig(), checkpoint=CheckpointConfig(every=0))
    local = run_experiment(cfg, write=False, dataset=data)
    backend = dataclasses.replace(cfg.backend, kind="ray", num_hosts=2, num_shards=2, cpus_per_host=0.25)
    remote = run_experiment(dataclasses.replace(cfg, backend=backend), write=False, dataset=data)
    rows = [pd.DataFrame([dataclasses.asdict(r) for r in res.records]) for res in (local, remote)]
    x, y = (f.drop(columns=[c for c in WALL_CLOCK_COLUMNS if c in f.columns]) for f in rows)
    pd.testing.assert_frame_equal(x, y, check_exact=True)
    assert_same_state(local.state.params, remote.state.params)
    assert_same_state(local.state.opt_state, remote.state.opt_state)
    assert any(k.startswith(f"{PREFIX}v/") for k in remote.state.opt_state)
