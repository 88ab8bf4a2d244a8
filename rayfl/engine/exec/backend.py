"""Execution backends: where client hosts and parameter-server shards live.

``Backend`` is the engine's only view of execution. Two implementations give the same numbers for the same seed:
``LocalBackend`` (this module) runs hosts and shards as plain objects in this process (the hosts' calls in
parallel on forked worker processes with ``backend.processes``, ``engine/exec/workers.py``);
``RayBackend`` (``engine/ray/backend.py``) runs them as Ray actors. Both group a round's clients into the same host
calls (``engine/exec/dispatch.py``: batches pulled by free hosts, or one share per host), use the same shard plan and
reduce the calls' partial sums in the same canonical order, and both evaluate on fixed-size test batches combined in
batch order.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Protocol, cast

import numpy as np
import torch

from rayfl.config.model import ModelConfig
from rayfl.config.sections import BackendConfig, CompressionConfig, host_gpu_shares
from rayfl.core.messages import Aggregate, ClientOutcome, Params, TrainTask
from rayfl.core.partials import ArrayPartial, Reduced
from rayfl.data.federated import FederatedDataset
from rayfl.engine.exec.client_state import ClientMemory, ClientStateStore, KeptUpload, keeps_state, pads
from rayfl.engine.exec.dispatch import call_plan, host_kinds, tasks_by_host
from rayfl.engine.exec.host import ClientHost, EvalStats, NumpyParams
from rayfl.engine.exec.param_server import ParamServerShard, plan_shards
from rayfl.engine.exec.workers import HostCall, HostWorkers, fork_refusal, planned_workers
from rayfl.fl.api.algorithm import Algorithm

__all__ = [
    "Backend",
    "EvalResult",
    "LocalBackend",
    "assemble_aggregate",
    "combine_eval",
    "eval_batches",
    "shard_plan",
    "tasks_by_host",
    "to_numpy",
    "uploads_by_host",
    "worker_count",
]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EvalResult:
    accuracy: float
    loss: float
    num_samples: int
    # per test sample, in test-set order: predicted right (left out of ``==``, which compares the figures above)
    correct_mask: np.ndarray | None = field(default=None, compare=False, repr=False)


class Backend(Protocol):
    """Runs a round's client tasks and the sharded reduction; evaluates global parameters."""

    def begin_round(self, round_idx: int) -> None:
        """The round the calls that follow belong to (told even when the round has no client task: its evaluation
        still runs on the hosts)."""
        ...

    def train_and_reduce(
        self, tasks: Sequence[TrainTask], params: Params, initial: Params | None = None
    ) -> tuple[Aggregate, list[ClientOutcome]]: ...

    def evaluate(
        self, params: Params, units: tuple[int, ...] | None = None, model_config: ModelConfig | None = None
    ) -> EvalResult: ...

    def close(self) -> None: ...

    def take_faults(self) -> int: ...

    def client_states(self) -> dict[int, object]: ...

    def client_state_batches(self, size: int) -> Iterator[dict[int, object]]:
        """Every client's memory by client id, at most ``size`` clients at a time in client-id order, each batch
        fetched when the one before has been consumed (checkpoints: the driver never holds them all at once)."""
        ...

    def load_client_states(self, states: dict[int, object]) -> None: ...

    def reduce_uploads(self, params: Params) -> Aggregate: ...

    def train_each(
        self, tasks: Sequence[TrainTask], params: Params, initial: Params | None = None
    ) -> tuple[dict[int, KeptUpload], list[ClientOutcome]]:
        """Train ``tasks`` on the hosts and return every successful client's upload apart (by client id) with every
        outcome (client-id order): the asynchronous policies' training, whose server applies each upload when it
        arrives."""
        ...


def to_numpy(params: Params) -> NumpyParams:
    return {k: v.detach().cpu().numpy() for k, v in params.items()}


def eval_batches(num_samples: int, batch_size: int, num_hosts: int) -> list[list[int]]:
    """Fixed-size test batches dealt round-robin to hosts (batch ids, not data, travel)."""
    num_batches = -(-num_samples // batch_size)
    return [list(range(h, num_batches, num_hosts)) for h in range(num_hosts)]


def combine_eval(stats: Sequence[EvalStats]) -> EvalResult:
    """Sum per-batch results in batch-id order, so the figures do not depend on how batches were spread."""
    ids = np.concatenate([s.batch_ids for s in stats])
    order = np.argsort(ids, kind="stable")
    loss = np.concatenate([s.loss_sum for s in stats])[order]
    correct = np.concatenate([s.correct for s in stats])[order]
    count = np.concatenate([s.count for s in stats])[order]
    total = int(count.sum())
    masks = [m for s in stats for m in s.correct_mask]
    mask = np.concatenate([masks[i] for i in order]) if len(masks) == len(order) and masks else None
    loss_total = 0.0
    for v in loss:  # sequential float64 sum in batch order (np.sum's pairwise order depends on length)
        loss_total += float(v)
    if any(s.nonfinite for s in stats):
        # a model whose logits are not finite has no accuracy: NaN, never "0 %" (argmax of NaN picks a class)
        return EvalResult(accuracy=math.nan, loss=math.nan, num_samples=total, correct_mask=None)
    return EvalResult(
        accuracy=float(correct.sum()) / max(1, total),
        loss=loss_total / max(1, total),
        num_samples=total,
        correct_mask=mask,
    )


def shard_plan(
    current: dict[str, int], params: Params, num_shards: int, shards: Sequence[object]
) -> tuple[dict[str, int], list[list[str]] | None]:
    """The shard plan for ``params``: ``current`` while it covers exactly their names, else a fresh plan over every
    tensor (a run added or dropped a global model), returned with each shard's new names. Which shard reduces a
    tensor never changes its value, so re-planning keeps results identical."""
    if len(current) == len(params) and all(name in current for name in params):
        return current, None
    plan = plan_shards({k: tuple(v.shape) for k, v in params.items()}, num_shards)
    return plan, [[n for n, k in plan.items() if k == s] for s in range(len(shards))]


def uploads_by_host(handles: Sequence[tuple[int, object]], num_hosts: int) -> list[list[object]]:
    """Every client's memory handle (in client-id order) dealt to hosts in contiguous runs of client ids, so the
    reduction over all uploads has one canonical order (hosts in id order, clients in id order) on every backend."""
    bounds = np.linspace(0, len(handles), num_hosts + 1).round().astype(int)
    return [[h for _, h in handles[bounds[k] : bounds[k + 1]]] for k in range(num_hosts)]


def worker_count(backend_cfg: BackendConfig, cuda_available: bool | None = None) -> tuple[int, str]:
    """How many worker processes the in-process backend runs its hosts' calls on (``backend.processes``; 1: in the
    driver) and, when that is fewer than asked, why (``""`` otherwise). ``auto`` is one per host, at most one per core
    this process may use; never more than one per host. Hosts that train on CUDA, a driver whose CUDA is initialised
    and ``torch_threads`` > 1 keep every call in the driver: a forked process can use neither CUDA nor OpenMP
    threads (``engine/exec/workers.py``); so does a process connected to Ray."""
    count = planned_workers(backend_cfg.processes, backend_cfg.num_hosts)
    if count <= 1:
        return 1, ""
    if cuda_available is None:
        cuda_available = torch.cuda.is_available()
    shares = host_gpu_shares(backend_cfg)
    cuda = backend_cfg.device == "cuda" or (backend_cfg.device == "auto" and cuda_available and max(shares) > 0)
    if cuda:
        return 1, "the hosts train on CUDA, which a forked worker process cannot use"
    if torch.cuda.is_initialized():  # type: ignore[no-untyped-call]
        return 1, "CUDA is initialised in this process, which makes forking worker processes unsafe"
    ray = sys.modules.get("ray")
    if ray is not None and ray.is_initialized():
        return 1, "Ray is connected in this process, and a forked worker process cannot share its connections"
    refusal = fork_refusal(backend_cfg.torch_threads)
    return (1, refusal) if refusal else (count, "")


def assemble_aggregate(results: Sequence[Reduced], outcomes: Sequence[ClientOutcome]) -> Aggregate:
    """The shards' reductions as one aggregate (arrays copied: object-store arrays arrive read-only)."""
    params: Params = {}
    coverage: dict[str, float] = {}
    covered: Params = {}
    for new, cov, masks in results:
        params.update({k: torch.from_numpy(np.array(v)) for k, v in new.items()})
        coverage.update(cov)
        covered.update({k: torch.from_numpy(np.array(v)) for k, v in masks.items()})
    ok = [o for o in outcomes if o.failure is None]
    return Aggregate(params=params, coverage=coverage, num_clients=len(ok), covered=covered)


class LocalBackend:
    """Hosts and shards as in-process objects; the same host calls and reduction order as the Ray backend. With
    ``backend.processes`` > 1 the hosts live in forked worker processes (``workers.HostWorkers``) that run a round's
    calls in parallel; their results are taken in the calls' order, so the numbers do not change."""

    def __init__(
        self,
        dataset: FederatedDataset,
        model_cfg: ModelConfig,
        algorithm: Algorithm,
        backend_cfg: BackendConfig,
        shapes: dict[str, tuple[int, ...]],
        eval_batch_size: int,
        init_seed: int,
        compression: CompressionConfig | None = None,
    ) -> None:
        self.dataset = dataset
        self.sizes = dataset.client_sizes()
        self.num_hosts = backend_cfg.num_hosts
        self.num_shards = backend_cfg.num_shards
        self.eval_batch_size = eval_batch_size
        self.shard_of = plan_shards(shapes, self.num_shards)

        def build(h: int) -> ClientHost:
            return ClientHost(h, dataset, model_cfg, algorithm, backend_cfg, init_seed, compression)

        count, why = worker_count(backend_cfg)
        if why:
            log.info("backend.processes: the hosts' calls run in this process: %s", why)
        # the hosts: in this process, or in ``count`` worker processes (``hosts`` is then empty)
        self.workers = HostWorkers(count, self.num_hosts, build) if count > 1 else None
        self.hosts = [build(h) for h in range(self.num_hosts)] if self.workers is None else []
        if self.workers is not None:
            log.info("in-process backend: %d hosts on %d worker processes", self.num_hosts, count)
        self.shards = [
            ParamServerShard(s, [n for n, k in self.shard_of.items() if k == s]) for s in range(self.num_shards)
        ]
        self._threads = torch.get_num_threads()
        self.algorithm = algorithm
        self.memories = ClientStateStore()  # per-client state across rounds (engine/exec/client_state.py)
        self.dispatch, self.clients_per_call = backend_cfg.dispatch, backend_cfg.clients_per_call
        self.kinds = host_kinds(backend_cfg)  # a mixed pool's GPU and CPU hosts, or None

    def _calls(self, tasks: Sequence[TrainTask]) -> list[tuple[int, list[TrainTask]]]:
        """The round's host calls in reduction order (``dispatch.call_plan``), each with the id of the host that makes
        it: pulled batches go round the hosts that may take them (which host of a kind trains a batch does not change
        its numbers), static shares to their own host."""
        plan = call_plan(tasks, self.sizes, self.num_hosts, self.dispatch, self.clients_per_call, self.kinds)
        return [(self._host_for(i, c.hosts), c.tasks) for i, c in enumerate(plan) if c.tasks]

    def _host_for(self, i: int, hosts: Sequence[int]) -> int:
        """The host of call ``i`` among ``hosts``, those that may make it: round the hosts; on worker processes round
        the workers first, then the hosts each holds, so that a worker with more hosts than another is not given
        more calls (with one host per worker the two are the same)."""
        if self.workers is None or len(hosts) == 1:
            return hosts[i % len(hosts)]
        count = self.workers.count
        mine = [h for h in hosts if self.workers.worker_of(h) == i % count]
        return mine[(i // count) % len(mine)] if mine else hosts[i % len(hosts)]

    def _run(self, calls: Sequence[HostCall], doing: str) -> list[object]:
        """The results of host calls ``(host id, method, arguments)``, in their order: one after another here, or in
        parallel on the worker processes."""
        if self.workers is not None:
            return self.workers.call(calls, doing)
        return [getattr(self.hosts[h], method)(*args) for h, method, args in calls]

    def clients_per_host(self) -> list[int]:
        """How many clients each host has trained in this run, as the hosts count them."""
        return cast(list[int], self._run([(h, "trained", ()) for h in range(self.num_hosts)], "counting clients"))

    def _plan(self, params: Params) -> NumpyParams:
        """``params`` as numpy arrays, with the tensors re-dealt to the shards when the global tensors changed (a
        model was added)."""
        self.shard_of, names = shard_plan(self.shard_of, params, self.num_shards, self.shards)
        if names is not None:
            for shard, own in zip(self.shards, names, strict=True):
                shard.set_names(own)
        return to_numpy(params)

    def train_and_reduce(
        self, tasks: Sequence[TrainTask], params: Params, initial: Params | None = None
    ) -> tuple[Aggregate, list[ClientOutcome]]:
        """One round's training and reduction; ``initial`` (the run's initial global tensors,
        ``client_state.first_values``) is what padding clients fall back to."""
        arrays = self._plan(params)
        outcomes: list[ClientOutcome] = []
        keep = keeps_state(self.algorithm, tasks)
        first = to_numpy(initial) if initial is not None and pads(tasks) else None
        calls = self._calls(tasks)  # a client is in one call of a round: every call's memories can be read first
        held = [cast(list[ClientMemory | None], self.memories.handles_for(t) if keep else []) for _, t in calls]
        ran = self._run(
            [
                (h, "run_round", (t, arrays, self.shard_of, self.num_shards, first, *m))
                for (h, t), m in zip(calls, held, strict=True)
            ],
            "training clients",
        )
        outs = cast(list[tuple[object, ...]], ran)
        for (_, host_tasks), out in zip(calls, outs, strict=True):
            outcomes.extend(cast(list[ClientOutcome], out[self.num_shards]))
            if keep:
                self.memories.update(host_tasks, out[self.num_shards + 1 :])
        outcomes.sort(key=lambda o: o.client_id)
        return assemble_aggregate(self._reduce(arrays, outs), outcomes), outcomes

    def train_each(
        self, tasks: Sequence[TrainTask], params: Params, initial: Params | None = None
    ) -> tuple[dict[int, KeptUpload], list[ClientOutcome]]:
        """``Backend.train_each`` in this process: the same hosts, partition and memories as ``train_and_reduce``."""
        arrays = to_numpy(params)
        keep = keeps_state(self.algorithm, tasks)
        first = to_numpy(initial) if initial is not None and pads(tasks) else None
        uploads: dict[int, KeptUpload] = {}
        outcomes: list[ClientOutcome] = []
        calls = self._calls(tasks)
        held = [cast(list[ClientMemory | None], self.memories.handles_for(t) if keep else []) for _, t in calls]
        ran = self._run(
            [(h, "run_clients", (t, arrays, first, *m)) for (h, t), m in zip(calls, held, strict=True)],
            "training clients",
        )
        for (_, host_tasks), out in zip(calls, cast(list[tuple[object, ...]], ran), strict=True):
            got, done = cast(tuple[dict[int, KeptUpload], list[ClientOutcome]], out[0])
            uploads.update(got)
            outcomes.extend(done)
            if keep:
                self.memories.update(host_tasks, out[1:])
        torch.set_num_threads(self._threads)
        outcomes.sort(key=lambda o: o.client_id)
        return {c: uploads[c] for c in sorted(uploads)}, outcomes

    def reduce_uploads(self, params: Params) -> Aggregate:
        """The all-device model: the algorithm's reducer over every client's kept upload (``eval_all_devices``,
        ``engine/exec/client_state.py``), elements no upload covers keeping ``params``' values; ``num_clients``
        counts the uploads."""
        arrays = self._plan(params)
        dealt = uploads_by_host(self.memories.handles(), self.num_hosts)
        calls: list[HostCall] = [
            (h, "reduce_uploads", (arrays, self.shard_of, self.num_shards, *held))
            for h, held in enumerate(dealt)
            if held
        ]
        outs = cast(list[Sequence[object]], self._run(calls, "reducing kept uploads"))
        count = sum(cast(int, out[self.num_shards]) for out in outs)
        return dataclasses.replace(assemble_aggregate(self._reduce(arrays, outs), []), num_clients=count)

    def _reduce(self, arrays: NumpyParams, outs: Sequence[Sequence[object]]) -> list[Reduced]:
        """Each shard's reduction of the host calls' partial sums for it (the first ``num_shards`` entries of each
        call's result, ``ClientHost.run_round``), in call order, at the driver's thread count (a host call sets its
        own)."""
        torch.set_num_threads(self._threads)
        return [
            shard.reduce(arrays, *(cast(ArrayPartial, out[s]) for out in outs)) for s, shard in enumerate(self.shards)
        ]

    def evaluate(
        self, params: Params, units: tuple[int, ...] | None = None, model_config: ModelConfig | None = None
    ) -> EvalResult:
        arrays = to_numpy(params)
        batches = eval_batches(len(self.dataset.y_test), self.eval_batch_size, self.num_hosts)
        calls: list[HostCall] = [
            (h, "evaluate", (arrays, b, self.eval_batch_size, units, model_config)) for h, b in enumerate(batches) if b
        ]
        stats = cast(list[EvalStats], self._run(calls, "evaluating"))
        torch.set_num_threads(self._threads)
        return combine_eval(stats)

    def client_states(self) -> dict[int, object]:
        """Every client's memory by client id (``engine/exec/client_state.py``), for checkpoints."""
        return self.memories.client_states()

    def client_state_batches(self, size: int) -> Iterator[dict[int, object]]:
        return self.memories.batches(size)

    def load_client_states(self, states: dict[int, object]) -> None:
        self.memories.load_client_states(states)

    def begin_round(self, round_idx: int) -> None:
        """Nothing to do in-process (no actor dies here)."""

    def take_faults(self) -> int:
        """Actor failures survived since the last call: none in-process."""
        return 0

    def close(self) -> None:
        """Stop the worker processes, if any (also after an error or Ctrl-C: none is left behind)."""
        if self.workers is not None:
            self.workers.close()
        torch.set_num_threads(self._threads)
