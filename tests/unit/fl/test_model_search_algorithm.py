"""The core method (paper 000, Algorithm 2) end to end: search under budgets, first-k sub-models, distillation."""

from __future__ import annotations

import dataclasses
import logging
import math
import pickle

import numpy as np
import pytest
import torch

from rayfl.config.model import ResNetConfig
from rayfl.config.sections import ResourceConfig, SystemConfig
from rayfl.core.errors import ConfigError
from rayfl.data.federated import FederatedDataset
from rayfl.engine.build import Setup, bind_algorithm, build_clock, build_setup
from rayfl.engine.driver import run_experiment
from rayfl.engine.sampling import sample_clients
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.common.distill.config import DistillConfig
from rayfl.fl.common.search import ModelSearch
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.model_search.algorithm import ModelSearchAlgorithm
from rayfl.fl.methods.model_search.config import ModelSearchConfig
from rayfl.fl.registry import algorithm_class
from rayfl.system.clock import SimClock
from tests.helpers import tiny_config, tiny_image_dataset

MIB = 2.0**20
RESNET = ResNetConfig(depth=18, widths=(4, 8, 8, 8), norm="gn", act="relu6")
DISTILL = DistillConfig(enabled=True, iterations=2, batch_size=8)


@pytest.fixture(scope="module")
def data() -> FederatedDataset:
    return tiny_image_dataset()


def config(algorithm: object, system: SystemConfig | None = None, **kw: object) -> ExperimentConfig:
    cfg = dataclasses.replace(tiny_config(kind="local"), algorithm=algorithm, **kw)  # type: ignore[arg-type]
    return cfg if system is None else dataclasses.replace(cfg, system=system)


def bound(cfg: ExperimentConfig, data: FederatedDataset) -> tuple[Setup, SimClock]:
    setup = build_setup(cfg, data)
    clock = build_clock(cfg, setup)
    bind_algorithm(cfg, setup, clock)
    return setup, clock


def budgets_between_smallest_and_largest(
    cfg: ExperimentConfig, data: FederatedDataset, headroom: float = 1.0
) -> SystemConfig:
    """Memory and bandwidth drawn uniformly per client and round from just above the smallest structure's needs to
    ``headroom`` x the largest's, so the smallest always fits and the search has room to choose."""
    setup, clock = bound(cfg, data)
    search = setup.algorithm.search  # type: ignore[attr-defined]
    small, large = (clock.oracle.elastic.model_cost(u) for u in (search.smallest, search.largest))  # type: ignore[union-attr]
    limit = cfg.system.comm_limit_s

    def rate(c: dict[str, float]) -> float:  # Mbit/s that moves the model down and up within the limit
        return 8.0 * (c["bytes_down"] + c["bytes_up"]) / limit / 1e6

    return SystemConfig(
        memory=ResourceConfig(
            source="uniform", low=small["peak_memory"] / MIB * 1.001, high=large["peak_memory"] / MIB * headroom
        ),
        bandwidth_down=ResourceConfig(source="uniform", low=rate(small) * 1.001, high=rate(large) * headroom),
    )


def test_registered() -> None:
    assert algorithm_class("model_search") is ModelSearchAlgorithm


def test_end_to_end_under_budgets_no_client_fails_and_rounds_record_the_search(data: FederatedDataset) -> None:
    cfg = config(ModelSearchConfig(ratios=(0.0, 0.5, 1.0), distill=DISTILL), model=RESNET, rounds=4)
    cfg = dataclasses.replace(cfg, system=budgets_between_smallest_and_largest(cfg, data))
    result = run_experiment(cfg, write=False, dataset=data)
    records = result.records
    assert len(records) == 4
    for r in records:
        assert r.clients_run == r.clients_sampled == 5
        assert r.clients_failed == r.failed_memory == r.failed_bandwidth == r.failed_memory_dip == 0
        assert 0.0 < r.memory_util <= 1.0 and 0.0 < r.bandwidth_util <= 1.0
        assert math.isfinite(r.search_s) and r.search_s >= 0.0
        assert 0.0 <= r.hit_rate <= 1.0
        assert math.isfinite(r.server_train_s) and r.server_train_s > 0.0  # distillation ran
        assert math.isfinite(r.train_loss) and math.isfinite(r.test_acc)
    distinct = [r.distinct_structures for r in records]
    assert distinct == sorted(distinct) and distinct[-1] > 2  # the search found structures beyond the pool's two
    assert all(torch.isfinite(v).all() for v in result.state.params.values())


def test_epsilon_one_assigns_only_the_smallest_and_largest_structures(data: FederatedDataset) -> None:
    algo = ModelSearchConfig(ratios=(0.0, 0.5, 1.0), epsilon=1.0, distill=DISTILL)
    cfg = config(algo, model=RESNET, rounds=3)
    cfg = dataclasses.replace(cfg, system=budgets_between_smallest_and_largest(cfg, data, headroom=1.5))
    setup, clock = bound(cfg, data)
    algorithm: ModelSearchAlgorithm = setup.algorithm  # type: ignore[assignment]
    ends = {algorithm.search.smallest, algorithm.search.largest}
    seen = set()
    for round_idx in range(6):
        ids = sample_clients(cfg.seed, round_idx, data.num_clients, cfg.clients_per_round)
        views = clock.check_in(round_idx, ids, [data.num_examples(int(c)) for c in ids])
        for cid, assignment in algorithm.assign(setup.algorithm.init_state(setup.params), round_idx, views).items():
            assert assignment.units in ends, cid
            seen.add(assignment.units)
        stats = algorithm.round_stats()
        assert stats.hit_rate == 0.0 and stats.distinct_structures <= 2
    assert seen == ends  # some clients can afford the largest structure, the others get the smallest
    assert algorithm.search.pool_size == 2
    records = run_experiment(cfg, write=False, dataset=data).records
    assert all(r.distinct_structures <= 2 and r.hit_rate == 0.0 and r.clients_failed == 0 for r in records)


def test_unconstrained_without_distillation_equals_fedavg_with_uniform_weights_bit_for_bit(
    data: FederatedDataset,
) -> None:
    fedavg = run_experiment(config(FedAvgConfig(weighting="uniform")), write=False, dataset=data)
    ours = run_experiment(
        config(ModelSearchConfig(ratios=(0.25, 0.5, 1.0), distill=DistillConfig(enabled=False))),
        write=False,
        dataset=data,
    )
    assert fedavg.state.params.keys() == ours.state.params.keys()
    for name, value in fedavg.state.params.items():
        assert torch.equal(value, ours.state.params[name]), name
    for a, b in zip(fedavg.records, ours.records, strict=True):
        assert (a.train_loss, a.test_acc, a.bytes_down, a.bytes_up) == (
            b.train_loss,
            b.test_acc,
            b.bytes_down,
            b.bytes_up,
        )
    assert all(r.distinct_structures == 1 and math.isnan(r.server_train_s) for r in ours.records)


def test_relu6_warning_when_blocks_can_be_skipped(data: FederatedDataset, caplog: pytest.LogCaptureFixture) -> None:
    cases = [
        (dataclasses.replace(RESNET, act="relu"), (0.0, 0.5, 1.0), True),
        (RESNET, (0.0, 0.5, 1.0), False),  # relu6 already
        (dataclasses.replace(RESNET, act="relu"), (0.5, 1.0), False),  # nothing is skipped
    ]
    for model, ratios, warns in cases:
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="rayfl.fl.methods.model_search.algorithm"):
            bound(config(ModelSearchConfig(ratios=ratios), model=model), data)
        hits = [r for r in caplog.records if "model.act: relu6" in r.getMessage()]
        assert len(hits) == (1 if warns else 0), (model.act, ratios)


def test_the_search_stays_on_the_driver(data: FederatedDataset) -> None:
    setup, clock = bound(config(ModelSearchConfig(), model=RESNET), data)
    algorithm: ModelSearchAlgorithm = setup.algorithm  # type: ignore[assignment]
    assert isinstance(algorithm.search, ModelSearch)
    ids = np.arange(3)
    algorithm.assign(algorithm.init_state(setup.params), 0, clock.check_in(0, ids, [20, 20, 20]))
    copy = pickle.loads(pickle.dumps(algorithm))
    assert copy._search is None and copy._last is None and copy._server is None
    assert copy.family is not None
    with pytest.raises(RuntimeError, match="bind_server"):
        _ = copy.search


def test_measured_server_time_puts_search_and_distillation_into_the_rounds_duration(data: FederatedDataset) -> None:
    """Issue 33: with ``system.server_time: measured`` (the paper settings) a round lasts its planned client time
    plus the server's measured time, which includes the in-place distillation (``server_train_s``); the clients'
    part is the same as with ``none`` (constant budgets, the same assignments)."""
    algo = ModelSearchConfig(ratios=(0.0, 0.5, 1.0), explore_probability=0.8, granularity="layer", distill=DISTILL)
    cfg = config(algo, model=RESNET, rounds=3)
    system = SystemConfig(bandwidth_down=ResourceConfig(source="constant", low=1.0))
    off = run_experiment(dataclasses.replace(cfg, system=system), write=False, dataset=data).records
    measured = dataclasses.replace(system, server_time="measured")
    on = run_experiment(dataclasses.replace(cfg, system=measured), write=False, dataset=data).records
    for a, b in zip(off, on, strict=True):
        assert b.server_train_s > 0.0
        assert b.sim_duration_s - a.sim_duration_s >= b.server_train_s + b.search_s
        assert b.sim_duration_s - a.sim_duration_s <= b.round_wall_s


def test_a_named_smallest_that_the_model_cannot_hold_is_refused_naming_the_key(data: FederatedDataset) -> None:
    from rayfl.fl.methods.model_search.config import SmallestConfig

    algo = ModelSearchConfig(ratios=(0.0, 0.5, 1.0), smallest=SmallestConfig(blocks=(1, 1)), distill=DISTILL)
    with pytest.raises(ConfigError, match=r"algorithm\.smallest\.blocks: blocks needs one count per stage"):
        bound(config(algo, model=RESNET), data)


def test_the_distillation_lr_can_follow_the_clients_schedule(data: FederatedDataset) -> None:
    """``distill.lr_schedule: clients`` (issue 40's control): each round the distillation's lr is scaled by the
    factor the clients' schedule applies that round. Clients halved from round 0 on (lr 0.5 -> 0.25, exact in
    binary), the distillation at 2^-10 following them, give the records of a constant distillation at 2^-11, and
    not those of a constant one at 2^-10."""

    def run(lr: float, schedule: str) -> list[tuple[float, float]]:
        distill = dataclasses.replace(DISTILL, lr=lr, lr_schedule=schedule)  # type: ignore[arg-type]
        cfg = config(ModelSearchConfig(ratios=(0.0, 0.5, 1.0), distill=distill), model=RESNET, rounds=2)
        train = dataclasses.replace(cfg.train, lr=0.5, lr_schedule="step", lr_decay_rounds=(0,), lr_decay=0.5)
        records = run_experiment(dataclasses.replace(cfg, train=train), write=False, dataset=data).records
        return [(r.train_loss, r.test_acc) for r in records]

    following = run(2.0**-10, "clients")
    assert following == run(2.0**-11, "constant")
    assert following != run(2.0**-10, "constant")
