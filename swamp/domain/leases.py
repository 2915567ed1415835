"""Step leases: the record that a dispatch is in flight on a worker.

``active`` until the dispatch ends: ``completed`` (success), ``failed`` (the method failed, or the
worker dropped after writing), ``expired`` (the worker dropped before writing, or the orchestrator
restarted), ``cancelled`` (whoever ran the step went away, or cancelled its workflow run).
``hasWrites`` is set, durably, before the first write is persisted: it decides whether a lost
dispatch may run again (no writes) or must fail (write-then-drop).
"""

from __future__ import annotations

from enum import Enum

from swamp.domain.lifecycle import IllegalTransition, Lifecycle


class LeaseState(str, Enum):
    ACTIVE = "active"
    COMPLETED = "completed"
    FAILED = "failed"
    EXPIRED = "expired"
    CANCELLED = "cancelled"


LEASE_LIFECYCLE = Lifecycle(
    "a step lease",
    {
        LeaseState.ACTIVE: {
            LeaseState.COMPLETED,
            LeaseState.FAILED,
            LeaseState.EXPIRED,
            LeaseState.CANCELLED,
        },
        LeaseState.COMPLETED: set(),
        LeaseState.FAILED: set(),
        LeaseState.EXPIRED: set(),
        LeaseState.CANCELLED: set(),
    },
)


def end(attrs: dict, target: LeaseState, *, now_iso: str, error: str | None = None) -> dict:
    """The ended lease record; an illegal transition raises and changes nothing."""
    LEASE_LIFECYCLE.check(LeaseState(attrs["state"]), target)
    ended = dict(attrs, state=target.value, endedAt=now_iso)
    if error:
        ended["error"] = error
    return ended


def mark_writes(attrs: dict) -> dict | None:
    """The record with ``hasWrites`` set, or ``None`` if it already is (idempotent)."""
    if attrs["state"] != LeaseState.ACTIVE.value:
        raise IllegalTransition(
            f"step lease {attrs['leaseId']} is {attrs['state']}; only active leases record writes"
        )
    if attrs.get("hasWrites"):
        return None
    return dict(attrs, hasWrites=True)
