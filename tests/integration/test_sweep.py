"""Real Ray Tune sweeps on 2 CPUs: trials are simulations on the Ray backend inside their placement groups."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from rayfl.cli import main
from rayfl.report import load_run
from rayfl.tune import load_sweep, run_sweep

TINY = """\
  name: tiny
  rounds: 2
  clients_per_round: 4
  data: {name: synthetic, partition: iid, num_clients: 8, synthetic_samples: 16}
  train: {lr: 0.05, batch_size: 8, eval_batch_size: 250}
"""

TRAIN = (
    """\
# rayfl sweep {path}
base:
"""
    + TINY
    + """\
  model: {name: cnn, channels: [4, 8]}
  backend: {kind: ray, num_hosts: 1}
param_space:
  algorithm.name: [fedavg, heterofl]
  seed: [0, 1]
max_concurrent_trials: 2
output_dir: {out}
"""
)

SEARCH = (
    """\
# rayfl sweep {path}
mode: search_only
base:
"""
    + TINY.replace("rounds: 2", "rounds: 12")
    + """\
  model: {name: resnet, depth: 18, widths: [4, 8, 8, 8], norm: gn, act: relu6}
  algorithm: {name: model_search, ratios: [0, 0.5, 1]}
  system:
    memory: {source: uniform, low: 1, high: 6}
    bandwidth_down: {source: uniform, low: 0.01, high: 0.1}
param_space:
  algorithm.epsilon: [0.2, 1.0]
max_concurrent_trials: 2
scheduler: {kind: asha, metric: memory_util, mode: max, grace_period_s: 10, max_t_s: 60, reduction_factor: 2}
output_dir: {out}
"""
)


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "sweep.yaml"
    path.write_text(text.replace("{path}", str(path)).replace("{out}", str(tmp_path / "out")))
    return path


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_a_four_trial_training_sweep_has_one_row_per_trial(tmp_path: Path) -> None:
    result = run_sweep(load_sweep(write(tmp_path, TRAIN)))
    table = result.table
    assert len(table) == 4 and list(table["status"]) == ["completed"] * 4
    assert sorted(zip(table["algorithm.name"], table["seed"], strict=True)) == [
        ("fedavg", 0),
        ("fedavg", 1),
        ("heterofl", 0),
        ("heterofl", 1),
    ]
    assert (table["rounds_done"] == 2).all() and table["test_acc"].between(0, 1).all()
    assert len(pd.read_csv(result.sweep_dir / "results.csv")) == 4
    assert len(pd.read_parquet(result.sweep_dir / "results.parquet")) == 4
    for trial, run_dir in zip(table["trial"], table["run_dir"], strict=True):
        run = load_run(run_dir)  # the trials are normal run directories
        assert Path(run_dir).parent == result.sweep_dir / "trials" and Path(run_dir).name == trial
        assert run.config["backend"]["cpus_per_host"] == 0.25 and run.rounds_run == 2
    assert result.best is not None and "Best trial by test_acc" in result.markdown


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.usefixtures("ray_local")
def test_asha_stops_search_only_trials_on_simulated_time(tmp_path: Path) -> None:
    result = run_sweep(load_sweep(write(tmp_path, SEARCH)))
    table = result.table
    assert len(table) == 2 and set(table["status"]) == {"stopped"}
    assert (table["rounds_done"] < 12).all() and (table["sim_hours"] * 3600 < 60 + 60).all()
    assert table["memory_util"].between(0, 1).all() and table["hit_rate"].between(0, 1).all()
    assert (table.loc[table["algorithm.epsilon"] == 1.0, "hit_rate"] == 0).all()


def test_search_command_and_sweep_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    experiment = tmp_path / "search.yaml"
    body = SEARCH.split("base:\n", 1)[1].split("param_space:", 1)[0]
    experiment.write_text("".join(line[2:] + "\n" for line in body.splitlines()) + f"output_dir: {tmp_path / 'runs'}\n")
    assert main(["search", str(experiment), "rounds=3"]) == 0
    out = capsys.readouterr().out
    assert "memory util" in out and "hit rate" in out
    assert load_run(tmp_path / "runs" / "tiny").rounds_run == 3
    assert main(["sweep", "--check", str(write(tmp_path, SEARCH)), "param_space.algorithm.t_max=[1, 5]"]) == 0
    assert "4 trial configs checked" in capsys.readouterr().out
    assert main(["sweep", "--check", str(write(tmp_path, SEARCH)), "param_space.algorithm.t_max=[-1]"]) == 2
    assert "sweep.yaml" in capsys.readouterr().err


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_a_sweep_whose_trials_must_avoid_the_only_node_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``backend.head: reserved`` keeps every trial bundle off the head; on this one-node Ray nothing else is left, so
    the fit check (which leaves a reserved head out of the nodes) refuses the sweep before any trial waits for ever."""
    path = write(
        tmp_path,
        TRAIN.replace("backend: {kind: ray, num_hosts: 1}", "backend: {kind: ray, num_hosts: 1, head: reserved}"),
    )
    assert main(["sweep", str(path)]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"rayfl: error: {path}: trial_resources: a trial can never be placed"), line
    assert "no nodes" in line, line
