"""Step leases: the record that a dispatch is in flight on a worker.

``active`` until the dispatch ends: ``completed`` (success), ``failed`` (the method failed, or the
worker dropped after writing), ``expired`` (the worker dropped before writing, or the orchestrator
restarted), ``cancelled`` (whoever ran the step went away, or cancelled its workflow run).
``hasWrites`` is set, durably, before the first write is persisted: it decides whether a lost
dispatch may run again (no writes) or must fail (write-then-drop).
"""

from __future__ import annotations

import re
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


#: A lease's error may quote a worker's own message; it is kept to this many characters, so a
#: lease row stays small wherever it goes (the store, the journal).
MAX_ERROR_CHARS = 4096


def end(attrs: dict, target: LeaseState, *, now_iso: str, error: str | None = None) -> dict:
    """The ended lease record; an illegal transition raises and changes nothing."""
    LEASE_LIFECYCLE.check(LeaseState(attrs["state"]), target)
    ended = dict(attrs, state=target.value, endedAt=now_iso)
    if error:
        ended["error"] = error if len(error) <= MAX_ERROR_CHARS else error[:MAX_ERROR_CHARS] + "…"
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


# -- a lease row read back from outside the store (the journal) -------------------------------

LEASE_ID = re.compile(r"[0-9a-f]{32}")  # a dispatch id: ordered, or a probe's uuid4 hex
TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}\.[0-9]{3}Z")
MAX_TEXT_CHARS = 256  # a worker, model type, model or method name (all far shorter)
MAX_ATTRIBUTES = 32  # a lease has eleven at most
_STATES = frozenset(state.value for state in LeaseState)
_TEXTS = ("workerName", "modelType", "modelName", "methodName")
_KNOWN = frozenset(
    {"leaseId", "dispatchId", "state", "hasWrites", "createdAt", "endedAt", "error", *_TEXTS}
)


def _text(value: object, limit: int) -> bool:
    if not isinstance(value, str) or not 0 < len(value) <= limit:
        return False
    try:
        value.encode("utf-8")  # a lone surrogate cannot be stored, printed or sent
    except UnicodeEncodeError:
        return False
    return True


def _scalar(value: object) -> bool:
    if value is None or isinstance(value, bool):
        return True
    if isinstance(value, (int, float)):
        return value == value and abs(value) < 2**53  # finite, and exact in JSON
    return _text(value, MAX_TEXT_CHARS)


def well_formed(attrs: object) -> bool:
    """Whether ``attrs`` are a lease's attributes as the orchestrator writes them: its ids (one
    dispatch id, twice), a known state, ``hasWrites`` true or false, its times as :func:`iso`
    spells them, names of a sensible length and an error of at most
    :data:`MAX_ERROR_CHARS`. An attribute this version does not know is let through only as a
    plain short value (one a later version may add), never a structure; so a lease row is a few
    KiB at most."""
    if not isinstance(attrs, dict) or len(attrs) > MAX_ATTRIBUTES:
        return False
    lease_id = attrs.get("leaseId")
    if not isinstance(lease_id, str) or not LEASE_ID.fullmatch(lease_id):
        return False
    if attrs.get("dispatchId") != lease_id or attrs.get("state") not in _STATES:
        return False
    if not isinstance(attrs.get("hasWrites"), bool):
        return False
    for name in ("createdAt", "endedAt"):
        stamp = attrs.get(name)
        if (stamp is not None or name == "createdAt") and not (
            isinstance(stamp, str) and TIMESTAMP.fullmatch(stamp)
        ):
            return False
    if not all(_text(attrs.get(name), MAX_TEXT_CHARS) for name in _TEXTS):
        return False
    error = attrs.get("error")
    if error is not None and not _text(error, MAX_ERROR_CHARS + 1):
        return False
    return all(
        _text(name, 64) and _scalar(value) for name, value in attrs.items() if name not in _KNOWN
    )
