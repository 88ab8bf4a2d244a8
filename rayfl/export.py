"""Trained models out of a run directory: ``rayfl.load_model(RUN_DIR)`` (the files: ``rayfl/engine/persist/export.py``;
running them on raw input: ``rayfl/models/predictor.py``)."""

from __future__ import annotations

import os

import torch

from rayfl.engine.checkpoint_export import export_checkpoint
from rayfl.engine.persist.export import ExportedModel, export_dir_arg, exported_models, load_exported
from rayfl.models.encoding import OOV_CHAR, InputEncoding
from rayfl.models.predictor import Predictor

__all__ = [
    "OOV_CHAR",
    "ExportedModel",
    "InputEncoding",
    "Predictor",
    "export_checkpoint",
    "exported_models",
    "load_model",
]


def load_model(
    run_dir: str | os.PathLike[str],
    model: int | str = 0,
    *,
    best: bool = False,
    device: str | torch.device = "cpu",
) -> Predictor:
    """The trained global model of a finished run, ready to run on new input.

    ``run_dir``: the run directory (``runs/NAME``) or the folder ``rayfl export`` wrote. ``model``: the global model's
    id, or its name as ``evals.csv`` names it (``main``, ``simple``, ``tier1`` ...). ``best``: the best evaluated
    state's model (runs with ``export.best: true``) instead of the last one. ``device``: where its weights go
    (``"cpu"``, ``"cuda"``, ``"cuda:1"``, a ``torch.device``).

    Returns a ``Predictor``, an ``nn.Module`` in eval mode that calls the trained module (``.module``: built from the
    run's own model config, a custom factory imported from the directory the run was started in, holding the weights
    the chosen evaluation scored), so ``model(to_input(x, spec))`` works as it did; and, on raw input, ``predict(x)``
    (class ids), ``predict_proba(x)`` (probabilities) and, for character models, ``predict_next(text, n)`` (the next
    ``n`` characters). Its ``spec`` and ``encoding`` are the export's input spec and vocabulary and names
    (``exported_models``). Arguments of the wrong kind are refused with one ``TypeError`` or ``ValueError`` naming
    them, a missing directory with a ``FileNotFoundError``, a model the run did not export with a ``KeyError`` listing
    those it did."""
    path = export_dir_arg(run_dir, "load_model")
    if isinstance(model, bool) or not isinstance(model, (int, str)):
        raise TypeError(
            "load_model(run_dir, model): model must be the global model's id (int) or name (str, as evals.csv names "
            f"it), got {type(model).__name__}"
        )
    if not isinstance(best, bool):
        raise TypeError(f"load_model(run_dir, best=...): best must be True or False, got {type(best).__name__}")
    module, info = load_exported(path, model, best=best, device=_device(device))
    return Predictor(module, info.input_spec, info.encoding).eval()


def _device(device: object) -> torch.device:
    """``device`` as a ``torch.device`` this process can put weights on, or one line saying why not."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(f"load_model(device=...): device must be a str or torch.device, got {type(device).__name__}")
    try:
        found = torch.device(device)
    except RuntimeError:
        raise ValueError(
            f"load_model(device=...): {device!r} is not a torch device (e.g. 'cpu', 'cuda', 'cuda:1')"
        ) from None
    if found.type == "cuda" and (found.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"load_model(device=...): {device!r} is not available here "
                         f"({torch.cuda.device_count()} CUDA device(s)); load on 'cpu'")  # fmt: skip
    return found
