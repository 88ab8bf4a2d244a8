"""Resource sources: replay lookups, exact transfer integration, window minima, range and level sources."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rayfl.config.sections import ResourceConfig
from rayfl.system.resources import (
    Constant,
    Empirical,
    Levels,
    Log,
    RangeSource,
    TraceReplay,
    Unlimited,
    build_source,
)

# a hand-made step log: 10 bit/s on [0, 2), 0 on [2, 3), 30 on [3, 4); period 4 (the last sample holds for the
# median sampling step, 1 s)
STEP = Log(np.array([0.0, 1.0, 2.0, 3.0]), np.array([10.0, 10.0, 0.0, 30.0]), "step")


def replay(*logs: Log, offset: str = "zero", assign: str = "round_robin") -> TraceReplay:
    return TraceReplay(list(logs), assign, offset, seed=0, purpose="test")


def test_lookup_at_between_and_past_the_end_loops() -> None:
    log = Log(np.array([0.0, 1.0, 2.0, 4.0]), np.array([5.0, 6.0, 7.0, 8.0]))
    assert log.period == 5.0  # 4 + median step 1
    src = replay(log)
    c = np.array([0])
    assert src.at(c, 0.0, 0)[0] == 5.0  # at a sample
    assert src.at(c, 1.5, 0)[0] == 6.0  # between samples: the last one at or before
    assert src.at(c, 3.999, 0)[0] == 7.0
    assert src.at(c, 4.0, 0)[0] == 8.0
    assert src.at(c, 4.9, 0)[0] == 8.0  # the last sample holds for one step
    assert src.at(c, 5.0, 0)[0] == 5.0  # past the end: loops
    assert src.at(c, 17.5, 0)[0] == 7.0  # 17.5 mod 5 = 2.5


def test_offsets_are_per_client_deterministic_and_shift_the_lookup() -> None:
    log = Log(np.arange(10.0), np.arange(10.0) * 100)
    src = replay(log, offset="random")
    clients = np.arange(6)
    off = src.offset_of(clients, src.log_of(clients))
    assert np.all((off >= 0) & (off < log.period)) and len(set(off.round(9))) == 6
    np.testing.assert_array_equal(off, replay(log, offset="random").offset_of(clients, src.log_of(clients)))
    t = 3.25
    expected = np.floor(np.mod(t + off, log.period)) * 100
    np.testing.assert_array_equal(src.at(clients, t, 0), expected)


def test_logs_are_assigned_round_robin_or_at_random() -> None:
    a, b = Log(np.array([0.0]), np.array([1.0])), Log(np.array([0.0]), np.array([2.0]))
    clients = np.arange(5)
    np.testing.assert_array_equal(replay(a, b).at(clients, 0.0, 0), [1, 2, 1, 2, 1])
    rnd = replay(a, b, assign="random").log_of(np.arange(200))
    assert set(rnd) == {0, 1} and 60 < rnd.sum() < 140


def test_transfer_time_integrates_a_step_trace_exactly() -> None:
    assert STEP.period == 4.0
    src = replay(STEP)
    c = np.array([0, 0, 0, 0, 0])
    start = np.array([0.0, 0.0, 1.5, 0.0, 5.0])
    bits = np.array([15.0, 20.0, 5.0, 50.0, 90.0])
    got = src.transfer_time(c, start, bits, 0)
    # 15 bits at 10 b/s from 0: 1.5 s | 20 bits: exactly the first segment, 2 s
    # from 1.5: 5 bits in 0.5 s | 50 bits: 20 by t=2, nothing until 3, 30 by t=4: 4 s
    np.testing.assert_allclose(got[:4], [1.5, 2.0, 0.5, 4.0])
    # from t=5: [5,6) 10 bits, [6,7) 0, [7,8) 30 -> 40 by t=8; [8,10) 20 -> 60 by 10; [10,11) 0; [11,12) 30 -> 90 at 12
    np.testing.assert_allclose(got[4], 7.0)
    assert src.transfer_time(np.array([0]), np.array([0.0]), np.array([0.0]), 0)[0] == 0.0


def test_transfer_time_is_infinite_on_a_dead_link_and_bits_over_rate_for_constants() -> None:
    dead = replay(Log(np.array([0.0, 1.0]), np.array([0.0, 0.0])))
    assert dead.transfer_time(np.array([0]), np.array([0.0]), np.array([8.0]), 0)[0] == np.inf
    const = Constant(4.0)
    np.testing.assert_allclose(const.transfer_time(np.array([1, 2]), np.zeros(2), np.array([8.0, 2.0]), 0), [2, 0.5])
    assert Unlimited().transfer_time(np.array([1]), np.zeros(1), np.array([8.0]), 0)[0] == 0.0


def test_window_min_sees_dips_including_wrapping_windows() -> None:
    log = Log(np.array([0.0, 1.0, 2.0, 3.0]), np.array([9.0, 2.0, 8.0, 7.0]))  # period 4
    src = replay(log)
    c = np.zeros(4, dtype=np.int64)
    start = np.array([2.0, 0.0, 3.5, 1.9])
    end = np.array([3.9, 0.9, 4.5, 10.0])
    np.testing.assert_array_equal(src.window_min(c, start, end, 0), [7.0, 9.0, 7.0, 2.0])
    # a window from 3.5 to 5.2 wraps into [0, 1.2]: it includes the dip at 1
    assert src.window_min(np.array([0]), np.array([3.5]), np.array([5.2]), 0)[0] == 2.0


def test_levels_give_exactly_one_fifth_per_level_every_round() -> None:
    src = Levels((1.0, 2.0, 3.0, 4.0, 5.0), seed=3, purpose="memory")
    for round_idx in range(20):
        cohort = np.random.default_rng(round_idx).choice(1000, size=50, replace=False)
        values = src.at(cohort, 0.0, round_idx)
        np.testing.assert_array_equal(np.bincount(values.astype(int))[1:], [10] * 5)
        # the value of a client does not depend on the order the cohort is given in
        shuffled = cohort[::-1]
        np.testing.assert_array_equal(src.at(shuffled, 0.0, round_idx), values[::-1])


def test_levels_of_different_resources_put_a_client_in_the_same_group() -> None:
    """HeteroFL's level is the device's: its memory and its bandwidth both come from level i."""
    memory = Levels((50.0, 40.0, 30.0, 20.0, 10.0), seed=3, purpose="memory")
    bandwidth = Levels((5.0, 4.0, 3.0, 2.0, 1.0), seed=3, purpose="bandwidth_down")
    for round_idx in range(10):
        cohort = np.random.default_rng(round_idx).choice(100, size=10, replace=False)
        np.testing.assert_array_equal(memory.at(cohort, 0.0, round_idx), 10.0 * bandwidth.at(cohort, 0.0, round_idx))


def test_levels_by_client_id_are_fixed_whatever_the_cohort() -> None:
    """``id_bounds``: FedHeN's split, ids 0-49 level 0 and 50-99 level 1, in every round and cohort order."""
    src = Levels((10.0, 20.0), seed=3, purpose="memory", id_bounds=(50,))
    for round_idx in range(5):
        cohort = np.random.default_rng(round_idx).choice(100, size=10, replace=False)
        np.testing.assert_array_equal(src.at(cohort, 0.0, round_idx), np.where(cohort < 50, 10.0, 20.0))
    three = Levels((1.0, 2.0, 3.0), seed=0, purpose="memory", id_bounds=(2, 5))
    np.testing.assert_array_equal(three.at(np.array([6, 0, 1, 2, 4, 5]), 0.0, 0), [3.0, 1.0, 1.0, 2.0, 2.0, 3.0])


def test_empirical_range_keeps_only_values_within_low_and_high(tmp_path: Path) -> None:
    """A ``high`` restricts an empirical distribution to the tests within ``[low, high]``; ``scale`` applies after."""
    table = tmp_path / "wifi.csv"
    rates = [5.0, 30.0, 55.0, 100.0, 250.0, 80.0]
    table.write_text("network_type,bandwidth_Mbps\n" + "".join(f"WIFI,{r}\n" for r in rates), encoding="utf-8")

    def samples_mbps(**kwargs: float) -> list[float]:
        cfg = ResourceConfig(source="empirical", file=str(table), format="mobilebandwidth", **kwargs)
        source = build_source(cfg, "bandwidth", 0, "down")
        assert isinstance(source, Empirical)
        return sorted(float(v) for v in source.samples / 1e6)

    assert samples_mbps() == sorted(rates)
    assert samples_mbps(low=30.0, high=100.0) == [30.0, 55.0, 80.0, 100.0]
    assert samples_mbps(low=30.0, high=100.0, scale=0.5) == [15.0, 27.5, 40.0, 50.0]
    cfg = ResourceConfig(source="empirical", file=str(table), format="mobilebandwidth", low=30.0, high=100.0)
    drawn = build_source(cfg, "bandwidth", 0, "down").at(np.arange(200), 0.0, 1) / 1e6
    assert set(drawn.tolist()) <= {30.0, 55.0, 80.0, 100.0}
    with pytest.raises(ValueError, match="no bandwidth value"):
        samples_mbps(low=300.0, high=400.0)


def test_range_sources_are_pure_functions_of_client_and_round() -> None:
    uni = RangeSource(1.0, 3.0, binary=False, per_round=True, seed=1, purpose="m")
    a = uni.at(np.array([4, 7, 9]), 0.0, 2)
    np.testing.assert_array_equal(a, uni.at(np.array([4, 7, 9]), 123.0, 2))
    np.testing.assert_array_equal(a[[1]], uni.at(np.array([7]), 0.0, 2))  # same client, alone
    assert np.all((a >= 1) & (a <= 3)) and not np.array_equal(a, uni.at(np.array([4, 7, 9]), 0.0, 3))
    fixed = RangeSource(1.0, 3.0, binary=False, per_round=False, seed=1, purpose="m")
    np.testing.assert_array_equal(fixed.at(np.array([4]), 0.0, 2), fixed.at(np.array([4]), 0.0, 9))
    binary = RangeSource(1.0, 3.0, binary=True, per_round=True, seed=1, purpose="m").at(np.arange(100), 0.0, 0)
    assert set(binary) == {1.0, 3.0}


def test_log_validation() -> None:
    with pytest.raises(ValueError, match="at least one"):
        Log(np.array([]), np.array([]))


def test_band_levels_lie_strictly_between_their_level_and_the_next() -> None:
    """``level_budget: band`` (issue 33): a client of level i >= 1 gets a value in [values[i], values[i - 1]); the
    top level keeps values[0]; the levels themselves (1/5 each) are those of the exact source."""
    values = (50.0, 40.0, 30.0, 20.0, 10.0)
    exact = Levels(values, seed=3, purpose="memory")
    band = Levels(values, seed=3, purpose="memory", band=True)
    for round_idx in range(20):
        cohort = np.random.default_rng(round_idx).choice(1000, size=50, replace=False)
        low, got = exact.at(cohort, 0.0, round_idx), band.at(cohort, 0.0, round_idx)
        top = low == 50.0
        assert (got[top] == 50.0).all()
        assert (got[~top] > low[~top]).all() and (got[~top] < low[~top] + 10.0).all()
    cohort = np.arange(1000)
    spread = band.at(cohort, 0.0, 0) - exact.at(cohort, 0.0, 0)
    assert 4.0 < spread[spread > 0].mean() < 6.0  # uniform in each band of width 10


def test_band_places_are_drawn_per_round_or_fixed_per_client_and_per_resource() -> None:
    values = (4.0, 2.0, 1.0)
    cohort = np.arange(30)
    fixed = Levels(values, seed=1, purpose="memory", band=True, per_round=False)
    moving = Levels(values, seed=1, purpose="memory", band=True)
    other = Levels(values, seed=1, purpose="bandwidth_down", band=True)

    def place(src: Levels, r: int) -> np.ndarray:  # the client's place within its band, in [0, 1)
        lo = Levels(values, seed=1, purpose="memory").at(cohort, 0.0, r)
        hi = np.select([lo == 1.0, lo == 2.0], [2.0, 4.0], np.nan)  # the top level has no band
        out: np.ndarray = (src.at(cohort, 0.0, r) - lo) / (hi - lo)
        return out

    both = ~np.isnan(place(fixed, 0)) & ~np.isnan(place(fixed, 1))
    assert both.any()
    np.testing.assert_allclose(place(fixed, 0)[both], place(fixed, 1)[both])  # fixed per client
    assert not np.allclose(place(moving, 0)[both], place(moving, 1)[both])  # redrawn every round
    m, b = place(moving, 0), place(other, 0)
    assert not np.allclose(m[~np.isnan(m)], b[~np.isnan(b)])  # memory and bandwidth independent


def test_band_needs_strictly_decreasing_values() -> None:
    with pytest.raises(ValueError, match="level_budget 'band' needs values strictly decreasing"):
        ResourceConfig(source="levels", values=(1.0, 2.0), level_budget="band")
    ResourceConfig(source="levels", values=(1.0, 2.0))  # exact levels take any order
