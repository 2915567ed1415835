"""What becomes of a step whose orchestrator died, once another takes it over.

On a shared database a placed step has a record (``swamp.store.pg_steps``) until its outcome
is written. When the orchestrator answering for it dies with the step open, the one that
reconciles it takes the step over and decides, from what is left, as the lease rules would
have: never two copies, never an effect twice.

What is left, best first:

1. **An answer** from the orchestrator that ran its last episode for the dead one (a claimer
   whose link broke): how that episode ended — the same :func:`~swamp.domain.episodes.next_move`
   as any episode.
2. **Its latest lease** (each dispatch of the step has one, naming the step): a lease left
   active, or expired by the reconciliation, is a lost worker — run again after the fence if
   it had no effect, failed ``write_then_drop`` if it had; a lease that ended with the method's
   result means the step ran while its outcome died with its orchestrator: failed, not run
   again (that result is not known); a cancelled one stays cancelled.
3. **Nothing**: the step waited for a worker, or its first dispatch is younger than its lease
   row. It is run again — after the fence, like any lost worker's step.
"""

from __future__ import annotations

from swamp.domain.episodes import Ending, EpisodeEnd, Move, Next, next_move
from swamp.domain.leases import LeaseState

ORPHANED = "its orchestrator died"


def lease_end(lease: dict) -> EpisodeEnd | Next:
    """How a lease the dead orchestrator left says its episode ended: an
    :class:`EpisodeEnd` for the lease rules, or the step's :class:`Next` when that is
    settled already."""
    worker = str(lease.get("workerName") or "?")
    state = lease.get("state")
    if state in (LeaseState.COMPLETED.value, LeaseState.FAILED.value) and not _lost(lease):
        return Next(
            Move.FAIL,
            "outcome_lost",
            f"it ran on worker {worker}, and its orchestrator died before it kept the "
            "outcome: it is not run again",
        )
    if state == LeaseState.CANCELLED.value:
        return Next(Move.FAIL, "cancelled", "the dispatch was cancelled")
    reason = str(lease.get("error") or ORPHANED)
    return EpisodeEnd(Ending.LOST, worker, reason, has_writes=bool(lease.get("hasWrites")))


def _lost(lease: dict) -> bool:
    """A ``failed`` lease that is a lost worker's (write-then-drop), not a method's result."""
    return bool(lease.get("hasWrites")) and "write-then-drop" in str(lease.get("error") or "")


def decide(
    end: EpisodeEnd | None,
    lease: dict | None,
    *,
    model: str,
    method: str,
    retry: str,
) -> Next:
    """The taken-over step's next move: ``end`` is how its last episode ended as the
    orchestrator that ran it answered (None: no answer), ``lease`` its latest lease (None:
    none). ``FINISH`` only with an answer (which carries the result)."""
    if end is not None:
        return next_move(end, model=model, method=method, retry=retry)
    if lease is None:
        return Next(Move.REQUEUE, reason=f"{ORPHANED} while it waited for a worker")
    settled = lease_end(lease)
    if isinstance(settled, Next):
        return settled
    return next_move(settled, model=model, method=method, retry=retry)
