"""Stopping a run by signal without losing it: SIGINT (Ctrl-C) and SIGTERM (a scheduler's pre-emption).

The first signal asks the driver to stop *after the round in progress*: the round finishes, a checkpoint is written
(``checkpoint.every > 0``), the record files and ``summary.json`` are completed, and ``run_experiment`` raises
``RunInterrupted`` (the CLI exits with ``128 + signal number``). A second signal stops at once with
``KeyboardInterrupt``: the record files are still completed, and the run resumes from its last checkpoint. While
``critical()`` is active (records being appended, a checkpoint being written) the second signal waits for it to end,
so no file is left half written.

Before the rounds begin (``setup=True`` until ``begin_rounds``: loading, Ray's start, the actors) nothing has been
written, so the first signal stops at once with ``SetupInterrupted`` (a ``KeyboardInterrupt``): the run is cleanly
absent, or a resumed run is left as it was. The handlers are installed whatever the process inherited: a job started
in the background of a script inherits SIGINT *ignored*, and Python then never turns it into ``KeyboardInterrupt``.

``ray.init`` is never interrupted: a handler's exception inside it can hang the process for good (Ray 2.60), so
``hold_signals_during`` runs it with handlers that only note a signal and hands the signal on once it returns; a
``KeyboardInterrupt`` that Ray's own signal check re-raises bare (``ray.wait`` in the set-up) is turned back into the
set-up's ``SetupInterrupted`` with its signal.

Handlers can only be installed from the main thread; elsewhere (a Tune trial's thread) ``StopRequests`` does nothing
and the process's own handling applies. The previous handlers are restored on exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any, TypeVar

T = TypeVar("T")

__all__ = ["RunInterrupted", "SetupInterrupted", "StopRequests", "hold_signals_during"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(Exception):
    """The run stopped after a round because of a signal; its records are complete up to ``rounds_done``."""

    def __init__(
        self, signum: int, rounds_done: int, run_dir: Path | None, checkpoint: Path | None, resume_from: str = ""
    ) -> None:
        name = signal.Signals(signum).name
        # ``resume_from``: the run's storage URI when ``run_dir`` is its staging folder (engine/persist/storage.py)
        where = f"; resume with: rayfl run --resume {resume_from or run_dir}" if checkpoint is not None else ""
        # rounds are numbered from 0, as in the records: the last round done is rounds_done - 1
        super().__init__(f"{name}: stopped after round {rounds_done - 1} ({rounds_done} rounds done){where}")
        self.signum = signum
        self.rounds_done = rounds_done
        self.run_dir = run_dir
        self.checkpoint = checkpoint


class SetupInterrupted(KeyboardInterrupt):
    """A signal arrived before the first round began: the run stopped at once, having written nothing."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"{signal.Signals(signum).name}: stopped before the first round began (nothing was written)")
        self.signum = signum


class StopRequests:
    """Signal handlers for the duration of a run (see module docstring)."""

    def __init__(self, enabled: bool = True, *, setup: bool = False) -> None:
        self.enabled = enabled  # False: a run that writes nothing keeps Python's own Ctrl-C behaviour
        self.in_setup = setup  # True until ``begin_rounds``: the first signal stops at once
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}
        self._critical = 0
        self._abort_pending = False

    @property
    def requested(self) -> bool:
        return self.signum is not None

    def __enter__(self) -> StopRequests:
        if self.enabled and threading.current_thread() is threading.main_thread():
            for sig in _SIGNALS:
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, kind: type[BaseException] | None, value: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
        if self.in_setup and self.signum is not None and type(value) is KeyboardInterrupt:
            # the set-up's stop, turned into a bare KeyboardInterrupt by the Ray call it landed in (Ray's signal check
            # raises a new one for any KeyboardInterrupt): the signal that stopped the set-up is known
            raise SetupInterrupted(self.signum) from value

    def release(self) -> None:
        """Put the previous handlers back (at most once; ``__exit__`` calls it)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def begin_rounds(self) -> None:
        """From now on the run has files to keep consistent: the first signal stops after the round in progress. A
        signal that arrived inside the ``critical`` section calling this becomes such a request."""
        if self.in_setup and self._abort_pending and self.signum is not None:
            note = f"rayfl: {signal.Signals(self.signum).name}: stopping after the first round (again: at once)\n"
            os.write(2, note.encode())
        self.in_setup = False
        self._abort_pending = False

    @contextlib.contextmanager
    def rounds(self) -> Iterator[StopRequests]:
        """The round loop: ``begin_rounds`` if not yet called; the handlers stay until the ``with`` of the whole run
        ends (the record files are completed after the loop, under ``critical``)."""
        self.begin_rounds()
        yield self

    @contextlib.contextmanager
    def critical(self) -> Iterator[None]:
        """A section a second signal must not cut short (it takes effect when the section ends)."""
        self._critical += 1
        try:
            yield
        finally:
            self._critical -= 1
            if self._critical == 0 and self._abort_pending:
                self._abort_pending = False
                if self.in_setup and self.signum is not None:
                    raise SetupInterrupted(self.signum)
                raise KeyboardInterrupt

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.in_setup:
            self.signum = signum
            if self._critical:  # making the run directory: stops once it is whole (or stops after a round)
                self._abort_pending = True
                return
            raise SetupInterrupted(signum)
        if self.signum is None:
            self.signum = signum
            # os.write, not logging: the handler may interrupt a logging call that holds the handler's lock
            note = f"rayfl: {signal.Signals(signum).name}: stopping after the round in progress (again: at once)\n"
            os.write(2, note.encode())
            return
        if self._critical:
            self._abort_pending = True
            return
        raise KeyboardInterrupt


def hold_signals_during(call: Callable[[], T]) -> T:
    """Run ``call`` (``ray.init``) in the main thread with SIGINT/SIGTERM handlers that only note the signal (and say
    so on stderr), and hand the first signal noted to the handler in place before, once ``call`` has returned or
    raised (the run's ``StopRequests`` then stops the set-up cleanly). A second signal while ``call`` runs ends the
    process at once by the signal's default action, for a ``ray.init`` that never returns: raising inside ``call`` is
    what can hang it. ``call`` must not replace the handlers (``ray/session.py`` keeps Ray from doing so). Off the
    main thread, or where a handler was put in outside Python (which Python cannot put back), ``call`` simply runs."""
    if threading.current_thread() is not threading.main_thread() or any(signal.getsignal(s) is None for s in _SIGNALS):
        return call()
    noted: list[int] = []
    previous: dict[int, Any] = {}

    def note(signum: int, frame: FrameType | None) -> None:
        noted.append(signum)
        name = signal.Signals(signum).name
        if len(noted) == 1:  # os.write, not logging: the handler may interrupt a logging call holding its lock
            os.write(2, f"rayfl: {name}: stopping once Ray's start returns (again: at once)\n".encode())
            return
        os.write(2, f"rayfl: {name} again: stopping now\n".encode())
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)

    def restore() -> None:
        handlers = list(previous.items())
        previous.clear()  # before any handler is put back: a signal in between finds nothing left to restore
        for sig, handler in handlers:
            signal.signal(sig, handler)

    def deliver(signum: int) -> None:
        handler = signal.getsignal(signum)
        if callable(handler):
            handler(signum, None)
        elif handler != signal.SIG_IGN:  # the default action
            signal.raise_signal(signum)

    for sig in _SIGNALS:
        previous[sig] = signal.signal(sig, note)
    try:
        value = call()
    except BaseException as err:
        restore()
        if noted:  # the signal still stops the set-up, with the call's error as its cause
            try:
                deliver(noted[0])
            except BaseException as stop:
                raise stop from err
        raise
    restore()
    if noted:
        deliver(noted[0])
    return value
