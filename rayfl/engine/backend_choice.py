"""``backend.kind: auto`` (the default): which backend a run takes, and why.

On one machine the in-process backend now runs its hosts' calls on worker processes (``backend.processes: auto``,
the default; ``engine/exec/workers.py``), as many as Ray would run host actors, without Ray's start (3-6 s more here)
or its processes (a 1.8 GB tree instead of 0.6 GB). ``python benchmarks/scale.py --n 100 --k 10 --mode train
--backend ray local --rounds 8`` on the 2-core benchmark machine, twice (issue 41): Ray 36.8 and 60.3 client
updates/s against 82.5 and 79.7 in-process on two worker processes, so Ray's rounds are not faster and its start is
never repaid: a run that gets worker processes stays in-process whatever its size. Where the in-process backend
would run on one process (``backend.processes`` 0 or 1, ``backend.torch_threads`` > 1, hosts on CUDA, one usable
core, off Linux) the cross-over measured against one process holds: Ray's two hosts trained in parallel (154 vs 106
client updates/s), and the same command put the cross-over at 963-1,150 client updates of the benchmark's size (one
local epoch of 64 samples on the small CNN), so such a run takes Ray when it trains at least ``CROSSOVER_UPDATES``
client-epochs (rounds x clients per round x local epochs, over its phases), and the in-process backend below that.
Whatever the size, it takes Ray when the config asks for what only Ray gives: a cluster (``backend.address``, so
more than one node), GPUs reserved per host (``backend.gpus_per_host``) or hosts kept warm for the next run
(``backend.keep_warm``).

The choice is a function of the config and of the cores this process may use (not of what else runs on the
machine), so a sweep's trials, a resumed run and ``rayfl validate`` all see the one the run made; it is written in
the run's first line, in the log and in ``summary.json`` (``backend``), and the run's ``config.yaml`` holds the kind
taken. A config that sets keys only Ray reads (``RAY_ONLY``: CPUs per host, timeouts, ...) and is run in-process by
``auto`` has them named in that reason ("not used in-process"), so ``backend.cpus_per_host=64`` is not silently
ignored.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from rayfl.engine.exec.workers import fork_refusal, planned_workers
from rayfl.experiment.schema import ExperimentConfig

__all__ = [
    "CROSSOVER_UPDATES",
    "RAY_ONLY",
    "BackendChoice",
    "choose_backend",
    "client_epochs",
    "in_process_workers",
    "resolve_backend",
]

# backend keys that only the Ray backend reads (the in-process backend emulates hosts and shards, and trains on the
# device its settings choose, so num_hosts, num_shards, torch_threads, device and gpu_memory_fraction are not here)
RAY_ONLY = (
    "cpus_per_host",
    "cpus_per_shard",
    "placement",
    "head",
    "start_timeout_s",
    "replace_timeout_s",
    "hang_timeout_s",
    "stall_timeout_s",
    "num_cpus",
    "object_store_mb",
    "max_actor_failures",
)

CROSSOVER_UPDATES = 1000  # client-epochs from which Ray's start pays off over one in-process process (docstring)


@dataclass(frozen=True)
class BackendChoice:
    """The backend a run takes (``kind``: ``local`` or ``ray``), what the config asked for and why."""

    kind: Literal["local", "ray"]
    asked: str
    reason: str

    def describe(self) -> str:
        """``local (auto: ...)`` for a choice, the kind alone when the config named it."""
        return f"{self.kind} ({self.asked}: {self.reason})" if self.asked == "auto" else self.kind

    def as_dict(self) -> dict[str, str]:
        return {"kind": self.kind, "asked": self.asked, "reason": self.reason}


def client_epochs(cfg: ExperimentConfig) -> int:
    """Local epochs trained over the run: rounds x clients per round x epochs, each phase with its own figures."""
    if not cfg.phases:
        return cfg.rounds * cfg.clients_per_round * cfg.train.epochs
    return sum(
        p.rounds * (p.clients_per_round or cfg.clients_per_round) * (p.epochs or cfg.train.epochs) for p in cfg.phases
    )


def choose_backend(cfg: ExperimentConfig) -> BackendChoice:
    """The backend ``cfg`` runs on (``backend.kind: auto`` resolved as the module docstring says)."""
    backend = cfg.backend
    if backend.kind != "auto":
        return BackendChoice(backend.kind, backend.kind, "as configured")
    if backend.address is not None:
        return BackendChoice("ray", "auto", f"backend.address is {backend.address!r} (a Ray cluster)")
    if backend.gpus_per_host > 0:
        return BackendChoice(
            "ray", "auto", f"backend.gpus_per_host is {backend.gpus_per_host:g} (GPUs reserved on Ray)"
        )
    if backend.keep_warm:
        return BackendChoice("ray", "auto", "backend.keep_warm keeps Ray's hosts for the next run")
    work = client_epochs(cfg)
    workers = in_process_workers(cfg)
    if workers > 1:
        reason = (
            f"{work:,} client-epochs on {workers} in-process worker processes, faster than Ray's hosts on one machine"
        )
        return BackendChoice("local", "auto", reason + _unused(cfg))
    if work >= CROSSOVER_UPDATES:
        return BackendChoice(
            "ray", "auto", f"{work:,} client-epochs, at least the {CROSSOVER_UPDATES:,} where Ray pays off"
        )
    reason = f"{work:,} client-epochs, below the {CROSSOVER_UPDATES:,} where Ray's start pays off"
    return BackendChoice("local", "auto", reason + _unused(cfg))


def in_process_workers(cfg: ExperimentConfig) -> int:
    """The worker processes the in-process backend would run ``cfg``'s hosts on, from the config and the cores this
    process may use (``exec.backend.worker_count`` without what only the running driver knows: CUDA initialised in
    it, Ray connected to it; either keeps that run on one process, and neither changes its records)."""
    backend = cfg.backend
    if backend.device == "cuda" or fork_refusal(backend.torch_threads):
        return 1
    return planned_workers(backend.processes, backend.num_hosts)


def _unused(cfg: ExperimentConfig) -> str:
    """The reason's tail naming the Ray-only keys an in-process run does not use (empty when there are none)."""
    unused = ray_only_settings(cfg)
    return f"; not used in-process: {', '.join(unused)} (backend.kind=ray uses them)" if unused else ""


def ray_only_settings(cfg: ExperimentConfig) -> list[str]:
    """``backend.KEY=VALUE`` for each key of ``RAY_ONLY`` that ``cfg`` sets to other than its default."""
    defaults = type(cfg.backend)()
    return [
        f"backend.{k}={getattr(cfg.backend, k)}" for k in RAY_ONLY if getattr(cfg.backend, k) != getattr(defaults, k)
    ]


def resolve_backend(cfg: ExperimentConfig) -> tuple[ExperimentConfig, BackendChoice]:
    """``cfg`` with ``backend.kind`` the backend it runs on, and the choice (``cfg`` itself when it named one)."""
    choice = choose_backend(cfg)
    if choice.kind == cfg.backend.kind:
        return cfg, choice
    return dataclasses.replace(cfg, backend=dataclasses.replace(cfg.backend, kind=choice.kind)), choice
