"""The in-process backend on worker processes (``backend.processes``, ``engine/exec/workers.py``; issue 41, item 1):
the records are the same bits as with every host call in the driver, a resume from a checkpoint too, a bad value is
refused in one line, and no worker process outlives its run (nor an error, nor a worker that dies)."""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from rayfl.cli import EXIT_ACTORS_FAILED
from rayfl.config.sections import BackendConfig
from rayfl.core.errors import ConfigError
from rayfl.core.messages import Assignment, TrainTask
from rayfl.data.federated import FederatedDataset
from rayfl.engine.build import build_backend, build_setup
from rayfl.engine.driver import run_experiment
from rayfl.engine.exec.backend import LocalBackend, worker_count
from rayfl.engine.exec.workers import HostWorkers, WorkerLostError
from rayfl.experiment.loader import load_config
from rayfl.experiment.schema import ExperimentConfig
from tests.helpers import tiny_config, tiny_image_dataset, tiny_yaml
from tests.resume_cases import assert_same_run, case, case_names, keep_checkpoints_up_to


@pytest.fixture(scope="module")
def data() -> FederatedDataset:
    return tiny_image_dataset()


@pytest.fixture(scope="module", autouse=True)
def _ray_disconnected() -> Iterator[None]:
    """This module's runs fork worker processes, which a process connected to Ray refuses to do (``worker_count``): a
    Ray that an earlier test of this process started (the session's ``ray_local``) is stopped for the module and
    started again after it, as ``ray_local`` starts it."""
    import ray

    was = ray.is_initialized()
    if was:
        ray.shutdown()
    try:
        yield
    finally:
        if was and not ray.is_initialized():
            ray.init(num_cpus=2, include_dashboard=False, object_store_memory=512 << 20, log_to_driver=False)


def _with(cfg: ExperimentConfig, processes: int | str, out: Path, name: str) -> ExperimentConfig:
    return dataclasses.replace(
        cfg,
        name=name,
        output_dir=str(out),
        backend=dataclasses.replace(cfg.backend, processes=processes),  # type: ignore[arg-type]
    )


def _no_workers_left() -> None:
    """No worker process of this module's backends is alive (another test's backend, dropped without ``close``, may
    still hold its own until it is collected)."""
    assert [p for p in mp.active_children() if p.name.startswith("rayfl-host-worker") and p.pid in _STARTED] == []


_STARTED: set[int] = set()


@pytest.fixture(autouse=True)
def _started(monkeypatch: pytest.MonkeyPatch) -> None:
    """Note the pid of every worker process started in the test (``_no_workers_left`` checks those)."""
    from rayfl.engine.exec import workers

    init = workers.HostWorkers.__init__

    def noting(self: workers.HostWorkers, *args: object, **kwargs: object) -> None:
        init(self, *args, **kwargs)  # type: ignore[arg-type]
        _STARTED.update(self.pids)

    monkeypatch.setattr(workers.HostWorkers, "__init__", noting)


# fedavg with server momentum (plain rounds); fedrescue over padding links (per-client memories read and written
# every round); heterofl (sub-models, distillation on the driver); fedhen (every client's last upload kept and
# reduced by the hosts: the all-device model); every other registered method's tiny case as a slow test
QUICK = ("fedavg", "fedrescue", "heterofl", "fedhen")


@pytest.mark.parametrize(
    "name", [n if n in QUICK else pytest.param(n, marks=pytest.mark.slow) for n in sorted({*QUICK, *case_names()})]
)
def test_two_worker_processes_write_the_same_records_as_one(name: str, data: FederatedDataset, tmp_path: Path) -> None:
    cfg = case(name, data, rounds=3)
    one = run_experiment(_with(cfg, 1, tmp_path, "one"), dataset=data)
    started = len(_STARTED)
    two = run_experiment(_with(cfg, 2, tmp_path, "two"), dataset=data)
    assert len(_STARTED) == started + 2  # the second run did train on two workers
    assert one.run_dir is not None and two.run_dir is not None
    assert_same_run(one.run_dir, two.run_dir, one, two)
    _no_workers_left()


def test_a_resume_on_worker_processes_equals_the_uninterrupted_run(data: FederatedDataset, tmp_path: Path) -> None:
    """The uninterrupted run in the driver, the resumed copy on two workers (client memories come back from the
    checkpoint to the driver's store and go to the workers with their clients' calls)."""
    cfg = case("fedrescue", data, rounds=4)
    full = run_experiment(_with(cfg, 1, tmp_path, "full"), dataset=data)
    assert full.run_dir is not None
    copy = tmp_path / "resumed"
    shutil.copytree(full.run_dir, copy)
    keep_checkpoints_up_to(copy, 2)
    resumed = run_experiment(_with(cfg, 2, tmp_path, "full"), dataset=data, resume=copy)
    assert [r.round_idx for r in resumed.records] == list(range(cfg.rounds))
    assert_same_run(full.run_dir, copy, full, resumed)
    _no_workers_left()


def test_the_workers_hold_the_hosts_and_count_their_clients(data: FederatedDataset) -> None:
    cfg = dataclasses.replace(tiny_config(kind="local", num_hosts=3, processes=2), rounds=2)
    setup = build_setup(cfg, data)
    backend = build_backend(cfg, setup)
    try:
        assert isinstance(backend, LocalBackend) and backend.workers is not None
        assert backend.workers.hosts_of == [[0, 2], [1]]
        # pulled calls go round the workers first: three hosts on two workers, each worker trains half the calls
        assert [backend._host_for(i, (0, 1, 2)) for i in range(6)] == [0, 1, 2, 1, 0, 1]
        tasks = [TrainTask(client_id=c, round_idx=0, seed=1, lr=0.05, assignment=Assignment()) for c in range(12)]
        aggregate, outcomes = backend.train_and_reduce(tasks, setup.params)
        assert len(outcomes) == 12 and aggregate.num_clients == 12
        counts = backend.clients_per_host()
        assert sum(counts) == 12 and counts[0] + counts[2] == counts[1] == 6
        pids = backend.workers.pids
        assert len(pids) == 2 and os.getpid() not in pids
    finally:
        backend.close()
    for pid in pids:  # gone, not only unlisted
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    _no_workers_left()


def test_a_worker_that_dies_stops_the_run_with_one_line(data: FederatedDataset) -> None:
    cfg = tiny_config(kind="local", num_hosts=2, processes=2)
    setup = build_setup(cfg, data)
    backend = build_backend(cfg, setup)
    try:
        assert isinstance(backend, LocalBackend) and backend.workers is not None
        os.kill(backend.workers.pids[1], signal.SIGKILL)
        with pytest.raises(WorkerLostError) as err:
            backend.evaluate(setup.params)
        message = str(err.value)
        assert "\n" not in message
        assert message.startswith("in-process worker 1 (client hosts 1) died (killed by signal 9) while evaluating")
    finally:
        backend.close()
    _no_workers_left()


def test_an_error_in_a_worker_reaches_the_driver_and_leaves_no_worker(data: FederatedDataset) -> None:
    cfg = tiny_config(kind="local", num_hosts=2, processes=2)
    setup = build_setup(cfg, data)
    backend = build_backend(cfg, setup)
    try:
        assert isinstance(backend, LocalBackend)
        name = next(iter(setup.params))
        wrong = {**setup.params, name: torch.zeros(5, 7)}  # a tensor of the wrong shape: the host's copy raises
        with pytest.raises(RuntimeError, match="must match") as err:
            backend.evaluate(wrong)
        assert "raised in an in-process worker" in "".join(getattr(err.value, "__notes__", []))
        assert backend.evaluate(setup.params).num_samples == len(data.y_test)  # the workers still answer
    finally:
        backend.close()
    _no_workers_left()


def test_the_worker_count() -> None:
    auto = BackendConfig(kind="local", num_hosts=64, processes="auto")
    assert worker_count(auto, cuda_available=False) == (min(64, len(os.sched_getaffinity(0))), "")
    assert worker_count(BackendConfig(num_hosts=2, processes=8), cuda_available=False) == (2, "")  # one per host
    assert worker_count(BackendConfig(num_hosts=4, processes=0), cuda_available=False) == (1, "")
    on_cuda = BackendConfig(num_hosts=2, processes=2, device="cuda")
    assert worker_count(on_cuda, cuda_available=True)[0] == 1
    shared = BackendConfig(num_hosts=2, processes=2, gpus_per_host=0.5)
    assert worker_count(shared, cuda_available=True)[0] == 1
    assert worker_count(shared, cuda_available=False) == (2, "")  # no CUDA: the share trains on the CPU
    count, why = worker_count(BackendConfig(num_hosts=2, processes=2, torch_threads=2), cuda_available=False)
    assert count == 1 and "torch_threads" in why


def test_a_process_connected_to_ray_forks_no_workers(data: FederatedDataset) -> None:
    """Ray's own rule (its "forking new processes in application code" anti-pattern): a forked child shares the
    parent's Ray connections without synchronisation. Connected, the backend keeps the calls in the driver and says
    why; once Ray is stopped it forks again."""
    import ray

    asked = BackendConfig(kind="local", num_hosts=2, processes=2)
    ray.init(num_cpus=1, include_dashboard=False, object_store_memory=128 << 20, log_to_driver=False)
    try:
        count, why = worker_count(asked, cuda_available=False)
        assert count == 1 and "Ray is connected" in why, (count, why)
        cfg = dataclasses.replace(tiny_config(kind="local", num_hosts=2, processes=2), rounds=1)
        backend = build_backend(cfg, build_setup(cfg, data))
        try:
            assert isinstance(backend, LocalBackend) and backend.workers is None
        finally:
            backend.close()
    finally:
        ray.shutdown()
    assert worker_count(asked, cuda_available=False) == (2, "")


def test_garbage_the_driver_left_is_freed_in_the_driver_not_in_a_forked_worker(tmp_path: Path) -> None:
    """An object the driver dropped in a reference cycle (say, a Ray object reference of an earlier run) is collected
    before the fork, in the driver; a worker that collects its own garbage never frees the driver's objects."""
    freed = tmp_path / "freed"
    freed.mkdir()

    class Cycle:
        def __init__(self) -> None:
            self.me = self

        def __del__(self) -> None:
            (freed / str(os.getpid())).touch()

    def build(host: int) -> object:
        gc.collect()  # a worker's own collection, as training's allocations trigger
        return object()

    gc.disable()  # the cycle waits for the collector, as garbage does between two of its runs
    try:
        Cycle()
        workers = HostWorkers(2, 2, build)
        workers.close()
    finally:
        gc.enable()
    gc.collect()
    assert sorted(p.name for p in freed.iterdir()) == [str(os.getpid())], "freed in a forked worker, not the driver"


def _load(tmp_path: Path, processes: str) -> ExperimentConfig:
    text = tiny_yaml("p", 1).format(out=tmp_path).replace("num_hosts: 1}", f"num_hosts: 2, processes: {processes}}}")
    path = tmp_path / "p.yaml"
    path.write_text(text)
    return load_config(path)


@pytest.mark.parametrize("bad", ["-1", "two", "1.5", "true", "[2]"])
def test_a_bad_process_count_is_refused_in_one_line(bad: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        _load(tmp_path, bad)
    message = str(err.value)
    assert "backend.processes" in message and "\n" not in message.strip(), message


def test_auto_and_counts_load(tmp_path: Path) -> None:
    assert _load(tmp_path, "auto").backend.processes == "auto"
    assert _load(tmp_path, "3").backend.processes == 3
    assert _load(tmp_path, "0").backend.processes == 0


def test_the_cli_run_on_workers_leaves_no_process(tmp_path: Path) -> None:
    """A whole run from the command line's entry point, on two workers: finished, and nothing left running."""
    from rayfl.cli import main

    path = tmp_path / "run.yaml"
    text = tiny_yaml("cli", 2).format(out=tmp_path).replace("num_hosts: 1}", "num_hosts: 2, processes: 2}")
    path.write_text(text)
    started = len(_STARTED)
    assert main(["run", str(path)]) == 0
    assert len(_STARTED) == started + 2
    assert (tmp_path / "cli" / "rounds.csv").exists()
    _no_workers_left()


def load_factor() -> float:
    """How much slower than idle this machine runs now (as ``tests/integration/test_faults.py``'s, without its
    imports of Ray): the waits below scale with it."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


def _children(pid: int) -> list[int]:
    """The processes whose parent is ``pid`` (from ``/proc``)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _gone(pids: list[int], within_s: float) -> bool:
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{p}").exists() and "(Z)" not in _state(p) for p in pids):
            return True
        time.sleep(0.2)
    return False


def _state(pid: int) -> str:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return "(Z)"
    return f"({stat.rsplit(')', 1)[1].split()[0]})"


@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
@pytest.mark.parametrize("how", ["sigint", "sigkill", "worker"])
def test_no_worker_outlives_a_stopped_or_killed_driver(how: str, tmp_path: Path) -> None:
    """A command-line run on two workers, stopped by Ctrl-C (it ends after the round, with its records), killed
    outright (nothing of the driver runs), or losing a worker (one line: which worker died, how, and where to resume
    from): its worker processes are gone soon after, none left orphaned."""
    root = Path(__file__).resolve().parents[3]
    path = tmp_path / "run.yaml"
    text = tiny_yaml("stop", 50).format(out=tmp_path).replace("num_hosts: 1}", "num_hosts: 2, processes: 2}")
    text += "checkpoint: {every: 1}\n"
    path.write_text(text)
    env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "rayfl.cli", "run", str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=root,
    )
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith("round    1/"):
                break
        workers = _children(proc.pid)
        assert len(workers) == 2, workers
        if how == "worker":
            os.kill(workers[1], signal.SIGKILL)
        else:
            proc.send_signal(signal.SIGINT if how == "sigint" else signal.SIGKILL)
        _, err = proc.communicate(timeout=120 * load_factor())
        assert _gone(workers, 15 * load_factor()), [(p, _state(p)) for p in workers]
        if how == "sigint":
            assert proc.returncode == 128 + signal.SIGINT and "stopped after round" in err, (proc.returncode, err)
            assert (tmp_path / "stop" / "rounds.csv").exists()
        if how == "worker":
            assert proc.returncode == EXIT_ACTORS_FAILED, (proc.returncode, err)
            last = err.strip().splitlines()[-1]
            assert re.fullmatch(
                r"rayfl: error: in-process worker \d \(client hosts \d\) died \(killed by signal 9\) .*"
                r"; resume from its checkpoint after round \d+ .*: rayfl run --resume .*",
                last,
            ), err
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
