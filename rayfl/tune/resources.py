"""What one sweep trial reserves: the placement-group bundles of its driver, client hosts and parameter-server shards.

A trial is one simulation whose driver (the Tune function) starts its own Ray actors. Tune creates the trial inside a
placement group, and the Ray backend, when it finds itself in one, pins its actors to the group's bundles by index
(``rayfl/engine/ray/placement.py``). This module fixes that layout; both sides follow it:

* bundle ``0``: the trial's driver process, ``{"CPU": driver_cpus}``;
* bundles ``1 .. H``: client host ``h`` in bundle ``1 + h``, ``{"CPU": cpus_per_host, "GPU": gpus_per_host}`` (the
  GPU entry only when ``gpus_per_host > 0``, and in a mixed pool only for the GPU hosts ``h < gpu_hosts``);
* bundles ``H + 1 .. H + S``: parameter-server shard ``s`` in bundle ``1 + H + s``, ``{"CPU": cpus_per_shard}``, only
  when ``cpus_per_shard > 0``. Ray refuses bundles that hold nothing, so shards that reserve no CPU get no bundle:
  the backend creates them with ``num_cpus=0`` inside the group without a bundle of their own.

``backend.cpus_per_host: 0`` means "split the cluster's CPUs over the hosts", which is right for one run on a machine
and wrong inside a sweep (every trial would claim the whole cluster), so a sweep first replaces it by an explicit
share (``TrialResources.cpus_per_host``, see ``trial_backend``) and the hosts then ask for exactly what their bundles
hold. Trials on the in-process backend (``backend.kind: local``) and search-only trials run everything in the driver:
one bundle. ``backend.processes`` (worker processes forked from the driver) does not apply in a sweep: a trial's
driver is a Ray worker process, which must not fork (its Ray connections would be shared with the child: Ray's
"forking new processes in application code" anti-pattern), so a local trial runs its hosts in its driver
(``processes: 1``) whatever the experiment asks.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Literal

from rayfl.config.fields import bounded
from rayfl.config.sections import BackendConfig, host_gpu_shares

__all__ = [
    "DEFAULT_DRIVER_CPUS",
    "DEFAULT_HOST_CPUS",
    "TrialResources",
    "driver_bundles",
    "one_process",
    "trial_backend",
    "trial_bundles",
]

DEFAULT_DRIVER_CPUS = 0.25  # a driver mostly waits on its hosts; small shares let trials share a 2-core machine
DEFAULT_HOST_CPUS = 0.25


@dataclass(frozen=True, kw_only=True)
class TrialResources:
    """The ``trial_resources`` section of a sweep file: CPU shares of a trial's driver and (when the experiment leaves
    ``backend.cpus_per_host`` at 0) of each client host, and how Tune places a trial's bundles over nodes."""

    driver_cpus: float = bounded(DEFAULT_DRIVER_CPUS, gt=0.0)  # the trial's driver process (bundle 0)
    cpus_per_host: float = bounded(DEFAULT_HOST_CPUS, gt=0.0)  # each client host, where backend.cpus_per_host is 0
    strategy: Literal["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] = "PACK"  # Ray's placement-group strategy


def trial_backend(backend: BackendConfig, resources: TrialResources) -> BackendConfig:
    """``backend`` with an explicit host CPU share: ``cpus_per_host: 0`` becomes ``resources.cpus_per_host``; an
    in-process trial's ``processes`` becomes 1 (module docstring)."""
    if backend.kind == "ray" and backend.cpus_per_host == 0:
        return dataclasses.replace(backend, cpus_per_host=resources.cpus_per_host)
    return one_process(backend) if backend.kind == "local" else backend


def one_process(backend: BackendConfig) -> BackendConfig:
    """``backend`` with its in-process hosts in the trial's driver: ``processes`` 1 (a trial forks no workers)."""
    return backend if backend.processes in (0, 1) else dataclasses.replace(backend, processes=1)


def driver_bundles(driver_cpus: float = DEFAULT_DRIVER_CPUS) -> list[dict[str, float]]:
    """A trial that runs everything in its driver (search-only, or the in-process backend)."""
    if driver_cpus <= 0:
        raise ValueError(f"driver_cpus must be > 0 (a bundle must hold something), got {driver_cpus}")
    return [{"CPU": float(driver_cpus)}]


def trial_bundles(backend: BackendConfig, *, driver_cpus: float = DEFAULT_DRIVER_CPUS) -> list[dict[str, float]]:
    """The bundles of a training trial on ``backend``, in the layout of the module docstring.

    Raises ``ValueError`` for ``backend.kind: ray`` with ``cpus_per_host: 0`` (pass the config through
    ``trial_backend`` first): a host bundle must say how much it holds.
    """
    bundles = driver_bundles(driver_cpus)
    if backend.kind == "local":  # everything in the driver (a trial forks no worker processes: module docstring)
        return bundles
    if backend.cpus_per_host <= 0:
        raise ValueError(
            "backend.cpus_per_host is 0 ('split the cluster's CPUs'), which a trial cannot reserve: give it an "
            "explicit share (a sweep does so from trial_resources.cpus_per_host)"
        )
    for gpus in host_gpu_shares(backend):  # a mixed pool's CPU-only hosts get bundles without a GPU entry
        bundles.append({"CPU": float(backend.cpus_per_host), **({"GPU": float(gpus)} if gpus > 0 else {})})
    if backend.cpus_per_shard > 0:
        bundles += [{"CPU": float(backend.cpus_per_shard)} for _ in range(backend.num_shards)]
    return bundles
