"""FedAvg on the smallest and on the largest model (paper 000's "Smallest" / "Largest" baselines), end to end."""

from __future__ import annotations

import csv
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from rayfl.config.model import ResNetConfig
from rayfl.config.sections import ResourceConfig, SystemConfig, TrainConfig
from rayfl.core.errors import ConfigError
from rayfl.core.messages import ClientView, ServerState
from rayfl.engine.build import build_backend, build_setup
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.methods.fedavg.algorithm import FedAvg
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.models import InputSpec, to_input
from rayfl.models.elastic.resnet import ResNetFamily
from rayfl.models.elastic.spec import first_k
from rayfl.models.families import build_family
from tests.helpers import tiny_config, tiny_image_dataset

# the tiny CNN (channels 8, 16) needs 0.047 MiB to train and moves 11680 bytes (down + up) in full; with S = (0,
# 0.25, 1) its smallest structure (2, 4) needs 0.014 MiB and 1216 bytes, the next smallest ones (2, 16) 0.021 MiB and
# 3424 bytes, (8, 4) 0.036 MiB and 4288 bytes
S = (0.0, 0.25, 1.0)
ONLY_SMALLEST_FITS = SystemConfig(
    memory=ResourceConfig(source="uniform", low=0.015, high=0.021),  # MiB
    bandwidth_down=ResourceConfig(source="uniform", low=0.0002, high=0.0004),  # Mbit/s: 1500-3000 bytes in 60 s
)


def _cfg(tmp_path: Path, algorithm: FedAvgConfig, system: SystemConfig | None = None, **kw: object) -> ExperimentConfig:
    return dataclasses.replace(
        tiny_config(kind="local"),
        algorithm=algorithm,
        system=system or SystemConfig(),
        output_dir=str(tmp_path),
        name="run",
        **kw,  # type: ignore[arg-type]
    )


def _clients(run: RunResult) -> list[dict[str, str]]:
    assert run.run_dir is not None
    with (run.run_dir / "clients.csv").open() as f:
        return list(csv.DictReader(f))


def test_smallest_structure_takes_the_smallest_allowed_ratio_per_dimension() -> None:
    ds = tiny_image_dataset()
    spec = InputSpec.of(ds.input_kind, ds.num_classes, ds.x, ds.meta)
    family = ResNetFamily(ResNetConfig(depth=18, widths=(8, 16, 32, 64)))
    space = family.space
    assert space.skippable.any() and not space.skippable.all()
    train = TrainConfig()
    with_zero = FedAvg(FedAvgConfig(model="smallest", ratios=(0.0, 0.25, 1.0)), train)
    with_zero.bind_client(family, spec)
    assert with_zero.smallest_units() == space.units([0.0 if skip else 0.25 for skip in space.skippable])
    no_zero = FedAvg(FedAvgConfig(model="smallest", ratios=(1.0, 0.5)), train)
    no_zero.bind_client(family, spec)
    assert no_zero.smallest_units() == space.units([0.5] * len(space.dims))
    # every client gets that structure, first-k, with the budgets setting
    views = [ClientView(c, 10, 1.0, 1.0) for c in (3, 1, 7)]
    state = ServerState(params={})
    assignments = with_zero.assign(state, 0, views)
    assert set(assignments) == {3, 1, 7}
    for a in assignments.values():
        assert a.units == with_zero.smallest_units() and a.enforce_budgets
        expected = family.slices(first_k(with_zero.smallest_units()))
        assert set(a.slices) == set(expected) and a.skip == frozenset(space.layouts) - set(expected)
        for name, tslice in expected.items():
            got = a.slices[name].index
            assert all(
                np.array_equal(g, e) if e is not None else g is None for g, e in zip(got, tslice.index, strict=True)
            )
    assert with_zero.eval_units(state) == with_zero.smallest_units()
    largest = FedAvg(FedAvgConfig(budgets="ignore"), train)
    assert all(a.units is None and not a.enforce_budgets for a in largest.assign(state, 0, views).values())
    assert largest.eval_units(state) is None


def test_smallest_blocks_names_the_smallest_model_block_by_block() -> None:
    """``smallest_blocks`` keeps the first blocks of each stage at the smallest positive ratio (paper 000's named
    smallest models: ViT-tiny-tiny is ``[1]``), where S's own smallest structure would remove every skippable block."""
    ds = tiny_image_dataset()
    spec = InputSpec.of(ds.input_kind, ds.num_classes, ds.x, ds.meta)
    family = ResNetFamily(ResNetConfig(depth=34, widths=(8, 16, 32, 64)))
    train = TrainConfig()
    named = FedAvg(FedAvgConfig(model="smallest", ratios=(0.0, 0.5, 1.0), smallest_blocks=(2, 2, 2, 2)), train)
    named.bind_client(family, spec)
    own = FedAvg(FedAvgConfig(model="smallest", ratios=(0.0, 0.5, 1.0)), train)
    own.bind_client(family, spec)
    units = named.smallest_units()
    # every width at 0.5 (the smallest positive ratio); of ResNet34's 3, 4, 6, 3 blocks the first two of each stage stay
    expected = list(family.space.units([0.5] * len(family.space.dims)))
    removed = 0
    for stage in family.stage_blocks():
        for dims in stage[2:]:
            for d in dims:
                if family.space.dims[d].skippable:
                    expected[d] = 0
                    removed += 1
    assert removed == 1 + 2 + 4 + 1 and units == tuple(expected)
    assert units != own.smallest_units()  # S's own smallest structure removes every skippable block
    assert named.eval_units(ServerState(params={})) == units


def _accuracy_of_sub_model(run: RunResult, cfg: ExperimentConfig, units: tuple[int, ...]) -> tuple[float, float]:
    """Test accuracy and mean loss of the first-k sub-model, computed by hand."""
    ds = tiny_image_dataset()
    spec = InputSpec.of(ds.input_kind, ds.num_classes, ds.x, ds.meta)
    model = build_family(cfg.model, spec).extract(run.state.params, first_k(units)).eval()
    with torch.no_grad():
        logits = model(to_input(ds.x_test, spec))
    labels = torch.from_numpy(np.asarray(ds.y_test, dtype=np.int64))
    loss = float(nn.functional.cross_entropy(logits, labels))
    return float((logits.argmax(1) == labels).double().mean()), loss


def test_fedavg_smallest_trains_and_evaluates_the_smallest_model(tmp_path: Path) -> None:
    algo = FedAvgConfig(model="smallest", ratios=S)
    cfg = _cfg(tmp_path, algo, ONLY_SMALLEST_FITS, rounds=4)
    run = run_experiment(cfg, write=True, dataset=tiny_image_dataset())
    units = (2, 4)
    rows = _clients(run)
    assert len(rows) == 4 * 5 and {r["units"] for r in rows} == {"2 4"}
    assert all(r["failure"] == "" and r["over_budget"] == "" for r in rows)
    assert all(float(r["memory_need_mib"]) < float(r["memory_budget_mib"]) for r in rows)
    assert all(float(r["bandwidth_need_mb"]) < float(r["bandwidth_budget_mb"]) for r in rows)
    assert all(r.clients_failed == 0 and r.clients_run == 5 for r in run.records)
    # the evaluated model is the trained sub-model ...
    acc, loss = _accuracy_of_sub_model(run, cfg, units)
    assert run.final_eval.accuracy == pytest.approx(acc, abs=1e-12)
    assert run.final_eval.loss == pytest.approx(loss, rel=1e-5)
    # ... not the full network, whose other weights never trained
    setup = build_setup(cfg, tiny_image_dataset())
    backend = build_backend(cfg, setup)
    full = backend.evaluate(run.state.params)
    sub = backend.evaluate(run.state.params, units)
    assert sub == run.final_eval
    assert full.accuracy != sub.accuracy and full.loss != sub.loss
    # outside the smallest structure the global tensors are still the initial ones
    family = build_family(cfg.model, setup.input_spec)
    for name, tslice in family.slices(first_k(units)).items():
        init, final = setup.params[name], run.state.params[name]
        covered = torch.zeros_like(init, dtype=torch.bool)
        covered[tslice.torch_index(tuple(init.shape))] = True
        assert torch.equal(init[~covered], final[~covered]), name
        assert not torch.equal(init[covered], final[covered]), name
    # with the full model, or the smallest structure of S = (0.5, 1), under the same budgets every client fails:
    # the full model is refused before the run (no client can ever train it, engine/preflight.py); the larger
    # smallest structure (a sub-model method's, not checked at start) runs with every client failing
    with pytest.raises(ConfigError, match="no client can ever train"):
        full = dataclasses.replace(cfg, algorithm=FedAvgConfig(), rounds=1)
        run_experiment(full, write=False, dataset=tiny_image_dataset())
    other = FedAvgConfig(model="smallest", ratios=(0.5, 1.0))
    failing = run_experiment(
        dataclasses.replace(cfg, algorithm=other, rounds=1), write=False, dataset=tiny_image_dataset()
    )
    assert failing.records[0].clients_failed == 5
    assert failing.records[0].failed_memory + failing.records[0].failed_bandwidth == 5


def test_fedavg_largest_ignoring_budgets_runs_everyone_and_records_over_budget(tmp_path: Path) -> None:
    tight = SystemConfig(
        memory=ResourceConfig(source="uniform", low=0.03, high=0.06),  # MiB: about half the clients fit
        bandwidth_down=ResourceConfig(source="uniform", low=0.0012, high=0.0025),  # Mbit/s: 9000-18750 B in 60 s
    )
    ignore = run_experiment(
        _cfg(tmp_path / "ignore", FedAvgConfig(budgets="ignore"), tight), write=True, dataset=tiny_image_dataset()
    )
    free = run_experiment(_cfg(tmp_path / "free", FedAvgConfig()), write=False, dataset=tiny_image_dataset())
    enforce = run_experiment(
        _cfg(tmp_path / "enforce", FedAvgConfig(), tight), write=False, dataset=tiny_image_dataset()
    )
    for r in ignore.records:
        assert r.failed_memory == r.failed_bandwidth == r.failed_memory_dip == r.clients_failed == 0
        assert r.clients_run == 5
    assert sum(r.over_budget for r in ignore.records) > 0
    causes = {row["over_budget"] for row in _clients(ignore)}
    assert {"memory", "bandwidth"} <= causes  # both budgets are broken by someone, and recorded
    assert all(row["failure"] == "" for row in _clients(ignore))
    # running over budget changes nothing in the training: the same model as an unconstrained run
    for name, value in free.state.params.items():
        assert torch.equal(value, ignore.state.params[name]), name
    assert ignore.final_eval == free.final_eval
    # while enforcing the same budgets fails clients and changes the model
    assert sum(r.clients_failed for r in enforce.records) > 0
    assert any(not torch.equal(free.state.params[n], enforce.state.params[n]) for n in free.state.params)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_local")
def test_sub_model_evaluation_is_the_same_on_ray_and_in_process(tmp_path: Path) -> None:
    cfg = _cfg(tmp_path, FedAvgConfig(model="smallest"), rounds=1)
    local = run_experiment(cfg, write=False, dataset=tiny_image_dataset())
    ray_cfg = dataclasses.replace(
        cfg, backend=dataclasses.replace(cfg.backend, kind="ray", num_hosts=2, cpus_per_host=0.25)
    )
    remote = run_experiment(ray_cfg, write=False, dataset=tiny_image_dataset())
    assert local.final_eval == remote.final_eval
    for name, value in local.state.params.items():
        assert torch.equal(value, remote.state.params[name]), name


def test_smallest_blocks_the_model_cannot_hold_stop_the_run_before_round_0_naming_the_key(tmp_path: Path) -> None:
    """A ``smallest_blocks`` that does not fit the model (the tiny CNN has one stage) is one located line at the
    start of the run, before anything is written, not a traceback from inside round 0."""
    cfg = _cfg(tmp_path, FedAvgConfig(model="smallest", ratios=S, smallest_blocks=(1, 1)))
    with pytest.raises(ConfigError, match=r"algorithm\.smallest_blocks: blocks needs one count per stage"):
        run_experiment(cfg, write=True, dataset=tiny_image_dataset())
    assert not any(tmp_path.iterdir())
