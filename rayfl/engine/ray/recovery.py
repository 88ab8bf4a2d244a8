"""Dead Ray actors replaced: a client host or parameter-server shard that dies mid-run costs a restart, not the run.

What Ray does, and what this module does on top (issue 12, item 2):

* **Ray restarts the process.** Hosts and shards are created with ``max_restarts=-1``: when an actor's process dies
  (SIGKILL, the kernel's or Ray's OOM killer, its node lost), Ray starts a new one in the same slot (the same
  placement-group bundle) and re-runs its constructor with the same arguments. Those are small on purpose: a host's
  data set is not one of them but travels, as an object-store reference, with every call (``RayClientHost`` in
  ``ray_pool.py``), and the host builds itself from it on the first call that finds it unbuilt. Ray 2.60 does not
  keep a restartable actor's object-store constructor arguments alive (ray-project/ray#53727: measured, the restart
  fails with ``ReferenceCountingAssertionError`` once the driver dropped the reference) and logs an error for every
  run that has such an actor; a reference carried by the calls has neither problem. A host holds nothing that later
  rounds depend on (its built models and caches are rebuilt on demand, every client's data comes from the object
  store and its state from the node's state store, ``state_stores.py``), so the restarted host is as good as the dead
  one. A
  shard's tensor names go with every ``reduce`` call, as its constructor knows only the first shard plan.
* **The driver re-runs the lost work.** Actor calls keep Ray's default ``max_task_retries=0``: the call in flight fails
  (``ActorUnavailableError``/``ActorDiedError``) and :class:`Recovery` resubmits it, unchanged, once the actor answers
  again. Ray's own task retries are not used, because the driver must (a) count the failures of a round for the
  ``faults`` record and the give-up limit (``backend.max_actor_failures``), which Ray's silent retries would hide,
  and (b) bound the wait for a replacement (``backend.replace_timeout_s``, apart from ``start_timeout_s``: a lost
  node that an autoscaler replaces takes minutes) with a clear message. Re-running is safe
  and gives the same bits: a host's ``run_round`` is a pure function of its arguments (each client's randomness is
  derived from seed, round and client; its memory is an argument), and a shard's ``reduce`` is a pure function of
  the previous tensors and every host's partial sum, which it receives together in one call, so no partial sum is
  ever half-merged into a shard and nothing has to be discarded.
* **Lineage reconstruction is not relied on** (it needs ``max_task_retries`` on the actor calls, see above). Objects
  that a dead worker had already returned (partial sums, the memories a state store handed out) live in the node's
  object store or, when small, in the driver's, so a killed process loses none of them. An object lost with its
  node makes the call that reads it fail: a shard's reduction then has its inputs recomputed by re-running the
  round's hosts (``InputsLost``); a host's call is re-run as it is.
* **A lost node** (issue 26, item 7: a pre-empted instance, its raylet and every actor on it gone) is the same
  death for every actor it held: Ray marks the node dead once its health checks fail (seconds; the calls in flight
  there then fail, and a call made to an actor that is restarting fails at once with "the actor is restarting":
  measured, no ``ray.wait`` waits on a vanished node) and restarts each actor where the remaining cluster has room.
  Where it has none, the wait for the replacement ends after ``backend.replace_timeout_s`` with one line naming the
  lost node and what the cluster still has (``ActorFailureError``); the driver adds the run's last checkpoint to
  resume from.
* **A hung or stuck actor** (alive but answering nothing: a stopped process, a deadlock in native code; or answering
  but doing nothing: blocked in a read on a dead mount, in a CUDA call that never returns) is what Ray cannot see:
  its node's health checks pass and ``ray.wait`` would wait for ever. The watchdog (``watchdog.py``; ``backend.
  hang_timeout_s`` and ``backend.stall_timeout_s``) watches every host, shard and state store with a call in flight:
  each answers pings from a thread of its own with its count of finished units of work. A ping unanswered for the
  hang timeout, or a count that stood still for the stall limit, gets the actor killed (``ray.kill`` without
  ``no_restart``), and from there it is a death like any other: Ray replaces a host or shard, the call is re-run and
  counted in ``faults``; a state store's loss stops the run.
* **Restarts and Ray's memory monitor.** Hosts and shards keep ``max_restarts=-1``, which makes them "retriable"
  workers, the monitor's first victims. That is the intended order: they are the processes whose loss costs only a
  re-run, while what nothing can recompute (the client memories' state stores, ``max_restarts=0``) is killed last.
  A host killed again and again by the monitor hits ``backend.max_actor_failures`` within its round, and the message
  points at the OOM killer.
* **Client memories lost with a node** (kept by the state store on that node, ``state_stores.py``) cannot be
  recomputed: their rounds are over, and nothing but a replay from the last checkpoint can
  make them again. A host call that reads one (``Step.state``), or the gathering of every memory for a checkpoint,
  therefore stops the run at once with one line (``StateLostError``) instead of re-running a call that can only
  fail again; ``rayfl run --resume`` replays from the last checkpoint, bit for bit, on whatever cluster is there.

An actor that dies while idle and is restarted by Ray before the driver's next call to it has lost no work; that
next call simply runs on the replacement and is not counted (the count is of calls that had to be re-run).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from rayfl.core.errors import RunLostError
from rayfl.engine.ray.watchdog import Killed, Pace, Watchdog

__all__ = [
    "ActorFailureError",
    "InputsLost",
    "Recovery",
    "StateLostError",
    "Step",
    "actor_died",
    "lost",
    "lost_nodes",
]

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class ActorFailureError(RunLostError):
    """The run gave up on dead Ray actors: more failures in one round than allowed, or a replacement that did not
    come (one line, with the driver's resume hint: ``RunLostError``)."""


class StateLostError(ActorFailureError):
    """Objects that no re-run can recompute (client memories) were lost with a Ray node: the run stops."""


class InputsLost(Exception):
    """A step's call failed because an object it reads was lost with the process or node that held it: the calls
    that made those objects must run again (``Step.recompute_inputs``)."""


@dataclass(frozen=True)
class Step:
    """One actor's share of a backend call, resubmitted as it is when the actor dies.

    ``submit`` sends the call and returns its object references; the one at ``probe`` is fetched (its value is what
    the caller needs, and it is ready when the call finished). ``label`` names the actor in messages ("client host
    1"); ``ready`` submits a round trip to the actor, used to wait for its replacement. ``recompute_inputs``: the
    call reads other steps' results (a shard's partial sums), so an object it cannot read is recomputed by running
    those steps again (``gather`` raises ``InputsLost``) instead of resubmitting this call alone. ``state``: the call
    reads objects that nothing can recompute (client memories), so an object it cannot read stops the run
    (``StateLostError``).
    """

    label: str
    submit: Callable[[], Sequence[Any]]
    ready: Callable[[], Any]
    probe: int = 0
    recompute_inputs: bool = False
    state: str = ""  # what the call reads that no re-run can recompute ("client memories"), if anything
    # the watchdog (``watchdog.py``): ``ping`` submits a call the actor answers beside the one in flight (its own
    # concurrency group) with its progress count, ``kill`` kills the actor so that Ray replaces it; ``None``: not
    # watched. ``doing``: what the call does, for the watchdog's line ("training clients 3, 8")
    ping: Callable[[], Any] | None = None
    kill: Callable[[], None] | None = None
    doing: str = ""


def _one_line(err: BaseException) -> str:
    """The first line of a Ray error, without colour codes (Ray's messages run over many lines)."""
    text = _ANSI.sub("", str(err)).strip()
    return " ".join(text.splitlines()[0].split()) if text else type(err).__name__


def _cause(err: BaseException) -> BaseException:
    """The loss behind a call's error: Ray wraps an argument it could not read in the call's ``RayTaskError``, whose
    first line names only the call."""
    cause = getattr(err, "cause", None)
    return cause if isinstance(cause, BaseException) and cause is not err else err


def _lost_kinds() -> tuple[type[BaseException], ...]:
    import ray.exceptions as rex

    return (rex.RayActorError, rex.ObjectLostError, rex.WorkerCrashedError, rex.NodeDiedError, rex.OutOfMemoryError)


def actor_died(err: BaseException) -> bool:
    """Whether ``err`` says the actor that ran the call died (or became unreachable) while it had the call."""
    import ray.exceptions as rex

    return isinstance(err, rex.RayActorError) and not isinstance(err, rex.RayTaskError)


def lost(err: BaseException) -> bool:
    """Whether ``err`` is a loss to a dead process or node (the actor, a worker, an object, a node), as opposed to an
    error of the code: directly, or as the reason a call could not read its arguments."""
    import ray.exceptions as rex

    if isinstance(err, _lost_kinds()) and not isinstance(err, rex.RayTaskError):
        return True
    cause = getattr(err, "cause", None) if isinstance(err, rex.RayTaskError) else None
    return cause is not None and cause is not err and isinstance(cause, _lost_kinds())


class Recovery:
    """Runs the calls of one backend step over several actors, waits for replacements and re-runs what was lost;
    counts the failures (per round for the limit, since the last ``take_faults`` for the record)."""

    def __init__(
        self, max_failures: int, restart_timeout_s: float, hang_timeout_s: float = 0.0, stall_timeout_s: float = 0.0
    ) -> None:
        self.max_failures = max_failures
        self.restart_timeout_s = restart_timeout_s  # backend.replace_timeout_s
        self.hang_timeout_s = hang_timeout_s  # backend.hang_timeout_s (0: no ping watch)
        self.stall_timeout_s = stall_timeout_s  # backend.stall_timeout_s (0: no progress watch)
        self.pace = Pace()  # the longest unit of work seen in the run: the stall limit grows with it (watchdog.py)
        self.hung_s: list[float] = []  # for each hung or stuck actor killed: how long its call had been in flight
        self.nodes = _alive_nodes()  # the cluster's nodes when the run began: those lost since are named in messages
        self.round_idx: int | None = None
        self._in_round = 0
        self._since_taken = 0
        self.restart_s: list[float] = []  # how long each replacement took to answer (for benchmarks and logs)

    def begin_round(self, round_idx: int) -> None:
        """The limit counts failures per round: a new round starts the count afresh."""
        if round_idx != self.round_idx:
            self.round_idx = round_idx
            self._in_round = 0

    def take_faults(self) -> int:
        """Failures survived since the last call (the driver calls it once per round, for ``RoundRecord.faults``)."""
        taken, self._since_taken = self._since_taken, 0
        self._in_round = 0
        return taken

    def gather(self, steps: Mapping[K, Step], submitted: dict[K, list[Any]] | None = None) -> dict[K, Any]:
        """Submit every step and collect the probe values as the calls finish (key -> value). A step whose call was
        lost (its actor died, or an object it needs went with a dead process or node) is resubmitted, unchanged, once
        the actor answers again (or ``InputsLost`` is raised for a ``recompute_inputs`` step whose actor lives on);
        any other error (the code's own) propagates as it is. ``submitted``, when given, receives each step's
        references (of its last, successful, call)."""
        import ray

        refs = submitted if submitted is not None else {}
        refs.update({k: list(s.submit()) for k, s in steps.items()})
        results: dict[K, Any] = {}
        pending = {refs[k][steps[k].probe]: k for k in steps}
        watch = self.watchdog()
        while pending:
            done, _ = ray.wait(list(pending), num_returns=1, timeout=watch.tick_s)
            if not done:
                watch.check(steps, pending.values())
                continue
            key = pending.pop(done[0])
            killed = watch.forget(key)
            try:
                results[key] = ray.get(done[0])
            except Exception as err:
                if not lost(err):
                    raise
                if steps[key].recompute_inputs and not actor_died(err):
                    self.failed(steps[key].label, err)
                    raise InputsLost(_one_line(err)) from err
                if steps[key].state and not actor_died(err):
                    raise self.state_lost(f"{steps[key].state} read by {steps[key].label}", err) from err
                self.replace(steps[key], err, killed)
                refs[key] = list(steps[key].submit())
                pending[refs[key][steps[key].probe]] = key
        return results

    def watchdog(self) -> Watchdog:
        """A watchdog for one batch of calls, with the run's timeouts and pace."""
        return Watchdog(self.hang_timeout_s, self.stall_timeout_s, self.pace)

    def failed(self, label: str, err: BaseException) -> None:
        """Count one failure; past ``max_failures`` in this round the run gives up."""
        self._in_round += 1
        self._since_taken += 1
        if self._in_round > self.max_failures:
            count = f"{self._in_round} Ray actor failure{'s' if self._in_round > 1 else ''}"
            raise ActorFailureError(
                f"{self._where()}{count} in one round, more than backend.max_actor_failures={self.max_failures}; "
                f"the last: {label}: {_one_line(err)} (look for the cause in the Ray logs, "
                "e.g. the OOM killer; give the hosts more memory or fewer clients, or raise "
                "backend.max_actor_failures)"
            ) from err

    def state_lost(self, what: str, err: BaseException) -> StateLostError:
        """The one-line error for objects that no re-run can recompute, lost with a Ray node."""
        nodes = lost_nodes(self.nodes)
        where = f"Ray node {', '.join(n[:12] for n in nodes)}" if nodes else "a Ray node"
        reason = _one_line(_cause(err)).split(". ")[0]  # Ray's first sentence ("Failed to retrieve object ...")
        return StateLostError(
            f"{self._where()}{what} were lost with {where} ({reason}); they cannot be recomputed, so the run stops"
        )

    def _where(self) -> str:
        return "" if self.round_idx is None else f"round {self.round_idx}: "

    def replace(self, step: Step, err: BaseException, killed: Killed | None = None) -> None:
        """Count the failure and wait until Ray's replacement of the actor answers (``killed``: the watchdog killed
        the actor as hung or stuck, and why)."""
        if killed is not None:
            self.hung_s.append(killed.in_flight_s)
            err = RuntimeError(killed.reason)
        self.failed(step.label, err)
        began = time.perf_counter()
        self._wait_ready(step)
        took = time.perf_counter() - began
        self.restart_s.append(took)
        log.warning(
            "%s died (%s); its replacement answered after %.2f s and re-runs its work (failure %d of at most %d in "
            "round %s)",
            step.label,
            _one_line(err),
            took,
            self._in_round,
            self.max_failures,
            self.round_idx,
        )

    def _wait_ready(self, step: Step) -> None:
        """Wait for the actor to answer (``step.ready`` is a call Ray itself retries while the actor restarts; should
        one still fail as ``ActorUnavailableError``, it is the same death, asked again until the timeout). An actor
        Ray will not restart (``ActorDiedError``: its constructor failed, or its arguments are gone) is given up
        on."""
        import ray
        import ray.exceptions as rex

        deadline = time.monotonic() + self.restart_timeout_s
        while True:
            try:
                ray.get(step.ready(), timeout=max(deadline - time.monotonic(), 0.0))
                return
            except (rex.GetTimeoutError, rex.ActorUnavailableError):
                if time.monotonic() >= deadline:
                    raise ActorFailureError(
                        f"{self._where()}{step.label} died and Ray did not restart it within "
                        f"{self.restart_timeout_s:g} s (backend.replace_timeout_s): {_cluster_now(self.nodes)}"
                    ) from None
                time.sleep(0.05)
            except rex.ActorDiedError as dead:
                raise ActorFailureError(f"{step.label} died and Ray cannot restart it: {_one_line(dead)}") from dead


def _alive_nodes() -> frozenset[str]:
    import ray

    return frozenset(n["NodeID"] for n in ray.nodes() if n.get("Alive")) if ray.is_initialized() else frozenset()


def lost_nodes(known: frozenset[str]) -> list[str]:
    """The nodes of ``known`` that are no longer alive (sorted ids)."""
    return sorted(known - _alive_nodes())


def _cluster_now(known: frozenset[str]) -> str:
    """Why a replacement may not come: the nodes lost since ``known`` was taken, and the resources the cluster has
    (all of them and those free)."""
    import ray

    def fmt(resources: Mapping[str, float]) -> str:
        return ", ".join(f"{k} {v:g}" for k, v in sorted(resources.items()) if k in ("CPU", "GPU"))

    nodes = lost_nodes(known)
    lost_text = "the cluster may have lost the resources it needs"
    if nodes:
        named = f"Ray node{'s' if len(nodes) > 1 else ''} {', '.join(n[:12] for n in nodes)}"
        lost_text = f"{named} lost; the remaining cluster cannot hold the replacement"
    try:
        have = f" (it has {fmt(ray.cluster_resources()) or 'no CPU'}, free {fmt(ray.available_resources()) or 'none'})"
    except Exception:  # the message must not fail on the way out
        have = ""
    return lost_text + have
