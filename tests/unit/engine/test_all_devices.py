"""The all-device model (``eval_all_devices``; paper 001's reporting models): the algorithm's reducer over every
client's last upload that reached the server, on hand tensors (FedHeN and Decouple), what a client keeps after a
good, a failed and a later round, and whole runs (every client active: the all-device model is the global one)."""

from __future__ import annotations

import csv
import dataclasses
import math

import numpy as np
import pytest
import torch

from rayfl.core.messages import ClientUpdate, ServerState, TrainTask
from rayfl.engine.build import bind_algorithm, build_backend, build_clock, build_setup
from rayfl.engine.driver import run_experiment
from rayfl.engine.exec.backend import LocalBackend, uploads_by_host
from rayfl.engine.exec.client_state import ClientMemory, KeptUpload, memory_bytes
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.common.multimodel import model_key
from rayfl.fl.methods.fedhen.config import DecoupleConfig, FedHeNConfig
from rayfl.models import InputSpec, build_model
from rayfl.models.elastic.spec import first_k
from tests.helpers import tiny_image_dataset
from tests.unit.fl.test_fedhen import MODEL, NUM_CLIENTS, constant_update, family, fedhen_config, nan_dataset

SPEC = InputSpec("image", 4, (3, 8, 8))


pytestmark = pytest.mark.usefixtures("private_cache_one_thread")


def _config(algorithm: object = None, **kw: object) -> ExperimentConfig:
    return dataclasses.replace(fedhen_config(algorithm, **kw), eval_all_devices=True)  # type: ignore[arg-type]


def _backends(cfg: ExperimentConfig, hosts: tuple[int, ...] = (2,)) -> tuple[list[LocalBackend], dict, object]:
    """In-process backends of ``cfg`` with each number of ``hosts`` (two shards), on one set-up."""
    setup = build_setup(cfg, tiny_image_dataset(NUM_CLIENTS))
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    backends = []
    for n in hosts:
        layout = dataclasses.replace(cfg.backend, num_hosts=n, num_shards=2)
        backend = build_backend(dataclasses.replace(cfg, backend=layout), setup)
        assert isinstance(backend, LocalBackend)
        backends.append(backend)
    return backends, setup.algorithm.init_state(setup.params).params, setup.algorithm


def _kept(update: ClientUpdate) -> ClientMemory:
    return ClientMemory(upload=KeptUpload.of(update))


def test_fedhen_all_device_model_on_hand_tensors() -> None:
    """Kept uploads: simple devices 0, 1, 2 at 1, 2, 3 and complex devices 7, 8 at 4 and 10; device 5 never trained
    (no memory) and device 4 keeps only padding parameters (no upload). The simple part M is the unweighted mean over
    all five devices, (1 + 2 + 3 + 4 + 10) / 5 = 4, the rest M' the mean over the complex ones, (4 + 10) / 2 = 7,
    on 1, 2 or 3 hosts alike; ``num_clients`` counts the five uploads. The global parameters (-3) are untouched."""
    fam = family()
    simple_units, complex_units = fam.side_exit_units(), fam.full_units
    shared = set(fam.slices(first_k(simple_units)))
    memories: dict[int, object] = {c: _kept(constant_update(fam, simple_units, float(c + 1), c)) for c in (0, 1, 2)} | {
        7: _kept(constant_update(fam, complex_units, 4.0, 7)),
        8: _kept(constant_update(fam, complex_units, 10.0, 8)),
    }
    memories[4] = ClientMemory(params={"conv1.weight": np.zeros((4, 3, 3, 3), dtype=np.float32)})
    backends, params, _ = _backends(_config(), hosts=(1, 2, 3))
    for backend in backends:
        previous = {k: torch.full_like(v, -3.0) for k, v in params.items()}
        backend.load_client_states(memories)
        aggregate = backend.reduce_uploads(previous)
        assert aggregate.num_clients == 5
        assert shared and set(aggregate.params) - shared
        for name, tensor in aggregate.params.items():
            assert torch.all(tensor == (4.0 if name in shared else 7.0)), (backend.num_hosts, name)
        assert all(torch.all(v == -3.0) for v in previous.values())


def test_decouple_all_device_models_are_two_means_over_all_devices() -> None:
    """Decouple's kept uploads name their model (``m1/`` for the simple model): simple devices at 1, 2, 6, complex
    ones at 4 and 10 give a simple model of 3 and a complex model of 7 everywhere; with only simple uploads the complex
    model keeps the global values (-3)."""
    (backend,), params, _ = _backends(_config(DecoupleConfig()))
    previous = {k: torch.full_like(v, -3.0) for k, v in params.items()}
    simple_cfg = dataclasses.replace(MODEL, exit_only=True)

    def upload(model_id: int, value: float, client_id: int) -> ClientMemory:
        model = build_model(simple_cfg if model_id else MODEL, SPEC)
        values = {model_key(model_id, k): torch.full_like(v, value) for k, v in model.state_dict().items()}
        return _kept(ClientUpdate(client_id, 1.0, values, {}, 5, 0.0, 1))

    simple = {0: upload(1, 1.0, 0), 1: upload(1, 2.0, 1), 3: upload(1, 6.0, 3)}
    backend.load_client_states({**simple, 6: upload(0, 4.0, 6), 9: upload(0, 10.0, 9)})
    both = backend.reduce_uploads(previous)
    assert "conv1.weight" in both.params and "m1/conv1.weight" in both.params
    for name, tensor in both.params.items():
        assert torch.all(tensor == (3.0 if name.startswith("m1/") else 7.0)), name
    backend.load_client_states(dict(simple))
    only_simple = backend.reduce_uploads(previous)
    for name, tensor in only_simple.params.items():
        assert torch.all(tensor == (3.0 if name.startswith("m1/") else -3.0)), name


def test_a_client_keeps_its_last_upload_and_a_failed_round_keeps_the_one_before() -> None:
    """Round 0: clients 2 and 9 train; each keeps exactly the update the server averaged (one client alone: the
    round's mean is its update). Round 1 on data where client 9's images are NaN: its update is dropped (``nan_update``)
    and it keeps its round-0 upload, while client 2's is replaced by its round-1 update."""
    cfg = _config()
    setup = build_setup(cfg, tiny_image_dataset(NUM_CLIENTS))
    bind_algorithm(cfg, setup, build_clock(cfg, setup))
    fam = family()
    complex_ = fam.assignment(first_k(fam.full_units))
    simple = fam.assignment(first_k(fam.side_exit_units()))
    backend = build_backend(cfg, setup)
    assert isinstance(backend, LocalBackend)

    def task(c: int, round_idx: int) -> TrainTask:
        return TrainTask(
            client_id=c,
            round_idx=round_idx,
            seed=cfg.seed,
            lr=0.05,
            assignment=simple if c < 6 else complex_,
            keep_upload=True,
        )

    alone = {}
    for c in (2, 9):
        aggregate, _ = backend.train_and_reduce([task(c, 0)], setup.params)
        alone[c] = aggregate.params
    kept0 = backend.client_states()
    assert set(kept0) == {2, 9}
    for c, memory in kept0.items():
        assert isinstance(memory, ClientMemory) and memory.upload is not None and memory.params is None
        assert memory_bytes(memory) == sum(v.nbytes for v in memory.upload.values.values())
        slices = memory.upload.slices
        for name, value in memory.upload.values.items():
            index = slices[name].torch_index(tuple(setup.params[name].shape)) if name in slices else ...
            assert torch.equal(torch.from_numpy(value), alone[c][name][index]), (c, name)
    assert set(kept0[2].upload.values) < set(kept0[9].upload.values)  # type: ignore[union-attr]

    nan_cfg = dataclasses.replace(cfg, name="nan")
    nan_setup = build_setup(nan_cfg, nan_dataset(bad_client=9))
    bind_algorithm(nan_cfg, nan_setup, build_clock(nan_cfg, nan_setup))
    nan_backend = build_backend(nan_cfg, nan_setup)
    nan_backend.load_client_states(kept0)
    _, outcomes = nan_backend.train_and_reduce([task(2, 1), task(9, 1)], setup.params)
    assert [o.failure for o in outcomes] == [None, "nan_update"]
    kept1 = nan_backend.client_states()
    assert kept1[9] is kept0[9]
    before, after = kept0[2].upload, kept1[2].upload  # type: ignore[union-attr]
    assert after is not None and before is not None and after.values.keys() == before.values.keys()
    assert any(not np.array_equal(after.values[k], before.values[k]) for k in after.values)


def test_uploads_are_dealt_to_hosts_in_runs_of_client_ids() -> None:
    handles = [(c, f"m{c}") for c in (0, 3, 4, 7, 9)]
    assert uploads_by_host(handles, 2) == [["m0", "m3"], ["m4", "m7", "m9"]]
    assert uploads_by_host(handles, 1) == [["m0", "m3", "m4", "m7", "m9"]]
    assert uploads_by_host([], 3) == [[], [], []]


# ----------------------------------------------------------------------------------------------------- whole runs
@pytest.mark.parametrize("algorithm", [FedHeNConfig(), DecoupleConfig()])
def test_with_every_device_active_the_all_device_model_is_the_global_model(tmp_path, algorithm) -> None:  # type: ignore[no-untyped-def]
    """All 12 devices train every round, so every kept upload is from the round just finished and the all-device model
    is the round's mean, i.e. the global model: its accuracy, loss, simple model and device average equal the global
    ones, bit for bit. Recorded in rounds.csv and as ``all_devices/simple`` rows of evals.csv."""
    cfg = dataclasses.replace(_config(algorithm), clients_per_round=NUM_CLIENTS, output_dir=str(tmp_path))
    result = run_experiment(cfg, write=True, dataset=tiny_image_dataset(NUM_CLIENTS))
    assert [(e.round_idx, e.name) for e in result.evals] == [
        (0, "simple"),
        (0, "all_devices/simple"),
        (1, "simple"),
        (1, "all_devices/simple"),
    ]
    for record in result.records:
        assert record.clients_run == NUM_CLIENTS and record.clients_failed == 0
        assert (record.all_devices_acc, record.all_devices_loss) == (record.test_acc, record.test_loss)
        assert record.all_devices_device_acc == record.device_acc
        simple, all_simple = (e for e in result.evals if e.round_idx == record.round_idx)
        assert (all_simple.test_acc, all_simple.test_loss) == (simple.test_acc, simple.test_loss)
    assert result.run_dir is not None
    rows = list(csv.DictReader((result.run_dir / "rounds.csv").open()))
    assert [float(r["all_devices_acc"]) for r in rows] == [r.all_devices_acc for r in result.records]


def test_with_some_devices_active_the_all_device_model_differs_and_is_off_by_default() -> None:
    """Four of twelve devices a round: after round 1 the all-device model averages round 0's devices too, so it is not
    the global model; without ``eval_all_devices`` no client keeps an upload and the columns stay NaN."""
    ds = tiny_image_dataset(NUM_CLIENTS)
    on = run_experiment(_config(rounds=2), write=False, dataset=ds)
    assert all(math.isfinite(r.all_devices_acc) for r in on.records)
    assert any(r.all_devices_loss != r.test_loss for r in on.records[1:])
    off = run_experiment(fedhen_config(rounds=2), write=False, dataset=ds)
    assert all(math.isnan(r.all_devices_acc) and math.isnan(r.all_devices_device_acc) for r in off.records)
    assert {e.name for e in off.evals} == {"simple"}
    for a, b in zip(on.records, off.records, strict=True):  # reporting only: training is unchanged
        assert (a.train_loss, a.test_acc, a.test_loss, a.device_acc) == (
            b.train_loss,
            b.test_acc,
            b.test_loss,
            b.device_acc,
        )
    assert isinstance(on.state, ServerState) and all(
        torch.equal(on.state.params[k], v) for k, v in off.state.params.items()
    )
