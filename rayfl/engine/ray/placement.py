"""Where the Ray backend's actors go: placement-group bundles, or Ray's SPREAD strategy.

Three situations, one decision each (pure functions here; ``ray_pool.py`` applies them):

* **Inside a placement group** (a Ray Tune trial, or any task started in one): the group was sized for the run, so
  every actor is pinned to its own bundle and asks for exactly what it was given. The layout (``trial_bundles`` in
  ``rayfl.tune`` builds it) is bundle 0 = the driver, bundles ``1..H`` = the ``H`` client hosts, then one bundle per
  parameter-server shard when shards reserve CPUs. Shards that reserve nothing get no bundle and stay in the group
  with bundle index ``-1`` ("any bundle"), which Ray accepts for zero-resource actors.
* **``backend.placement: spread``** (the default, outside a group): each actor uses Ray's ``SPREAD`` strategy, so a
  multi-node cluster puts client hosts on every node.
* **``backend.placement: pack``** (outside a group): the backend reserves its own ``PACK`` group (one bundle per host
  and per CPU-reserving shard) so hosts fill as few nodes as possible (e.g. four quarter-GPU hosts on one GPU),
  all-or-nothing, and gives it back when it closes.

On a reserved head (``backend.head``, ``head.py``) the layout names the head in ``avoid``: outside a group every actor
carries a label selector that excludes it, and a group of the pool's own has each bundle excluded from it; a Tune
trial's group is excluded by the sweep when it asks for the group (``rayfl/tune/sweep.py``).

In all three a mixed pool (``backend.gpu_hosts``) gives the GPU share to hosts ``0 .. gpu_hosts - 1`` only; the other
hosts ask for CPUs alone (and their bundles hold no GPU).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rayfl.config.sections import gpu_shares

__all__ = ["ANY_BUNDLE", "ActorSlot", "PoolLayout", "layout_in_group", "pack_layout", "spread_layout"]

ANY_BUNDLE = -1  # Ray's bundle index for "anywhere in the group"
_EPS = 1e-9  # Ray keeps resources to 1e-4; this only absorbs float noise in the comparisons


@dataclass(frozen=True)
class ActorSlot:
    """What one actor asks Ray for and where: ``bundle_index`` is its bundle in the placement group
    (``ANY_BUNDLE`` = in the group, no bundle of its own), or ``None`` outside any group."""

    num_cpus: float
    num_gpus: float = 0.0
    bundle_index: int | None = None


@dataclass(frozen=True)
class PoolLayout:
    """One slot per client host and per parameter-server shard, in id order; ``avoid`` is the node none of them may
    run on (a reserved head, ``head.py``), or None."""

    hosts: tuple[ActorSlot, ...]
    shards: tuple[ActorSlot, ...]
    avoid: str | None = None


def spread_layout(
    num_hosts: int, num_shards: int, host_cpus: float, gpus: float, shard_cpus: float, gpu_hosts: int = 0
) -> PoolLayout:
    """No placement group: every actor on its own, with the resources configured (``gpus`` for the first
    ``gpu_hosts`` hosts, all when 0: ``config.sections.gpu_shares``)."""
    return PoolLayout(
        hosts=tuple(ActorSlot(host_cpus, g) for g in gpu_shares(num_hosts, gpus, gpu_hosts)),
        shards=(ActorSlot(shard_cpus),) * num_shards,
    )


def layout_in_group(
    bundles: Sequence[Mapping[str, float]],
    num_hosts: int,
    num_shards: int,
    cpus_per_host: float,
    gpus_per_host: float,
    cpus_per_shard: float,
    first: int = 1,
    gpu_hosts: int = 0,
) -> PoolLayout:
    """Pin host ``h`` to bundle ``first + h`` and shard ``s`` to ``first + num_hosts + s`` of an existing group
    (``first = 1``: bundle 0 is the driver's). A host with ``cpus_per_host == 0`` takes its bundle's CPUs; only the
    first ``gpu_hosts`` hosts (all when 0) ask for ``gpus_per_host``. Raises
    ``ValueError`` when the group has too few bundles or a bundle is too small for its actor."""
    shard_bundles = num_shards if cpus_per_shard > 0 else 0
    needed = first + num_hosts + shard_bundles
    if len(bundles) < needed:
        parts = [f"{first} for the driver"] if first else []
        parts.append(f"{num_hosts} for backend.num_hosts")
        if shard_bundles:
            parts.append(f"{num_shards} for backend.num_shards at {cpus_per_shard} CPU")
        raise ValueError(
            f"the current placement group has {len(bundles)} bundles, but the Ray backend needs {needed} "
            f"({' + '.join(parts)}); size the group from the same backend config (trial_bundles in rayfl.tune)"
        )
    hosts = []
    for h, gpus in enumerate(gpu_shares(num_hosts, gpus_per_host, gpu_hosts)):
        index = first + h
        bundle_cpus = float(bundles[index].get("CPU", 0.0))
        slot = ActorSlot(cpus_per_host if cpus_per_host > 0 else bundle_cpus, gpus, index)
        _check_fits(bundles[index], slot, f"client host {h}")
        hosts.append(slot)
    shards = []
    for s in range(num_shards):
        if cpus_per_shard > 0:
            slot = ActorSlot(cpus_per_shard, 0.0, first + num_hosts + s)
            _check_fits(bundles[slot.bundle_index or 0], slot, f"parameter-server shard {s}")
        else:
            slot = ActorSlot(0.0, 0.0, ANY_BUNDLE)
        shards.append(slot)
    return PoolLayout(tuple(hosts), tuple(shards))


def pack_layout(
    num_hosts: int, num_shards: int, host_cpus: float, gpus: float, shard_cpus: float, gpu_hosts: int = 0
) -> tuple[list[dict[str, float]], PoolLayout]:
    """The bundles of the backend's own ``PACK`` group and where each actor goes in it (``gpus`` for the first
    ``gpu_hosts`` hosts, all when 0). Actors that reserve nothing get no bundle (Ray refuses empty bundles); with no
    bundle at all the list is empty and no group is needed."""
    bundles: list[dict[str, float]] = []

    def slot(cpus: float, gpus_: float) -> ActorSlot:
        bundle = {k: v for k, v in (("CPU", cpus), ("GPU", gpus_)) if v > 0}
        if not bundle:
            return ActorSlot(0.0, 0.0, ANY_BUNDLE)
        bundles.append(bundle)
        return ActorSlot(cpus, gpus_, len(bundles) - 1)

    hosts = tuple(slot(host_cpus, g) for g in gpu_shares(num_hosts, gpus, gpu_hosts))
    shards = tuple(slot(shard_cpus, 0.0) for _ in range(num_shards))
    if not bundles:
        return [], spread_layout(num_hosts, num_shards, host_cpus, gpus, shard_cpus, gpu_hosts)
    return bundles, PoolLayout(hosts, shards)


def _check_fits(bundle: Mapping[str, float], slot: ActorSlot, who: str) -> None:
    for resource, amount in (("CPU", slot.num_cpus), ("GPU", slot.num_gpus)):
        have = float(bundle.get(resource, 0.0))
        if amount > have + _EPS:
            raise ValueError(
                f"{who} needs {amount:g} {resource} but its placement-group bundle {slot.bundle_index} holds "
                f"{dict(bundle)}; size the group from the same backend config (trial_bundles in rayfl.tune)"
            )
