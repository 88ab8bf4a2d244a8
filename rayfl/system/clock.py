"""The simulated clock: budgets at check-in, a plan of every client's round before it runs, and round durations.

Per client in round ``r`` starting at simulated time ``T`` (all times in simulated seconds):

1. *Check-in* reads the budgets at ``T``: memory = the memory value; bandwidth = the bytes it can move within
   ``comm_limit_s`` at its current download and upload rates (``2 L / (1/down + 1/up)`` bytes for equal download and
   upload sizes, i.e. ``L x rate`` when both rates are equal).
2. *Fit*: the assignment's peak training memory must fit the memory budget and ``down/rate_down + up/rate_up`` must
   fit ``comm_limit_s`` (failure ``memory`` or ``bandwidth``); with ``compute_limit_s``, the round's training FLOPs
   must fit what the client's compute speed does within that limit (failure ``compute``); an unavailable client
   fails ``unavailable``, and one whose download or upload rate is zero at ``T`` fails ``no_network`` (a
   zero-bandwidth span or an all-zero trace).
3. *Timeline*: the download starts at ``T`` and takes the exact integral of the bandwidth log; compute takes
   ``train FLOPs / compute speed`` (modelled) from the end of the download; the upload follows. A client whose memory
   value drops below its need during its compute window fails ``memory_dip`` (paper 000, Appendix D.2.2), one that
   goes unavailable before it finishes fails ``dropped``, and one that would finish after ``deadline_s`` fails
   ``deadline``. Failed clients are not run and not aggregated.
   With unstable links (``system.links``, ``links.py``) the bytes each client moves are the transfer levels its
   links put on the wire this round (drawn before the round, so the plan is exact for the download; the upload is
   planned for the client's own level, an upper bound when it trains less without padding); a client that receives
   nothing and cannot pad fails ``link_down``. The budget check uses the whole assignment, as the client plans for.
4. *Duration* = the latest finish among the clients that run (``comm_limit_s`` when none does: the server waits out
   the round), plus the measured server time with ``server_time: measured`` (the round's search, aggregation and
   distillation on the driver: paper 000's latency counts them, Sec. 4.3).

Memory utilisation (``ClientPlan.memory_util``) is the model's own need over the memory the runtime overhead leaves
(``system.memory_overhead_mib`` is in every need the fit check uses, and out of the utilisation); the overhead's
share of the budget is reported beside it (``memory_overhead_share``).

Everything here is a function of the seed, the traces and the assignments: the host's speed never enters the clock
(``compute_time: measured`` is the one opt-in exception, and then memory dips are checked at check-in only).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

import numpy as np

from rayfl.config.model import ModelConfig
from rayfl.config.sections import SystemConfig, TrainConfig
from rayfl.core.messages import Assignment, ClientView, LinkDraw
from rayfl.system.costs import CostOracle, samples_per_round
from rayfl.system.links import LinkModel, attempted, column_levels, delivered
from rayfl.system.resources import ResourceSource, build_source

__all__ = ["ClientPlan", "SimClock"]


@dataclass(frozen=True)
class ClientPlan:
    """One round's plan, one entry per sampled client (in check-in order)."""

    round_idx: int
    start_s: float
    client_id: np.ndarray
    memory_budget: np.ndarray
    memory_need: np.ndarray
    bandwidth_budget: np.ndarray  # bytes within comm_limit_s
    bytes_down: np.ndarray
    bytes_up: np.ndarray
    download_s: np.ndarray
    compute_s: np.ndarray
    upload_s: np.ndarray
    failure: tuple[str | None, ...]
    # per client: the budget it exceeded although it ran (assignments with enforce_budgets=False), else ""
    over_budget: tuple[str, ...] = ()
    links: tuple[LinkDraw | None, ...] = ()  # per client: what its unstable links deliver ((): perfect links)
    # per client: FLOPs of its round's local training (3 x forward FLOPs x samples processed; empty: not planned)
    train_flops: np.ndarray = field(default_factory=lambda: np.zeros(0))
    memory_overhead: float = 0.0  # bytes of runtime overhead inside every memory_need (system.memory_overhead_mib)

    def link(self, i: int) -> LinkDraw | None:
        """The link draw of the ``i``-th client (None with perfect links)."""
        return self.links[i] if self.links else None

    def row(self, i: int) -> ClientPlan:
        """Client ``i``'s row as a plan of its own: every per-client column cut to its entry, every other field
        (the round, its start, the memory overhead, and any field added later) kept as it is."""
        one = slice(i, i + 1)
        return replace(self, **{name: column[one] for name, column in self._columns().items() if len(column)})

    @staticmethod
    def concat(plans: Sequence[ClientPlan], round_idx: int, start_s: float) -> ClientPlan:
        """The rows of ``plans`` as one plan of round ``round_idx`` starting at ``start_s`` (an asynchronous step's
        arrivals), in the order given. Per-client columns are concatenated; a column empty in every plan stays
        empty, and one that only some plans recorded is left empty (not recorded for the step). Every other field
        (the memory overhead, any field added later) is the first plan's: the same for every plan of a run."""
        if not plans:
            raise ValueError("ClientPlan.concat needs at least one plan")
        columns: dict[str, Any] = {}
        for name, first in plans[0]._columns().items():
            parts = [getattr(p, name) for p in plans]
            if not all(len(part) for part in parts):
                columns[name] = first[:0]
            elif isinstance(first, np.ndarray):
                columns[name] = np.concatenate(parts)
            else:
                columns[name] = tuple(entry for part in parts for entry in part)
        return replace(plans[0], round_idx=round_idx, start_s=start_s, **columns)

    @classmethod
    def empty(cls, round_idx: int, start_s: float) -> ClientPlan:
        """A plan of no client (an asynchronous step that nothing reached), its columns read off the type's fields."""
        given: dict[str, Any] = {"round_idx": round_idx, "start_s": start_s}
        for f in fields(cls):
            if f.name not in given and f.default is MISSING and f.default_factory is MISSING:
                given[f.name] = () if str(f.type).startswith("tuple") else np.zeros(0)
        return cls(**given)

    def _columns(self) -> dict[str, Any]:
        """The per-client columns, read off the type's fields: every array or tuple field (one entry per client,
        empty when not recorded); a row is never built from a hand-written list of them."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: v for name, v in values.items() if isinstance(v, np.ndarray | tuple)}

    @property
    def runs(self) -> np.ndarray:
        return np.array([f is None for f in self.failure], dtype=bool)

    @property
    def bandwidth_need(self) -> np.ndarray:
        need: np.ndarray = self.bytes_down + self.bytes_up
        return need

    @property
    def finish_s(self) -> np.ndarray:
        finish: np.ndarray = self.download_s + self.compute_s + self.upload_s
        return finish

    @property
    def memory_util(self) -> np.ndarray:
        """The model's own need over the memory left to it: ``(need - overhead) / (budget - overhead)``, so that a
        model filling what the runtime leaves reads 1 whatever the overhead (paper 000's Figure 6 measures the
        model's GPU memory; the runtime's share is ``memory_overhead_share``). NaN for unlimited budgets and for
        budgets that the overhead alone fills."""
        ovh = self.memory_overhead
        room = self.memory_budget - ovh
        with np.errstate(divide="ignore", invalid="ignore"):
            util: np.ndarray = np.where(
                np.isfinite(self.memory_budget) & (room > 0), (self.memory_need - ovh) / room, np.nan
            )
        return util

    @property
    def memory_overhead_share(self) -> np.ndarray:
        """The runtime overhead's share of each memory budget (NaN for unlimited budgets)."""
        with np.errstate(divide="ignore", invalid="ignore"):
            share: np.ndarray = np.where(
                np.isfinite(self.memory_budget), self.memory_overhead / self.memory_budget, np.nan
            )
        return share

    @property
    def bandwidth_util(self) -> np.ndarray:
        with np.errstate(divide="ignore", invalid="ignore"):
            util: np.ndarray = np.where(
                np.isfinite(self.bandwidth_budget), self.bandwidth_need / self.bandwidth_budget, np.nan
            )
        return util

    def duration_s(self, comm_limit_s: float) -> float:
        if len(self.client_id) == 0:  # nobody was sampled (a server phase): no client time at all
            return 0.0
        runs = self.runs
        return float(self.finish_s[runs].max()) if runs.any() else float(comm_limit_s)


class SimClock:
    """Owns simulated time and the resource sources of every client."""

    def __init__(self, cfg: SystemConfig, train: TrainConfig, seed: int, oracle: CostOracle) -> None:
        self.cfg = cfg
        self.train = train
        self.oracle = oracle
        self.now = 0.0
        self.memory = build_source(cfg.memory, "memory", seed, "memory")
        self.down = build_source(cfg.bandwidth_down, "bandwidth", seed, "bandwidth_down")
        self.up: ResourceSource = (
            self.down if cfg.bandwidth_up is None else build_source(cfg.bandwidth_up, "bandwidth", seed, "bandwidth_up")
        )
        self.compute = build_source(cfg.compute, "compute", seed, "compute")
        self.availability = build_source(cfg.availability, "availability", seed, "availability")
        self.links = LinkModel(cfg.links, seed)

    # 1. check-in --------------------------------------------------------------------------------------------------
    def check_in(
        self, round_idx: int, clients: np.ndarray, num_examples: Sequence[int], at: float | None = None
    ) -> list[ClientView]:
        """The clients' views at the round's start, or at simulated time ``at`` (an asynchronous run's clients
        check in when each starts)."""
        t = self.now if at is None else at
        mem = self.memory.at(clients, t, round_idx)
        bw = self._bandwidth_budget(clients, round_idx, t)
        flops = self._compute_budget(clients, round_idx, t)
        # plain Python numbers from ``tolist`` (the same values as ``int``/``float`` of each element, at a tenth of the
        # cost: a census checks in every client of the run)
        return list(
            map(
                ClientView,
                np.asarray(clients, dtype=np.int64).tolist(),
                [int(n) for n in num_examples],
                np.asarray(mem, dtype=np.float64).tolist(),
                np.asarray(bw, dtype=np.float64).tolist(),
                np.asarray(flops, dtype=np.float64).tolist(),
            )
        )

    def _compute_budget(self, clients: np.ndarray, round_idx: int, t: float) -> np.ndarray:
        """Training FLOPs each client can do within ``compute_limit_s`` at its compute speed (inf without a limit)."""
        if self.cfg.compute_limit_s <= 0:
            return np.full(len(clients), np.inf)
        budget: np.ndarray = self.compute.at(clients, t, round_idx) * self.cfg.compute_limit_s
        return budget

    def _bandwidth_budget(self, clients: np.ndarray, round_idx: int, t: float) -> np.ndarray:
        down = self.down.at(clients, t, round_idx)
        up = self.up.at(clients, t, round_idx)
        with np.errstate(divide="ignore"):
            return 2.0 * self.cfg.comm_limit_s / (8.0 / down + 8.0 / up)  # bytes; inf when both are unlimited

    # 2-3. plan ----------------------------------------------------------------------------------------------------
    def plan(
        self,
        round_idx: int,
        views: Sequence[ClientView],
        assignments: Mapping[int, Assignment],
        models: Sequence[ModelConfig] = (),
        train: TrainConfig | None = None,
        train_flops: np.ndarray | None = None,
        at: float | None = None,
    ) -> ClientPlan:
        """``models``: the architectures of a multi-model run's global models (``ServerState.models``), so each
        client's costs are those of the model it was assigned; ``train``: this round's local training when it is not
        the run's (a phase with its own epochs); ``train_flops``: each client's training FLOPs when the algorithm
        counts them itself (``Algorithm.train_flops``), instead of the model's FLOPs per sample times its samples;
        ``at``: the clients' start in simulated time when it is not the round's (an asynchronous run's)."""
        now = self.now if at is None else at
        clients = np.array([v.client_id for v in views], dtype=np.int64)
        n = len(clients)
        costs = self.oracle.model_costs([assignments[int(c)] for c in clients], models)
        mem_budget = np.array([v.memory_budget for v in views], dtype=np.float64)
        bw_budget = np.array([v.bandwidth_budget for v in views], dtype=np.float64)
        need = costs.memory  # the oracle includes system.memory_overhead_mib
        enforce = np.array([assignments[int(c)].enforce_budgets for c in clients], dtype=bool)
        t0 = np.full(n, now)
        rate_down = self.down.at(clients, now, round_idx)
        rate_up = self.up.at(clients, now, round_idx)
        with np.errstate(divide="ignore", invalid="ignore"):
            comm_need_s = 8.0 * costs.bytes_down / rate_down + 8.0 * costs.bytes_up / rate_up
        draws = self.links.draw(round_idx, clients, now)
        sent_down, sent_up, cut_off = self._link_bytes(clients, assignments, draws, costs.bytes_down, costs.bytes_up)
        download = self.down.transfer_time(clients, t0, 8.0 * sent_down, round_idx)
        samples = np.array([self._samples(v.num_examples, train or self.train) for v in views], dtype=np.float64)
        speed = self.compute.at(clients, now, round_idx)
        work = costs.train_flops_per_sample * samples if train_flops is None else np.asarray(train_flops, np.float64)
        flops_budget = np.array([v.compute_budget for v in views], dtype=np.float64)
        with np.errstate(divide="ignore", invalid="ignore"):
            compute = np.where(np.isfinite(speed), work / speed, 0.0)
        upload = self.up.transfer_time(clients, t0 + download + compute, 8.0 * sent_up, round_idx)
        # a client not available at check-in fails ``unavailable``; one with no network then (a zero-bandwidth span,
        # or an all-zero trace) fails ``no_network``
        available = self.availability.at(clients, now, round_idx) >= 0.5
        online = (rate_down > 0) & (rate_up > 0)
        finish = download + compute + upload
        stays = self.availability.window_min(clients, t0, t0 + np.where(np.isfinite(finish), finish, 0.0), round_idx)
        if self.cfg.compute_time == "modelled":
            lowest = self.memory.window_min(clients, t0 + download, t0 + download + compute, round_idx)
        else:
            lowest = mem_budget
        failure: list[str | None] = []
        over_budget: list[str] = []
        for i in range(n):
            exceeded = ""
            if need[i] > mem_budget[i]:
                exceeded = "memory"
            elif comm_need_s[i] > self.cfg.comm_limit_s:
                exceeded = "bandwidth"
            elif work[i] > flops_budget[i]:
                exceeded = "compute"
            elif need[i] > lowest[i]:
                exceeded = "memory_dip"
            over_budget.append(exceeded if not enforce[i] else "")
            if not available[i]:
                failure.append("unavailable")
            elif not online[i]:
                failure.append("no_network")
            elif exceeded and enforce[i]:
                failure.append(exceeded)
            elif cut_off[i]:
                failure.append("link_down")
            elif stays[i] < 0.5:
                failure.append("dropped")
            elif self.cfg.deadline_s > 0 and finish[i] > self.cfg.deadline_s:
                failure.append("deadline")
            else:
                failure.append(None)
        return ClientPlan(
            round_idx=round_idx,
            start_s=now,
            client_id=clients,
            memory_budget=mem_budget,
            memory_need=need,
            bandwidth_budget=bw_budget,
            bytes_down=sent_down,
            bytes_up=sent_up,
            download_s=download,
            compute_s=compute,
            upload_s=upload,
            failure=tuple(failure),
            over_budget=tuple(over_budget),
            links=tuple(draws) if self.links.enabled else (),
            train_flops=work,
            memory_overhead=self.oracle.overhead_bytes,
        )

    def _link_bytes(
        self,
        clients: np.ndarray,
        assignments: Mapping[int, Assignment],
        draws: Sequence[LinkDraw | None],
        bytes_down: np.ndarray,
        bytes_up: np.ndarray,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Bytes each client's links put on the wire (down, up) and who receives nothing and cannot pad."""
        down, up = bytes_down.copy(), bytes_up.copy()
        cut_off = np.zeros(len(clients), dtype=bool)
        for i, (c, draw) in enumerate(zip(clients, draws, strict=True)):
            if draw is None:
                continue
            levels = column_levels(self.oracle.family, assignments[int(c)], draw.column_ratio)
            n = len(levels)
            cost = self.oracle.costs(levels)
            down[i] = cost.bytes_down[attempted(draw.down_run, n) - 1]
            up[i] = cost.bytes_up[attempted(draw.up_run, n) - 1]
            cut_off[i] = delivered(draw.down_run, n) == 0 and not draw.padding
        return down, up, cut_off

    @staticmethod
    def _samples(num_examples: int, t: TrainConfig) -> int:
        """Samples a client processes in local training (epochs over its data, capped by ``max_steps``)."""
        return samples_per_round(t, num_examples)

    def measured_compute(self, plan: ClientPlan, wall_s: Mapping[int, float]) -> ClientPlan:
        """With ``compute_time: measured``, replace modelled compute by measured training time x the scale."""
        if self.cfg.compute_time != "measured":
            return plan
        compute = np.array(
            [wall_s.get(int(c), 0.0) * self.cfg.measured_time_scale for c in plan.client_id], dtype=np.float64
        )
        t0 = np.full(len(plan.client_id), plan.start_s)
        start_up = t0 + plan.download_s + compute
        upload = self.up.transfer_time(plan.client_id, start_up, 8.0 * plan.bytes_up, plan.round_idx)
        return replace(plan, compute_s=compute, upload_s=upload)

    # 4. advance ---------------------------------------------------------------------------------------------------
    def advance(self, plan: ClientPlan, server_s: float, modelled_server_s: float = 0.0) -> float:
        """Move the clock past the round; returns the round's simulated duration. Server time: the measured
        ``server_s`` under ``server_time: measured``, else the ``modelled_server_s`` an algorithm reports (a server
        phase's search, ``engine/phases.py``)."""
        duration = plan.duration_s(self.cfg.comm_limit_s)
        if self.cfg.server_time == "measured":
            duration += server_s
        else:
            duration += modelled_server_s
        self.now += duration
        return duration
