"""The elastic queue: steps waiting for a matching worker, and their episodes as data.

A placed step that finds no free matching worker *waits* — whether no worker matches yet or every
matching one is full — until one can take it or its queue timeout passes. Each wait is a *pending
dispatch* episode: ``waiting`` → ``dispatched`` | ``timed_out`` | ``cancelled`` | ``orphaned``.
The terminal states are sticky: a later transition is a silent no-op, so racing endings (a
timeout and a dispatch in the same instant) settle on whichever came first.

:class:`WaitingQueue` keeps waiting steps in arrival order, grouped by requirement, so that the
assignment (``swamp.domain.scheduler.assign``) looks at each requirement's oldest step only.
"""

from __future__ import annotations

import itertools
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Any

from swamp.domain.durations import HINT, parse_duration
from swamp.domain.lifecycle import Lifecycle
from swamp.errors import UserError

if TYPE_CHECKING:
    from swamp.domain.scheduler import Requirement

DEFAULT_QUEUE_TIMEOUT = 600.0  # 10 minutes; 0 waits forever
MAX_WAITING = 100_000  # steps waiting at once; one more is refused, not queued


class PendingState(str, Enum):
    WAITING = "waiting"
    DISPATCHED = "dispatched"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    ORPHANED = "orphaned"


PENDING_LIFECYCLE = Lifecycle(
    "a pending dispatch",
    {
        PendingState.WAITING: {
            PendingState.DISPATCHED,
            PendingState.TIMED_OUT,
            PendingState.CANCELLED,
            PendingState.ORPHANED,
        },
        PendingState.DISPATCHED: set(),
        PendingState.TIMED_OUT: set(),
        PendingState.CANCELLED: set(),
        PendingState.ORPHANED: set(),
    },
)


def end(
    attrs: dict,
    target: PendingState,
    *,
    now_iso: str,
    dispatch_id: str | None = None,
    reason: str | None = None,
) -> dict | None:
    """The ended record, or ``None`` when the episode has already ended (sticky: no-op)."""
    current = PendingState(attrs["state"])
    if PENDING_LIFECYCLE.terminal(current):
        return None
    PENDING_LIFECYCLE.check(current, target)
    ended = dict(attrs, state=target.value, endedAt=now_iso)
    if dispatch_id:
        ended["dispatchId"] = dispatch_id
    if reason:
        ended["reason"] = reason
    return ended


def parse_queue_timeout(text: str, *, what: str) -> float:
    """Seconds to wait for a worker; ``0`` (or ``0s``, ``0m``, …) waits forever."""
    if isinstance(text, str) and text.strip() and text.strip().rstrip("smhdw") == "0":
        return 0.0
    try:
        return float(parse_duration(text, what=what))
    except UserError:
        raise UserError(f"invalid {what} {text!r}: {HINT}, or 0 to wait forever") from None


def effective_timeout(run: float | None, serve: float | None) -> float:
    """The run's own timeout beats the orchestrator's, which beats the default."""
    if run is not None:
        return run
    if serve is not None:
        return serve
    return DEFAULT_QUEUE_TIMEOUT


def requirement_text(placement_json: dict) -> str:
    """The requirement as ``worker queue`` lists it: ``target=t``, then each ``k=v``, then
    ``platform=p``, or ``any worker``."""
    parts = []
    if placement_json.get("target"):
        parts.append(f"target={placement_json['target']}")
    parts += [f"{k}={v}" for k, v in sorted((placement_json.get("labels") or {}).items())]
    if placement_json.get("platform"):
        parts.append(f"platform={placement_json['platform']}")
    return ", ".join(parts) or "any worker"


def format_age(seconds: float) -> str:
    if seconds < 1:
        return "<1s"
    if seconds < 60:
        return f"{int(seconds)}s"
    if seconds < 3600:
        return f"{int(seconds // 60)}m"
    return f"{int(seconds // 3600)}h{int(seconds % 3600 // 60)}m"


_SEQ = itertools.count(1)


@dataclass(eq=False)
class WaitingStep:
    """One step in the queue. ``seq`` is arrival order; ``ticket`` is the shell's handle (what
    it wakes when the step is assigned), opaque here."""

    requirement: Requirement
    seq: int = field(default_factory=lambda: next(_SEQ))
    ticket: Any = None
    live: bool = True  # False once it left the queue (assigned, timed out, cancelled)


class WaitingQueue:
    def __init__(self) -> None:
        self.groups: dict[Requirement, deque[WaitingStep]] = {}
        self._count = 0

    def __repr__(self) -> str:
        return f"<WaitingQueue waiting={self._count} requirements={len(self.groups)}>"

    def __len__(self) -> int:
        return self._count

    def add(self, step: WaitingStep) -> None:
        self.groups.setdefault(step.requirement, deque()).append(step)
        self._count += 1

    def discard(self, step: WaitingStep) -> bool:
        """Take a step out wherever it is (timed out, cancelled); lazily, in O(1)."""
        if not step.live:
            return False
        step.live = False
        self._count -= 1
        self._trim(step.requirement)
        group = self.groups.get(step.requirement)
        if group is not None and len(group) > 64 + 2 * self._count:  # bounded: compact
            self.groups[step.requirement] = deque(s for s in group if s.live)
        return True

    def head(self, requirement: Requirement) -> WaitingStep | None:
        group = self.groups.get(requirement)
        return group[0] if group else None

    def pop(self, requirement: Requirement) -> WaitingStep:
        step = self.groups[requirement].popleft()
        step.live = False
        self._count -= 1
        self._trim(requirement)
        return step

    def _trim(self, requirement: Requirement) -> None:
        """Drop steps that left from the front; forget a requirement nobody waits for."""
        group = self.groups.get(requirement)
        while group and not group[0].live:
            group.popleft()
        if not group:
            self.groups.pop(requirement, None)

    def waiting(self) -> list[WaitingStep]:
        """Every waiting step, oldest first."""
        steps = [s for group in self.groups.values() for s in group if s.live]
        steps.sort(key=lambda s: s.seq)
        return steps
