"""``rayfl sweep --resume``: a sweep stopped by SIGINT continues through Tune's restore; the interrupted trial goes on
from the rayfl checkpoint it reported to Tune (not from scratch), and every trial's records equal a plain run's."""

from __future__ import annotations

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
from tests.resume_cases import assert_same_run

ROOT = Path(__file__).resolve().parents[2]

SWEEP = """\
# rayfl sweep {path}
base:
  name: tiny
  rounds: 8
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
def test_an_interrupted_sweep_resumes_its_trials_mid_run(tmp_path: Path) -> None:
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
    # Tune holds the first trial's second checkpoint (round 4): its first is surely in Tune's experiment state, so
    # the trial cannot start over
    _wait_for("out/sweep/tune/00000_*/checkpoint_000001/rayfl.json", tmp_path, proc)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=240)
    sweep_dir = tmp_path / "out" / "sweep"  # named after the sweep file
    assert proc.returncode == 130, out + err
    assert f"rayfl sweep --resume {sweep_dir}" in err
    first = sorted((sweep_dir / "trials").iterdir())[0]
    head = (first / "rounds.csv").read_text().splitlines()[:3]  # header and rounds 0-1, wall times included
    assert main(["sweep", "--resume", str(sweep_dir)]) == 0
    trials = sorted((sweep_dir / "trials").iterdir())
    assert len(trials) == 2
    assert (first / "rounds.csv").read_text().splitlines()[:3] == head  # continued, not started over
    for trial in trials:
        cfg = load_config(trial / "config.yaml", ["backend.kind=local", f"output_dir={tmp_path / 'plain'}"])
        plain = run_experiment(cfg)
        assert plain.run_dir is not None
        assert_same_run(plain.run_dir, trial)
