"""Simulated time reads in s, min or h with enough digits to compare runs (0.006 h and 0.012 h differ)."""

from __future__ import annotations

import math

from rayfl.core.units import format_sim_time, time_unit


def test_adaptive_units_keep_differences_visible() -> None:
    assert format_sim_time(0.0) == "0.000 s"
    assert format_sim_time(0.006 * 3600) == "21.60 s"
    assert format_sim_time(0.012 * 3600) == "43.20 s"
    assert format_sim_time(307.5) == "5.125 min"
    assert format_sim_time(3600 * 123.44) == "123.4 h"
    assert format_sim_time(math.nan) == "—" and format_sim_time(None) == "—"
    assert time_unit(59.9) == ("s", 1.0) and time_unit(60.0) == ("min", 60.0) and time_unit(7200) == ("h", 3600.0)
