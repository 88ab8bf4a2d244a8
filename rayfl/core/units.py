"""Simulated time as people read it: seconds, minutes or hours, whichever keeps the number readable, with enough
digits that two runs' times compare (0.006 h and 0.012 h were both "0.01 h" before; now "21.6 s" and "43.2 s").

Used by the progress line, ``rayfl search``, the report's tables and plots; imports nothing heavy.
"""

from __future__ import annotations

import math

__all__ = ["format_sim_time", "time_unit"]

_UNITS = (("h", 3600.0), ("min", 60.0), ("s", 1.0))


def time_unit(seconds: float) -> tuple[str, float]:
    """The unit (name, seconds in one) that shows ``seconds`` as a number from 1 up (s below a minute, min below an
    hour, h from an hour); a plot of several runs picks it from the largest time."""
    for name, size in _UNITS:
        if abs(seconds) >= size:
            return name, size
    return "s", 1.0


def format_sim_time(seconds: float | None) -> str:
    """``seconds`` in its unit with four significant digits at most and three decimals at most: ``0.006 s``,
    ``21.74 s``, ``5.125 min``, ``123.4 h``; ``—`` when unknown (None or NaN)."""
    if seconds is None or math.isnan(seconds):
        return "—"
    if math.isinf(seconds):
        return "inf s"
    name, size = time_unit(seconds)
    value = seconds / size
    magnitude = abs(value)
    decimals = 1 if magnitude >= 100 else 2 if magnitude >= 10 else 3
    if magnitude >= 1000:
        decimals = 0
    return f"{value:.{decimals}f} {name}"
