"""Resource traces: rayfl's file format, importers of published network logs, samplers, generators, a recorder.

A trace is one resource of one device over time (free memory, bandwidth down or up, compute speed, availability),
stored in the format of ``rayfl.traces.format`` and replayed against the simulated clock. ``traces/README.md`` in the
repository describes the format and the trace files rayfl ships.
"""

from __future__ import annotations

from rayfl.traces.format import SI_FACTORS, UNITS, Trace, TraceError, read_trace, write_trace
from rayfl.traces.importers import IMPORTERS, import_mahimahi, import_pensieve, import_ucc, ucc_members
from rayfl.traces.recorder import record
from rayfl.traces.samplers import FlashSpeedSampler, MobileBandwidthSampler
from rayfl.traces.synthetic import bandwidth_trace, memory_trace

__all__ = [
    "IMPORTERS",
    "SI_FACTORS",
    "UNITS",
    "FlashSpeedSampler",
    "MobileBandwidthSampler",
    "Trace",
    "TraceError",
    "bandwidth_trace",
    "import_mahimahi",
    "import_pensieve",
    "import_ucc",
    "memory_trace",
    "read_trace",
    "record",
    "ucc_members",
    "write_trace",
]
