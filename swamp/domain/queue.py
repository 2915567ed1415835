"""The elastic queue: steps waiting for a matching worker, and their episodes as data.

A placed step that finds no free matching worker *waits* — whether no worker matches yet or every
matching one is full — until one can take it or its queue timeout passes. Each wait is a *pending
dispatch* episode: ``waiting`` → ``dispatched`` | ``timed_out`` | ``cancelled`` | ``orphaned``.
The terminal states are sticky: a later transition is a silent no-op, so racing endings (a
timeout and a dispatch in the same instant) settle on whichever came first.

:class:`WaitingQueue` keeps waiting steps grouped by requirement, each group ordered by priority
(raised by aging, :mod:`swamp.domain.priority`), then fair share between submitters, then age, so
that the assignment (``swamp.domain.scheduler.assign``) looks at each requirement's best step
only: at 10,000 waiting steps a pick costs a few dictionary reads per submitter at the top level.
"""

from __future__ import annotations

import heapq
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


@dataclass(eq=False, slots=True)
class WaitingStep:
    """One step in the queue. ``seq`` is arrival order; ``ticket`` is the shell's handle (what
    it wakes when the step is assigned), opaque here. ``level`` is its priority less the aging
    epoch it started waiting in (:mod:`swamp.domain.priority`): the queue's order, fixed."""

    requirement: Requirement
    seq: int = field(default_factory=lambda: next(_SEQ))
    ticket: Any = None
    live: bool = True  # False once it left the queue (assigned, timed out, cancelled)
    priority: int = 0
    submitter: str = ""
    level: int = 0


class _Line:
    """One submitter's steps at one level of one requirement, oldest first. Steps that left
    from the middle stay until they reach the front (``live`` counts the others)."""

    __slots__ = ("steps", "live")

    def __init__(self) -> None:
        self.steps: deque[WaitingStep] = deque()
        self.live = 0

    def head(self) -> WaitingStep:
        steps = self.steps
        while not steps[0].live:
            steps.popleft()
        return steps[0]


class Group:
    """The steps waiting for one requirement: by level (a lazy max-heap of the levels present),
    then by submitter, each submitter's oldest first."""

    __slots__ = ("levels", "heap", "count")

    def __init__(self) -> None:
        self.levels: dict[int, dict[str, _Line]] = {}
        self.heap: list[int] = []  # −level; a level that emptied stays until it surfaces
        self.count = 0

    def __len__(self) -> int:
        """Steps held, counting those that left and are not yet dropped (bounded)."""
        return sum(len(line.steps) for lines in self.levels.values() for line in lines.values())

    def top(self) -> dict[str, _Line]:
        heap, levels = self.heap, self.levels
        while -heap[0] not in levels:
            heapq.heappop(heap)
        return levels[-heap[0]]


class WaitingQueue:
    """Waiting steps grouped by requirement, each group in the order of :meth:`best`:

    1. the highest level (priority, raised by aging) first;
    2. among equals, fair share between submitters: the one with the fewest steps running
       goes first, then the one served longest ago (so two submitters with the same number
       running take turns), then the oldest step;
    3. a submitter's own steps oldest first.

    It also counts each submitter's running steps (:meth:`started`, :meth:`finished`), which
    the shell reports as slots are given and given back.
    """

    def __init__(self) -> None:
        self.groups: dict[Requirement, Group] = {}
        self.running: dict[str, int] = {}  # submitter → steps holding a slot
        self.served: dict[str, int] = {}  # submitter → when it last got a slot (a counter)
        self.by_priority: dict[int, int] = {}  # base priority → steps waiting (for /metrics)
        self._turn = 0
        self._count = 0

    def __repr__(self) -> str:
        return (
            f"<WaitingQueue waiting={self._count} requirements={len(self.groups)} "
            f"submitters running={len(self.running)}>"
        )

    def __len__(self) -> int:
        return self._count

    # -- submitters --------------------------------------------------------------------------

    def started(self, submitter: str) -> None:
        """A step of ``submitter`` got a slot (from the queue or at once)."""
        self.running[submitter] = self.running.get(submitter, 0) + 1
        self._turn += 1
        self.served[submitter] = self._turn
        if len(self.served) > 4096:  # bounded: forget who is idle (they rejoin as new)
            self.served = {s: t for s, t in self.served.items() if s in self.running}

    def finished(self, submitter: str) -> None:
        """A step of ``submitter`` gave its slot back."""
        left = self.running.get(submitter, 0) - 1
        if left > 0:
            self.running[submitter] = left
        else:
            self.running.pop(submitter, None)

    # -- steps -------------------------------------------------------------------------------

    def add(self, step: WaitingStep) -> None:
        group = self.groups.get(step.requirement)
        if group is None:
            group = self.groups[step.requirement] = Group()
        lines = group.levels.get(step.level)
        if lines is None:
            lines = group.levels[step.level] = {}
            heapq.heappush(group.heap, -step.level)
            if len(group.heap) > 16 + 2 * len(group.levels):  # bounded: rebuild
                group.heap = [-level for level in group.levels]
                heapq.heapify(group.heap)
        line = lines.get(step.submitter)
        if line is None:
            line = lines[step.submitter] = _Line()
        line.steps.append(step)
        line.live += 1
        group.count += 1
        self._count += 1
        self.by_priority[step.priority] = self.by_priority.get(step.priority, 0) + 1

    def discard(self, step: WaitingStep) -> bool:
        """Take a step out wherever it is (timed out, cancelled); lazily, in O(1)."""
        if not step.live:
            return False
        self._leave(step)
        return True

    def best(self, requirement: Requirement) -> tuple[tuple[int, int, int, int], WaitingStep]:
        """The step of ``requirement`` that goes next, with its rank (lower goes first): the
        rank of a step only worsens as steps start, until one finishes."""
        lines = self.groups[requirement].top()
        running, served = self.running, self.served
        chosen: WaitingStep | None = None
        key = (0, 0, 0)
        for submitter, line in lines.items():
            ahead = running.get(submitter, 0)
            if chosen is not None and ahead > key[0]:
                continue  # more running than the best so far: it cannot be first
            head = line.steps[0]
            if not head.live:
                head = line.head()
            mine = (ahead, served.get(submitter, 0), head.seq)
            if chosen is None or mine < key:
                chosen, key = head, mine
        assert chosen is not None  # a level is dropped with its last line
        return (-chosen.level, *key), chosen

    def head(self, requirement: Requirement) -> WaitingStep | None:
        """The step of ``requirement`` that goes next, or ``None`` if none waits for it."""
        return self.best(requirement)[1] if requirement in self.groups else None

    def take(self, step: WaitingStep) -> None:
        """``step`` (the :meth:`best` of its requirement) leaves the queue with a slot."""
        self._leave(step)
        self.started(step.submitter)

    def steps_of(self, requirement: Requirement) -> list[WaitingStep]:
        """Every waiting step of ``requirement`` (in no particular order)."""
        group = self.groups.get(requirement)
        if group is None:
            return []
        return [
            s
            for lines in group.levels.values()
            for line in lines.values()
            for s in line.steps
            if s.live
        ]

    def _leave(self, step: WaitingStep) -> None:
        step.live = False
        self._count -= 1
        left = self.by_priority[step.priority] - 1
        if left:
            self.by_priority[step.priority] = left
        else:
            del self.by_priority[step.priority]
        group = self.groups[step.requirement]
        group.count -= 1
        if not group.count:
            del self.groups[step.requirement]
            return
        lines = group.levels[step.level]
        line = lines[step.submitter]
        line.live -= 1
        if not line.live:
            del lines[step.submitter]
            if not lines:
                del group.levels[step.level]
            return
        steps = line.steps
        while not steps[0].live:  # what left from the front goes at once
            steps.popleft()
        if len(steps) > 64 + 2 * line.live:  # bounded: compact what left from the middle
            line.steps = deque(s for s in steps if s.live)

    def waiting(self) -> list[WaitingStep]:
        """Every waiting step, oldest first."""
        steps = [s for requirement in self.groups for s in self.steps_of(requirement)]
        steps.sort(key=lambda s: s.seq)
        return steps
