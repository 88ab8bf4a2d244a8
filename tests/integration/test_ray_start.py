"""The Ray backend's start: actors created before the data exists, and kept warm across runs on request.

A run's hosts and shards are created as soon as Ray is up, so their processes start while the data set is still
being built (by ``prepare_run``, or by ``prestart`` before ``rayfl run`` imports the driver); with ``keep_warm`` a
finished run parks them, the next run with the same layout takes them (the same processes) and its hosts rebuild
themselves from that run's data and recipe, so its records are a cold run's, bit for bit; another layout gets new
actors, and ``release_warm_pool`` gives the parked ones back.
"""

from __future__ import annotations

import dataclasses
import gc
import os
import threading
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
import ray

import rayfl.data
from rayfl.config.sections import DataConfig
from rayfl.engine import build as build_module
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.engine.persist.records import HOST_CLOCK_FIELDS
from rayfl.engine.ray import pool as ray_pool
from rayfl.engine.ray.backend import release_warm_pool
from rayfl.engine.ray.placement import PoolLayout
from rayfl.engine.ray.session import prestart
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.methods.heterofl.config import HeteroFLConfig
from tests.helpers import tiny_config, tiny_image_dataset

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]

# measured per run (wall clock)
NOT_COMPARED = HOST_CLOCK_FIELDS


@pytest.fixture(autouse=True)
def _no_warm_pool_left() -> Iterator[None]:
    """Later tests share the session's Ray: give back whatever a test left parked."""
    yield
    release_warm_pool()


def _cfg(hosts: int = 2, **changes: Any) -> ExperimentConfig:
    cfg = tiny_config(kind="ray", num_hosts=hosts, cpus_per_host=0.25, keep_warm=True)
    return dataclasses.replace(cfg, rounds=2, **changes)


def _rows(result: RunResult) -> list[tuple[Any, ...]]:
    return [
        tuple("nan" if v != v else v for k, v in dataclasses.asdict(r).items() if k not in NOT_COMPARED)
        for r in result.records
    ]


def _pids(actors: list[Any]) -> list[int]:
    return [int(p) for p in ray.get([a.__ray_call__.remote(lambda _self: os.getpid()) for a in actors])]


def _parked() -> ray_pool.ActorPool:
    warm = ray_pool._warm
    assert warm is not None, "the run did not park its actors"
    return warm


def test_a_warm_pool_serves_the_next_runs_with_cold_records() -> None:
    """A, then B (another algorithm, seed and data set) and A again on A's actors: B's records are those of a cold
    B (the in-process backend, which Ray equals bit for bit), the second A's those of the first; the parked hosts
    hold no data set between runs."""
    a = _cfg()
    b = _cfg(seed=3, algorithm=HeteroFLConfig())
    data_a, data_b = tiny_image_dataset(), tiny_image_dataset(num_clients=10, seed=1)
    first = run_experiment(a, write=False, dataset=data_a)
    pool = _parked()
    pids = _pids([*pool.hosts, *pool.shards])
    held = ray.get([h.__ray_call__.remote(lambda host: hasattr(host, "dataset")) for h in pool.hosts])
    assert held == [False, False]  # parked: the run's data and models were dropped

    warm_b = run_experiment(b, write=False, dataset=data_b)
    assert _parked() is pool and _pids([*pool.hosts, *pool.shards]) == pids  # the same processes served B
    local = dataclasses.replace(b, backend=dataclasses.replace(b.backend, kind="local"))
    assert _rows(warm_b) == _rows(run_experiment(local, write=False, dataset=data_b))

    again = run_experiment(a, write=False, dataset=data_a)
    assert _pids([*pool.hosts, *pool.shards]) == pids
    assert _rows(again) == _rows(first) and again.final_eval == first.final_eval


def test_another_layout_gets_new_actors_and_release_gives_them_back() -> None:
    data = tiny_image_dataset()
    run_experiment(_cfg(hosts=2), write=False, dataset=data)
    two = [*_parked().hosts, *_parked().shards]
    run_experiment(_cfg(hosts=1), write=False, dataset=data)
    one = [*_parked().hosts, *_parked().shards]
    assert len(one) == 2
    for actor in two:  # the parked two-host pool was killed, not left behind
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.ready.remote(), timeout=60)
    assert release_warm_pool() and ray_pool._warm is None and not release_warm_pool()
    for actor in one:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.ready.remote(), timeout=60)


def _cold(cfg: ExperimentConfig) -> ExperimentConfig:
    return dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, keep_warm=False))


def test_without_keep_warm_a_run_leaves_no_actors(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: dict[str, Any] = {}
    take = ray_pool.take_pool

    def taking(backend_cfg: Any) -> ray_pool.ActorPool:
        pool = take(backend_cfg)
        seen["actors"] = [*pool.hosts, *pool.shards]
        return pool

    monkeypatch.setattr(ray_pool, "take_pool", taking)
    run_experiment(_cold(_cfg()), write=False, dataset=tiny_image_dataset())
    assert ray_pool._warm is None and len(seen["actors"]) == 3
    for actor in seen["actors"]:
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(actor.ready.remote(), timeout=60)


@ray.remote(num_cpus=0.25, max_restarts=-1)  # restartable, as hosts and shards are
class _Answering:
    def ready(self) -> int:
        return os.getpid()


def test_a_released_pool_refuses_calls_when_release_returns() -> None:
    """``ray.kill`` only sends the request, and a call right after it was answered by the old process in 16 of 120
    tries (Ray 2.60, 2 cores): ``release`` returns only once every actor is dead, so a run that ended has given its
    CPUs back. Eight pools of three make a pass without that wait unlikely (0.87^24, about 4%)."""
    for _ in range(8):
        actors = [_Answering.remote() for _ in range(3)]  # type: ignore[attr-defined]
        ray.get([a.ready.remote() for a in actors])
        pool = ray_pool.ActorPool(actors[:2], actors[2:], PoolLayout((), ()), None, False, ())
        pool.release()
        assert pool.hosts == [] and pool.shards == []
        for actor in actors:
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(actor.ready.remote(), timeout=60)


def test_hosts_start_while_the_data_is_being_prepared(monkeypatch: pytest.MonkeyPatch) -> None:
    """The data set's construction waits until the run's hosts exist and answer: it could not finish if the actors
    were only created once the data was ready."""
    seen: dict[str, Any] = {}
    created = threading.Event()
    take, build_setup = ray_pool.take_pool, build_module.build_setup

    def taking(backend_cfg: Any) -> ray_pool.ActorPool:
        seen["pool"] = take(backend_cfg)
        created.set()
        return seen["pool"]

    def slow_setup(*args: Any) -> Any:
        seen["created_first"] = created.wait(timeout=120)
        if seen["created_first"]:  # the hosts' processes are up (importing torch and rayfl) before the data
            seen["answered"] = ray.get([h.ready.remote() for h in seen["pool"].hosts], timeout=120)
        return build_setup(*args)

    monkeypatch.setattr(ray_pool, "take_pool", taking)
    monkeypatch.setattr(build_module, "build_setup", slow_setup)
    result = run_experiment(_cold(_cfg()), write=False, dataset=tiny_image_dataset())
    assert seen["created_first"] and seen["answered"] == [0, 1]
    assert len(result.records) == 2


def test_prestart_starts_the_actors_before_the_data_and_the_run_keeps_no_copy_of_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``rayfl run``'s start: the data set's loading waits until the prestarted hosts answer (it could not finish if
    they were created after it), the run takes those very actors and releases them at its end, and once the data set
    is in the object store the driver holds no reference to the loaded one."""
    seen: dict[str, Any] = {}
    load = rayfl.data.build_federated_dataset

    def slow_load(*args: Any) -> Any:
        for _ in range(1200):  # the actors are created once Ray is up and the imports are done
            if ray_pool._warm is not None:
                break
            threading.Event().wait(0.1)
        seen["hosts"] = list(ray_pool._warm.hosts) if ray_pool._warm is not None else []
        seen["answered"] = ray.get([h.ready.remote() for h in seen["hosts"]], timeout=120)
        return load(*args)

    monkeypatch.setattr(rayfl.data, "build_federated_dataset", slow_load)
    cfg = _cold(_cfg(data=DataConfig(name="synthetic", num_clients=8, synthetic_samples=16)))
    data = [prestart(cfg).dataset]
    assert seen["answered"] == [0, 1] and ray_pool._warm is not None and ray_pool._warm.hosts == seen["hosts"]
    loaded = weakref.ref(data[0])

    def check(record: Any) -> None:
        gc.collect()
        seen.setdefault("loaded_alive", []).append(loaded() is not None)

    result = run_experiment(cfg, write=False, dataset=data.pop(), callbacks=[check])
    assert len(result.records) == 2 and seen["loaded_alive"] == [False, False]
    assert ray_pool._warm is None  # taken by the run and, without keep_warm, released at its end
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(seen["hosts"][0].ready.remote(), timeout=60)
