"""How a dispatch episode ends, and what becomes of its step: decided, not improvised.

An episode is one dispatch of a step to one worker: lease, credential, frame, relay, result. The
shell reports how it ended as an :class:`EpisodeEnd`; :func:`lease_ending` says how the step
lease ends and :func:`next_move` whether the step is finished, goes back in the queue, or fails
(and why). Both are plain functions, so every path through a lost, busy or cancelled dispatch
is a row in a table and has a unit test.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

from swamp.domain.leases import LeaseState


class Ending(str, Enum):
    SUCCEEDED = "succeeded"  # the method ran and succeeded
    FAILED = "failed"  # the method ran and failed
    LOST = "lost"  # the worker's socket dropped mid-dispatch
    BUSY = "busy"  # the worker said it had no free slot (a race with its own count)
    REFUSED = "refused"  # the worker refused the dispatch for another reason
    MALFORMED = "malformed"  # the worker's reply was not a result
    CANCELLED = "cancelled"  # whoever ran the step went away
    STOPPED = "stopped"  # the worker was stopped (a second signal) while the step ran
    UNACKNOWLEDGED = "unacknowledged"  # the worker said nothing of the dispatch in time
    TIMED_OUT = "timed_out"  # it ran past its execution timeout and was stopped


@dataclass(frozen=True)
class EpisodeEnd:
    how: Ending
    worker: str
    reason: str = ""
    has_writes: bool = False  # the step had an effect: running it again could repeat it


def lease_ending(end: EpisodeEnd) -> tuple[LeaseState, str | None]:
    """The lease's final state and error."""
    if end.how is Ending.SUCCEEDED:
        return LeaseState.COMPLETED, None
    if end.how is Ending.LOST:
        if end.has_writes:
            return LeaseState.FAILED, "worker disconnected after writing (write-then-drop)"
        return LeaseState.EXPIRED, f"worker lost before writing: {end.reason}"
    if end.how is Ending.BUSY:
        return LeaseState.EXPIRED, f"worker had no free slot: {end.reason}"
    if end.how is Ending.MALFORMED:
        return LeaseState.FAILED, "malformed result"
    if end.how is Ending.CANCELLED:
        return LeaseState.CANCELLED, "dispatch cancelled"
    if end.how is Ending.STOPPED:
        return LeaseState.FAILED, "worker stopped"
    if end.how is Ending.UNACKNOWLEDGED:
        if end.has_writes:
            return LeaseState.FAILED, f"worker did not acknowledge the dispatch: {end.reason}"
        return LeaseState.EXPIRED, f"worker did not acknowledge the dispatch: {end.reason}"
    if end.how is Ending.TIMED_OUT:
        return LeaseState.FAILED, f"timed out: {end.reason}"
    return LeaseState.FAILED, end.reason or None


class Move(str, Enum):
    FINISH = "finish"  # the step has its result (succeeded or failed)
    REQUEUE = "requeue"  # nothing happened: wait for a worker again, under the same deadline
    FENCE_THEN_REQUEUE = "fence_then_requeue"  # a lost worker: let it die first, then requeue
    FAIL = "fail"  # the step fails with ``reason``


@dataclass(frozen=True)
class Next:
    move: Move
    code: str = ""  # the error code of a failure: write_then_drop, worker_lost, dispatch_failed
    reason: str = ""


def next_move(end: EpisodeEnd, *, model: str, method: str, retry: str) -> Next:
    """What happens to the step after an episode. ``retry`` is the model's policy
    (``"never"``: a lost worker fails the step instead of running it again)."""
    if end.how in (Ending.SUCCEEDED, Ending.FAILED):
        return Next(Move.FINISH)
    if end.how is Ending.BUSY:
        return Next(Move.REQUEUE)
    if end.how is Ending.TIMED_OUT:
        return Next(
            Move.FAIL,
            "execution_timeout",
            f"{method} ran longer than its timeout on worker {end.worker} and was stopped "
            f"({end.reason})",
        )
    if end.how in (Ending.LOST, Ending.UNACKNOWLEDGED):
        if end.has_writes:
            return Next(
                Move.FAIL,
                "write_then_drop",
                f"worker {end.worker} disconnected after {method} had run a command or "
                f"written data ({end.reason}); failing the step rather than running it twice "
                "(write-then-drop)",
            )
        if retry == "never":
            return Next(
                Move.FAIL,
                "worker_lost",
                f"worker {end.worker} was lost ({end.reason}); model {model!r} declares "
                'retry = "never", so the step is not run again',
            )
        return Next(Move.FENCE_THEN_REQUEUE, reason=end.reason)
    if end.how is Ending.MALFORMED:
        return Next(
            Move.FAIL,
            "dispatch_failed",
            f"worker {end.worker} sent a malformed result: {end.reason}",
        )
    if end.how is Ending.CANCELLED:
        return Next(Move.FAIL, "cancelled", "the dispatch was cancelled")
    if end.how is Ending.STOPPED:
        return Next(
            Move.FAIL,
            "worker_stopped",
            f"worker {end.worker} was stopped while it ran the step ({end.reason})",
        )
    return Next(
        Move.FAIL, "dispatch_failed", f"worker {end.worker} refused the dispatch: {end.reason}"
    )
