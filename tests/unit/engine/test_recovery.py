"""``Recovery``'s bookkeeping without a cluster: failures counted per round and since the last record, the give-up
past ``backend.max_actor_failures`` as one line, and which Ray errors count as losses (real Ray exception objects).
The Ray side (real actors killed mid-run) is ``tests/integration/test_faults.py``."""

from __future__ import annotations

import pytest
import ray.exceptions as rex

from rayfl.engine.ray.recovery import ActorFailureError, Recovery, StateLostError, actor_died, lost

UNAVAILABLE = rex.ActorUnavailableError("The actor is temporarily unavailable: RpcError", b"\0" * 16)
OBJECT_LOST = rex.ObjectLostError("00" * 28, None, "")


def test_failures_are_counted_per_round_and_taken_once_for_the_record() -> None:
    recovery = Recovery(max_failures=2, restart_timeout_s=1.0)
    recovery.begin_round(0)
    recovery.failed("client host 0", UNAVAILABLE)
    recovery.failed("client host 1", UNAVAILABLE)
    assert recovery.take_faults() == 2
    assert recovery.take_faults() == 0
    recovery.begin_round(1)  # a new round may fail twice again
    recovery.failed("client host 0", UNAVAILABLE)
    recovery.begin_round(1)  # the same round: the count goes on
    recovery.failed("parameter-server shard 0", UNAVAILABLE)
    with pytest.raises(ActorFailureError) as err:
        recovery.failed("client host 1", UNAVAILABLE)
    message = str(err.value)
    assert "\n" not in message
    assert message.startswith(
        "round 1: 3 Ray actor failures in one round, more than backend.max_actor_failures=2; the last: client host "
        "1: The actor 00000000000000000000000000000000 is unavailable"
    ), message


def test_zero_failures_allowed_gives_up_at_the_first() -> None:
    recovery = Recovery(max_failures=0, restart_timeout_s=1.0)
    with pytest.raises(ActorFailureError) as err:
        recovery.failed("client host 0", UNAVAILABLE)
    assert str(err.value).startswith("1 Ray actor failure in one round, more than backend.max_actor_failures=0;")


def test_state_lost_with_a_node_is_one_line_the_driver_completes_with_where_to_resume() -> None:
    """Client memories lost with a node (``tests/integration/test_node_loss.py`` loses real ones): one line, an
    ``ActorFailureError`` (the CLI's exit 4), to which the driver of a written run adds the resume command."""
    recovery = Recovery(max_failures=3, restart_timeout_s=1.0)
    recovery.begin_round(2)
    err = recovery.state_lost("the client memories of clients 1, 3 read by client host 0", OBJECT_LOST)
    assert isinstance(err, StateLostError) and isinstance(err, ActorFailureError)
    err.resume_hint("; resume from its checkpoint after round 1 on a cluster that can hold the run: rayfl run ...")
    message = str(err)
    assert "\n" not in message
    assert message.startswith(
        "round 2: the client memories of clients 1, 3 read by client host 0 were lost with a Ray node ("
    ), message
    assert message.endswith(
        "; they cannot be recomputed, so the run stops; resume from its checkpoint after round 1 on a cluster that "
        "can hold the run: rayfl run ..."
    ), message
    assert recovery.take_faults() == 0  # a stop, not a survived failure


def test_losses_are_told_from_errors_of_the_code() -> None:
    assert actor_died(UNAVAILABLE) and lost(UNAVAILABLE)
    assert actor_died(rex.ActorDiedError()) and lost(rex.ActorDiedError())
    assert lost(OBJECT_LOST) and not actor_died(OBJECT_LOST)
    # a call that could not read an argument: Ray wraps the loss as the call's error
    unreadable = rex.RayTaskError("reduce", "traceback", OBJECT_LOST).as_instanceof_cause()
    assert lost(unreadable) and not actor_died(unreadable)
    dead_input = rex.RayTaskError("reduce", "traceback", UNAVAILABLE).as_instanceof_cause()
    assert lost(dead_input) and not actor_died(dead_input)
    # the code's own error inside the actor is no loss: it propagates unchanged
    own = rex.RayTaskError("run_round", "traceback", ValueError("bad")).as_instanceof_cause()
    assert not lost(own) and not actor_died(own)
    assert not lost(ValueError("bad"))


def test_the_progress_line_names_replaced_actors() -> None:
    import io

    from rayfl.engine.persist.records import RoundRecord
    from rayfl.engine.progress import ProgressLine

    stream = io.StringIO()
    line = ProgressLine(stream, total_rounds=2)
    fields = dict.fromkeys(("sim_time_s", "train_loss", "test_acc", "test_loss", "wall_time_s"), 0.0)
    fields.update(dict.fromkeys(("round_wall_s", "train_wall_s", "eval_wall_s", "lr"), 0.0))
    sizes = dict.fromkeys(("clients_run", "clients_failed", "bytes_down", "bytes_up"), 0)
    line(RoundRecord(round_idx=0, **fields, **sizes))
    line(RoundRecord(round_idx=1, **fields, **sizes, faults=2))
    first, second = stream.getvalue().splitlines()
    assert "replaced" not in first
    assert second.endswith(" | 2 dead actors replaced")
