"""Worker processes of the in-process backend (``backend.processes``): its client hosts' calls run in parallel.

``LocalBackend`` (``engine/exec/backend.py``) hands a round's host calls, in the plan's order, to ``HostWorkers``;
each call goes to the worker process that holds its host (host ``h`` lives in worker ``h % processes``), every worker
runs its calls one after another, and the results come back in the calls' order, so the reduction sees the same
partial sums in the same order as in one process, and the records are the same bits.

The workers are forked from the driver once the data set, the algorithm and the initial model are built: they share
the driver's data set copy-on-write (nothing is copied or sent) and build their hosts there (``ClientHost`` is
deterministic: its template is seeded). A call and its result travel pickled (plain ``pickle``, not torch's sharing
reductions) over one ``multiprocessing`` queue each way per worker; the queues' feeder threads let the driver send
every call of a round before it collects any result. A worker ignores Ctrl-C (the driver's stop handler ends the
run after the round, or closes the workers), leaves when the driver is gone, and one that dies stops the run with
one line (``WorkerLostError``) instead of a hang.

Forking is safe only where the child uses neither CUDA nor OpenMP threads (GNU OpenMP's thread pool does not survive
``fork``: a child that runs a parallel region after the parent did hangs), so ``worker_count`` keeps the hosts in the
driver when they train on CUDA, when CUDA is initialised in the driver, or when ``backend.torch_threads`` > 1; nor
where Ray is connected in the driver (its core worker's threads and connections are not the child's to use).
"""

from __future__ import annotations

import contextlib
import gc
import multiprocessing as mp
import os
import pickle
import queue
import signal
import sys
import traceback
import weakref
from collections.abc import Callable, Sequence
from multiprocessing.process import BaseProcess
from typing import Any

from rayfl.core.cores import usable_cores
from rayfl.core.errors import RunLostError

__all__ = ["HostCall", "HostWorkers", "WorkerLostError", "fork_refusal", "planned_workers"]

HostCall = tuple[int, str, tuple[Any, ...]]  # (host id, ClientHost method, its arguments)

_POLL_S = 0.5  # how often a waiting driver looks whether a worker is still alive (and a worker whether the driver is)
_CLOSE_S = 10.0  # how long close() waits for an idle worker to leave before it terminates it


class WorkerLostError(RunLostError):
    """A worker process of the in-process backend died (its calls' results are lost); one line, with the driver's
    resume hint (``RunLostError``)."""


def planned_workers(processes: int | str, num_hosts: int) -> int:
    """``backend.processes`` as a count: ``auto`` is one per host, at most one per usable core; a count is capped at
    the hosts (a host lives in one worker); 0 and 1 are one process (the driver)."""
    asked = min(num_hosts, usable_cores()) if processes == "auto" else max(1, int(processes))
    return max(1, min(asked, num_hosts))


def fork_refusal(torch_threads: int) -> str:
    """Why worker processes cannot be forked for hosts at ``torch_threads`` on this platform, whatever the driver has
    done (``""`` when they can): a forked child runs one OpenMP thread only, and only Linux forks safely."""
    if torch_threads > 1:
        return f"backend.torch_threads is {torch_threads}: a forked worker can run one thread only"
    if not sys.platform.startswith("linux") or "fork" not in mp.get_all_start_methods():
        return "worker processes are forked on Linux only (macOS's system libraries are not safe to fork)"
    return ""


def _dumps(obj: object) -> bytes:
    return pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)


def _error(err: BaseException) -> bytes:
    """``err`` pickled with the worker's traceback as a note; a stand-in ``RuntimeError`` when it does not pickle."""
    text = "".join(traceback.format_exception(err))
    try:
        err.add_note(f"(raised in an in-process worker)\n{text}")
        payload = _dumps(err)
        pickle.loads(payload)  # an exception whose constructor takes other arguments pickles but does not load
        return payload
    except Exception:
        return _dumps(RuntimeError(f"{type(err).__name__} in an in-process worker: {err}\n{text}"))


class _Arg:
    """In a call's result: "argument ``index`` of the call itself" (a client memory a host handed back unchanged),
    which the driver replaces by its own object: nothing travels back, and the driver keeps the object it had."""

    __slots__ = ("index",)

    def __init__(self, index: int) -> None:
        self.index = index


def _shrink(result: object, args: tuple[Any, ...]) -> object:
    """``result`` with each entry (of a tuple result) that is one of ``args`` as an ``_Arg``."""
    if not isinstance(result, tuple):
        return result
    ids = {id(a): i for i, a in enumerate(args) if a is not None}
    return tuple(_Arg(ids[id(r)]) if r is not None and id(r) in ids else r for r in result)


def _expand(result: object, args: tuple[Any, ...]) -> object:
    """``_shrink`` undone in the driver, with the driver's own arguments."""
    if not isinstance(result, tuple):
        return result
    return tuple(args[r.index] if isinstance(r, _Arg) else r for r in result)


def _serve(build: Callable[[int], object], host_ids: Sequence[int], requests: Any, replies: Any, driver: int) -> None:
    """A worker's life: build its hosts, then run the calls it is sent until told to stop or the driver is gone."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import torch

    torch.set_num_threads(1)  # each host sets its own count per call; nothing else here computes
    try:
        hosts = {h: build(h) for h in host_ids}
    except BaseException as err:
        replies.put((False, _error(err)))
        return
    replies.put((True, b""))
    while True:
        try:
            message = requests.get(timeout=_POLL_S)
        except queue.Empty:
            if os.getppid() != driver:
                return
            continue
        if message is None:
            return
        try:
            calls: list[HostCall] = pickle.loads(message)
            reply = (True, _dumps([_shrink(getattr(hosts[h], method)(*args), args) for h, method, args in calls]))
        except BaseException as err:
            reply = (False, _error(err))
        replies.put(reply)


class HostWorkers:
    """``count`` forked worker processes holding hosts ``0 .. num_hosts - 1`` (host ``h`` in worker ``h % count``),
    built by ``build(h)`` in the worker."""

    def __init__(self, count: int, num_hosts: int, build: Callable[[int], object]) -> None:
        ctx = mp.get_context("fork")
        self.count = count
        self.hosts_of = [list(range(w, num_hosts, count)) for w in range(count)]
        self._requests = [ctx.Queue() for _ in range(count)]
        self._replies = [ctx.Queue() for _ in range(count)]
        self._procs: list[BaseProcess] = []
        self._busy = False
        # a backend dropped without close() (a script, a test) stops its workers when it is collected
        self._finalizer = weakref.finalize(self, _stop, self._procs, self._requests, self._replies, [False])
        driver = os.getpid()
        # The children must not free what the driver holds: garbage awaiting the collector (a Ray object reference
        # of an earlier run in a cycle, whose release would talk to the driver's Ray connections from the child) is
        # collected here, in the driver, and every object left is frozen for the fork, so that no collection in a
        # child ever visits (or, copy-on-write, copies) the driver's objects (Python's ``gc.freeze`` recipe).
        gc.collect()
        gc.freeze()
        try:
            try:
                for w in range(count):
                    proc = ctx.Process(
                        target=_serve,
                        args=(build, self.hosts_of[w], self._requests[w], self._replies[w], driver),
                        name=f"rayfl-host-worker-{w}",
                        daemon=True,  # ended by multiprocessing at the driver's exit, whatever happened before
                    )
                    proc.start()
                    self._procs.append(proc)
            finally:
                gc.unfreeze()
            self._busy = True
            errors = [self._reply(w, "building its hosts") for w in range(count)]
            self._busy = False
            self._raise_first(errors)
        except BaseException:
            self.close()
            raise

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs if p.pid is not None]

    def worker_of(self, host: int) -> int:
        return host % self.count

    def call(self, calls: Sequence[HostCall], doing: str) -> list[object]:
        """Run ``calls`` (each on its host's worker, a worker's calls in their order) and return their results in
        the order of ``calls``; the first call that raised raises here, once every worker has answered."""
        if self._busy:
            raise RuntimeError("the in-process backend's workers were left mid-call by an earlier error")
        per_worker: list[list[int]] = [[] for _ in range(self.count)]
        for i, (h, _, _) in enumerate(calls):
            per_worker[self.worker_of(h)].append(i)
        used = [w for w in range(self.count) if per_worker[w]]
        self._busy = True
        for w in used:  # pickled here, in the calls' order: arguments shared by calls (the global model) go once
            self._requests[w].put(_dumps([calls[i] for i in per_worker[w]]))
        results: list[object] = [None] * len(calls)
        errors: list[BaseException | None] = []
        for w in used:
            got = self._reply(w, doing)
            if isinstance(got, BaseException):
                errors.append(got)
                continue
            for i, result in zip(per_worker[w], got, strict=True):
                results[i] = _expand(result, calls[i][2])
        self._busy = False
        self._raise_first(errors)
        return results

    def _reply(self, w: int, doing: str) -> Any:
        """Worker ``w``'s answer (results, or the exception it raised), or ``WorkerLostError`` raised when it died."""
        while True:
            try:
                ok, payload = self._replies[w].get(timeout=_POLL_S)
                break
            except queue.Empty:
                proc = self._procs[w]
                if not proc.is_alive():
                    code = proc.exitcode
                    how = f"killed by signal {-code}" if code is not None and code < 0 else f"exit code {code}"
                    raise WorkerLostError(
                        f"in-process worker {w} (client hosts {', '.join(map(str, self.hosts_of[w]))}) died "
                        f"({how}) while {doing} (backend.processes=1 trains in the driver process instead)"
                    ) from None
        if ok:
            return pickle.loads(payload) if payload else None
        err = pickle.loads(payload)
        return err if isinstance(err, BaseException) else RuntimeError(str(err))

    @staticmethod
    def _raise_first(errors: Sequence[BaseException | None]) -> None:
        for err in errors:
            if err is not None:
                raise err

    def close(self) -> None:
        """Stop every worker: idle ones are asked to leave and waited for; busy ones (the driver left a call
        unanswered: an error, Ctrl-C) and any that do not leave are terminated. Safe to call twice."""
        self._finalizer.detach()
        _stop(self._procs, self._requests, self._replies, [self._busy])
        self._busy = False


def _stop(procs: list[BaseProcess], requests: Sequence[Any], replies: Sequence[Any], busy: list[bool]) -> None:
    """``HostWorkers.close`` (``busy[0]``: a call is unanswered), also run when the workers are collected."""
    running, procs[:] = list(procs), []
    if not running:
        return
    wait = 0.0 if busy[0] else _CLOSE_S
    for w, proc in enumerate(running):
        if proc.is_alive() and not busy[0]:
            with contextlib.suppress(OSError, ValueError):
                requests[w].put(None)
    for proc in running:
        proc.join(wait)
        if proc.is_alive():
            proc.terminate()
            proc.join(5.0)
        if proc.is_alive():
            proc.kill()
            proc.join()
    for q in (*requests, *replies):
        q.cancel_join_thread()  # a request the dead worker never read must not hold the driver at exit
        q.close()
