"""Runs stopped by a real signal (SIGINT, SIGTERM, twice) or an exception keep consistent records, and resume to
exactly the run that never stopped: FedAvg, HeteroFL with static BN, and model search with in-place distillation
(its search pool in the state; every random draw derived from the seed, round and client)."""

from __future__ import annotations

import dataclasses
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from rayfl.cli import main
from rayfl.config.sections import CheckpointConfig
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.engine.persist.checkpoint import CheckpointStore
from rayfl.experiment.loader import dump_config
from rayfl.experiment.schema import ExperimentConfig
from tests.resume_cases import assert_records_agree, assert_same_run, assert_same_state, case

ROOT = Path(__file__).resolve().parents[2]


def _config(name: str, tmp_path: Path, rounds: int = 6) -> ExperimentConfig:
    """A written run checkpointed every 3 rounds, so that a stop's own checkpoint is the one it resumes from."""
    cfg = case(name, None, rounds=rounds)
    return dataclasses.replace(cfg, name=name, output_dir=str(tmp_path / "runs"), checkpoint=CheckpointConfig(every=3))


def _uninterrupted(cfg: ExperimentConfig) -> RunResult:
    return run_experiment(dataclasses.replace(cfg, name=f"{cfg.name}-whole"))


def _run_cli(args: list[str], signals: list[int], at_round: int, timeout_s: float = 300) -> tuple[int, str, str]:
    """``rayfl ARGS`` in a subprocess; once it prints round ``at_round``'s line (``step`` in an asynchronous run),
    ``signals`` are sent to it."""
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rayfl.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith((f"round {at_round:>4}/", f"step {at_round:>4}/")):
            for sig in signals:
                proc.send_signal(sig)
            break
    out, err = proc.communicate(timeout=timeout_s)
    return proc.returncode, "".join(lines) + out, err


def _final_checkpoint_params(run_dir: Path) -> dict[str, torch.Tensor]:
    found = CheckpointStore(run_dir, keep=1).latest()
    assert found is not None
    return found[1].state.params


@pytest.mark.slow
@pytest.mark.parametrize("name", ["fedavg", "heterofl", "model_search"])
def test_sigint_at_a_round_then_resume_equals_the_uninterrupted_run(name: str, tmp_path: Path) -> None:
    cfg = _config(name, tmp_path)
    path = tmp_path / f"{name}.yaml"
    dump_config(cfg, path)
    code, out, err = _run_cli(["run", str(path)], [signal.SIGINT], at_round=0)
    assert code == 130, out + err
    run_dir = Path(cfg.output_dir) / name
    summary = assert_records_agree(run_dir)
    assert summary["status"] == "interrupted" and 1 <= summary["rounds"] < cfg.rounds
    assert f"rayfl run --resume {run_dir}" in err
    stopped_at = summary["rounds"]
    assert CheckpointStore(run_dir, 1).latest()[0].rounds_done == stopped_at  # type: ignore[index]
    resumed = run_experiment(cfg, resume=run_dir)
    whole = _uninterrupted(cfg)
    assert whole.run_dir is not None
    assert_same_run(whole.run_dir, run_dir, whole, resumed)
    if name == "model_search":
        assert resumed.state.algo_state is not None  # the search pool came through the checkpoint
        assert max(r.distinct_structures for r in resumed.records) > 2  # and the search grew it


@pytest.mark.slow
def test_sigterm_and_a_second_signal_keep_records_consistent_and_the_cli_resumes(tmp_path: Path) -> None:
    cfg = _config("fedavg", tmp_path)
    path = tmp_path / "fedavg.yaml"
    dump_config(cfg, path)
    code, out, err = _run_cli(["run", str(path)], [signal.SIGTERM], at_round=1)
    assert code == 143, out + err
    run_dir = Path(cfg.output_dir) / "fedavg"
    assert assert_records_agree(run_dir)["status"] == "interrupted"
    # twice at once: no round is finished, the records still agree, and the last checkpoint is where it resumes
    code, out, err = _run_cli(["run", "--resume", str(run_dir)], [signal.SIGINT, signal.SIGINT], at_round=3)
    assert code == 130, out + err
    assert assert_records_agree(run_dir)["status"] == "interrupted"
    assert main(["run", "--resume", str(run_dir)]) == 0  # the command line's resume, in this process
    whole = _uninterrupted(cfg)
    assert whole.run_dir is not None
    assert_same_run(whole.run_dir, run_dir)
    assert_same_state(whole.state.params, _final_checkpoint_params(run_dir))
    assert assert_records_agree(run_dir)["status"] == "finished"


class _Crash(RuntimeError):
    pass


def test_an_exception_mid_run_keeps_records_consistent_and_resumes(tmp_path: Path) -> None:
    cfg = _config("fedavg", tmp_path, rounds=5)

    def crash(record: object) -> None:
        if getattr(record, "round_idx", -1) == 3:
            raise _Crash("boom")

    with pytest.raises(_Crash):
        run_experiment(cfg, callbacks=[crash])
    run_dir = Path(cfg.output_dir) / "fedavg"
    summary = assert_records_agree(run_dir)
    assert summary["status"] == "error: _Crash" and summary["rounds"] == 4
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    resumed = run_experiment(cfg, resume=copy)  # from the checkpoint after round 3: round 3 is run again
    whole = _uninterrupted(cfg)
    assert whole.run_dir is not None
    assert_same_run(whole.run_dir, copy, whole, resumed)
