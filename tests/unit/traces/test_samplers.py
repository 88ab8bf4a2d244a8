"""Samplers of measured bandwidth distributions, on excerpts of the real files."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rayfl.traces.format import TraceError
from rayfl.traces.samplers import FLASH_KBPS_TO_MBPS, FlashSpeedSampler, MobileBandwidthSampler, technology_key
from tests.unit.traces.helpers import SHIPPED, head


@pytest.fixture
def mobile_dir(real_traces: Path, tmp_path: Path) -> Path:
    """The header and first 200 tests of the 4G, 5G and Wi-Fi 6 files."""
    for name in ("4G.csv", "5G.csv", "wifi6.csv"):
        (tmp_path / name).write_text(head(real_traces / "mobilebandwidth-sigcomm22" / name, 201))
    return tmp_path


def test_draws_only_measured_values_and_is_deterministic(mobile_dir: Path) -> None:
    sampler = MobileBandwidthSampler(mobile_dir)
    assert len(sampler) == 600
    draws = sampler.sample(np.random.default_rng(7), 1000)
    assert np.isin(draws, sampler.values_mbps).all()
    np.testing.assert_array_equal(draws, sampler.sample(np.random.default_rng(7), 1000))
    assert not np.array_equal(draws, sampler.sample(np.random.default_rng(8), 1000))


def test_filter_by_technology(mobile_dir: Path) -> None:
    four_g = MobileBandwidthSampler(mobile_dir, technology="4G")
    assert len(four_g) == 200 and set(four_g.technologies) == {"4G"}
    assert four_g.values_mbps[0] == 138.3  # the first row of 4G.csv
    wifi = MobileBandwidthSampler(mobile_dir, technology="Wi-Fi 6")
    assert len(wifi) == 200 and set(wifi.technologies) == {"WiFi6"}
    assert np.isin(wifi.sample(np.random.default_rng(0), 50), wifi.values_mbps).all()
    assert not np.isin(wifi.values_mbps, four_g.values_mbps).all()
    assert len(MobileBandwidthSampler(mobile_dir, technology=["4g", "wifi"])) == 400
    with pytest.raises(TraceError, match=r"no rows of technology 'WiFi5' \(present: 4G, 5G, WiFi6\)"):
        MobileBandwidthSampler(mobile_dir, technology="WiFi5")
    assert technology_key("Wi-Fi 6") == technology_key("WIFI6") == "wifi6"


def test_single_file_and_bad_number(mobile_dir: Path) -> None:
    assert len(MobileBandwidthSampler(mobile_dir / "5G.csv")) == 200
    lines = (mobile_dir / "4G.csv").read_text().splitlines(keepends=True)
    bad = mobile_dir / "bad.csv"
    bad.write_text("".join([*lines[:3], lines[1].replace(",138.3,", ",fast,")]))
    with pytest.raises(TraceError, match=r"bad.csv:4: bad number for bandwidth_Mbps: 'fast'"):
        MobileBandwidthSampler(bad)


def test_flash_speeds() -> None:
    sampler = FlashSpeedSampler(SHIPPED / "flash-device-network" / "speed_distri.json")
    assert len(sampler) == 19
    first = sampler.devices["e6899215-86a1-4b87-b938-49bf4cd299be"]
    assert first[0] == pytest.approx(7491.4 * 1024 * 8 / 1e6) and FLASH_KBPS_TO_MBPS == 0.008192
    down = sampler.sample(np.random.default_rng(3), 5000)
    assert (down >= 0).all()
    np.testing.assert_array_equal(down, sampler.sample(np.random.default_rng(3), 5000))
    up = sampler.sample(np.random.default_rng(3), 5000, direction="up")
    assert np.median(up) < np.median(down)  # SOURCE.md: median up_u 3286 KB/s < down_u 4318 KB/s
