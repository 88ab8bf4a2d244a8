"""``rayfl sweep --resume``: a sweep stopped by SIGINT continues through Tune's restore; the interrupted trial goes on
from the rayfl checkpoint it reported to Tune (not from scratch), and every trial's records equal a plain run's."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rayfl.cli import main
from rayfl.engine.driver import run_experiment
from rayfl.experiment.loader import load_config
from rayfl.tune.metrics import RoundMetrics
from tests.resume_cases import assert_same_run

ROOT = Path(__file__).resolve().parents[2]

SWEEP = """\
# rayfl sweep {path}
base:
  name: tiny
  rounds: 12  # the second trial has 10 rounds left when the test interrupts it (rounds as short as 0.1 s)
  clients_per_round: 4
  data: {{name: synthetic, partition: iid, num_clients: 8, synthetic_samples: 16}}
  train: {{lr: 0.05, batch_size: 8, eval_batch_size: 250}}
  model: {{name: cnn, channels: [4, 8]}}
  backend: {{kind: ray, num_hosts: 1}}
  checkpoint: {{every: 2}}
param_space:
  seed: [0, 1]
max_concurrent_trials: 1
output_dir: {out}
"""


def _wait_for(pattern: str, root: Path, proc: subprocess.Popen[str], timeout_s: float = 240) -> Path:
    began = time.monotonic()
    while time.monotonic() - began < timeout_s:
        found = sorted(root.glob(pattern))
        if found:
            return found[0]
        assert proc.poll() is None, "the sweep ended before it was interrupted"
        time.sleep(0.2)
    raise AssertionError(f"no {pattern} under {root} after {timeout_s} s")


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
@pytest.mark.parametrize("state", ["whole", "cut short"])
def test_an_interrupted_sweep_resumes_its_trials_mid_run(
    tmp_path: Path, state: str, caplog: pytest.LogCaptureFixture
) -> None:
    """With Tune's state ``cut short`` (as a driver killed while Tune rewrote it leaves it), Tune cannot restore and
    starts the sweep afresh: the trials, named as before, continue from their run directories all the same (the
    first, finished before the interrupt, only reports its last round again)."""
    path = tmp_path / "sweep.yaml"
    path.write_text(SWEEP.format(path=path, out=tmp_path / "out"))
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rayfl.cli", "sweep", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
    )
    # Tune holds the trial's second checkpoint (round 4): its first is surely in Tune's experiment state, so the
    # trial cannot start over. With the state cut short, Tune's state does not count: the second trial's first
    # checkpoint (round 2, in its run directory), the first trial finished
    cut = state == "cut short"
    _wait_for(
        "out/sweep/tune/00001_*/checkpoint_000000/rayfl.json"
        if cut
        else "out/sweep/tune/00000_*/checkpoint_000001/rayfl.json",
        tmp_path,
        proc,
    )
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=240)
    sweep_dir = tmp_path / "out" / "sweep"  # named after the sweep file
    assert proc.returncode == 130, out + err
    assert f"rayfl sweep --resume {sweep_dir}" in err
    # header and rounds 0-1 of the trials run so far, wall times included
    heads = {t: (t / "rounds.csv").read_text().splitlines()[:3] for t in (sweep_dir / "trials").iterdir()}
    assert len(heads) == 1 + cut
    if cut:
        newest = sorted((sweep_dir / "tune").glob("experiment_state-*.json"))[-1]
        newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])
    with caplog.at_level(logging.WARNING, logger="rayfl.tune.sweep"):
        assert main(["sweep", "--resume", str(sweep_dir)]) == 0
    warned = [r.getMessage() for r in caplog.records if "cannot be read" in r.getMessage()]
    assert len(warned) == cut, warned
    trials = sorted((sweep_dir / "trials").iterdir())
    assert len(trials) == 2
    assert {t: (t / "rounds.csv").read_text().splitlines()[:3] for t in heads} == heads  # continued, not redone
    for trial in trials:
        cfg = load_config(trial / "config.yaml", ["backend.kind=local", f"output_dir={tmp_path / 'plain'}"])
        plain = run_experiment(cfg)
        assert plain.run_dir is not None
        assert_same_run(plain.run_dir, trial)
        # Tune's last report: the running figures of the resumed trial (rebuilt from its records) are an
        # uninterrupted trial's
        tune_dir = sweep_dir / "tune" / trial.name
        last = json.loads((tune_dir / "result.json").read_text().splitlines()[-1])
        metrics = RoundMetrics()
        want = [metrics(r) for r in plain.records][-1]
        for key in ("train_gmacs", "total_clients_sampled", "total_network_mb", "best_test_acc", "test_acc"):
            assert last[key] == want[key], (trial.name, key, last[key], want[key])
        # Tune's markers of the trial's checkpoints, none deleted (their indices run from 0 on; a restored trial
        # may report again under an index its restored state had not reached), each only the checkpoint's names
        markers = sorted(tune_dir.glob("checkpoint_*"))
        assert [m.name for m in markers] == [f"checkpoint_{i:06d}" for i in range(len(markers))], markers
        assert all([p.name for p in m.iterdir()] == ["rayfl.json"] for m in markers), markers
        assert max(json.loads((m / "rayfl.json").read_text())["manifest"] for m in markers) == "round-000012.json"
