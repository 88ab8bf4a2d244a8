"""A raw published log given where a rayfl trace is expected names the way out: the resource's ``format`` (mahimahi
is recognised by its lines) or ``rayfl traces import``."""

from __future__ import annotations

from pathlib import Path

import pytest

from rayfl.core.errors import ConfigError
from rayfl.experiment.loader import load_config
from rayfl.traces.format import TraceError, read_trace


def test_a_mahimahi_log_read_as_a_rayfl_trace_names_the_format_and_the_import(tmp_path: Path) -> None:
    log = tmp_path / "cell.down"
    log.write_text("0\n0\n12\n25\n")
    with pytest.raises(TraceError, match="look like a mahimahi log") as caught:
        read_trace(log)
    assert "format: mahimahi" in str(caught.value) and "rayfl traces import FORMAT SRC OUT" in str(caught.value)
    with pytest.raises(ConfigError, match="rayfl traces import"):
        load_config(None, [f"system.bandwidth_down={{source: trace, file: {log}}}"])
