"""Sweeps with Ray Tune: one trial is one simulation (or one search-only run).

``load_sweep`` reads and checks a sweep file (``spec.py``), ``run_sweep`` runs it (``sweep.py``); ``trial_bundles``
(``resources.py``) is the placement-group layout a trial reserves and the Ray backend pins its actors to. Importing
this package imports neither Ray nor torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from rayfl.tune.resources import TrialResources, trial_backend, trial_bundles
from rayfl.tune.spec import Sweep, SweepConfig, load_sweep

if TYPE_CHECKING:
    from rayfl.tune.sweep import SweepResult

__all__ = [
    "Sweep",
    "SweepConfig",
    "SweepResult",
    "TrialResources",
    "load_sweep",
    "run_sweep",
    "trial_backend",
    "trial_bundles",
]


def run_sweep(
    sweep: Sweep, *, overrides: Sequence[str] = (), verbose: int = 0, resume: Path | str | None = None
) -> SweepResult:
    """Run a checked sweep, or resume it in its folder, a path or a storage URI (``rayfl.tune.sweep.run_sweep``,
    imported on call: it loads Ray and pandas)."""
    from rayfl.tune.sweep import run_sweep as run

    return run(sweep, overrides=overrides, verbose=verbose, resume=resume)
