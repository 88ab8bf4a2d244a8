"""Stopping a run by signal without losing it: SIGINT (Ctrl-C) and SIGTERM (a scheduler's pre-emption).

The first signal asks the driver to stop *after the round in progress*: the round finishes, a checkpoint is written
(``checkpoint.every > 0``), the record files and ``summary.json`` are completed, and ``run_experiment`` raises
``RunInterrupted`` (the CLI exits with ``128 + signal number``). A second signal stops at once with
``KeyboardInterrupt``: the record files are still completed, and the run resumes from its last checkpoint. While
``critical()`` is active (records being appended, a checkpoint being written) the second signal waits for it to end,
so no file is left half written.

Handlers can only be installed from the main thread; elsewhere (a Tune trial's thread) ``StopRequests`` does nothing
and the process's own handling applies. The previous handlers are restored on exit.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

__all__ = ["RunInterrupted", "StopRequests"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class RunInterrupted(Exception):
    """The run stopped after a round because of a signal; its records are complete up to ``rounds_done``."""

    def __init__(self, signum: int, rounds_done: int, run_dir: Path | None, checkpoint: Path | None) -> None:
        name = signal.Signals(signum).name
        where = f"; resume with: rayfl run --resume {run_dir}" if checkpoint is not None else ""
        super().__init__(f"{name}: stopped after round {rounds_done}{where}")
        self.signum = signum
        self.rounds_done = rounds_done
        self.run_dir = run_dir
        self.checkpoint = checkpoint


class StopRequests:
    """Signal handlers for the duration of a run (see module docstring)."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled  # False: a run that writes nothing keeps Python's own Ctrl-C behaviour
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
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

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
                raise KeyboardInterrupt

    def _handle(self, signum: int, frame: FrameType | None) -> None:
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
