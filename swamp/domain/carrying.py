"""A running step carried across its worker's move to another orchestrator (a shared database).

When a worker's socket is lost without a word from its orchestrator, the worker does not kill
what it runs at once: it *carries* its dispatches for as long as it would have run them anyway
had it not noticed the loss — until it has heard nothing for as many heartbeats as make it give
up on a silent orchestrator, and at least long enough for a dead holder to be buried
(:func:`carry_seconds`). Every rule that runs a lost worker's step again waits for that (the
fences, :func:`lost_worker_fence`), so carrying changes no guarantee. Meanwhile it enrolls
elsewhere and lists what it carries.

The orchestrator it reaches (the *carrier*) marks each listed lease *carried by* itself
(:func:`mark`), and the decision is the burial's: when the dead holder is reconciled, under its
liveness lock, each lease it left that a serving orchestrator carries moves to that one, still
active (:func:`bury`); the others expire as before. The carrier then tells the worker to go on
(and hears the run to its end as any dispatch of its own), or to stop. Adopting before the
burial would race the old holder, were it alive after all.

Only a dead holder's own steps are carried: the step's record names the holder as its owner
(:func:`carriable`). A step sent to it by another orchestrator is settled by that one's rules
after its link broke, which would run it again; a workflow's step has no record.
"""

from __future__ import annotations

from swamp.domain.leases import LeaseState
from swamp.domain.workers import FENCE_MARGIN, HEARTBEATS_MISSED, fence_seconds

WAIT = "wait"  # the carrier marked it: go on carrying until told
STOP = "stop"  # not adopted: stop it now
MAX_LISTED = 256  # dispatches a worker may list (its slots are fewer: MAX_CAPACITY)
CARRY_AT_LEAST = 12.0  # seconds: see carry_seconds
MAX_CARRY = 3600.0  # seconds a listed dispatch may say it is carried for (a heartbeat's few)


def may_carry(*, offered: bool, draining: bool, closed_by_peer: bool) -> bool:
    """Whether a worker keeps its running dispatches when its socket is lost: its orchestrator
    said it adopts carried runs (``offered``, a shared database), the worker is not draining,
    and the socket was lost rather than closed by the orchestrator (a close it sent is a
    decision: it lets its workers go, replaced the connection, or stops)."""
    return offered and not draining and not closed_by_peer


def carry_seconds(heartbeat: float, missed: int = HEARTBEATS_MISSED) -> float:
    """How long after it last heard from its orchestrator a worker carries its dispatches: as
    long as it would have run them not knowing (``missed`` heartbeats of silence), and at least
    :data:`CARRY_AT_LEAST` — long enough for a peer to bury the dead holder (its grace, 5 s)
    however short the heartbeat. Every fence that runs a lost worker's step again on a shared
    database waits longer than this (:func:`lost_worker_fence`; a dead holder's steps wait the
    grace and ``swamp.domain.peers.rerun_fence`` after its death)."""
    return max(heartbeat * missed, CARRY_AT_LEAST)


def carry_until(last_heard: float, heartbeat: float, missed: int) -> float:
    """Until when a worker carries its dispatches after its socket was lost (on the same
    clock as ``last_heard``)."""
    return last_heard + carry_seconds(heartbeat, missed)


def lost_worker_fence(heartbeat: float, *, carrying: bool) -> float:
    """How long after losing a worker told ``heartbeat`` its step may run again elsewhere:
    where workers carry their runs (a shared database), until its carry has surely ended."""
    fence = fence_seconds(heartbeat)
    return max(fence, carry_seconds(heartbeat) + FENCE_MARGIN) if carrying else fence


def carriable(lease: dict | None, *, worker: str, carrier: str, owner: str | None) -> bool:
    """Whether ``carrier`` may mark ``lease`` as carried by itself for ``worker``: still
    active, the worker's own, another orchestrator's, not already carried by a third, of a step
    whose record's owner (``owner``) is that orchestrator."""
    if lease is None or lease.get("state") != LeaseState.ACTIVE.value:
        return False
    holder = lease.get("orchestrator")
    return (
        lease.get("workerName") == worker
        and isinstance(holder, str)
        and holder not in ("", carrier)
        and lease.get("carriedBy") in (None, carrier)
        and isinstance(lease.get("stepId"), str)
        and owner == holder
    )


def mark(lease: dict, carrier: str, *, effects: bool = False) -> dict | None:
    """``lease`` marked carried by ``carrier`` — and write-bearing if the run had an
    ``effects`` (not adopted, it must not run again) — or ``None`` if it says so already."""
    marked = dict(lease, carriedBy=carrier)
    if effects:
        marked["hasWrites"] = True
    return None if marked == lease else marked


def unmark(lease: dict | None, carrier: str) -> dict | None:
    """``lease`` no longer carried by ``carrier`` (``None``: it is not, or it moved)."""
    if (
        lease is None
        or lease.get("carriedBy") != carrier
        or lease.get("state") != LeaseState.ACTIVE.value
    ):
        return None
    return {k: v for k, v in lease.items() if k != "carriedBy"}


def bury(lease: dict, dead: str, serving: set[str]) -> str | None:
    """At the burial of ``dead``: the orchestrator ``lease`` moves to (still active), or
    ``None`` (it expires, as any lease the dead one left)."""
    carrier = lease.get("carriedBy")
    if (
        lease.get("state") == LeaseState.ACTIVE.value
        and lease.get("orchestrator") == dead
        and isinstance(carrier, str)
        and carrier in serving
        and carrier != dead
    ):
        return carrier
    return None


def moved(lease: dict, carrier: str) -> dict:
    """``lease`` as its carrier holds it from the burial on."""
    kept = {k: v for k, v in lease.items() if k != "carriedBy"}
    return {**kept, "orchestrator": carrier, "carriedFrom": lease.get("orchestrator", "")}


def adopted(lease: dict | None, *, carrier: str, worker: str) -> bool:
    """Whether the burial moved ``lease`` to ``carrier`` (for ``worker``): the run goes on."""
    return (
        lease is not None
        and lease.get("state") == LeaseState.ACTIVE.value
        and lease.get("orchestrator") == carrier
        and lease.get("workerName") == worker
        and bool(lease.get("carriedFrom"))
    )
