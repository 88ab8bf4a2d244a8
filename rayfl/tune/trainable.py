"""The Tune trainable: one trial is one simulation (or one search-only run), reporting every round.

Tune calls ``run_trial(config, plan=...)`` inside the trial's placement group (bundle 0); ``config`` holds the trial's
swept values under their dotted keys. The trial rebuilds its experiment config from the plan, names its run directory
after the Tune trial (``<sweep>/trials/<trial name>``, a normal run directory that ``rayfl report`` reads), runs, and
hands Tune one metrics dict per round (``metrics.RoundMetrics``), with the round's rayfl checkpoint when it wrote one,
so that ``rayfl sweep --resume`` continues the trial from it (``checkpoints.py``). When a scheduler stops the trial
early, the round rows written so far stay in the run directory (``rounds.csv`` is flushed every round). On storage by
URI the run directory is staged on the trial's node and copied to ``<sweep>/trials/<trial name>`` there at each
checkpoint and at the end; a restored trial reads its records back from the storage before it resumes.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayfl.core.files import is_storage_uri
from rayfl.engine.persist.storage import RunMirror, open_storage, staging_path
from rayfl.tune.checkpoints import pack, restore_into
from rayfl.tune.cluster import SWEEP_MARKER, check_trial_node
from rayfl.tune.metrics import RoundMetrics

if TYPE_CHECKING:
    from rayfl.engine.persist.records import RoundRecord
    from rayfl.tune.trials import TrialPlan

__all__ = ["TuneReporter", "run_trial"]

log = logging.getLogger(__name__)


class TuneReporter:
    """A round callback that reports each round's metrics to Tune, with the round's rayfl checkpoint when it wrote one
    (``checkpoints.py``)."""

    def __init__(self, run_dir: Path, metrics: RoundMetrics | None = None) -> None:
        self._metrics = metrics or RoundMetrics()
        self._run_dir = run_dir

    def __call__(self, record: RoundRecord) -> None:
        from ray import tune

        metrics = {**self._metrics(record), "run_dir": str(self._run_dir)}
        if record.checkpoint_bytes <= 0:
            tune.report(metrics)
            return
        with tempfile.TemporaryDirectory(prefix="rayfl-ckpt-") as tmp:
            folder = pack(self._run_dir, record.round_idx + 1, Path(tmp), self._metrics.carried)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(str(folder)))  # copied before it returns


def run_trial(config: dict[str, Any], *, plan: TrialPlan) -> None:
    """Tune's function trainable for rayfl sweeps; a restored trial resumes its run from Tune's checkpoint."""
    from ray import tune

    trial_name = tune.get_context().get_trial_name()
    check_trial_node(plan.trials_dir, SWEEP_MARKER)  # this node reaches the sweep's storage, or one line says not
    point = {p.key: config[p.key] for p in plan.params}
    cfg = plan.config(point, name=trial_name)
    remote = open_storage(plan.trials_dir).child(trial_name) if is_storage_uri(plan.trials_dir) else None
    # on storage by URI the run is staged on this node (``engine/persist/storage.py``) and copied there as it goes
    run_dir = staging_path(remote) if remote is not None else Path(plan.trials_dir) / trial_name
    metrics = RoundMetrics()
    resume: Path | None = None
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None and plan.mode != "search_only":
        if remote is not None:  # the records written so far, read back from the storage
            RunMirror(run_dir, remote).pull()
        with checkpoint.as_directory() as folder:
            info = restore_into(Path(folder), run_dir)
        metrics.carry(info.carried)
        resume = run_dir
        log.info("trial %s: resuming from %s", trial_name, info.manifest)
    elif remote is not None:
        if remote.exists():  # restarted from scratch (no checkpoint reported yet): its partial records go
            remote.fs.delete_dir(remote.path)
    elif run_dir.exists():
        shutil.rmtree(run_dir)
    reporter = TuneReporter(run_dir, metrics)
    log.info("trial %s: %s", trial_name, point)
    if plan.mode == "search_only":
        from rayfl.engine.search_only import run_search_only

        run_search_only(cfg, callbacks=[reporter])
    else:
        from rayfl.engine.driver import run_experiment

        run_experiment(cfg, callbacks=[reporter], resume=resume)
    if remote is not None:  # everything is on the storage (the run's last push): the staging folder goes
        shutil.rmtree(run_dir.parent, ignore_errors=True)
