"""``rayfl export RUN_DIR OUT`` (``engine/persist/export.py:export_checkpoint``): a run that ended in an error (or was
killed) has only its checkpoints; the export from the checkpoint writes the files a finished run's export writes, the
same tensors and metadata, and they load back with the run's accuracy."""

from __future__ import annotations

import csv
import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

import rayfl
from rayfl.cli import main
from rayfl.config.model import CNNConfig
from rayfl.config.sections import CheckpointConfig, DataConfig
from rayfl.data import build_federated_dataset
from rayfl.engine.driver import run_experiment
from rayfl.engine.persist.records import RoundRecord
from rayfl.experiment.schema import ExperimentConfig
from rayfl.export import exported_models
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.fedhen.config import DecoupleConfig
from rayfl.fl.methods.heterofl.config import HeteroFLConfig
from rayfl.models import to_input
from tests.helpers import tiny_config
from tests.unit.fl.test_fedhen import fedhen_config


def _data(tmp_path: Path) -> DataConfig:
    """A Parquet file of 300 3x8x8 images labelled by a fixed linear teacher (tests.helpers' tiny task), split IID
    into 12 clients, 60 rows held out as the test set: data the export builds again from the run's config."""
    path = tmp_path / "tiny.parquet"
    if not path.exists():
        import pyarrow as pa
        import pyarrow.parquet as pq

        rng = np.random.default_rng(0)
        x = rng.integers(0, 256, size=(300, 3 * 8 * 8), dtype=np.uint8)
        y = (x.astype(np.float64) @ rng.normal(size=(3 * 8 * 8, 4))).argmax(1)
        pq.write_table(pa.table({"pixels": pa.array(list(x), pa.list_(pa.uint8())), "label": y}), path)
    return DataConfig(name="parquet", path=str(path), input_shape=(3, 8, 8), partition="iid", num_clients=12,
                      test_fraction=0.2)  # fmt: skip


def _config(algorithm: object, tmp_path: Path) -> ExperimentConfig:
    if isinstance(algorithm, DecoupleConfig):  # two global models, each its own architecture
        cfg = fedhen_config(algorithm)
    else:
        cfg = dataclasses.replace(tiny_config(kind="local", num_hosts=1), algorithm=algorithm,
                                  model=CNNConfig(channels=(8, 16), norm="batch"))  # fmt: skip
    return dataclasses.replace(cfg, data=_data(tmp_path), output_dir=str(tmp_path / "runs"), eval_every=1,
                               checkpoint=CheckpointConfig(every=1, keep=2))  # fmt: skip


class _Crash(RuntimeError):
    pass


def _crash_after(round_idx: int):  # type: ignore[no-untyped-def]
    def callback(record: RoundRecord) -> None:
        if record.round_idx == round_idx:
            raise _Crash(f"stopped after round {round_idx}")

    return callback


def _meta(path: Path) -> dict[str, object]:
    with safe_open(str(path), framework="pt") as f:
        loaded: dict[str, object] = json.loads((f.metadata() or {})["rayfl"])
    return loaded


@pytest.mark.parametrize(
    "algorithm", [FedAvgConfig(), HeteroFLConfig(), DecoupleConfig()], ids=["fedavg", "heterofl-static-bn", "decouple"]
)
def test_a_crashed_runs_checkpoint_exports_what_a_finished_run_does(tmp_path: Path, algorithm: object) -> None:
    cfg = _config(algorithm, tmp_path)
    finished = run_experiment(dataclasses.replace(cfg, name="finished", rounds=2))
    assert finished.run_dir is not None
    with pytest.raises(_Crash):  # the same run, meant for 4 rounds, ends in an error after its second
        run_experiment(dataclasses.replace(cfg, name="crashed", rounds=4), callbacks=[_crash_after(1)])
    crashed = Path(cfg.output_dir) / "crashed"
    assert not (crashed / "models").exists()  # a run ending in an error exports nothing itself
    out = tmp_path / "exported"
    assert main(["export", str(crashed), str(out)]) == 0
    reference = sorted(p.name for p in (finished.run_dir / "models").glob("*.safetensors"))
    assert sorted(p.name for p in out.glob("*.safetensors")) == reference and len(reference) >= 1
    for name in reference:
        want, got = load_file(str(finished.run_dir / "models" / name)), load_file(str(out / name))
        assert want.keys() == got.keys() and all(torch.equal(want[k], got[k]) for k in want)
        meta_want, meta_got = _meta(finished.run_dir / "models" / name), _meta(out / name)
        assert meta_got.pop("config_digest") != meta_want.pop("config_digest")  # each names its own run's config
        assert meta_got == meta_want  # round 1, its accuracies, config, input spec, units
    model = rayfl.load_model(out)
    ds = build_federated_dataset(cfg.data, cfg.seed)
    info = exported_models(out)[0]
    step = cfg.train.eval_batch_size  # as the engine evaluates: batch norms without running statistics see a batch
    with torch.no_grad():
        x = np.asarray(ds.x_test)
        logits = torch.cat([model(to_input(x[i : i + step], info.input_spec)) for i in range(0, len(x), step)])
    accuracy = float((logits.argmax(dim=1).numpy() == ds.y_test).mean())
    assert accuracy == info.accuracy == finished.final_eval.accuracy


def test_the_newest_checkpoint_after_an_evaluation_is_used(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Evaluations every second round: the checkpoint after round 2 holds an unevaluated state, so the one after round
    1 is exported (as a finished run exports its last evaluated state); with only the newest kept, its state is
    exported with an unknown (NaN) accuracy."""
    cfg = dataclasses.replace(_config(FedAvgConfig(), tmp_path), eval_every=2, rounds=6)
    with pytest.raises(_Crash):
        run_experiment(dataclasses.replace(cfg, name="keep2"), callbacks=[_crash_after(2)])
    assert main(["export", str(tmp_path / "runs" / "keep2")]) == 0
    (info,) = exported_models(tmp_path / "runs" / "keep2")
    assert info.round_idx == 1 and not math.isnan(info.accuracy)
    assert "model 0 (main), round 1" in capsys.readouterr().out
    keep1 = dataclasses.replace(cfg, name="keep1", checkpoint=CheckpointConfig(every=1, keep=1))
    with pytest.raises(_Crash):
        run_experiment(keep1, callbacks=[_crash_after(2)])
    assert main(["export", str(tmp_path / "runs" / "keep1")]) == 0
    (info,) = exported_models(tmp_path / "runs" / "keep1")
    assert info.round_idx == 2 and math.isnan(info.accuracy)


def test_export_refuses_a_directory_without_a_run_or_a_checkpoint(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["export", str(tmp_path)]) == 2
    assert "not a run directory (no config.yaml)" in capsys.readouterr().err
    cfg = dataclasses.replace(_config(FedAvgConfig(), tmp_path), name="nockpt", rounds=1,
                              checkpoint=CheckpointConfig(every=0))  # fmt: skip
    run_experiment(cfg)
    assert main(["export", str(tmp_path / "runs" / "nockpt")]) == 2
    assert "holds no readable checkpoint after a round" in capsys.readouterr().err


def test_a_run_killed_with_sigkill_exports_from_its_checkpoint(tmp_path: Path) -> None:
    """``rayfl run`` in its own process, killed with SIGKILL once it has checkpointed two rounds: no exports, no
    summary of an end; ``rayfl export`` writes the models of a checkpoint's round from what the kill left."""
    import os
    import signal
    import subprocess
    import sys
    import time

    data = _data(tmp_path)
    (tmp_path / "run.yaml").write_text(
        f"name: killed\nrounds: 1000\nclients_per_round: 4\noutput_dir: {tmp_path / 'runs'}\n"
        f"data: {{name: parquet, path: {data.path}, input_shape: [3, 8, 8], partition: iid, num_clients: 12, "
        "test_fraction: 0.2}\nmodel: {name: cnn, channels: [4, 8]}\ntrain: {lr: 0.05, batch_size: 8}\n"
        "backend: {kind: local, num_hosts: 1}\ncheckpoint: {every: 1, keep: 2}\n"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}  # fmt: skip
    cli = "import sys; from rayfl.cli import main; sys.exit(main(sys.argv[1:]))"
    log = tmp_path / "stderr.txt"
    with log.open("wb") as err:
        proc = subprocess.Popen([sys.executable, "-c", cli, "run", str(tmp_path / "run.yaml")], env=env,
                                stdout=subprocess.DEVNULL, stderr=err)  # fmt: skip
    run_dir = tmp_path / "runs" / "killed"
    try:
        deadline = time.monotonic() + 120
        while not (run_dir / "checkpoints" / "round-000002.json").exists():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    assert proc.returncode == -signal.SIGKILL and not (run_dir / "models").exists()
    assert main(["export", str(run_dir)]) == 0
    (info,) = exported_models(run_dir)
    assert info.round_idx >= 1 and not math.isnan(info.accuracy)
    with (run_dir / "rounds.csv").open() as f:
        recorded = {int(row["round_idx"]): float(row["test_acc"]) for row in csv.DictReader(f)}
    assert recorded[info.round_idx] == info.accuracy  # the accuracy its round recorded
    assert rayfl.load_model(run_dir) is not None
