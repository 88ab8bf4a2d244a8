"""Trained models out of a run directory: ``rayfl.load_model(RUN_DIR)`` (the files:
``rayfl/engine/persist/export.py``)."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from rayfl.engine.checkpoint_export import export_checkpoint
from rayfl.engine.persist.export import ExportedModel, exported_models, load_exported

__all__ = ["ExportedModel", "export_checkpoint", "exported_models", "load_model"]


def load_model(
    run_dir: str | Path, model: int | str = 0, *, best: bool = False, device: str | torch.device = "cpu"
) -> nn.Module:
    """The trained global model ``model`` (its id, or its name as ``evals.csv`` names it: ``main``, ``simple``,
    ``tier1`` ...) of a finished run, as an ``nn.Module`` in eval mode holding the weights its last evaluation
    scored; with ``best`` the best evaluated state's (runs with ``export.best: true``). The module is built from the
    run's own model config, a custom factory imported from the directory the run was started in. Its inputs are what
    ``rayfl.models.to_input`` makes of stored samples with the export's ``input_spec`` (``exported_models``)."""
    return load_exported(run_dir, model, best=best, device=device)[0]
