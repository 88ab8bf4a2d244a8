"""Per-client resource values as pure functions of ``(client, time, round)``, vectorised over clients.

Every source returns values in SI units (bytes, bit/s, FLOP/s, 0/1). ``TraceReplay`` is the step function of a
``(timestamp, value)`` log: the value at ``t`` is the last sample at or before ``(t + offset) mod period``, where the
period is the log's length plus one median sampling interval (so the last sample holds as long as the others), and
the log loops. It can also integrate a bandwidth log exactly (``transfer_time``) and find the lowest value in a time
window (``window_min``), which is what the simulated clock needs.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from rayfl.config.sections import ResourceConfig
from rayfl.core.rng import derive_rng

__all__ = [
    "Constant",
    "Empirical",
    "Levels",
    "Log",
    "RangeSource",
    "ResourceSource",
    "TraceReplay",
    "Unlimited",
    "build_source",
]

# config units -> SI
UNIT_SCALE = {"memory": 2.0**20, "bandwidth": 1e6, "compute": 1e9, "availability": 1.0, "link_error": 1.0}


class ResourceSource(ABC):
    """Values of one resource for a set of clients at simulated time ``t`` (seconds) in round ``round_idx``."""

    @abstractmethod
    def at(self, clients: np.ndarray, t: float, round_idx: int) -> np.ndarray:
        """Value per client (SI units)."""

    @property
    def time_invariant(self) -> bool:
        """Whether a client's value is the same at every time and round (a check over the run's budgets then needs
        one round start, not several); ``False`` unless a source knows better."""
        return False

    def window_min(self, clients: np.ndarray, start: np.ndarray, end: np.ndarray, round_idx: int) -> np.ndarray:
        """Lowest value per client over ``[start, end]``; sources that hold a value for the round return it."""
        return self.at(clients, float(np.min(start)) if len(start) else 0.0, round_idx)

    def transfer_time(self, clients: np.ndarray, start: np.ndarray, bits: np.ndarray, round_idx: int) -> np.ndarray:
        """Seconds to move ``bits`` per client from ``start`` at this (bandwidth) resource's rate."""
        rate = self.at(clients, float(np.min(start)) if len(start) else 0.0, round_idx)
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.where(bits <= 0, 0.0, bits / rate)
        return np.where(rate <= 0, np.where(bits <= 0, 0.0, np.inf), out)


class Unlimited(ResourceSource):
    def at(self, clients: np.ndarray, t: float, round_idx: int) -> np.ndarray:
        return np.full(len(clients), np.inf)

    @property
    def time_invariant(self) -> bool:
        return True


@dataclass(frozen=True)
class Constant(ResourceSource):
    value: float

    def at(self, clients: np.ndarray, t: float, round_idx: int) -> np.ndarray:
        return np.full(len(clients), self.value)

    @property
    def time_invariant(self) -> bool:
        return True


@dataclass(frozen=True)
class RangeSource(ResourceSource):
    """Uniform in ``[low, high]`` (or only its two ends with ``binary``), per client and round or per client."""

    low: float
    high: float
    binary: bool
    per_round: bool
    seed: int
    purpose: str

    def at(self, clients: np.ndarray, t: float, round_idx: int) -> np.ndarray:
        key = round_idx if self.per_round else -1
        out = np.empty(len(clients))
        for i, c in enumerate(clients):  # one derived generator per (client, round): order-free and reproducible
            u = derive_rng(self.seed, self.purpose, int(c), key).random()
            out[i] = (self.high if u >= 0.5 else self.low) if self.binary else self.low + u * (self.high - self.low)
        return out

    @property
    def time_invariant(self) -> bool:
        return not self.per_round


@dataclass(frozen=True)
class Levels(ResourceSource):
    """Each round, the given clients split into ``len(values)`` equal groups by a seeded permutation.

    With ``n`` clients and ``L`` levels every level gets ``n // L`` clients and the first ``n % L`` levels one more:
    exactly 1/L each when ``L`` divides the cohort. The value of a client depends on the round's cohort, which is
    what "exactly 1/5 of the sampled clients per level" means.

    A level is the client's, not the resource's: the permutation does not depend on ``purpose``, so every ``levels``
    source of a run with the same number of levels puts a client in the same group. Memory and bandwidth levels then
    describe one device class (HeteroFL's "model complexity level", paper 000 settings 1-2: the clients of level
    ``i`` have the memory *and* the bandwidth of the ``i``-th model), rather than two independent draws whose
    minimum would skew the cohort towards the small levels.

    With ``id_bounds`` a client's level is fixed by its id instead (ids below ``id_bounds[0]`` level 0, and so on),
    whatever the round's cohort: FedHeN's first half of the clients simple devices, the last half complex ones.

    With ``band`` a client of level ``i >= 1`` gets a value drawn uniformly in ``[values[i], values[i - 1])`` (its
    band, up to the next level; ``values`` decreasing) instead of ``values[i]``; level 0 keeps ``values[0]``. The
    place in the band is drawn per client and round (``per_round``) or once per client, from a generator keyed by
    the source's ``purpose``: memory and bandwidth of one client lie at independent places of their bands.
    """

    values: tuple[float, ...]
    seed: int
    purpose: str
    id_bounds: tuple[int, ...] = ()  # non-empty: the level is fixed by client id, not drawn per round
    band: bool = False
    per_round: bool = True

    def at(self, clients: np.ndarray, t: float, round_idx: int) -> np.ndarray:
        values = np.asarray(self.values, dtype=np.float64)
        if self.id_bounds:
            level = np.searchsorted(np.asarray(self.id_bounds), np.asarray(clients, dtype=np.int64), side="right")
        else:
            order = np.argsort(np.asarray(clients), kind="stable")  # canonical: independent of the caller's order
            perm = derive_rng(self.seed, "levels", len(self.values), round_idx).permutation(len(clients))
            level = np.empty(len(clients), dtype=np.int64)
            level[order[perm]] = np.arange(len(clients)) * len(self.values) // max(len(clients), 1)
        if not self.band:
            return values[level]
        key = round_idx if self.per_round else -1
        u = np.array([derive_rng(self.seed, f"{self.purpose}/band", int(c), key).random() for c in clients])
        upper = values[np.maximum(level - 1, 0)]
        # u < 1, so a value stays below the next level's; level 0 has upper == values[0]
        return values[level] + u * (upper - values[level])

    @property
    def time_invariant(self) -> bool:
        # a level drawn per round's cohort changes; a level fixed by id keeps, and so does its place in the band
        # unless that is drawn per round
        return bool(self.id_bounds) and not (self.band and self.per_round)


@dataclass(frozen=True)
class Empirical(ResourceSource):
    """Values drawn per client and round from an empirical distribution (e.g. phone bandwidth tests)."""

    samples: np.ndarray
    seed: int
    purpose: str
    per_round: bool = True

    def at(self, clients: np.ndarray, t: float, round_idx: int) -> np.ndarray:
        key = round_idx if self.per_round else -1
        idx = [derive_rng(self.seed, self.purpose, int(c), key).integers(len(self.samples)) for c in clients]
        return self.samples[np.asarray(idx, dtype=np.int64)]

    @property
    def time_invariant(self) -> bool:
        return not self.per_round


@dataclass(frozen=True)
class Log:
    """One ``(timestamp, value)`` log in SI units, as a looping step function."""

    t: np.ndarray  # seconds from the log's start, non-decreasing, t[0] == 0
    values: np.ndarray
    name: str = ""

    def __post_init__(self) -> None:
        if len(self.t) == 0 or len(self.t) != len(self.values):
            raise ValueError(f"log {self.name!r}: needs as many timestamps as values, at least one")

    @property
    def period(self) -> float:
        if len(self.t) == 1:
            return 1.0
        step = float(np.median(np.diff(self.t)))
        return float(self.t[-1]) + (step if step > 0 else 1.0)

    @property
    def edges(self) -> np.ndarray:
        """Segment boundaries of one period: sample i holds on [edges[i], edges[i+1])."""
        return np.append(self.t, self.period)

    @property
    def cumulative(self) -> np.ndarray:
        """Integral of the value from 0 to each edge (for transfer times)."""
        return np.concatenate([[0.0], np.cumsum(self.values * np.diff(self.edges))])


class TraceReplay(ResourceSource):
    """Logs assigned to clients (round-robin or seeded at random), each client with its own offset into its log."""

    def __init__(self, logs: Sequence[Log], assign: str, offset: str, seed: int, purpose: str) -> None:
        if not logs:
            raise ValueError("trace replay needs at least one log")
        self.logs = list(logs)
        self.assign = assign
        self.offset_mode = offset
        self.seed = seed
        self.purpose = purpose
        self._edges = [log.edges for log in self.logs]
        self._cum = [log.cumulative for log in self.logs]

    def log_of(self, clients: np.ndarray) -> np.ndarray:
        c = np.asarray(clients, dtype=np.int64)
        if self.assign == "round_robin":
            out: np.ndarray = c % len(self.logs)
            return out
        return np.array([derive_rng(self.seed, f"{self.purpose}/log", int(k)).integers(len(self.logs)) for k in c])

    def offset_of(self, clients: np.ndarray, logs: np.ndarray) -> np.ndarray:
        if self.offset_mode == "zero":
            return np.zeros(len(clients))
        periods = np.array([self.logs[k].period for k in logs])
        u = np.array([derive_rng(self.seed, f"{self.purpose}/offset", int(c)).random() for c in clients])
        offsets: np.ndarray = u * periods
        return offsets

    def _groups(self, clients: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        logs = self.log_of(clients)
        return logs, self.offset_of(clients, logs)

    def at(self, clients: np.ndarray, t: float, round_idx: int) -> np.ndarray:
        return self.at_times(clients, np.full(len(clients), float(t)))

    def at_times(self, clients: np.ndarray, times: np.ndarray) -> np.ndarray:
        """Value per client at its own time."""
        logs, offsets = self._groups(clients)
        out = np.empty(len(clients))
        for k in np.unique(logs):  # a loop over logs, vectorised over the clients replaying each
            sel = logs == k
            log = self.logs[k]
            tau = np.mod(times[sel] + offsets[sel], log.period)
            out[sel] = log.values[np.searchsorted(log.t, tau, side="right") - 1]
        return out

    def window_min(self, clients: np.ndarray, start: np.ndarray, end: np.ndarray, round_idx: int) -> np.ndarray:
        logs, offsets = self._groups(clients)
        out = np.empty(len(clients))
        for i, (k, off) in enumerate(zip(logs, offsets, strict=True)):
            log = self.logs[k]
            if end[i] - start[i] >= log.period:
                out[i] = log.values.min()
                continue
            a = np.mod(start[i] + off, log.period)
            b = a + (end[i] - start[i])
            first = np.searchsorted(log.t, a, side="right") - 1
            if b < log.period:
                last = np.searchsorted(log.t, b, side="right") - 1
                out[i] = log.values[first : last + 1].min()
            else:  # the window wraps past the end of the log
                last = np.searchsorted(log.t, b - log.period, side="right") - 1
                out[i] = min(log.values[first:].min(), log.values[: last + 1].min())
        return out

    def transfer_time(self, clients: np.ndarray, start: np.ndarray, bits: np.ndarray, round_idx: int) -> np.ndarray:
        """Exact time to move ``bits`` from ``start`` by integrating the looping step function (inf if it is all 0)."""
        logs, offsets = self._groups(clients)
        out = np.empty(len(clients))
        for k in np.unique(logs):
            sel = logs == k
            edges, cum, period = self._edges[k], self._cum[k], self.logs[k].period
            per_period = cum[-1]
            # a transfer that starts never (after an endless one) never ends; looking its start up would index past
            # the log (NaN sorts last)
            never = ~np.isfinite(start[sel])
            tau0 = np.mod(np.where(never, 0.0, start[sel]) + offsets[sel], period)
            seg = np.minimum(np.searchsorted(edges, tau0, side="right") - 1, len(edges) - 2)
            done0 = cum[seg] + self.logs[k].values[seg] * (tau0 - edges[seg])  # integral from 0 to tau0
            target = done0 + bits[sel]
            if per_period <= 0:
                out[sel] = np.where(never | (bits[sel] > 0), np.inf, 0.0)
                continue
            laps = np.floor(target / per_period)
            rest = target - laps * per_period
            # a transfer ending exactly on a lap boundary ends where the previous lap's last positive segment does,
            # not after the zero-bandwidth span that may close the log
            boundary = (rest <= 0) & (laps > 0)
            laps = np.where(boundary, laps - 1, laps)
            rest = np.where(boundary, per_period, rest)
            # first edge whose cumulative reaches ``rest``; the crossing lies in the segment before it
            j = np.clip(np.searchsorted(cum, rest, side="left"), 1, len(cum) - 1)
            rate = self.logs[k].values[j - 1]
            with np.errstate(divide="ignore", invalid="ignore"):
                within = np.where(rate > 0, (rest - cum[j - 1]) / rate, 0.0)
            tau1 = edges[j - 1] + within
            out[sel] = np.where(never, np.inf, np.where(bits[sel] <= 0, 0.0, laps * period + tau1 - tau0))
        return out


_NOT_LOGS = {"license", "copying", "readme", "source", "notice"}


def _trace_files(cfg: ResourceConfig) -> list[Path]:
    if cfg.file:
        return [Path(cfg.file)]
    assert cfg.directory is not None
    files = [
        p
        for p in sorted(Path(cfg.directory).glob(cfg.pattern))
        if p.is_file() and not p.name.startswith(".") and p.name.split(".")[0].lower() not in _NOT_LOGS
    ]
    if not files:
        raise ValueError(f"no trace files matching {cfg.pattern!r} in {cfg.directory}")
    return files


def load_logs(cfg: ResourceConfig, kind: str) -> list[Log]:
    """Read every log of a ``trace`` source in SI units (the file's declared unit, times ``cfg.scale``)."""
    from rayfl.system.logs import load_si

    logs = []
    for path in _trace_files(cfg):
        t, values = load_si(path, cfg.format, kind, direction=cfg.direction)
        logs.append(Log(np.asarray(t, dtype=np.float64), np.asarray(values, dtype=np.float64) * cfg.scale, path.name))
    return logs


def _within(samples: np.ndarray, cfg: ResourceConfig, unit: float, kind: str) -> np.ndarray:
    """An empirical distribution restricted to ``[low, high]`` when ``high`` is set (e.g. paper 000 setting 5's
    Wi-Fi rates "within [30, 100] Mb/s"): the tests outside the range are left out, not clipped."""
    if cfg.high <= 0.0:
        return samples
    kept = samples[(samples >= cfg.low * unit) & (samples <= cfg.high * unit)]
    if len(kept) == 0:
        raise ValueError(f"{cfg.file}: no {kind} value of the distribution lies in [{cfg.low:g}, {cfg.high:g}]")
    return kept


def build_source(cfg: ResourceConfig | None, kind: str, seed: int, purpose: str) -> ResourceSource:
    """The source a ``ResourceConfig`` describes; ``kind`` is memory, bandwidth, compute or availability."""
    if cfg is None or cfg.source == "none":
        return Unlimited()
    unit = UNIT_SCALE[kind] * cfg.scale
    if cfg.source == "constant":
        return Constant(cfg.low * unit)
    if cfg.source in ("uniform", "binary"):
        return RangeSource(cfg.low * unit, cfg.high * unit, cfg.source == "binary", cfg.per_round, seed, purpose)
    if cfg.source == "levels":
        band = cfg.level_budget == "band"
        return Levels(tuple(v * unit for v in cfg.values), seed, purpose, tuple(cfg.id_bounds), band, cfg.per_round)
    if cfg.source == "empirical":
        from rayfl.system.logs import load_distribution_si

        assert cfg.file is not None
        samples = np.asarray(load_distribution_si(Path(cfg.file), cfg.format, kind, cfg.technology)) * cfg.scale
        return Empirical(_within(samples, cfg, unit, kind), seed, purpose, cfg.per_round)
    return TraceReplay(load_logs(cfg, kind), cfg.assign, cfg.offset, seed, purpose)
