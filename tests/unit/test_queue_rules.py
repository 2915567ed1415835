"""Queue episodes as data, queue timeouts, and how an episode ends: every row of the tables."""

import pytest

from swamp.domain.episodes import Ending, EpisodeEnd, Move, lease_ending, next_move
from swamp.domain.leases import LeaseState
from swamp.domain.queue import (
    DEFAULT_QUEUE_TIMEOUT,
    PENDING_LIFECYCLE,
    PendingState,
    effective_timeout,
    end,
    format_age,
    parse_queue_timeout,
    requirement_text,
)
from swamp.errors import IllegalTransition, UserError

TERMINAL = [s for s in PendingState if s is not PendingState.WAITING]


@pytest.mark.parametrize("target", TERMINAL)
def test_a_waiting_episode_ends_once_and_the_end_is_sticky(target):
    waiting = {"queueId": "q", "state": "waiting"}
    ended = end(waiting, target, now_iso="t1", dispatch_id="d" if target == "dispatched" else None)
    assert ended["state"] == target.value and ended["endedAt"] == "t1"
    for later in PendingState:
        assert end(ended, later, now_iso="t2") is None  # no-op: whichever ended first stands


def test_waiting_cannot_go_back_to_waiting():
    with pytest.raises(IllegalTransition):
        end({"queueId": "q", "state": "waiting"}, PendingState.WAITING, now_iso="t")
    assert all(PENDING_LIFECYCLE.terminal(s) for s in TERMINAL)


def test_an_orphaned_episode_says_why():
    ended = end(
        {"queueId": "q", "state": "waiting"},
        PendingState.ORPHANED,
        now_iso="t",
        reason="orchestrator restart",
    )
    assert ended["reason"] == "orchestrator restart"


@pytest.mark.parametrize(
    ("text", "seconds"), [("0", 0), ("0s", 0), ("0m", 0), ("2s", 2), ("5m", 300), ("1h", 3600)]
)
def test_queue_timeouts(text, seconds):
    assert parse_queue_timeout(text, what="--queue-timeout") == seconds


@pytest.mark.parametrize("text", ["", "2x", "-1s", "soon", "1.5m", "00x"])
def test_a_bad_queue_timeout_names_the_flag(text):
    with pytest.raises(UserError, match="--queue-timeout"):
        parse_queue_timeout(text, what="--queue-timeout")


def test_the_run_beats_the_server_which_beats_the_default():
    assert effective_timeout(None, None) == DEFAULT_QUEUE_TIMEOUT == 600
    assert effective_timeout(None, 30) == 30
    assert effective_timeout(5, 30) == 5
    assert effective_timeout(0, 30) == 0  # the run waits forever


def test_requirements_and_ages_as_listed():
    assert requirement_text({}) == "any worker"
    assert requirement_text({"target": "w1"}) == "target=w1"
    assert (
        requirement_text({"labels": {"zone": "a", "gpu": "true"}, "platform": "linux"})
        == "gpu=true, zone=a, platform=linux"
    )
    assert [format_age(s) for s in (0.2, 5, 125, 3 * 3600 + 120)] == ["<1s", "5s", "2m", "3h2m"]


# -- episodes -------------------------------------------------------------------------------------


def episode(how, *, writes=False):
    return EpisodeEnd(how, "w1", reason="socket closed", has_writes=writes)


def test_how_the_lease_ends():
    assert lease_ending(episode(Ending.SUCCEEDED)) == (LeaseState.COMPLETED, None)
    assert lease_ending(episode(Ending.FAILED))[0] is LeaseState.FAILED
    assert lease_ending(episode(Ending.LOST))[0] is LeaseState.EXPIRED
    assert lease_ending(episode(Ending.LOST, writes=True)) == (
        LeaseState.FAILED,
        "worker disconnected after writing (write-then-drop)",
    )
    assert lease_ending(episode(Ending.BUSY))[0] is LeaseState.EXPIRED
    assert lease_ending(episode(Ending.CANCELLED)) == (LeaseState.CANCELLED, "dispatch cancelled")
    assert lease_ending(episode(Ending.MALFORMED)) == (LeaseState.FAILED, "malformed result")
    assert lease_ending(episode(Ending.STOPPED)) == (LeaseState.FAILED, "worker stopped")


def moves(how, *, writes=False, retry="once"):
    return next_move(episode(how, writes=writes), model="m", method="t.run", retry=retry)


def test_what_becomes_of_the_step():
    assert moves(Ending.SUCCEEDED).move is Move.FINISH
    assert moves(Ending.FAILED).move is Move.FINISH  # the method's own failure is a result
    assert moves(Ending.BUSY).move is Move.REQUEUE
    assert moves(Ending.LOST).move is Move.FENCE_THEN_REQUEUE
    lost_after_writing = moves(Ending.LOST, writes=True)
    assert lost_after_writing.move is Move.FAIL and lost_after_writing.code == "write_then_drop"
    never = moves(Ending.LOST, retry="never")
    assert never.move is Move.FAIL and 'retry = "never"' in never.reason
    assert moves(Ending.REFUSED).code == "dispatch_failed"
    assert moves(Ending.MALFORMED).move is Move.FAIL
    stopped = moves(Ending.STOPPED)
    assert stopped.move is Move.FAIL and stopped.code == "worker_stopped"


def test_a_dispatch_taken_back_or_timed_out():
    """Taken back from a worker that said nothing of it: as if the worker were lost (fenced,
    then queued again; never for a retry = "never" model). Past its execution timeout: the
    step fails, whatever the worker did."""
    assert lease_ending(episode(Ending.UNACKNOWLEDGED))[0] is LeaseState.EXPIRED
    assert moves(Ending.UNACKNOWLEDGED).move is Move.FENCE_THEN_REQUEUE
    assert moves(Ending.UNACKNOWLEDGED, retry="never").code == "worker_lost"
    assert moves(Ending.UNACKNOWLEDGED, writes=True).code == "write_then_drop"
    assert lease_ending(episode(Ending.TIMED_OUT))[0] is LeaseState.FAILED
    timed_out = moves(Ending.TIMED_OUT)
    assert timed_out.move is Move.FAIL and timed_out.code == "execution_timeout"


def test_every_ending_has_a_lease_state_and_a_move():
    for how in Ending:
        for writes in (False, True):
            state, _ = lease_ending(episode(how, writes=writes))
            assert isinstance(state, LeaseState)
            assert isinstance(moves(how, writes=writes).move, Move)
