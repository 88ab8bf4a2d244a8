"""Fixtures for the trace tests: the real third-party logs rayfl does not ship (``ucc-5g-mmsys20``,
``mobilebandwidth-sigcomm22``), in ``../shared/traces-real`` beside the repository. The shipped sets are read from
the package (``tests.unit.traces.helpers.SHIPPED``) and need no fixture."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.unit.traces.helpers import REAL_TRACES


@pytest.fixture(scope="session")
def real_traces() -> Path:
    """The shared folder of real logs; CI clones the repository with ``shared/`` beside it."""
    if not (REAL_TRACES / "README.md").is_file():
        pytest.fail(f"the real traces are missing: expected {REAL_TRACES} (shared/ beside the repository)")
    return REAL_TRACES
