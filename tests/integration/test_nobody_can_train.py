"""A run in which no client can ever train (the full model exceeds every memory budget, budgets enforced) is refused
at start with the reason and the fix (exit 2, no run directory), instead of failing every client of every round and
exiting 0; with ``algorithm.budgets=ignore``, or a method that picks sub-models that fit, the same budgets run."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from rayfl.cli import main
from rayfl.config.sections import ResourceConfig, SystemConfig
from rayfl.core.errors import ConfigError
from rayfl.engine.driver import run_experiment
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from tests.helpers import tiny_config, tiny_image_dataset, tiny_yaml

TINY = tiny_yaml("nobody", 2, 'system:\n  memory: {{source: uniform, low: 0.001, high: 0.002}}\n')


def test_no_client_fits_is_refused_with_the_fix_and_no_run_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "nobody.yaml"
    path.write_text(TINY.format(out=tmp_path / "runs"))
    assert main(["run", str(path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "algorithm.budgets: no client can ever train" in err
    assert "memory" in err and "set algorithm.budgets=ignore" in err
    assert not (tmp_path / "runs").exists()
    assert main(["run", str(path), "algorithm.budgets=ignore"]) == 0  # the fix the line names
    assert (tmp_path / "runs" / "nobody" / "summary.json").exists()


def test_one_client_that_fits_at_some_round_is_enough() -> None:
    # half the clients have no memory limit at all: the run goes ahead (write=False: nothing on disk)
    memory = ResourceConfig(source="levels", values=(0.001, 1e6), id_bounds=(4,))
    cfg = dataclasses.replace(tiny_config(kind="local"), rounds=1, system=SystemConfig(memory=memory))
    data = tiny_image_dataset(num_clients=8)
    assert run_experiment(cfg, write=False, dataset=data).records[0].clients_run > 0
    starved = dataclasses.replace(cfg, system=SystemConfig(memory=dataclasses.replace(memory, values=(0.001, 0.002))))
    with pytest.raises(ConfigError, match="no client can ever train"):
        run_experiment(starved, write=False, dataset=data)
    ignored = dataclasses.replace(starved, algorithm=FedAvgConfig(budgets="ignore"))
    assert run_experiment(ignored, write=False, dataset=data).records[0].clients_run > 0


def test_the_run_name_follows_a_method_given_by_override(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "setting.yaml"
    path.write_text(TINY.format(out=tmp_path / "runs").replace("name: nobody", "name: s3-fedavg"))
    assert main(["validate", str(path), "algorithm.name=heterofl"]) == 0
    assert "(s3-heterofl: heterofl" in capsys.readouterr().out  # the file's method in the name replaced
    assert main(["validate", str(path), "algorithm.name=heterofl", "name=mine"]) == 0
    assert "(mine: heterofl" in capsys.readouterr().out  # a name given by override is kept
    plain = tmp_path / "plain.yaml"
    plain.write_text(TINY.format(out=tmp_path / "runs"))
    assert main(["validate", str(plain), "algorithm.name=fedrolex"]) == 0
    assert "(nobody-fedrolex: fedrolex" in capsys.readouterr().out  # else the method appended
