"""``backend.kind: auto`` (``rayfl/engine/backend_choice.py``): in-process whatever the size when its hosts get worker
processes, else in-process below the measured cross-over and Ray from it on; Ray whenever a cluster, GPUs or warm
hosts are asked for; the choice and its reason in the run's first line and in ``summary.json``, and ``config.yaml``
holding the kind taken."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from rayfl.cli import main
from rayfl.config.sections import BackendConfig, TrainConfig
from rayfl.engine.backend_choice import (
    CROSSOVER_UPDATES,
    RAY_ONLY,
    choose_backend,
    client_epochs,
    in_process_workers,
    resolve_backend,
)
from rayfl.experiment.schema import ExperimentConfig, PhaseConfig


def _cfg(rounds: int = 3, clients: int = 10, epochs: int = 1, **backend: object) -> ExperimentConfig:
    return ExperimentConfig(
        rounds=rounds,
        clients_per_round=clients,
        train=TrainConfig(epochs=epochs),
        backend=BackendConfig(**backend),  # type: ignore[arg-type]
    )


def test_auto_is_the_default_and_small_runs_stay_in_process() -> None:
    assert BackendConfig().kind == "auto"
    choice = choose_backend(_cfg(processes=1))
    assert (choice.kind, choice.asked) == ("local", "auto")
    assert choice.describe() == "local (auto: 30 client-epochs, below the 1,000 where Ray's start pays off)"


def test_a_run_whose_hosts_get_worker_processes_stays_in_process_whatever_its_size() -> None:
    """Issue 41: on worker processes the in-process rounds are faster than Ray's on one machine, so Ray's start is
    never repaid; a run that would train on one process keeps the cross-over."""
    big = {"rounds": 1000, "clients": 100}
    choice = choose_backend(_cfg(**big, processes=2))  # type: ignore[arg-type]
    assert (choice.kind, choice.reason) == (
        "local",
        "100,000 client-epochs on 2 in-process worker processes, faster than Ray's hosts on one machine",
    )
    assert in_process_workers(_cfg(processes=4, num_hosts=3)) == 3  # a host lives in one worker
    # what keeps the hosts in the driver keeps the cross-over
    for one in (
        {"processes": 1},
        {"processes": 0},
        {"processes": 2, "num_hosts": 1},
        {"processes": 2, "torch_threads": 2},
    ):
        assert in_process_workers(_cfg(**one)) == 1, one  # type: ignore[arg-type]
        assert choose_backend(_cfg(**big, **one)).kind == "ray", one  # type: ignore[arg-type]
    assert choose_backend(_cfg(**big, processes=2, device="cuda")).kind == "ray"  # type: ignore[arg-type]


def test_ray_only_keys_of_a_run_that_auto_keeps_in_process_are_named_in_its_reason() -> None:
    """Issue 41: ``backend.cpus_per_host=64`` under ``auto`` on a small run is not silently ignored."""
    choice = choose_backend(_cfg(cpus_per_host=64.0, start_timeout_s=300.0, num_hosts=4))
    assert choice.kind == "local"
    assert choice.reason.endswith(
        "; not used in-process: backend.cpus_per_host=64.0, backend.start_timeout_s=300.0 (backend.kind=ray uses them)"
    )
    # keys at their defaults, and keys the in-process backend reads too (hosts, shards, threads), are not named
    assert "not used" not in choose_backend(_cfg(num_hosts=4, num_shards=2, torch_threads=2)).reason
    # a run that goes to Ray uses them: nothing to say; a run on worker processes names them too
    assert "not used" not in choose_backend(_cfg(rounds=100, cpus_per_host=64.0, processes=1)).reason
    assert choose_backend(_cfg(rounds=100, cpus_per_host=64.0, processes=2)).reason.endswith(
        "; not used in-process: backend.cpus_per_host=64.0 (backend.kind=ray uses them)"
    )
    assert set(RAY_ONLY) <= {f.name for f in dataclasses.fields(BackendConfig)}


def test_the_cross_over_counts_client_epochs_over_phases() -> None:
    assert client_epochs(_cfg(rounds=10, clients=10, epochs=10)) == CROSSOVER_UPDATES
    assert choose_backend(_cfg(rounds=10, clients=10, epochs=10, processes=1)).kind == "ray"
    assert choose_backend(_cfg(rounds=10, clients=10, epochs=9, processes=1)).kind == "local"
    phased = dataclasses.replace(
        _cfg(rounds=30, clients=10),
        phases=(PhaseConfig(rounds=10), PhaseConfig(rounds=20, clients_per_round=40, epochs=2)),
    )
    assert client_epochs(phased) == 10 * 10 * 1 + 20 * 40 * 2


@pytest.mark.parametrize(
    ("backend", "reason"),
    [
        ({"address": "auto"}, "backend.address is 'auto' (a Ray cluster)"),
        ({"gpus_per_host": 0.5}, "backend.gpus_per_host is 0.5 (GPUs reserved on Ray)"),
        ({"keep_warm": True}, "backend.keep_warm keeps Ray's hosts for the next run"),
    ],
)
def test_clusters_gpus_and_warm_hosts_take_ray_whatever_the_size(backend: dict[str, object], reason: str) -> None:
    choice = choose_backend(_cfg(rounds=1, clients=1, **backend))
    assert (choice.kind, choice.reason) == ("ray", reason)


def test_a_named_kind_is_kept() -> None:
    for kind in ("local", "ray"):
        cfg = _cfg(rounds=1000, kind=kind) if kind == "local" else _cfg(rounds=1, kind=kind)
        resolved, choice = resolve_backend(cfg)
        assert resolved is cfg and (choice.kind, choice.asked, choice.describe()) == (kind, kind, kind)
    resolved, _ = resolve_backend(_cfg())
    assert resolved.backend == dataclasses.replace(BackendConfig(), kind="local")


TINY = """\
name: auto-tiny
rounds: 2
clients_per_round: 4
output_dir: {out}
data: {{name: synthetic, partition: iid, num_clients: 8, synthetic_samples: 16}}
model: {{name: cnn, channels: [4, 8]}}
train: {{lr: 0.05, batch_size: 8}}
backend: {{processes: 1}}
"""


def test_the_choice_is_in_the_first_line_and_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "tiny.yaml"
    path.write_text(TINY.format(out=tmp_path / "runs"))
    assert main(["run", str(path)]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.endswith("backend local (auto: 8 client-epochs, below the 1,000 where Ray's start pays off)")
    run_dir = tmp_path / "runs" / "auto-tiny"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["backend"] == {
        "kind": "local",
        "asked": "auto",
        "reason": "8 client-epochs, below the 1,000 where Ray's start pays off",
    }
    assert "kind: local" in (run_dir / "config.yaml").read_text()
