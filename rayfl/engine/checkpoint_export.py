"""``rayfl export RUN_DIR [OUT]``: the models of a stopped run, from its checkpoint.

A run writes its models when it finishes or is stopped by a signal (``engine/persist/export.py``); one that ended in
an error or was killed with SIGKILL leaves only its checkpoints. ``export_checkpoint`` builds the run's parts as the
run built them (data, algorithm, clock; in this process) and writes, with ``write_models``, the files a finished run's
export writes. It sits beside the driver, not in ``persist/``, because it builds a run's parts (``build.py``) and
``persist/`` stays below them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
from pathlib import Path

from rayfl.engine.persist.export import EXPORT_DIR, write_models
from rayfl.models.encoding import InputEncoding

__all__ = ["export_checkpoint"]

log = logging.getLogger(__name__)


def export_checkpoint(run_dir: str | os.PathLike[str], out: str | os.PathLike[str] | None = None) -> list[Path]:
    """``rayfl export RUN_DIR [OUT]``: the models of a run that ended without writing them (an error, ``kill -9``),
    from its checkpoint, as the files a finished run's export writes (``write_models``; into ``RUN_DIR/models``
    unless ``out`` is given). A finished run exports the state its last evaluation scored, so the newest kept
    checkpoint taken right after an evaluated round is used (its accuracies from the checkpoint and ``evals.csv``);
    when no kept checkpoint is of an evaluated round, the newest one, its accuracies NaN. The data set, the algorithm
    and the initial model are built from the run's ``config.yaml`` as the run built them, in this process (the
    evaluation parameters of some methods need the data: HeteroFL's static batch norm); a custom factory is
    imported from the working directory, as ``rayfl run --resume`` does, and the data set's vocabulary and names go
    into the files as a finished run's do (``input_encoding``). ``export.best`` has no checkpointed state: only the
    final models are written. ``run_dir`` and ``out`` are paths (``str`` or ``Path``); anything else is refused with
    one ``TypeError``. Returns the files and directories written."""
    import torch

    from rayfl.core.errors import ConfigError
    from rayfl.engine.build import bind_algorithm, build_clock, build_setup
    from rayfl.engine.persist.checkpoint import CheckpointRefused, CheckpointStore
    from rayfl.engine.phases import PhaseSchedule
    from rayfl.engine.steps import evaluation_due
    from rayfl.experiment.loader import load_config

    for name, value in (("run_dir", run_dir), ("out", out)):
        if not isinstance(value, (str, os.PathLike)) and (name == "run_dir" or value is not None):
            raise TypeError(f"export_checkpoint(run_dir, out=None): {name} must be a path (str or Path), "
                            f"got {type(value).__name__}")  # fmt: skip
    run_dir = Path(run_dir)
    if not (run_dir / "config.yaml").is_file():
        raise ConfigError("not a run directory (no config.yaml): give the directory a run wrote", file=str(run_dir))
    cfg = load_config(run_dir / "config.yaml")
    cfg = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, kind="local"))
    store = CheckpointStore(run_dir, cfg.checkpoint.keep)
    found = None
    for manifest_path in reversed(store.manifests()):
        try:
            manifest, snapshot = store.load(manifest_path)
        except CheckpointRefused as err:
            raise ConfigError(err.reason, file=str(err.path)) from err
        except (ValueError, OSError) as err:
            log.warning("checkpoint %s cannot be read (%s); trying the one before", manifest_path, err)
            continue
        evaluated = evaluation_due(cfg, snapshot.rounds_done - 1)
        if found is None or evaluated:
            found = (manifest.record_sizes, snapshot, evaluated)
        if evaluated:
            break
    if found is None or found[1].rounds_done < 1:
        raise ConfigError("holds no readable checkpoint after a round (the run stopped before its first one, or "
                          "checkpoint.every was 0): nothing to export", file=str(run_dir))  # fmt: skip
    sizes, snapshot, evaluated = found
    round_idx = snapshot.rounds_done - 1
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.backend.server_threads)  # as the driver computes evaluation parameters
    try:
        setup = build_setup(cfg)
        bind_algorithm(cfg, setup, build_clock(cfg, setup))
        schedule = PhaseSchedule(setup.algorithm, cfg.rounds)
        schedule.results = dict(snapshot.phase_results)
        algorithm, state = schedule.algorithm_at(round_idx), snapshot.state
        names = algorithm.model_names(state)
        accuracies = [math.nan] * len(names)
        if evaluated:
            accuracies[0] = float(snapshot.last_eval[0])
            further = _evals_at(run_dir, sizes.get("evals", 0), round_idx)
            accuracies[1:] = [further.get(name, math.nan) for name in names[1:]]
        else:
            log.warning("%s: no kept checkpoint follows an evaluated round; exporting round %d's state, its "
                        "accuracy unknown (NaN)", run_dir, round_idx)  # fmt: skip
        target = run_dir / EXPORT_DIR if out is None else Path(out)
        encoding = InputEncoding.of(setup.dataset.meta, setup.input_spec)
        return write_models(
            run_dir, cfg, setup.input_spec, round_idx, state, algorithm, accuracies, out=target, encoding=encoding
        )
    finally:
        torch.set_num_threads(threads)


def _evals_at(run_dir: Path, size: int, round_idx: int) -> dict[str, float]:
    """``name -> test_acc`` of ``evals.csv``'s rows of ``round_idx``, reading only the checkpoint's ``size`` bytes
    (rows after the checkpoint belong to rounds it does not hold); the file is not changed."""
    import csv
    import io

    path = run_dir / "evals.csv"
    if size <= 0 or not path.is_file():
        return {}
    with path.open("rb") as f:
        text = f.read(size).decode("utf-8", errors="replace")
    found: dict[str, float] = {}
    for row in csv.DictReader(io.StringIO(text)):
        with contextlib.suppress(KeyError, TypeError, ValueError):
            if int(row["round_idx"]) == round_idx:
                found[str(row["name"])] = float(row["test_acc"])
    return found
