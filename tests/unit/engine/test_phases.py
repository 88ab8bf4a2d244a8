"""Multi-phase runs: records, clock and report cover every phase; the phase of a round is a function of the round."""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from rayfl.config.sections import BackendConfig
from rayfl.core.errors import ConfigError
from rayfl.core.messages import Assignment, TrainTask
from rayfl.engine.build import build_clock, build_setup
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.engine.exec.client_state import keeps_state
from rayfl.engine.exec.host import ClientHost
from rayfl.engine.phases import Phase, PhasedAlgorithm, PhaseSchedule, build_run_algorithm
from rayfl.experiment.loader import load_config
from rayfl.experiment.schema import ExperimentConfig, PhaseConfig
from rayfl.fl.methods.fedavg.algorithm import FedAvg
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.fedoras.algorithm import op_tables, supernet_family
from rayfl.fl.methods.fedoras.sampling import path_flops
from rayfl.fl.methods.fedoras.search import SearchState
from rayfl.models.elastic import CostModel, ElasticFamily
from tests.helpers import tiny_config, tiny_image_dataset
from tests.helpers_fedoras import fedoras_tiny_config


def _fedoras(hosts: int, tmp: Path | None = None) -> RunResult:
    cfg = fedoras_tiny_config(kind="local", num_hosts=hosts)
    if tmp is not None:
        cfg = dataclasses.replace(cfg, output_dir=str(tmp))
    return run_experiment(cfg, write=tmp is not None, dataset=tiny_image_dataset())


def result_family(cfg: ExperimentConfig) -> ElasticFamily | None:
    return build_clock(cfg, build_setup(cfg, tiny_image_dataset())).oracle.family


def cost_model(cfg: ExperimentConfig) -> CostModel:
    cost = build_clock(cfg, build_setup(cfg, tiny_image_dataset())).oracle.elastic
    assert cost is not None
    return cost


def test_schedule_maps_rounds_to_phases() -> None:
    algorithm = build_run_algorithm(fedoras_tiny_config(kind="local"))
    assert isinstance(algorithm, PhasedAlgorithm)
    schedule = PhaseSchedule(algorithm, 7)
    assert [schedule.phase_at(r).name for r in range(7)] == ["supernet"] * 2 + ["search"] * 3 + ["finetune"] * 2
    assert [schedule.clients_per_round(r, 4) for r in range(7)] == [4, 4, 0, 0, 0, 4, 4]
    single = PhaseSchedule(build_run_algorithm(tiny_config(kind="local")), 3)
    assert [schedule.index_of(r) for r in range(7)] == [0, 0, 1, 1, 1, 2, 2] and single.index_of(2) == 0


def test_three_phase_run_covers_every_phase_in_records_clock_and_report(tmp_path: Path) -> None:
    result = _fedoras(2, tmp_path)
    records = result.records
    assert [r.phase for r in records] == ["supernet"] * 2 + ["search"] * 3 + ["finetune"] * 2
    assert [r.clients_run for r in records] == [4, 4, 0, 0, 0, 4, 4]
    assert [r.num_models for r in records] == [1] * 5 + [4] * 2  # one model per tier in the fine-tuning phase
    times = [r.sim_time_s for r in records]
    assert all(b > a for a, b in itertools.pairwise(times))  # every phase moves the one clock
    search = records[2:5]
    assert all(r.sim_duration_s > 0 and r.search_s > 0 for r in search)  # modelled server time of the search
    assert all(math.isnan(r.train_loss) for r in search) and all(r.bytes_down == 0 for r in search)
    assert all(math.isfinite(r.train_loss) for r in records if r.phase != "search")
    summary = json.loads((result.run_dir / "summary.json").read_text())  # type: ignore[operator]
    assert [p["name"] for p in summary["phases"]] == ["supernet", "search", "finetune"]
    assert sum(p["sim_time_s"] for p in summary["phases"]) == pytest.approx(records[-1].sim_time_s)
    tiers = summary["phases"][1]["result"]["tiers"]  # the search reports its chosen path per tier
    assert [t["tier"] for t in tiers] == [0, 1, 2, 3] and sum(t["clients"] for t in tiers) == 12
    for t in tiers:
        low, high = t["flops_bracket"]
        assert low <= t["flops"] <= high and len(t["path"]) == 3 and 0.0 <= t["test_acc"] <= 1.0
    assert "result" not in summary["phases"][0]
    tuned = summary["phases"][2]["result"]["tiers"]  # the fine-tuning reports each tier's model
    assert [t["path"] for t in tuned] == [t["path"] for t in tiers] and all(0 <= t["test_acc"] <= 1 for t in tuned)
    rows = (result.run_dir / "rounds.csv").read_text().splitlines()  # type: ignore[operator]
    assert "phase" in rows[0].split(",") and len(rows) == 8


def test_search_state_is_handed_over_and_hosts_do_not_change_results() -> None:
    one, two = _fedoras(1), _fedoras(2)
    assert [(r.train_loss, r.test_acc, r.sim_time_s) for r in one.records] == [
        (r.train_loss, r.test_acc, r.sim_time_s) for r in two.records
    ]
    for name in one.state.params:
        assert torch.equal(one.state.params[name], two.state.params[name])


def test_search_phase_finds_in_bracket_paths_per_tier() -> None:
    cfg = dataclasses.replace(
        fedoras_tiny_config(kind="local", num_hosts=1), rounds=5, phases=fedoras_tiny_config().phases[:2]
    )
    result = run_experiment(cfg, write=False, dataset=tiny_image_dataset())
    state = result.state.algo_state
    assert isinstance(state, SearchState) and len(state.searches) == 4
    edges = state.tiers.edges
    tables = op_tables(supernet_family(result_family(cfg)), cost_model(cfg))
    for tier, search in enumerate(state.searches):
        flops = path_flops(tables, search.seen_paths)
        inside = (flops >= edges[tier]) & (flops <= edges[tier + 1])
        assert len(search.paths) == 6 and search.evaluations == int(inside.sum())  # evaluated: the in-bracket ones
        assert (search.seen_scores[inside] >= 0).all() and (search.seen_scores[~inside] < 0).all()
        assert len(np.unique(search.paths, axis=0)) == len(search.paths)  # a population holds each path once
        best, score = search.best
        assert 0.0 <= score <= 1.0 and score == search.seen_scores.max()
        assert edges[tier] <= path_flops(tables, best)[0] <= edges[tier + 1]  # the best path lies in its bracket
        assert len(np.unique(search.seen_paths, axis=0)) == len(search.seen_paths)  # nothing scored twice


def test_phases_must_add_up_to_rounds(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(
        "rounds: 5\nphases:\n  - name: a\n    rounds: 2\n    algorithm: {name: fedavg}\n"
        "  - name: b\n    rounds: 2\n    algorithm: {name: fjord}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match="phases' rounds"):
        load_config(path)


class _Remembering(FedAvg):
    """FedAvg that keeps a state per client across rounds (it gives none back: only the flag matters here)."""

    keeps_client_state = True


@pytest.mark.parametrize("noop", [False, True])
def test_hosts_ask_the_phase_of_the_tasks_round_for_every_client_hook(noop: bool) -> None:
    """Phase a (FedAvg weighing by examples) then phase b (FedAvg weighing clients equally, keeping client state):
    a host's partial sums carry each phase's own ``client_weight``, whether clients train or return what they got
    (``train.noop``, where the host asks the weight itself), and only phase b's clients carry memories."""
    base = tiny_config(kind="local")
    train = dataclasses.replace(base.train, noop=noop)
    phased = PhasedAlgorithm(
        [
            Phase("a", 0, 1, FedAvg(FedAvgConfig(), train)),
            Phase("b", 1, 1, _Remembering(FedAvgConfig(weighting="uniform"), train)),
        ],
        train,
    )
    setup = build_setup(dataclasses.replace(base, train=train), tiny_image_dataset())
    host = ClientHost(0, setup.dataset, base.model, phased, BackendConfig(kind="local"), init_seed=1)
    params = {k: v.numpy() for k, v in setup.params.items()}
    client = 3
    weights = []
    for round_idx in (0, 1):
        task = TrainTask(client_id=client, round_idx=round_idx, seed=0, lr=0.05, assignment=Assignment())
        partial, _outcomes, *_ = host.run_round([task], params, {k: 0 for k in params}, 1, None, None)
        sums = partial.values()  # type: ignore[attr-defined]  # one shard's ArrayPartial
        weights.append({float(s.weight) for s in sums})
    assert weights == [{float(setup.dataset.num_examples(client))}, {1.0}]
    assert setup.dataset.num_examples(client) != 1
    tasks = [TrainTask(client_id=client, round_idx=r, seed=0, lr=0.05, assignment=Assignment()) for r in (0, 1)]
    assert [keeps_state(phased, [t]) for t in tasks] == [False, True]


def test_fedavg_then_fedavg_equals_one_fedavg_run() -> None:
    """A general (non-FedorAS) schedule: two FedAvg phases hand over the parameters and equal one FedAvg run
    (with a constant learning rate the per-phase schedule is the same)."""
    base = tiny_config(kind="local", num_hosts=2)
    phased = dataclasses.replace(
        base,
        phases=(
            PhaseConfig(name="a", rounds=1, algorithm=FedAvgConfig()),
            PhaseConfig(name="b", rounds=2, algorithm=FedAvgConfig()),
        ),
    )
    assert isinstance(phased, ExperimentConfig)
    one = run_experiment(base, write=False, dataset=tiny_image_dataset())
    two = run_experiment(phased, write=False, dataset=tiny_image_dataset())
    assert [r.test_acc for r in one.records] == [r.test_acc for r in two.records]
    assert [r.phase for r in two.records] == ["a", "b", "b"]
    for name in one.state.params:
        assert torch.equal(one.state.params[name], two.state.params[name])


def test_a_phase_may_have_its_own_clients_per_round_learning_rate_and_epochs(tmp_path: Path) -> None:
    """Phase b samples 2 clients a round at lr 0.01 with the cosine schedule over its own 2 rounds, and trains 2 epochs
    (its clients' modelled compute time doubles); phase a keeps the run's 5 clients, lr 0.05 and one
    epoch; a phase's clients beyond the data are refused."""
    base = tiny_config(kind="local", num_hosts=1)
    one_epoch = dataclasses.replace(
        base,
        rounds=3,
        output_dir=str(tmp_path / "runs"),
        train=dataclasses.replace(base.train, lr_schedule="cosine"),
        phases=(
            PhaseConfig(name="a", rounds=1, algorithm=FedAvgConfig()),
            PhaseConfig(name="b", rounds=2, algorithm=FedAvgConfig(), clients_per_round=2, lr=0.01),
        ),
    )
    b = dataclasses.replace(one_epoch.phases[1], epochs=2)
    two_epochs = dataclasses.replace(one_epoch, name="two", phases=(one_epoch.phases[0], b))
    runs = [run_experiment(c, dataset=tiny_image_dataset()) for c in (one_epoch, two_epochs)]
    assert [r.clients_sampled for r in runs[1].records] == [5, 2, 2]
    assert [r.lr for r in runs[1].records] == [0.05, 0.01, pytest.approx(0.005)]
    clients = [pd.read_csv(r.run_dir / "clients.csv") for r in runs]  # type: ignore[operator]
    phase_a = clients[0].round_idx == 0
    assert (clients[1].compute_s[phase_a] == clients[0].compute_s[phase_a]).all()
    assert (clients[1].compute_s[~phase_a] == 2 * clients[0].compute_s[~phase_a]).all()
    schedule = PhaseSchedule(build_run_algorithm(two_epochs), 3)
    assert [schedule.train(two_epochs.train, r).epochs for r in range(3)] == [1, 2, 2]
    path = tmp_path / "bad.yaml"
    path.write_text(
        "rounds: 2\ndata: {name: synthetic, num_clients: 4}\nmodel: {name: cnn}\nclients_per_round: 2\nphases:\n"
        "  - {name: a, rounds: 2, clients_per_round: 5, algorithm: {name: fedavg}}\n",
        encoding="utf-8",
    )
    with pytest.raises(ConfigError, match=r"phases\[0\]\.clients_per_round: 5 exceeds data.num_clients=4"):
        load_config(path)


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        (
            "rounds: 2\ndata: {name: synthetic}\nalgorithm: {name: fedoras}\nmodel: {name: cnn}\n",
            "needs model.name: supernet",
        ),
        (
            "rounds: 2\ndata: {name: synthetic}\nalgorithm: {name: fedoras_search}\nmodel: {name: supernet}\n",
            "must follow a 'fedoras' phase",
        ),
        (
            "rounds: 2\ndata: {name: synthetic}\nmodel: {name: supernet}\nphases:\n"
            "  - {name: a, rounds: 1, algorithm: {name: fedavg}}\n"
            "  - {name: b, rounds: 1, algorithm: {name: fedoras_search}}\n",
            "phases\\[1\\].algorithm.name: 'fedoras_search' must follow",
        ),
        ("rounds: 2\ndata: {name: synthetic}\nmodel: {name: supernet, ops: [conv1, conv9]}\n", "unknown op 'conv9'"),
        (
            "rounds: 2\ndata: {name: synthetic}\nmodel: {name: supernet}\nphases:\n"
            "  - {name: a, rounds: 1, algorithm: {name: fedoras}}\n"
            "  - {name: b, rounds: 1, algorithm: {name: fedoras_search}}\n",
            r"phases\[1\]\.algorithm\.validation: 'held_out' scores paths on the held-out validation set: set "
            r"data\.val_fraction above 0",
        ),
        (
            "rounds: 2\ndata: {name: synthetic}\nmodel: {name: supernet}\n"
            "algorithm: {name: fedoras, tiers: {shares: [0.5, 0.4]}}\n",
            "sum to 1",
        ),
    ],
)
def test_fedoras_configs_are_checked(tmp_path: Path, yaml_text: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(yaml_text, encoding="utf-8")
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_random_search_switch_draws_fresh_valid_paths() -> None:
    cfg = fedoras_tiny_config(kind="local", num_hosts=1)
    random_search = dataclasses.replace(cfg.phases[1].algorithm, method="supernet_random")
    search = dataclasses.replace(cfg.phases[1], algorithm=random_search)
    cfg = dataclasses.replace(cfg, rounds=5, phases=(cfg.phases[0], search))
    result = run_experiment(cfg, write=False, dataset=tiny_image_dataset())
    state = result.state.algo_state
    assert isinstance(state, SearchState)
    tables = op_tables(supernet_family(result_family(cfg)), cost_model(cfg))
    for tier, tier_search in enumerate(state.searches):
        flops = path_flops(tables, tier_search.seen_paths)
        # random children are drawn inside the bracket, so every scored path is a real accuracy
        assert ((flops >= state.tiers.edges[tier]) & (flops <= state.tiers.edges[tier + 1])).all()
        assert (tier_search.seen_scores >= 0.0).all()


def test_fedoras_on_a_one_op_space_equals_fedavg() -> None:
    """With one candidate op (no identity) every path is the whole supernet and every example goes through every op,
    so OPA's per-op weights equal FedAvg's example counts: one FedorAS round is FedAvg, bit for bit."""
    base = fedoras_tiny_config(kind="local", num_hosts=2)
    model = dataclasses.replace(base.model, ops=("mb3_e2",))
    fedoras = dataclasses.replace(
        base,
        model=model,
        rounds=2,
        phases=(
            PhaseConfig(
                name="supernet",
                rounds=2,
                algorithm=dataclasses.replace(base.phases[0].algorithm, subspace_params=10**9),
            ),
        ),
    )
    fedavg = dataclasses.replace(fedoras, phases=(), algorithm=FedAvgConfig())
    a = run_experiment(fedoras, write=False, dataset=tiny_image_dataset())
    b = run_experiment(fedavg, write=False, dataset=tiny_image_dataset())
    assert [(r.train_loss, r.test_acc) for r in a.records] == [(r.train_loss, r.test_acc) for r in b.records]
    for name in a.state.params:
        assert torch.equal(a.state.params[name], b.state.params[name]), name
