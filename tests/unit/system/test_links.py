"""Unstable links: column levels of an assignment, run lengths with the geometric law, what a transfer delivers and
what bytes it moves. Real families, real clock; hand-computed expectations."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import numpy as np
import pytest
import torch

from rayfl.config.model import CNNConfig
from rayfl.config.sections import LinkConfig, ResourceConfig
from rayfl.core.messages import Assignment, ClientUpdate, TensorSlice
from rayfl.engine.build import build_clock, build_setup
from rayfl.models.elastic.spec import SubModelSpec, first_k
from rayfl.system.links import LinkModel, attempted, column_levels, delivered, level_ratio, restrict_update
from tests.helpers import tiny_config, tiny_image_dataset


def _clock_and_family(er: ResourceConfig, padding: bool = True):  # type: ignore[no-untyped-def]
    cfg = dataclasses.replace(tiny_config(kind="local"), model=CNNConfig(channels=(8, 16)))
    cfg = dataclasses.replace(
        cfg, system=dataclasses.replace(cfg.system, links=LinkConfig(error_rate=er, padding=padding))
    )
    setup = build_setup(cfg, tiny_image_dataset())
    clock = build_clock(cfg, setup)
    assert clock.oracle.family is not None
    return clock, clock.oracle.family, setup


def _uniform(family, rate: float) -> tuple[int, ...]:  # type: ignore[no-untyped-def]
    return family.space.units(SubModelSpec.uniform(family.space, rate).ratios)


def test_run_lengths_follow_the_geometric_law() -> None:
    """Columns go in order until the first loss: with n levels, P(p_d = j) = (1-er)^j er for j < n and
    (1-er)^n for j = n; every frequency within 4 standard deviations over 20,000 clients."""
    er, n, draws = 0.2, 8, 20_000
    model = LinkModel(LinkConfig(error_rate=ResourceConfig(source="constant", low=er)), seed=3)
    got = model.draw(round_idx=5, clients=np.arange(draws), t=0.0)
    down = np.array([delivered(d.down_run, n) for d in got if d is not None])
    up = np.array([delivered(d.up_run, n) for d in got if d is not None])
    for observed in (down, up):
        for j in range(n + 1):
            p = (1 - er) ** j * (er if j < n else 1.0)
            sd = math.sqrt(p * (1 - p) / draws)
            assert abs(float(np.mean(observed == j)) - p) < 4 * sd, (j, float(np.mean(observed == j)), p)
    assert not np.array_equal(down, up)  # two independent directions
    again = model.draw(round_idx=5, clients=np.arange(draws)[::-1], t=0.0)  # order-free, derived per client
    assert [d.down_run for d in again[::-1] if d is not None] == [d.down_run for d in got if d is not None]


def test_error_rate_is_drawn_per_client_and_round_from_its_range() -> None:
    model = LinkModel(LinkConfig(error_rate=ResourceConfig(source="uniform", low=0.1, high=0.2)), seed=0)
    rates = np.array([d.error_rate for d in model.draw(0, np.arange(500), 0.0) if d is not None])
    assert rates.min() >= 0.1 and rates.max() <= 0.2 and rates.std() > 0.02
    assert LinkModel(LinkConfig(), seed=0).draw(0, np.arange(3), 0.0) == [None, None, None]
    with pytest.raises(ValueError, match="error_rate"):
        LinkConfig(error_rate=ResourceConfig(source="constant", low=1.0))


def test_delivered_and_attempted_levels() -> None:
    assert [delivered(r, 4) for r in (-1, 0, 1, 3, 4, 9)] == [4, 0, 1, 3, 4, 4]
    assert [attempted(r, 4) for r in (-1, 0, 1, 3, 4, 9)] == [4, 1, 2, 4, 4, 4]


def test_column_levels_are_nested_first_k_prefixes_ending_at_the_assignment() -> None:
    _, family, _ = _clock_and_family(ResourceConfig(source="constant", low=0.1))
    own = _uniform(family, 0.75)
    assignment = family.assignment(first_k(own))
    levels = column_levels(family, assignment, 0.125)
    assert [lv.units for lv in levels] == [_uniform(family, j / 8) for j in range(1, 7)]
    assert levels[-1] is assignment
    for j, lv in enumerate(levels[:-1], start=1):
        want = family.slices(first_k(_uniform(family, j / 8)))
        assert lv.slices.keys() == want.keys()
        for name, tslice in want.items():
            for a, b in zip(lv.slices[name].index, tslice.index, strict=True):
                assert (a is None and b is None) or np.array_equal(a, b), name
    assert level_ratio(family, levels, 0) == 0.0 and level_ratio(family, levels, 6) == 0.75
    full_levels = column_levels(family, Assignment(), 0.25)
    assert len(full_levels) == 4 and full_levels[-1] == Assignment()


def test_restrict_update_keeps_exactly_the_positions_of_the_level() -> None:
    """A 3x4 update with rows {0, 2, 5} (label rows) and columns 0..3, cut to a level covering rows 0..2 and
    columns 0..1: rows {0, 2} and columns {0, 1} remain, at their global positions."""
    value = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    update = ClientUpdate(0, 1.0, {"w": value}, {"w": TensorSlice((np.array([0, 2, 5]), np.arange(4)))}, 1, 0.0, 1)
    level = Assignment(slices={"w": TensorSlice((np.arange(3), np.arange(2)))})
    cut = restrict_update(update, level, {"w": torch.Size([6, 4])})
    assert torch.equal(cut.values["w"], torch.tensor([[0.0, 1.0], [4.0, 5.0]]))  # update rows 0 and 1
    assert [list(i) for i in cut.slices["w"].index if i is not None] == [[0, 2], [0, 1]]


def test_clock_counts_the_bytes_that_were_sent_and_fails_clients_that_cannot_pad() -> None:
    """The bytes moved are the delivered levels plus the one lost; without padding, nothing delivered = link_down."""
    clock, family, _setup = _clock_and_family(ResourceConfig(source="constant", low=0.5), padding=False)
    views = clock.check_in(0, np.arange(40), [20] * 40)
    assignments = {v.client_id: Assignment() for v in views}
    plan = clock.plan(0, views, assignments)
    levels = column_levels(family, Assignment(), 0.125)
    cost = clock.oracle.costs(levels)
    for i in range(40):
        draw = plan.link(i)
        assert draw is not None
        assert plan.bytes_down[i] == cost.bytes_down[attempted(draw.down_run, len(levels)) - 1]
        assert plan.bytes_up[i] == cost.bytes_up[attempted(draw.up_run, len(levels)) - 1]
        assert (plan.failure[i] == "link_down") == (draw.down_run == 0)
    assert "link_down" in plan.failure and None in plan.failure


def test_config_refuses_error_rates_outside_0_1_naming_file_and_line(tmp_path: Any) -> None:
    from rayfl.core.errors import ConfigError
    from rayfl.experiment.loader import load_config

    path = tmp_path / "bad.yaml"
    path.write_text("system:\n  links:\n    error_rate:\n      source: uniform\n      low: 0.1\n      high: 1.5\n")
    with pytest.raises(ConfigError, match=r"bad.yaml:2: system.links: error_rate values must lie in \[0, 1\)"):
        load_config(path)
    path.write_text("system:\n  links:\n    error_rate:\n      source: empirical\n")
    with pytest.raises(ConfigError, match="not supported"):
        load_config(path)
    path.write_text("system:\n  links:\n    error_rate:\n      source: trace\n")
    with pytest.raises(ConfigError, match=r"system\.links\.error_rate\.file: a trace source needs exactly one of file"):
        load_config(path)


TRACE = "traces/link-error-rounds.csv"  # er 0 in rounds 0-3, 0.1 in 4-7, 0.2 in 8-11, 0.15 in 12-15, then again


def test_error_rate_replayed_from_a_trace_by_round() -> None:
    """``trace_time: round`` reads the trace at the round index: with offset zero every client gets the trace's row,
    and a perfect-link row (er 0) delivers everything; with random offsets clients differ within a round."""
    er = ResourceConfig(source="trace", file=TRACE, offset="zero")
    model = LinkModel(LinkConfig(error_rate=er, trace_time="round"), seed=0)
    expected = {0: 0.0, 3: 0.0, 4: 0.1, 7: 0.1, 8: 0.2, 12: 0.15, 16: 0.0, 21: 0.1}
    for round_idx, rate in expected.items():
        draws = model.draw(round_idx, np.arange(6), t=1e6)  # the simulated time is not read
        assert [d.error_rate for d in draws if d is not None] == [rate] * 6, round_idx
        if rate == 0.0:
            assert all(d is not None and d.down_run == d.up_run == -1 for d in draws)
    spread = LinkModel(LinkConfig(error_rate=dataclasses.replace(er, offset="random"), trace_time="round"), seed=0)
    assert len({d.error_rate for d in spread.draw(0, np.arange(40), 0.0) if d is not None}) > 1
    by_time = LinkModel(LinkConfig(error_rate=er), seed=0)  # simulated seconds: t = 9 s is the row from 8
    assert {d.error_rate for d in by_time.draw(0, np.arange(3), 9.0) if d is not None} == {0.2}


def test_an_error_rate_trace_outside_0_1_is_refused_naming_the_row(tmp_path) -> None:  # type: ignore[no-untyped-def]
    bad = tmp_path / "bad.csv"
    bad.write_text("# rayfl-trace v1\n# kind: link_error\n# unit: 1\nt_s,value\n0,0.1\n1,1.5\n")
    with pytest.raises(ValueError, match=r"bad.csv row 2 has error rate 1.5, outside \[0, 1\)"):
        LinkModel(LinkConfig(error_rate=ResourceConfig(source="trace", file=str(bad))), seed=0)
    memory = tmp_path / "memory.csv"
    memory.write_text("# rayfl-trace v1\n# kind: memory\n# unit: MiB\nt_s,value\n0,100\n")
    with pytest.raises(ValueError, match="memory trace"):
        LinkModel(LinkConfig(error_rate=ResourceConfig(source="trace", file=str(memory))), seed=0)
