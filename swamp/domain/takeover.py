"""What becomes of a step whose orchestrator died, once another takes it over.

On a shared database a placed step has a record (``swamp.store.pg_steps``) until its outcome
is written. When the orchestrator answering for it dies with the step open, the one that
reconciles it takes the step over and decides, from what is left, as the lease rules would
have: never two copies, never an effect twice.

What is left:

- **Its latest lease** (each dispatch of the step has one, naming the step; a lease's id is
  its dispatch's, and starts with the time it opened).
- **Answers** from orchestrators that ran an episode of it for the dead one (a claimer whose
  link broke answers whoever took the steps over, or kept its answer in the database).

What decides, in order (:func:`answer_for`, :func:`still_running`, :func:`decide`):

1. The latest lease is still active and names an orchestrator that serves the database: the
   step runs there (one of an earlier version, or not asked): wait for it to end.
2. An answer *for the latest lease's dispatch* says how that episode ended — the same
   :func:`~swamp.domain.episodes.next_move` as any episode. An answer for an earlier episode
   says nothing about the latest one (it ran again since).
3. Else the latest lease by the lease rules: left active by the dead one, or expired by its
   reconciliation, it is a lost worker — run again after the fence if it had no effect, failed
   ``write_then_drop`` if it had; ended with the method's result, the step ran and its
   outcome died with its orchestrator — failed, not run again; cancelled, it stays cancelled.
4. No lease: the newest answer if there is one; else, if its record says it was waiting for
   a worker (the mark is cleared, and written, before a step that waited is dispatched), it
   is run again — after the fence, like any lost worker's step; else it may have been sent
   to a worker the moment its orchestrator died (a dispatch's lease row comes within 50 ms,
   at its end for most): whether it ran cannot be told, so it fails ``outcome_lost``.
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


def answer_for(lease: dict | None, answers: list[tuple[str | None, dict]]) -> dict | None:
    """Of ``answers`` (each with the dispatch id it is about, ``None`` for a refusal before
    anything ran), the one that speaks for the step: the latest lease's own; with no lease,
    the newest (a refusal only if nothing else)."""
    if lease is not None:
        latest = lease.get("leaseId")
        return next((answer for dispatch, answer in answers if dispatch == latest), None)
    ran = sorted((a for a in answers if a[0] is not None), key=lambda a: str(a[0]))
    if ran:
        return ran[-1][1]
    return answers[-1][1] if answers else None


def still_running(lease: dict | None, serving: set[str]) -> bool:
    """The latest lease is active and names an orchestrator that serves the database: the
    step runs there still (its lease ends when it does)."""
    return (
        lease is not None
        and lease.get("state") == LeaseState.ACTIVE.value
        and lease.get("orchestrator") in serving
    )


def decide(
    end: EpisodeEnd | None,
    lease: dict | None,
    *,
    model: str,
    method: str,
    retry: str,
    waiting: bool = False,
) -> Next:
    """The taken-over step's next move: ``end`` is how its last episode ended as the
    orchestrator that ran it answered (None: no answer), ``lease`` its latest lease (None:
    none), ``waiting`` what its record says. ``FINISH`` only with an answer (which carries
    the result)."""
    if end is not None:
        return next_move(end, model=model, method=method, retry=retry)
    if lease is None:
        if waiting:
            return Next(Move.REQUEUE, reason=f"{ORPHANED} while it waited for a worker")
        return Next(
            Move.FAIL,
            "outcome_lost",
            f"{ORPHANED} as it sent it to a worker: whether it ran cannot be told, so it is "
            "not run again",
        )
    settled = lease_end(lease)
    if isinstance(settled, Next):
        return settled
    return next_move(settled, model=model, method=method, retry=retry)
