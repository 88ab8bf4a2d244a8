"""Dead Ray actors replaced (issue 12, item 2): real ``ClientHost`` and ``ParamServerShard`` processes are SIGKILLed
mid-run, and the run completes with the same records (every deterministic column), evaluations and final weights as
an undisturbed run, with the failures counted in ``faults``; a host that keeps dying ends the run with one clear line.

Timing is made deterministic without touching the engine: the test's algorithm (or shard class) calls ``Pause.at`` at
one chosen point (a client's training in a round, a host's first evaluation, a shard's second reduction); the first
process to get there writes its pid to a file and waits; the test reads that pid, checks it is one of the backend's
actor processes (their pids asked from the actors at start-up), and SIGKILLs it while the call is in flight. The
replacement reaches the same point, finds the slot taken and goes on, so it computes exactly what the dead one would
have. The undisturbed run is the in-process backend, which the Ray backend equals bit for bit
(``test_backend_equivalence.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import os
import re
import signal
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
import torch
from torch import nn

from rayfl.config.sections import SystemConfig
from rayfl.core.messages import Assignment, ClientUpdate, ClientView
from rayfl.core.partials import ArrayPartial, NumpyParams, Reduced
from rayfl.data.federated import FederatedDataset
from rayfl.engine import build as build_module
from rayfl.engine.driver import RunResult, run_experiment
from rayfl.engine.exec.param_server import ParamServerShard
from rayfl.engine.persist.records import HOST_CLOCK_FIELDS, RoundRecord
from rayfl.engine.ray import pool as ray_pool_module
from rayfl.engine.ray import state_stores as state_stores_module
from rayfl.engine.ray.recovery import ActorFailureError, StateLostError
from rayfl.engine.ray.state_stores import StateStore
from rayfl.engine.sampling import sample_clients
from rayfl.experiment.loader import load_config
from rayfl.experiment.schema import ExperimentConfig
from rayfl.fl.api.client import ClientContext
from rayfl.fl.methods.fedavg.algorithm import FedAvg
from rayfl.fl.methods.fedavg.config import FedAvgConfig
from rayfl.fl.methods.fedrescue.algorithm import FedResCuE
from tests.helpers import tiny_config, tiny_image_dataset

pytestmark = [pytest.mark.ray, pytest.mark.usefixtures("ray_local")]

REPO = Path(__file__).resolve().parents[2]
# measured per run (wall clock), or the count under test
NOT_COMPARED = HOST_CLOCK_FIELDS | {"faults"}
KILL_TIMEOUT_S = 120.0


@dataclasses.dataclass(frozen=True)
class Pause:
    """The first ``times`` processes to call ``at`` each claim a slot, write their pid to ``label.N.pid`` and wait to
    be killed; later calls (the replacements) go straight on."""

    directory: str
    label: str
    times: int = 1

    def at(self) -> None:
        for n in range(self.times):
            claim = Path(self.directory) / f"{self.label}.{n}.claim"
            try:
                os.close(os.open(claim, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                continue
            tmp = claim.with_suffix(".tmp")
            tmp.write_text(str(os.getpid()))
            tmp.rename(claim.with_suffix(".pid"))
            self.wait()
            raise RuntimeError(f"{self.label}: pid {os.getpid()} was not killed")

    def wait(self) -> None:
        time.sleep(KILL_TIMEOUT_S)


@dataclasses.dataclass(frozen=True)
class BlockedRead(Pause):
    """A ``Pause`` whose paused process blocks in the kernel instead, in the open of a FIFO (``label.fifo``, made by
    the test) that nobody writes: the interpreter lock is released, as in a read on a dead mount, so the process goes
    on answering pings. Should nothing kill it, ``release_fifo`` (``KILL_TIMEOUT_S`` later) lets it go on to fail."""

    def wait(self) -> None:
        with open(Path(self.directory) / f"{self.label}.fifo", "rb") as fifo:
            fifo.read()


def release_fifo(path: Path) -> threading.Timer:
    """Make the FIFO ``path`` and, after ``KILL_TIMEOUT_S``, open it for writing once (releasing a ``BlockedRead``
    that nothing killed, so that the test fails instead of hanging); cancel the returned timer at the end."""
    os.mkfifo(path)

    def release() -> None:
        with contextlib.suppress(OSError):  # ENXIO: no reader left, as it should be
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))

    timer = threading.Timer(KILL_TIMEOUT_S, release)
    timer.daemon = True
    timer.start()
    return timer


def load_factor() -> float:
    """How much slower than idle this machine runs now (the last minute's load per core, at least 1): the watchdog
    tests' timeouts and time limits scale with it, since other work may share the cores."""
    return max(1.0, os.getloadavg()[0] / (os.cpu_count() or 1))


class PausingFedAvg(FedAvg):
    """FedAvg that pauses where the test kills: a client's training in a round, a host's first evaluation."""

    train_pause: Pause | None = None
    train_at: tuple[int, int] = (-1, -1)  # (round, client)
    eval_pause: Pause | None = None

    def local_train(self, ctx: ClientContext, x: np.ndarray, y: np.ndarray) -> ClientUpdate:
        if self.train_pause is not None and (ctx.task.round_idx, ctx.task.client_id) == self.train_at:
            self.train_pause.at()
        return super().local_train(ctx, x, y)

    def eval_model(self) -> nn.Module | None:
        if self.eval_pause is not None:  # a host builds its evaluation model at its first evaluation
            self.eval_pause.at()
        return None  # the run's global model


class PlanFailingFedAvg(PausingFedAvg):
    """PausingFedAvg whose clients of round ``fail_round`` all fail in planning: their training FLOPs exceed any
    compute budget, so that round runs no client task, only its evaluation."""

    fail_round: int = -1

    def train_flops(
        self, round_idx: int, views: Sequence[ClientView], assignments: Mapping[int, Assignment]
    ) -> np.ndarray | None:
        return np.full(len(views), 1e30) if round_idx == self.fail_round else None


def pausing_shard(pause: Pause, on_call: int) -> type[ParamServerShard]:
    """A parameter-server shard whose ``on_call``-th reduction (counted per process) pauses. Made in a function so
    that Ray ships the class by value, with its pause."""

    class PausingShard(ParamServerShard):
        calls = 0

        def reduce(
            self, previous: NumpyParams, *partials: ArrayPartial, names: Sequence[str] | None = None
        ) -> Reduced:
            self.calls += 1
            if self.calls == on_call:
                pause.at()
            return super().reduce(previous, *partials, names=names)

    return PausingShard


class PausingFedResCuE(FedResCuE):
    """FedResCuE that pauses where the test kills: a client's training in a round."""

    train_pause: Pause | None = None
    train_at: tuple[int, int] = (-1, -1)

    def local_train(self, ctx: ClientContext, x: np.ndarray, y: np.ndarray) -> ClientUpdate:
        if self.train_pause is not None and (ctx.task.round_idx, ctx.task.client_id) == self.train_at:
            self.train_pause.at()
        return super().local_train(ctx, x, y)


class Killer:
    """Kills, one by one, the processes that pause under ``label`` (``times`` of them). The first must be one of the
    run's actors: ``seen["pids"]`` maps the pid each actor gave (asked when the backend started and after every
    round) to the actor's name; the later ones are replacements started within the round."""

    def __init__(self, directory: Path, label: str, seen: dict[str, Any], times: int = 1) -> None:
        self.directory, self.label, self.seen, self.times = directory, label, seen, times
        self.killed: list[tuple[str, int]] = []
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            for n in range(self.times):
                path = self.directory / f"{self.label}.{n}.pid"
                deadline = time.monotonic() + KILL_TIMEOUT_S
                while not path.exists():
                    if time.monotonic() > deadline:
                        raise TimeoutError(f"nothing paused at {path.name}")
                    time.sleep(0.01)
                pid = int(path.read_text())
                actor = self.seen["pids"].get(pid, "a replacement")
                if n == 0 and actor == "a replacement":
                    raise AssertionError(f"pid {pid} is none of the backend's actors {self.seen['pids']}")
                os.kill(pid, signal.SIGKILL)
                self.killed.append((actor, pid))
        except BaseException as err:  # reported by join()
            self.error = err

    def join(self) -> list[tuple[str, int]]:
        self.thread.join(timeout=KILL_TIMEOUT_S)
        if self.error is not None:
            raise self.error
        return self.killed


def _pid(actor: Any) -> int:
    return int(ray.get(actor.__ray_call__.remote(lambda _self: os.getpid())))


def _actor_pids(backend: Any) -> dict[int, str]:
    """pid -> actor name, each pid asked from its actor."""
    pids = {_pid(a): f"client host {h}" for h, a in enumerate(backend.hosts)}
    pids.update({_pid(a): f"parameter-server shard {s}" for s, a in enumerate(backend.shards)})
    return pids


@pytest.fixture
def instrumented(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """Runs started in the test use ``seen["algorithm"]`` when set, and record their backend and its actors' pids
    (asked from the actors before the first round; ``_run_ray`` asks again after every round) in ``seen``."""
    seen: dict[str, Any] = {"pids": {}}
    build_algorithm = build_module.build_run_algorithm
    build_backend = build_module.build_backend  # start-up (engine/startup.py) looks it up there at each start

    def algorithm(cfg: ExperimentConfig) -> Any:
        return seen.get("algorithm") or build_algorithm(cfg)

    def backend(cfg: ExperimentConfig, setup: Any) -> Any:
        built = build_backend(cfg, setup)
        seen[f"{cfg.backend.kind}_backend"] = built
        if cfg.backend.kind == "ray":
            seen["backend"] = built
            seen["pids"].update(_actor_pids(built))
        return built

    monkeypatch.setattr(build_module, "build_run_algorithm", algorithm)
    monkeypatch.setattr(build_module, "build_backend", backend)
    yield seen


def _row(record: RoundRecord) -> tuple[Any, ...]:
    values = dataclasses.asdict(record)
    return tuple(
        "nan" if isinstance(v, float) and math.isnan(v) else v for k, v in values.items() if k not in NOT_COMPARED
    )


def _assert_same_run(got: RunResult, want: RunResult) -> None:
    assert [_row(r) for r in got.records] == [_row(r) for r in want.records]
    assert got.evals == want.evals
    assert got.final_eval == want.final_eval
    assert got.state.params.keys() == want.state.params.keys()
    for name in want.state.params:
        assert torch.equal(got.state.params[name], want.state.params[name]), name


def _local(cfg: ExperimentConfig, dataset: FederatedDataset | None) -> RunResult:
    local = dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, kind="local"))
    return run_experiment(local, write=False, dataset=dataset)


def _tiny(**backend: Any) -> ExperimentConfig:
    return dataclasses.replace(tiny_config(kind="ray", cpus_per_host=0.25, **backend), rounds=2)


def _run_ray(
    cfg: ExperimentConfig, data: FederatedDataset | None, seen: dict[str, Any], states: bool = False
) -> RunResult:
    """Run on Ray, asking every actor its pid after each round (``seen["pids"]``; ``seen["last"]``: the last
    round's); with ``states`` also every client's memory (``seen["states"]``: the last round's, fetched while the
    run's state stores are up)."""

    def ask(record: RoundRecord) -> None:
        seen["last"] = _actor_pids(seen["backend"])
        seen["pids"].update(seen["last"])
        if states:
            seen["states"] = seen["backend"].client_states()

    return run_experiment(cfg, write=False, dataset=data, callbacks=[ask])


def _replacements(caplog: pytest.LogCaptureFixture) -> list[str]:
    """The recovery log's lines about replacements (they carry how long each took)."""
    return [r.getMessage() for r in caplog.records if "replacement answered after" in r.getMessage()]


def test_a_killed_client_host_is_replaced_and_the_run_is_unchanged(
    instrumented: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Kill a host while it evaluates (round 0) and one while it trains (round 1): the same records, evaluations and
    weights as the undisturbed run, one fault counted in each of those rounds, new processes in the killed slots."""
    cfg = _tiny(num_hosts=2)
    data = tiny_image_dataset()
    want = _local(cfg, data)
    algorithm = PausingFedAvg(cfg.algorithm, cfg.train)
    algorithm.train_at = (1, int(sample_clients(cfg.seed, 1, data.num_clients, cfg.clients_per_round)[0]))
    algorithm.train_pause = Pause(str(tmp_path), "train")
    algorithm.eval_pause = Pause(str(tmp_path), "eval")
    instrumented["algorithm"] = algorithm
    killers = [Killer(tmp_path, label, instrumented) for label in ("eval", "train")]
    with caplog.at_level(logging.WARNING, logger="rayfl.engine.ray.recovery"):
        got = _run_ray(cfg, data, instrumented)
    killed = [k for killer in killers for k in killer.join()]
    assert [name.startswith("client host") for name, _ in killed] == [True, True]
    assert [r.faults for r in got.records] == [1, 1]
    _assert_same_run(got, want)
    assert not {pid for _, pid in killed} & set(instrumented["last"])  # each killed slot runs a new process
    assert len(_replacements(caplog)) == 2
    print("\n".join(_replacements(caplog)))


def test_a_killed_parameter_server_shard_is_replaced_and_the_run_is_unchanged(
    instrumented: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two shards; one is killed while it reduces round 1. Its replacement (constructed with the first shard plan)
    is given its tensors again and reduces the same partial sums: the same run, one fault in round 1."""
    cfg = _tiny(num_hosts=1, num_shards=2)
    data = tiny_image_dataset()
    want = _local(cfg, data)
    # each shard reduces once a round: its second reduction is round 1's
    monkeypatch.setattr(ray_pool_module, "ParamServerShard", pausing_shard(Pause(str(tmp_path), "reduce"), 2))
    killer = Killer(tmp_path, "reduce", instrumented)
    with caplog.at_level(logging.WARNING, logger="rayfl.engine.ray.recovery"):
        got = _run_ray(cfg, data, instrumented)
    [(name, pid)] = killer.join()
    assert name.startswith("parameter-server shard")
    assert [r.faults for r in got.records] == [0, 1]
    _assert_same_run(got, want)
    assert pid not in instrumented["last"]
    assert len(_replacements(caplog)) == 1
    print("\n".join(_replacements(caplog)))


def test_a_host_that_keeps_dying_ends_the_run_with_one_clear_line(
    instrumented: dict[str, Any], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """``backend.max_actor_failures=1``: the host training a round-0 client is killed, its replacement re-runs the
    work and is killed too; ``rayfl run`` stops with one line naming the limit and exit code 4."""
    from rayfl import cli

    args = [
        "run",
        "name=dying",
        f"output_dir={tmp_path / 'runs'}",
        "rounds=2",
        "clients_per_round=4",
        "data.name=synthetic",
        "data.num_clients=8",
        "data.synthetic_samples=16",
        "model.name=cnn",
        "model.channels=[4,8]",
        "train.batch_size=8",
        "train.sequence_loss=last",  # the embedded default trains characters
        "backend.kind=ray",
        "backend.num_hosts=1",
        "backend.cpus_per_host=0.25",
        "backend.max_actor_failures=1",
    ]
    cfg = load_config(None, args[1:])
    algorithm = PausingFedAvg(cfg.algorithm, cfg.train)
    algorithm.train_at = (0, int(sample_clients(cfg.seed, 0, cfg.data.num_clients, cfg.clients_per_round)[0]))
    algorithm.train_pause = Pause(str(tmp_path), "train", times=2)
    instrumented["algorithm"] = algorithm
    killer = Killer(tmp_path, "train", instrumented, times=2)
    code = cli.main(args)
    killed = killer.join()
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 4
    assert [name for name, _ in killed][1] == "a replacement"
    assert len(err) == 1, err
    assert err[0].startswith(
        "rayfl: error: round 0: 2 Ray actor failures in one round, more than backend.max_actor_failures=1; the "
        "last: client host "
    ), err[0]


def test_a_fatal_evaluation_fault_in_a_round_without_training_names_that_round(
    instrumented: dict[str, Any], tmp_path: Path
) -> None:
    """Round 1's clients all fail in planning (no training task), and the host evaluating round 1 (the first
    evaluation: ``eval_every=2``) is killed with ``backend.max_actor_failures=0``: the give-up names round 1, not round
    0, the last round that trained."""
    cfg = dataclasses.replace(
        _tiny(num_hosts=1, max_actor_failures=0), eval_every=2, system=SystemConfig(compute_limit_s=1e6)
    )
    algorithm = PlanFailingFedAvg(cfg.algorithm, cfg.train)
    algorithm.fail_round = 1
    algorithm.eval_pause = Pause(str(tmp_path), "eval")
    instrumented["algorithm"] = algorithm
    killer = Killer(tmp_path, "eval", instrumented)
    rounds: list[RoundRecord] = []
    with pytest.raises(ActorFailureError) as err:
        run_experiment(cfg, write=False, dataset=tiny_image_dataset(), callbacks=[rounds.append])
    [(name, _)] = killer.join()
    assert name == "client host 0"
    assert [(r.round_idx, r.clients_run) for r in rounds] == [(0, cfg.clients_per_round)]  # round 0 trained
    assert str(err.value).startswith(
        "round 1: 1 Ray actor failure in one round, more than backend.max_actor_failures=0; the last: client host 0"
    ), str(err.value)


def test_per_client_state_survives_a_host_kill(instrumented: dict[str, Any], tmp_path: Path) -> None:
    """FedResCuE with local model padding (experiments/fedrescue/cpu.yaml, shrunk): every client remembers its model.
    The only host, which made every memory so far, is killed in round 1 while it trains a client that trained in
    round 0; its replacement reads the memories from the state store (an actor apart from the hosts) and the run is
    the same as undisturbed, memories included."""
    overrides = [
        "rounds=2",
        "clients_per_round=4",
        "data.num_clients=6",
        "data.synthetic_samples=24",
        "backend.kind=ray",
        "backend.num_hosts=1",
        "backend.cpus_per_host=0.25",
    ]
    cfg = load_config(REPO / "experiments" / "fedrescue" / "cpu.yaml", overrides)
    sampled = [set(sample_clients(cfg.seed, r, cfg.data.num_clients, cfg.clients_per_round).tolist()) for r in range(2)]
    again = sorted(sampled[1] & sampled[0])
    assert again  # the killed host trains a client with a memory from an earlier round
    want = _local(cfg, None)
    algorithm = PausingFedResCuE(cfg.algorithm, cfg.train)
    algorithm.train_at = (1, again[0])
    algorithm.train_pause = Pause(str(tmp_path), "train")
    instrumented["algorithm"] = algorithm
    killer = Killer(tmp_path, "train", instrumented)
    got = _run_ray(cfg, None, instrumented, states=True)
    [(name, _)] = killer.join()
    assert name.startswith("client host")
    assert [r.faults for r in got.records] == [0, 1]
    _assert_same_run(got, want)
    states = instrumented["states"]
    local_states = instrumented["local_backend"].memories.client_states()
    assert sorted(states) == sorted(local_states) == sorted(set().union(*sampled))
    for client, memory in states.items():
        other = local_states[client]
        assert memory.params is not None and memory.params.keys() == other.params.keys()
        assert all(np.array_equal(memory.params[k], other.params[k]) for k in memory.params), client
        assert (memory.slices or {}).keys() == (other.slices or {}).keys()
        for name, tslice in (memory.slices or {}).items():
            assert repr(tslice) == repr((other.slices or {})[name])


class Freezer(Killer):
    """Like ``Killer``, but stops the paused process (SIGSTOP: it hangs without dying, Ray sees nothing wrong) and
    notes when; the round watchdog must kill it. The process is killed at ``join`` should it still exist."""

    def _run(self) -> None:
        try:
            path = self.directory / f"{self.label}.0.pid"
            deadline = time.monotonic() + KILL_TIMEOUT_S
            while not path.exists():
                if time.monotonic() > deadline:
                    raise TimeoutError(f"nothing paused at {path.name}")
                time.sleep(0.01)
            pid = int(path.read_text())
            actor = self.seen["pids"].get(pid, "a replacement")
            if actor == "a replacement":
                raise AssertionError(f"pid {pid} is none of the backend's actors {self.seen['pids']}")
            os.kill(pid, signal.SIGSTOP)
            self.stopped_at = time.time()
            self.killed.append((actor, pid))
        except BaseException as err:  # reported by join()
            self.error = err

    def join(self) -> list[tuple[str, int]]:
        try:
            return super().join()
        finally:
            for _, pid in self.killed:  # the watchdog's kill failed: leave no stopped process behind
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)


def test_a_host_frozen_with_sigstop_is_killed_by_the_watchdog_within_its_timeout(
    instrumented: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A host is stopped (SIGSTOP) while it trains in round 1: it neither dies nor answers. With
    ``backend.hang_timeout_s: 2`` the watchdog kills it once its pings have gone 2 s unanswered, Ray replaces it and
    the round is re-run: the same run as undisturbed, one fault in round 1."""
    timeout_s = 2.0
    cfg = _tiny(num_hosts=2, hang_timeout_s=timeout_s)
    data = tiny_image_dataset()
    want = _local(cfg, data)
    algorithm = PausingFedAvg(cfg.algorithm, cfg.train)
    algorithm.train_at = (1, int(sample_clients(cfg.seed, 1, data.num_clients, cfg.clients_per_round)[0]))
    algorithm.train_pause = Pause(str(tmp_path), "train")
    instrumented["algorithm"] = algorithm
    freezer = Freezer(tmp_path, "train", instrumented)
    with caplog.at_level(logging.WARNING, logger="rayfl.engine.ray"):
        got = _run_ray(cfg, data, instrumented)
    [(name, pid)] = freezer.join()
    assert name.startswith("client host")
    [hung] = [r for r in caplog.records if "killing it as hung" in r.getMessage()]
    detected_s = hung.created - freezer.stopped_at
    print(f"frozen host killed {detected_s:.2f} s after SIGSTOP (hang_timeout_s={timeout_s:g})")
    # a ping goes out every tick (timeout / 4); the one unanswered for the timeout went out at most a tick before the
    # stop or a tick after it, and is checked at the next tick: plus this (shared, 2-core) machine's delays
    tick = timeout_s / 4
    assert timeout_s - tick <= detected_s <= timeout_s + 2 * tick + 3.0
    assert [r.faults for r in got.records] == [0, 1]
    _assert_same_run(got, want)
    assert pid not in instrumented["last"]


def _run_blocked(
    cfg: ExperimentConfig,
    data: FederatedDataset | None,
    seen: dict[str, Any],
    fifo: Path,
    caplog: pytest.LogCaptureFixture,
) -> RunResult:
    """``_run_ray`` with the Ray warnings captured, while an actor blocks reading ``fifo`` (freed by a timer that
    lets it fail should nothing kill it)."""
    timer = release_fifo(fifo)
    try:
        with caplog.at_level(logging.WARNING, logger="rayfl.engine.ray"):
            return _run_ray(cfg, data, seen)
    finally:
        timer.cancel()


def _blocked_pid(tmp_path: Path, label: str, seen: dict[str, Any]) -> tuple[str, int, float]:
    """The actor that blocked under ``label`` (its name, pid, and when it blocked: its pid file's time)."""
    path = tmp_path / f"{label}.0.pid"
    pid = int(path.read_text())
    return seen["pids"].get(pid, "a replacement"), pid, path.stat().st_mtime


def _stuck_line(caplog: pytest.LogCaptureFixture) -> tuple[logging.LogRecord, float]:
    """The watchdog's one line about a stuck actor, and the stall limit it names; no actor was found hung."""
    assert not [r for r in caplog.records if "killing it as hung" in r.getMessage()]
    [stuck] = [r for r in caplog.records if "killing it as stuck" in r.getMessage()]
    limit = re.search(r"limit ([0-9.]+) s", stuck.getMessage())
    assert limit is not None, stuck.getMessage()
    return stuck, float(limit.group(1))


def test_a_host_blocked_in_a_read_with_the_lock_released_is_killed_as_stuck(
    instrumented: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A host blocks in round 1, while it trains a client, in a read of a FIFO that nobody writes (a read on a dead
    mount): the read released the interpreter lock, so the host answers every ping, but its progress (clients
    trained) stands still. With ``backend.stall_timeout_s`` the watchdog kills it as stuck, in one line naming the
    host and its clients, Ray replaces it and the call is re-run: the same run as undisturbed, one fault in round
    1."""
    load = load_factor()
    stall_s = 3.0 * load
    cfg = _tiny(num_hosts=2, stall_timeout_s=stall_s)
    data = tiny_image_dataset()
    want = _local(cfg, data)
    client = int(sample_clients(cfg.seed, 1, data.num_clients, cfg.clients_per_round)[0])
    algorithm = PausingFedAvg(cfg.algorithm, cfg.train)
    algorithm.train_at = (1, client)
    algorithm.train_pause = BlockedRead(str(tmp_path), "train")
    instrumented["algorithm"] = algorithm
    got = _run_blocked(cfg, data, instrumented, tmp_path / "train.fifo", caplog)
    name, pid, blocked_at = _blocked_pid(tmp_path, "train", instrumented)
    assert name.startswith("client host")
    stuck, limit = _stuck_line(caplog)
    message = stuck.getMessage()
    assert message.startswith(f"{name} made no progress for "), message
    clients = re.search(r"while training clients ([0-9, ]+), though", message)
    assert clients is not None and client in {int(c) for c in clients.group(1).split(", ")}, message
    detected_s = stuck.created - blocked_at
    print(f"blocked host killed {detected_s:.2f} s after it blocked (stall limit {limit:g} s, load x{load:.1f})")
    tick = min(stall_s, cfg.backend.hang_timeout_s) / 4
    assert 0 < detected_s <= limit + 2 * tick + 3.0 * load
    assert limit >= stall_s - 0.05  # the line gives it to 0.1 s
    assert [r.faults for r in got.records] == [0, 1]
    _assert_same_run(got, want)
    assert pid not in instrumented["last"]
    assert len(_replacements(caplog)) == 1


def test_a_shard_blocked_in_a_read_with_the_lock_released_is_killed_as_stuck(
    instrumented: dict[str, Any], tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two shards; one blocks in a FIFO read (the interpreter lock released) as it begins its round-1 reduction.
    It answers pings, but merges no partial sum: the watchdog kills it as stuck, its replacement reduces the same
    partial sums, and the run is the same as undisturbed, one fault in round 1."""
    load = load_factor()
    cfg = _tiny(num_hosts=1, num_shards=2, stall_timeout_s=3.0 * load)
    data = tiny_image_dataset()
    want = _local(cfg, data)
    # each shard reduces once a round: its second reduction is round 1's
    monkeypatch.setattr(ray_pool_module, "ParamServerShard", pausing_shard(BlockedRead(str(tmp_path), "reduce"), 2))
    got = _run_blocked(cfg, data, instrumented, tmp_path / "reduce.fifo", caplog)
    name, pid, _ = _blocked_pid(tmp_path, "reduce", instrumented)
    assert name.startswith("parameter-server shard")
    stuck, _ = _stuck_line(caplog)
    assert stuck.getMessage().startswith(f"{name} made no progress for "), stuck.getMessage()
    assert re.search(r"while reducing the partial sums of [0-9]+ host calls, though", stuck.getMessage())
    assert [r.faults for r in got.records] == [0, 1]
    _assert_same_run(got, want)
    assert pid not in instrumented["last"]


def blocking_store(pause: Pause) -> type[StateStore]:
    """A state store whose first ``take`` of some memories pauses. Made in a function so that Ray ships the class by
    value, with its pause."""

    class BlockingStore(StateStore):
        def take(self, ids: Sequence[int]) -> tuple[int, dict[int, object]]:
            if ids:
                pause.at()
            return super().take(ids)

    return BlockingStore


def test_a_state_store_blocked_in_a_read_stops_the_run_in_one_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clients that remember how often they trained; the state store blocks in a FIFO read (the interpreter lock
    released) as it hands round 1's memories out. It answers pings but serves nothing: the watchdog kills it, and
    since no re-run can recompute the memories it kept, the round stops with one line naming the store, its call
    and the limit (``StateLostError``, which the driver completes with where to resume)."""
    from tests.integration.test_client_state_ray import ROUNDS, CountingFedAvg, _rounds

    cfg = tiny_config(kind="ray", num_hosts=1, cpus_per_host=0.25, stall_timeout_s=3.0 * load_factor())
    cfg = dataclasses.replace(cfg, algorithm=FedAvgConfig())
    monkeypatch.setattr(state_stores_module, "StateStore", blocking_store(BlockedRead(str(tmp_path), "take")))
    setup = build_module.build_setup(cfg, tiny_image_dataset())
    setup = dataclasses.replace(setup, algorithm=CountingFedAvg(cfg.algorithm, cfg.train))
    build_module.bind_algorithm(cfg, setup, build_module.build_clock(cfg, setup))
    backend = build_module.build_backend(cfg, setup)
    timer = release_fifo(tmp_path / "take.fifo")
    try:
        params = _rounds(backend, setup.params, ROUNDS[:1])
        with caplog.at_level(logging.WARNING, logger="rayfl.engine.ray"), pytest.raises(StateLostError) as err:
            _rounds(backend, params, ROUNDS[1:2], start=1)
    finally:
        timer.cancel()
        backend.close()
    stuck, limit = _stuck_line(caplog)
    assert stuck.getMessage().startswith("state store 0 made no progress for "), stuck.getMessage()
    message = str(err.value)
    assert "\n" not in message
    assert re.fullmatch(
        r"state store 0 was stuck: its progress stood still for [0-9.]+ s while handing out client memories "
        rf"\(limit {limit:.1f} s, backend.stall_timeout_s\); killed, and the client memories it kept cannot be "
        r"recomputed, so the run stops",
        message,
    ), message
