"""Signals before a run's first round (``engine/stop.py``): they stop at once, except while the run directory is
being made, where they wait for it to be whole and then ask the first round to be the last; ``ray.init``'s own SIGTERM
handler does not replace the run's."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from rayfl.engine.stop import SetupInterrupted, StopRequests, keep_sigterm_handler


def _deliver(sig: int) -> None:
    os.kill(os.getpid(), sig)
    time.sleep(0.05)  # Python runs the handler in the main thread at the next instruction


def test_a_signal_in_set_up_stops_at_once() -> None:
    with pytest.raises(SetupInterrupted) as caught, StopRequests(setup=True):
        _deliver(signal.SIGINT)
        pytest.fail("the signal did not stop the set-up")
    assert caught.value.signum == signal.SIGINT and "nothing was written" in str(caught.value)


def test_a_signal_while_the_run_directory_is_made_waits_for_it() -> None:
    with StopRequests(setup=True) as stop:
        with stop.critical():
            _deliver(signal.SIGTERM)
            stop.begin_rounds()  # the directory is whole: from here a stop comes after the round in progress
        assert stop.requested and stop.signum == signal.SIGTERM
    with pytest.raises(SetupInterrupted), StopRequests(setup=True) as stop, stop.critical():
        _deliver(signal.SIGINT)  # still in set-up when the section ends: stopped then


def test_ray_inits_sigterm_handler_does_not_replace_the_runs() -> None:
    def exits(signum: int, frame: object) -> None:  # what ray.init installs
        sys.exit(signum)

    with StopRequests(setup=True) as stop:
        with keep_sigterm_handler():
            signal.signal(signal.SIGTERM, exits)
        assert signal.getsignal(signal.SIGTERM) == stop._handle
        with pytest.raises(SetupInterrupted), keep_sigterm_handler():
            signal.signal(signal.SIGTERM, exits)
            _deliver(signal.SIGTERM)  # while Ray's handler is in place: handed to the run's
    assert signal.getsignal(signal.SIGTERM) is not exits
