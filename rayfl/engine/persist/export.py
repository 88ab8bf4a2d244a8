"""The trained global models a written run leaves behind, as files other tools read: ``RUN_DIR/models/``.

A run's global models live in the driver as one flat parameter dict (``ServerState.params``, further models under
``m{k}/`` names, ``fl/common/multimodel.py``). At the run's end each global model is written as one safetensors file
holding exactly the tensors its evaluation used (``Algorithm.eval_params``; for a model evaluated as a sub-model,
``eval_units``, the sub-model's own tensors), so that the file loads into the module the evaluation scored:

* ``model{k}-{name}.safetensors``: global model ``k`` as it ended (``export.final``, the default), ``name`` being the
  algorithm's name for it (``main``, ``simple``, ``tier1`` ...);
* ``best-model{k}-{name}.safetensors``: every global model of the evaluated state whose main test accuracy was the
  highest (``export.best``);
* ``model{k}-{name}-hf/``: for ``model.name: custom``, the module's ``save_pretrained`` directory when the model is
  (or holds) a Hugging Face ``PreTrainedModel``, for ``from_pretrained``.

Each file's metadata (``__metadata__["rayfl"]``, JSON) says what it is: model id and name, the round and test accuracy
of the evaluation it was scored in, the model's config (a tier's or family member's own architecture), the sub-model's
units, the input spec the model was built for and converts inputs with, what turns raw input into samples
(``input_encoding``: a character model's vocabulary, a feature vector's column names, the class names, as the data set's
loader recorded them; ``rayfl/models/encoding.py``) and the SHA-256 digest of the run's ``config.yaml``.
``load_model`` builds the module from that metadata alone, a custom factory imported from the directory the run was
started in, as the run imported it, and wraps it in a ``Predictor`` (``rayfl/models/predictor.py``) that runs on raw
input. A file written before ``input_encoding`` was recorded loads as before; its predictor then refuses text.

The export works from the state the driver holds, not from checkpoints, so it costs a run nothing but the writes. A
run that ended without it (an error, ``kill -9``) leaves its checkpoints: ``rayfl export RUN_DIR [OUT]``
(``engine/checkpoint_export.py``) writes the same files from the newest one taken after an evaluation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from rayfl.config.model import CustomModelConfig, ModelConfig, as_model_config
from rayfl.core.messages import Params, ServerState
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api import capabilities
from rayfl.fl.api.algorithm import Algorithm
from rayfl.fl.common.multimodel import model_params
from rayfl.models import InputSpec
from rayfl.models.encoding import InputEncoding

__all__ = [
    "EXPORT_DIR",
    "ExportedModel",
    "ModelExporter",
    "config_digest",
    "export_dir_arg",
    "exported_models",
    "load_exported",
    "write_models",
]

log = logging.getLogger(__name__)

EXPORT_DIR = "models"
FORMAT = 1
_META_KEY = "rayfl"


@dataclass(frozen=True)
class ExportedModel:
    """One exported file and what its metadata says."""

    path: Path
    model_id: int
    name: str
    round_idx: int  # the evaluated round whose state this is (0-based)
    accuracy: float  # the model's test accuracy in that evaluation
    best: bool
    model_config: dict[str, Any]
    input_spec: InputSpec
    units: tuple[int, ...] | None  # the sub-model the evaluation scored (None: the full model)
    track_stats: bool  # batch norms with running statistics (HeteroFL's static BN evaluation model)
    config_digest: str
    search_from: str  # the run's working directory, where a custom factory was imported from
    encoding: InputEncoding | None = None  # vocabulary and names (None: written before rayfl recorded them)


def config_digest(run_dir: Path) -> str:
    """SHA-256 of the run's ``config.yaml`` as written (ties a model file to the run that made it)."""
    path = run_dir / "config.yaml"
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else ""


@dataclass
class ModelExporter:
    """Follows a run's evaluated states and writes its models at the end (``write``). Holding a state costs nothing:
    a server update makes new parameter dicts, it never changes an earlier state's tensors."""

    cfg: ExperimentConfig
    spec: InputSpec
    run_dir: Path
    encoding: InputEncoding  # what the data set's loader recorded (``InputEncoding.of(dataset.meta, spec)``)
    last: tuple[int, ServerState, Algorithm, tuple[float, ...]] | None = None
    best: tuple[int, ServerState, Algorithm, tuple[float, ...]] | None = None
    best_before: float = float("-inf")  # a resumed run's earlier best (its file stays unless beaten)

    def __post_init__(self) -> None:
        if self.cfg.export.best:
            earlier = [m.accuracy for m in exported_models(self.run_dir) if m.best and m.model_id == 0]
            self.best_before = max(earlier, default=float("-inf"))

    def observe(self, round_idx: int, state: ServerState, algorithm: Algorithm, accuracies: Sequence[float]) -> None:
        """An evaluated round: its state, the algorithm it ran and every global model's test accuracy in id order."""
        entry = (round_idx, state, algorithm, tuple(float(a) for a in accuracies))
        self.last = entry
        main = entry[3][0]
        if self.cfg.export.best and main == main and main > max(self.best_before, self._best_acc()):
            self.best = entry

    def _best_acc(self) -> float:
        return self.best[3][0] if self.best is not None else float("-inf")

    def write(self) -> list[Path]:
        """Write what ``export`` asks for; returns the files and directories written."""
        written: list[Path] = []
        run_dir, cfg, spec, encoding = self.run_dir, self.cfg, self.spec, self.encoding
        if self.cfg.export.final and self.last is not None:
            written += write_models(run_dir, cfg, spec, *self.last, best=False, encoding=encoding)
        if self.cfg.export.best and self.best is not None:
            for old in self.run_dir.glob(f"{EXPORT_DIR}/best-*"):  # a resumed run's earlier, beaten best
                _remove(old)
            written += write_models(run_dir, cfg, spec, *self.best, best=True, encoding=encoding)
        return written


def _remove(path: Path) -> None:
    if path.is_dir():
        for child in path.iterdir():
            _remove(child)
        path.rmdir()
    else:
        path.unlink()


def write_models(
    run_dir: Path,
    cfg: ExperimentConfig,
    spec: InputSpec,
    round_idx: int,
    state: ServerState,
    algorithm: Algorithm,
    accuracies: Sequence[float],
    *,
    best: bool = False,
    out: Path | None = None,
    encoding: InputEncoding,
) -> list[Path]:
    """Write every global model of ``state`` under ``run_dir/models/`` (or ``out``), with ``encoding`` (what turns
    raw input into the samples ``spec`` describes) in each file's metadata; returns what was written."""
    from safetensors.torch import save_file

    out = run_dir / EXPORT_DIR if out is None else out
    out.mkdir(parents=True, exist_ok=True)
    params = capabilities.eval_params(algorithm, state)
    names = algorithm.model_names(state)
    digest = config_digest(run_dir)
    written: list[Path] = []
    for model_id, name in enumerate(names):
        # model 0 as the engine's main evaluation scores it: the run's model (or its eval_units sub-model)
        config = as_model_config(state.models[model_id]) if model_id > 0 else cfg.model
        units = algorithm.eval_units(state) if model_id == 0 else None
        track = model_id == 0 and units is None and capabilities.eval_model(algorithm) is not None
        tensors = _model_tensors(config, spec, model_params(params, model_id), units)
        meta = {
            "format": FORMAT,
            "model_id": model_id,
            "name": name,
            "round_idx": round_idx,
            "accuracy": accuracies[model_id] if model_id < len(accuracies) else float("nan"),
            "best": best,
            "model_config": _config_dict(config),
            "input_spec": dataclasses.asdict(spec),
            "input_encoding": encoding.to_json(),
            "units": list(units) if units is not None else None,
            "track_stats": track,
            "config_digest": digest,
            "search_from": _import_dir(),
        }
        stem = f"{'best-' if best else ''}model{model_id}-{_safe(name)}"
        path = out / f"{stem}.safetensors"
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()}, str(path), {_META_KEY: _json(meta)})
        written.append(path)
        if isinstance(config, CustomModelConfig):
            hf_dir = _save_pretrained(config, spec, tensors, out / f"{stem}-hf")
            if hf_dir is not None:
                written.append(hf_dir)
    log.info("exported %d model file(s) to %s", len(written), out)
    return written


def _import_dir() -> str:
    """Where this process imports custom factories from (``rayfl.models.custom``)."""
    from rayfl.models import custom

    return custom._search_dir or os.getcwd()


def _json(meta: dict[str, Any]) -> str:
    return json.dumps(meta, allow_nan=True, sort_keys=True)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)


def _config_dict(config: ModelConfig) -> dict[str, Any]:
    from rayfl.experiment.loader import config_to_dict

    return config_to_dict(config)


def _model_tensors(
    config: ModelConfig, spec: InputSpec, params: Params, units: tuple[int, ...] | None
) -> dict[str, torch.Tensor]:
    """The tensors of the module the evaluation scored: the model's own, or the first-k sub-model's slices."""
    if units is None:
        return dict(params)
    from rayfl.models.elastic.family import gather
    from rayfl.models.elastic.spec import first_k
    from rayfl.models.families import build_family

    family = build_family(config, spec)
    slices = family.slices(first_k(units))
    with torch.device("meta"):
        names = list(family.build(units).state_dict())
    return {n: params[n] if n not in slices else gather(params[n], slices[n]) for n in names if n in params}


def _save_pretrained(config: CustomModelConfig, spec: InputSpec, tensors: Params, target: Path) -> Path | None:
    """``save_pretrained`` of the custom model (or of the outermost module inside it that has one), loaded with the
    exported weights; ``None`` when it has none."""
    module = _build(config, spec, None, False)
    save = next((getattr(m, "save_pretrained", None) for m in module.modules() if hasattr(m, "save_pretrained")), None)
    if not callable(save):
        return None
    _load(module, tensors, "the exported weights")
    save(str(target))
    return target


def exported_models(run_dir: str | os.PathLike[str]) -> list[ExportedModel]:
    """Every exported model of ``run_dir``, final ones first, each in model id order (none: an empty list).

    ``run_dir``: a run directory (its ``models/`` folder is read) or a folder ``rayfl export`` wrote. A path that is
    not a directory is refused with one ``FileNotFoundError``, an argument that is not a path with one ``TypeError``."""
    run_dir = export_dir_arg(run_dir, "exported_models")
    out = run_dir / EXPORT_DIR
    if not out.is_dir() and any(run_dir.glob("*.safetensors")):
        out = run_dir
    found = [_read_meta(p) for p in sorted(out.glob("*.safetensors"))] if out.is_dir() else []
    return sorted(found, key=lambda m: (m.best, m.model_id))


def export_dir_arg(run_dir: object, caller: str) -> Path:
    """``run_dir`` as a directory path, or one line saying what is wrong with it."""
    if not isinstance(run_dir, (str, os.PathLike)):
        raise TypeError(
            f"{caller}(run_dir): run_dir must be a path (str or Path) to a run directory or to the folder "
            f"`rayfl export` wrote, got {type(run_dir).__name__}"
        )
    path = Path(run_dir)
    if not path.is_dir():
        what = "is a file" if path.exists() else "does not exist"
        raise FileNotFoundError(
            f"{caller}(run_dir): {path} {what}; give a run directory (runs/NAME) or the folder `rayfl export` wrote"
        )
    return path


def _read_meta(path: Path) -> ExportedModel:
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        raw = (f.metadata() or {}).get(_META_KEY)
    if raw is None:
        raise ValueError(f"{path}: not a rayfl model export (no '{_META_KEY}' metadata)")
    meta = json.loads(raw)
    spec = meta["input_spec"]
    return ExportedModel(
        path=path,
        model_id=int(meta["model_id"]),
        name=str(meta["name"]),
        round_idx=int(meta["round_idx"]),
        accuracy=float(meta["accuracy"]),
        best=bool(meta["best"]),
        model_config=dict(meta["model_config"]),
        input_spec=InputSpec(
            input_kind=spec["input_kind"],
            num_classes=int(spec["num_classes"]),
            sample_shape=tuple(spec["sample_shape"]),
            mean=tuple(spec["mean"]),
            std=tuple(spec["std"]),
        ),
        units=tuple(meta["units"]) if meta["units"] is not None else None,
        track_stats=bool(meta["track_stats"]),
        config_digest=str(meta["config_digest"]),
        search_from=str(meta["search_from"]),
        encoding=InputEncoding.from_json(meta["input_encoding"]) if "input_encoding" in meta else None,
    )


def find_export(run_dir: str | Path, model: int | str = 0, *, best: bool = False) -> ExportedModel:
    """The export of ``model`` (its id, or its name as ``evals.csv`` names it) in a run directory."""
    found = [m for m in exported_models(run_dir) if m.best == best]
    if not found:
        kind = "best " if best else ""
        raise FileNotFoundError(
            f"{Path(run_dir) / EXPORT_DIR}: no {kind}model exports (runs write them when they finish; "
            f"{'export.best: true keeps the best' if best else 'export.final: false turns them off'})"
        )
    for m in found:
        if model in (m.model_id, m.name):
            return m
    choices = ", ".join(f"{m.model_id} ({m.name})" for m in found)
    raise KeyError(f"model {model!r} is not among the run's exported models: {choices}")


def load_exported(
    run_dir: str | Path, model: int | str = 0, *, best: bool = False, device: str | torch.device = "cpu"
) -> tuple[nn.Module, ExportedModel]:
    """The exported module with its weights, in eval mode, and its metadata (``rayfl.load_model``)."""
    from safetensors.torch import load_file

    info = find_export(run_dir, model, best=best)
    config = model_config_of(info.model_config)
    module = _build(config, info.input_spec, info.units, info.track_stats, info.search_from)
    _load(module, load_file(str(info.path)), str(info.path))
    return module.to(device).eval(), info


def model_config_of(raw: dict[str, Any]) -> ModelConfig:
    """A model section (as ``config_to_dict`` wrote it) back as its config dataclass, checked as the loader checks."""
    from rayfl.experiment.loader import YamlSource

    source = YamlSource(data={"model": raw}, origins={}, file=None, base_dir=Path.cwd())
    cfg: ExperimentConfig = source.build(ExperimentConfig)
    return cfg.model


def _build(
    config: ModelConfig,
    spec: InputSpec,
    units: tuple[int, ...] | None,
    track_stats: bool,
    search_from: str | None = None,
) -> nn.Module:
    """The module of an export, initialised on a forked RNG (the caller's global RNG untouched) and loaded after."""
    from rayfl.models import build_model

    with torch.random.fork_rng(devices=[]), _imports_from(search_from):
        if units is None and not track_stats:
            return build_model(config, spec)
        from rayfl.models.families import build_family

        family: Any = build_family(config, spec)
        if units is not None:
            return family.build(units)  # type: ignore[no-any-return]
        return family.build(family.full_units, track_stats=True)  # type: ignore[no-any-return]


@contextlib.contextmanager
def _imports_from(directory: str | None) -> Iterator[None]:
    """Custom factories imported from ``directory`` first (the run's working directory), as the run imported them."""
    from rayfl.models import custom

    if directory is None or not Path(directory).is_dir():
        yield
        return
    before = custom._search_dir
    custom.search_from(directory)
    try:
        yield
    finally:
        custom.search_from(before)


def _load(module: nn.Module, tensors: Params, source: str) -> None:
    """Copy ``tensors`` into ``module`` by name: every floating-point entry of its state must be there, nothing else."""
    own = module.state_dict()
    unknown = sorted(set(tensors) - set(own))
    missing = sorted(k for k, v in own.items() if v.is_floating_point() and k not in tensors)
    if unknown or missing:
        raise ValueError(
            f"{source}: the weights do not fit the model built from its config "
            f"(missing {missing[:5]}, unexpected {unknown[:5]})"
        )
    with torch.no_grad():
        for name, tensor in tensors.items():
            own[name].copy_(tensor)
