"""Signals before a run's first round (``engine/stop.py``): they stop at once, except while the run directory is being
made, where they wait for it to be whole and then ask the first round to be the last; a signal while ``ray.init``
runs waits for it to return."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from rayfl.engine.stop import SetupInterrupted, StopRequests, hold_signals_during

ROOT = Path(__file__).resolve().parents[3]


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


def test_a_signal_during_ray_init_waits_for_it_to_return_then_stops_the_set_up() -> None:
    # ray.init must not be interrupted (an exception inside its connect can hang the process for good): a signal that
    # arrives while it runs is held until it has returned, then handed to the run's own handler
    done: list[str] = []

    def init() -> str:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.05)  # Python runs the handler here, at the next instruction: it must not raise
        done.append("init")
        return "up"

    with StopRequests(setup=True) as stop:
        with pytest.raises(SetupInterrupted) as caught:
            hold_signals_during(init)
        assert done == ["init"], "the signal cut the call short"
        assert caught.value.signum == signal.SIGTERM
        for sig in (signal.SIGINT, signal.SIGTERM):
            assert signal.getsignal(sig) == stop._handle, f"{signal.Signals(sig).name}'s handler was not put back"
        assert hold_signals_during(lambda: "up") == "up"  # no signal: the call's value


def test_a_second_signal_during_the_held_call_ends_the_process_at_once() -> None:
    # for a ray.init that never returns: the caller insists, and raising inside ray.init could hang it
    script = (
        "import os, signal, time\n"
        "from rayfl.engine.stop import StopRequests, hold_signals_during\n"
        "def init():\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(0.2)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    time.sleep(5)\n"
        "    print('the call went on')\n"
        "with StopRequests(setup=True):\n"
        "    hold_signals_during(init)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == -signal.SIGTERM, (done.returncode, done.stdout, done.stderr)
    assert "the call went on" not in done.stdout
    assert "SIGTERM: stopping once Ray's start returns" in done.stderr and "SIGTERM again" in done.stderr


def test_a_signal_held_while_the_call_fails_still_stops_the_set_up() -> None:
    def init() -> None:
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)
        raise RuntimeError("the GCS did not start")

    with StopRequests(setup=True), pytest.raises(SetupInterrupted) as caught:
        hold_signals_during(init)
    assert isinstance(caught.value.__cause__, RuntimeError)


def test_an_error_of_the_held_call_reaches_the_caller() -> None:
    def init() -> None:
        raise RuntimeError("the GCS did not start")

    with StopRequests(setup=True) as stop, pytest.raises(RuntimeError, match="the GCS did not start"):
        hold_signals_during(init)
    assert stop.signum is None


def test_a_bare_keyboard_interrupt_in_set_up_after_a_signal_becomes_that_signals_stop() -> None:
    # Ray's signal check (ray.wait, ray.get) re-raises the handler's SetupInterrupted as a bare KeyboardInterrupt
    with pytest.raises(SetupInterrupted) as caught, StopRequests(setup=True):
        try:
            _deliver(signal.SIGTERM)
        except SetupInterrupted:
            raise KeyboardInterrupt from None
    assert caught.value.signum == signal.SIGTERM
    with pytest.raises(KeyboardInterrupt) as bare, StopRequests(setup=True):
        raise KeyboardInterrupt  # no signal came: left as it is
    assert type(bare.value) is KeyboardInterrupt
