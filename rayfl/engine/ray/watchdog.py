"""The watchdog over Ray actors with a call in flight: one that runs no Python (hung) or whose work has stopped moving
(stuck) is killed, so that the recovery it would get from a death replaces it (``recovery.py``).

Ray sees neither case: the process lives and its node's health checks pass, so ``ray.wait`` would wait for ever. Two
kinds, told apart by what the actor still answers (issue 45, item 5):

* **Hung** (``backend.hang_timeout_s``): the actor answers no ping. Every watched actor answers its pings from a
  thread of its own (a "watchdog" concurrency group, ``pool.py``, ``state_stores.py``) even while its call runs, so a
  ping unanswered for the timeout means the process runs no Python at all: stopped, deadlocked in native code holding
  the interpreter lock, its node unreachable.
* **Stuck** (``backend.stall_timeout_s``): the actor answers, but its progress has not moved. The ping's answer is the
  actor's count of finished units of work, bumped by the work itself: a host's training forward passes (a hook on the
  client's model), clients trained, test batches evaluated and uploads reduced, a shard's partial sums merged, a state
  store's calls served. A host blocked in a read on a dead mount, or in a CUDA call that never returns, has released
  the lock and answers every ping; only the count, still for the timeout while its call is in flight, shows it does
  nothing. A unit's length depends on the run (one forward and backward pass: milliseconds for a toy model, seconds or
  more for a large one on a slow device), so the limit is the configured timeout or ``STALL_FACTOR`` times the longest
  gap between two moves the run has seen for that kind of actor (``Pace``, kept for the whole run), whichever is
  longer.

Either way one warning line names the actor (one per actor: its other calls in flight die with it), what its call
was doing and for how long nothing moved; the actor is killed with ``ray.kill`` (Ray restarts a host or shard in its
slot; the call in flight fails as the actor's death and is re-run like any other, counted in ``faults``; a state
store is not restarted, and its loss stops the run).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, cast

__all__ = ["STALL_FACTOR", "Killed", "Pace", "Watchdog", "Watched", "WatchedCall", "wait_watched", "watchdog_group"]

log = logging.getLogger(__name__)

# the stall limit is at least this many times the longest gap between two moves of the progress of one kind of actor
# seen in the run: a unit of work that took 30 s once is not stuck at 60 s
STALL_FACTOR = 10.0

_F = TypeVar("_F", bound=Callable[..., Any])


def watchdog_group(method: _F) -> _F:
    """Run the actor method ``method`` (its ping) in the actor's "watchdog" concurrency group, beside the call in
    flight (the actor class is made with ``concurrency_groups={"watchdog": 1}``)."""
    import ray

    return cast(_F, ray.method(concurrency_group="watchdog")(method))


class Watched(Protocol):
    """What the watchdog needs of a call in flight (``recovery.Step``): ``ping`` submits a call the actor answers
    beside the one in flight, with its progress count; ``kill`` kills it (``None``: not watched)."""

    @property
    def label(self) -> str: ...
    @property
    def doing(self) -> str: ...
    @property
    def ping(self) -> Callable[[], Any] | None: ...
    @property
    def kill(self) -> Callable[[], None] | None: ...


@dataclass(frozen=True)
class WatchedCall:
    """``Watched`` for a call that ``recovery.Step`` does not describe (a state store's)."""

    label: str
    doing: str
    ping: Callable[[], Any] | None
    kill: Callable[[], None] | None


@dataclass(frozen=True)
class Killed:
    """A call whose actor the watchdog killed: how long the call had been in flight, and why (one phrase for the
    failure's message)."""

    in_flight_s: float
    reason: str


@dataclass
class Pace:
    """The longest gap between two moves of an actor's progress seen so far in the run, per kind of actor (a host's
    unit, a training step or a client, takes far longer than a shard's, one partial sum merged); ``Recovery`` keeps
    one."""

    longest_s: dict[str, float] = field(default_factory=dict)

    def saw(self, label: str, gap_s: float) -> None:
        kind = _kind(label)
        self.longest_s[kind] = max(self.longest_s.get(kind, 0.0), gap_s)

    def of(self, label: str) -> float:
        return self.longest_s.get(_kind(label), 0.0)


def _kind(label: str) -> str:
    """The kind of actor a label names ("client host 3" -> "client host")."""
    return label.rstrip("0123456789 ")


@dataclass
class _Call:
    """The watchdog's view of one call in flight."""

    began: float  # when the watchdog first saw it
    moved: float  # when its actor's progress last moved (first: ``began``)
    moves: int = 0  # how often it moved: the pace counts gaps between two moves (the first also holds the call's
    # wait for its arguments and a fresh actor's start-up)
    progress: int | None = None  # the count last read (``None``: no ping answered yet)
    ping: tuple[Any, float] | None = None  # the outstanding ping and when it was sent


class Watchdog:
    """The watchdog of one ``Recovery.gather`` (or dispatch loop): every ``tick_s`` (a quarter of the shorter timeout,
    at most 5 s) it reads the answered pings of the watched calls in flight, sends a new ping where none is
    outstanding, and kills the actor of a call that is hung or stuck (module docstring)."""

    def __init__(self, hang_timeout_s: float, stall_timeout_s: float = 0.0, pace: Pace | None = None) -> None:
        self.hang_timeout_s = hang_timeout_s
        self.stall_timeout_s = stall_timeout_s
        self.pace = pace if pace is not None else Pace()
        on = [t for t in (hang_timeout_s, stall_timeout_s) if t > 0]
        self.tick_s = min(5.0, max(0.05, min(on) / 4)) if on else None
        self._calls: dict[Any, _Call] = {}
        self._killed: dict[Any, Killed] = {}
        self._dead: dict[str, Killed] = {}  # actor label -> why it was killed (its other calls in flight die with it)

    def stall_limit_s(self, label: str) -> float:
        """How long the progress of actor ``label`` may stand still: the configured timeout, or more for a run whose
        units of that kind of actor are long."""
        return max(self.stall_timeout_s, STALL_FACTOR * self.pace.of(label))

    def check(self, steps: Mapping[Any, Watched], keys: Iterable[Any]) -> None:
        """Look at the calls ``keys`` (all in flight) once."""
        if self.tick_s is None:
            return
        now = time.monotonic()
        for key in list(keys):
            step = steps[key]
            if step.ping is None or key in self._killed:
                continue
            if step.label in self._dead:  # a call queued behind the one that got its actor killed: no second line
                self._killed[key] = self._dead[step.label]
                continue
            call = self._calls.setdefault(key, _Call(began=now, moved=now))
            reason = self._look(step, call, now)
            if reason is not None:
                self._killed[key] = self._dead[step.label] = Killed(now - call.began, reason)
                if step.kill is not None:
                    step.kill()
            elif call.ping is None:
                call.ping = (step.ping(), now)

    def _look(self, step: Watched, call: _Call, now: float) -> str | None:
        """Read the call's answered ping; returns why its actor must be killed, or ``None``."""
        import ray

        doing = f" while {step.doing}" if step.doing else ""
        if call.ping is not None:
            answered, _ = ray.wait([call.ping[0]], timeout=0)
            if answered:
                self._read(step.label, call, answered[0], now)
            elif self.hang_timeout_s > 0 and now - call.ping[1] >= self.hang_timeout_s:
                silent_s = now - call.ping[1]
                log.warning("%s answered no ping for %.1f s%s: killing it as hung", step.label, silent_s, doing)
                return (
                    f"hung: answered no ping for {self.hang_timeout_s:g} s (backend.hang_timeout_s) while its call "
                    f"had run {now - call.began:.1f} s, so it was killed"
                )
        limit = self.stall_limit_s(step.label)
        if self.stall_timeout_s > 0 and call.progress is not None and now - call.moved >= limit:
            log.warning(
                "%s made no progress for %.1f s%s, though it answers pings (blocked with the interpreter lock "
                "released: a read, a device call; limit %.1f s, backend.stall_timeout_s): killing it as stuck",
                step.label,
                now - call.moved,
                doing,
                limit,
            )
            return (
                f"stuck: its progress stood still for {now - call.moved:.1f} s{doing} (limit {limit:.1f} s, "
                "backend.stall_timeout_s), so it was killed"
            )
        return None

    def _read(self, label: str, call: _Call, ref: Any, now: float) -> None:
        """Take an answered ping's progress count (a ping that failed: the actor died, and its call will say so)."""
        import ray

        call.ping = None
        try:
            progress = int(ray.get(ref))
        except Exception:
            return
        if call.progress is not None and progress != call.progress:
            if call.moves:
                self.pace.saw(label, now - call.moved)
            call.moved, call.moves = now, call.moves + 1
        call.progress = progress

    def forget(self, key: Any) -> Killed | None:
        """The call came back (done or failed): stop watching it; returns how and why the watchdog killed its actor,
        or ``None``."""
        self._calls.pop(key, None)
        return self._killed.pop(key, None)


def wait_watched(watch: Watchdog, calls: Mapping[Any, tuple[Watched, Any]]) -> dict[Any, Killed]:
    """Wait until every call of ``calls`` (key -> its handles and its object reference) has come back, each watched
    while in flight; returns those whose actors the watchdog killed (their references hold the deaths)."""
    import ray

    pending = {ref: key for key, (_, ref) in calls.items()}
    steps = {key: watched for key, (watched, _) in calls.items()}
    killed: dict[Any, Killed] = {}
    while pending:
        done, _ = ray.wait(list(pending), num_returns=len(pending), timeout=watch.tick_s)
        for ref in done:
            key = pending.pop(ref)
            gone = watch.forget(key)
            if gone is not None:
                killed[key] = gone
        if pending:
            watch.check(steps, pending.values())
    return killed
