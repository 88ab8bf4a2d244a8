"""The Tune trainable: one trial is one simulation (or one search-only run), reporting every round.

Tune calls ``run_trial(config, plan=...)`` inside the trial's placement group (bundle 0); ``config`` holds the trial's
swept values under their dotted keys. The trial rebuilds its experiment config from the plan, names its run directory
after the Tune trial (``<sweep>/trials/<trial name>``, a normal run directory that ``rayfl report`` reads), runs, and
hands Tune one metrics dict per round (``metrics.RoundMetrics``), with a marker of the round's rayfl checkpoint when it
wrote one, so that ``rayfl sweep --resume`` continues the trial from its run directory's checkpoints
(``checkpoints.py``). When a scheduler stops the trial early, the round rows written so far stay in the run directory
(``rounds.csv`` is flushed every round). On storage by URI the run directory is staged on the trial's node and copied
to ``<sweep>/trials/<trial name>`` there at each checkpoint and at the end; a restored trial reads its records and
checkpoints back from the storage before it resumes.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rayfl.core.files import is_storage_uri
from rayfl.engine.persist.checkpoint import CheckpointStore
from rayfl.engine.persist.records import read_round_records
from rayfl.engine.persist.storage import RunMirror, Storage, open_storage, staging_path
from rayfl.tune.checkpoints import pack, restore_into
from rayfl.tune.cluster import SWEEP_MARKER, check_trial_node
from rayfl.tune.metrics import RoundMetrics

if TYPE_CHECKING:
    from rayfl.engine.persist.records import RoundRecord
    from rayfl.tune.trials import TrialPlan

__all__ = ["TuneReporter", "run_trial"]

log = logging.getLogger(__name__)


class TuneReporter:
    """A round callback that reports each round's metrics to Tune, with a marker of the round's rayfl checkpoint when
    it wrote one (``checkpoints.py``). A resumed trial's first report takes in the rounds before it from the run
    directory's records first, so that its running figures continue the interrupted trial's."""

    def __init__(self, run_dir: Path, resumed: bool = False) -> None:
        self._metrics = RoundMetrics()
        self._run_dir = run_dir
        self._replay = resumed
        self.reported = False

    def __call__(self, record: RoundRecord) -> None:
        from ray import tune

        if self._replay:  # the records are cut back to the checkpoint and hold this round's row already
            self._replay = False
            self._metrics.replay(r for r in read_round_records(self._run_dir) if r.round_idx < record.round_idx)
        metrics = {**self._metrics(record), "run_dir": str(self._run_dir)}
        self.reported = True
        if record.checkpoint_bytes <= 0:
            tune.report(metrics)
            return
        with tempfile.TemporaryDirectory(prefix="rayfl-ckpt-") as tmp:
            folder = pack(self._run_dir, record.round_idx + 1, Path(tmp))
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(str(folder)))  # copied before it returns

    def report_last(self) -> None:
        """Report the last round of a run that has finished (read back from its records), without a checkpoint."""
        from ray import tune

        *before, last = read_round_records(self._run_dir)
        self._metrics.replay(before)
        self.reported = True
        tune.report({**self._metrics(last), "run_dir": str(self._run_dir)})


def run_trial(config: dict[str, Any], *, plan: TrialPlan) -> None:
    """Tune's function trainable for rayfl sweeps; a restored trial resumes its run directory from its newest
    checkpoint (``checkpoints.py``)."""
    from ray import tune

    trial_name = tune.get_context().get_trial_name()
    check_trial_node(plan.trials_dir, SWEEP_MARKER)  # this node reaches the sweep's storage, or one line says not
    point = {p.key: config[p.key] for p in plan.params}
    cfg = plan.config(point, name=trial_name)
    remote = open_storage(plan.trials_dir).child(trial_name) if is_storage_uri(plan.trials_dir) else None
    # on storage by URI the run is staged on this node (``engine/persist/storage.py``) and copied there as it goes
    run_dir = staging_path(remote) if remote is not None else Path(plan.trials_dir) / trial_name
    resume = None if plan.mode == "search_only" else _resumable(run_dir, remote, tune.get_checkpoint(), trial_name)
    if resume is None:  # started afresh (or from scratch again: no checkpoint yet): partial records go
        if remote is not None and remote.exists():
            remote.fs.delete_dir(remote.path)
        if run_dir.exists():
            shutil.rmtree(run_dir)
    reporter = TuneReporter(run_dir, resumed=resume is not None)
    log.info("trial %s: %s", trial_name, point)
    if plan.mode == "search_only":
        from rayfl.engine.search_only import run_search_only

        run_search_only(cfg, callbacks=[reporter])
    else:
        from rayfl.engine.driver import run_experiment

        run_experiment(cfg, callbacks=[reporter], resume=resume)
        # a run whose checkpoint came after its last round (it had ended before Tune's state said so, its driver
        # killed meanwhile) resumes to no round at all: its last round is reported again, from its records
        if resume is not None and not reporter.reported:
            reporter.report_last()
    if remote is not None:  # everything is on the storage (the run's last push): the staging folder goes
        shutil.rmtree(run_dir.parent, ignore_errors=True)


def _resumable(run_dir: Path, remote: Storage | None, checkpoint: Any, trial_name: str) -> Path | None:
    """``run_dir`` when it holds a checkpoint to continue from, else None. That is the newest checkpoint there: the
    one Tune's marker names (``checkpoint``), or a later one, or one Tune's state had not heard of at all (a driver
    killed between two of Tune's state saves, or Tune's state lost and the sweep started afresh in Tune: the trial
    names are the same). On storage by URI the run directory is first read back from the storage."""
    if remote is not None and remote.exists():
        RunMirror(run_dir, remote).pull()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder:
            info = restore_into(Path(folder), run_dir)  # a ValueError when the run has lost its checkpoints
        named, newest = info.manifest, info.resumes_from
    else:  # Tune's state names none (saved before the trial's first checkpoint, or lost)
        manifests = CheckpointStore(run_dir, keep=1).manifests()
        if not manifests:
            return None
        named, newest = "none", manifests[-1].name
    said = "" if newest == named else f" (Tune's state names {named})"
    log.info("trial %s: resuming from %s%s", trial_name, newest, said)
    return run_dir
