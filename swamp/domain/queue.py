"""The elastic queue: steps waiting for a matching worker, and their episodes as data.

A placed step that finds no free matching worker *waits* — whether no worker matches yet or every
matching one is full — until one can take it or its queue timeout passes. Each wait is a *pending
dispatch* episode: ``waiting`` → ``dispatched`` | ``timed_out`` | ``cancelled`` | ``orphaned``.
The terminal states are sticky: a later transition is a silent no-op, so racing endings (a
timeout and a dispatch in the same instant) settle on whichever came first.

:class:`WaitingQueue` keeps waiting steps grouped by requirement, each group by submitter, then
priority, each line oldest first, so that the assignment (``swamp.domain.scheduler.assign``)
finds the next step without a scan: priority first (raised by aging only up to the
highest given, :mod:`swamp.domain.priority`), then fair share between submitters, then age. At
10,000 waiting steps a pick costs a few dictionary reads per submitter and, for the few
submitters that could be first, one per priority they have waiting.
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
    it wakes when the step is assigned), opaque here. ``epoch`` is the aging tick it started
    waiting in (:mod:`swamp.domain.priority`): with ``priority``, all the order needs, fixed."""

    requirement: Requirement
    seq: int = field(default_factory=lambda: next(_SEQ))
    ticket: Any = None
    live: bool = True  # False once it left the queue (assigned, timed out, cancelled)
    priority: int = 0
    submitter: str = ""
    epoch: int = 0


def _arrival(step: WaitingStep) -> int:
    return step.seq


class _Line:
    """One submitter's steps of one priority in one requirement, oldest first. Steps that left
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
    """The steps waiting for one requirement: by submitter, then by priority, each line oldest
    first; and the priorities present (a lazy max-heap, and how many steps each)."""

    __slots__ = ("subs", "priorities", "heap", "count")

    def __init__(self) -> None:
        self.subs: dict[str, dict[int, _Line]] = {}  # submitter → priority → line
        self.priorities: dict[int, int] = {}  # priority → steps waiting
        self.heap: list[int] = []  # −priority; one that emptied stays until it surfaces
        self.count = 0

    def __len__(self) -> int:
        """Steps held, counting those that left and are not yet dropped (bounded)."""
        return sum(len(line.steps) for lines in self.subs.values() for line in lines.values())

    def oldest(self) -> WaitingStep:
        """Its step that has waited longest: the oldest of its lines' heads."""
        heads = (line.head() for lines in self.subs.values() for line in lines.values())
        return min(heads, key=_arrival)

    def top(self) -> int:
        """The highest priority a step waiting here was given."""
        heap, priorities = self.heap, self.priorities
        while -heap[0] not in priorities:
            heapq.heappop(heap)
        return -heap[0]


class WaitingQueue:
    """Waiting steps grouped by requirement. Which goes next (:meth:`pick`), among the steps
    of the requirements a free worker matches:

    1. the *top* is the highest priority any of them was given; the *contenders* are the steps
       given it and those whose priority, raised by aging (a point per tick waited), reached it;
    2. among the contenders, fair share between submitters: the one with the fewest steps
       running goes first, then the one served longest ago (so two submitters with the same
       number running take turns), then the oldest step — whatever tick each arrived in;
    3. a submitter's own steps oldest first.

    So steps given the same priority are ordered by fair share alone, and aging only lifts a
    step into a higher priority's contest: nothing waits more than (top − its priority) ticks
    before it contends. It also counts each submitter's running steps (:meth:`started`,
    :meth:`finished`), which the shell reports as slots are given and given back.
    """

    def __init__(self) -> None:
        self.groups: dict[Requirement, Group] = {}
        self.running: dict[str, int] = {}  # submitter → steps holding a slot
        self.served: dict[str, int] = {}  # submitter → when it last got a slot (a counter)
        self.by_priority: dict[int, int] = {}  # base priority → steps waiting (for /metrics)
        self.submitters: dict[str, int] = {}  # submitter → steps waiting
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
        priority = step.priority
        present = group.priorities.get(priority, 0)
        group.priorities[priority] = present + 1
        if not present:
            heapq.heappush(group.heap, -priority)
            if len(group.heap) > 16 + 2 * len(group.priorities):  # bounded: rebuild
                group.heap = [-p for p in group.priorities]
                heapq.heapify(group.heap)
        lines = group.subs.get(step.submitter)
        if lines is None:
            lines = group.subs[step.submitter] = {}
        line = lines.get(priority)
        if line is None:
            line = lines[priority] = _Line()
        line.steps.append(step)
        line.live += 1
        group.count += 1
        self._count += 1
        self.by_priority[priority] = self.by_priority.get(priority, 0) + 1
        self.submitters[step.submitter] = self.submitters.get(step.submitter, 0) + 1

    def discard(self, step: WaitingStep) -> bool:
        """Take a step out wherever it is (timed out, cancelled); lazily, in O(1)."""
        if not step.live:
            return False
        self._leave(step)
        return True

    def pick(self, requirements: list[Requirement], epoch: int) -> WaitingStep | None:
        """The step that goes next in aging tick ``epoch`` among those waiting for
        ``requirements`` (each with at least one step waiting), or ``None`` if none does.

        Submitters are visited in fair-share order (fewest running, then served longest ago)
        and the first with a contender wins: only its lines are looked at, one per priority
        it has waiting (a line's oldest step is its most raised)."""
        groups = [self.groups[requirement] for requirement in requirements]
        top = max(group.top() for group in groups)
        running, served = self.running, self.served
        order = [(running.get(s, 0), served.get(s, 0), s) for s in self.submitters]
        heapq.heapify(order)
        chosen: WaitingStep | None = None
        first: tuple[int, int] = (0, 0)
        while order:
            ahead, turn, submitter = heapq.heappop(order)
            if chosen is not None and (ahead, turn) != first:
                break  # every later submitter has more running, or was served since
            for group in groups:
                lines = group.subs.get(submitter)
                if lines is None:
                    continue
                for priority, line in lines.items():
                    head = line.steps[0]
                    if not head.live:
                        head = line.head()
                    if priority < top and head.epoch > epoch - (top - priority):
                        continue  # not raised to the top yet
                    if chosen is None or head.seq < chosen.seq:
                        chosen, first = head, (ahead, turn)
        return chosen

    def head(self, requirement: Requirement, epoch: int = 0) -> WaitingStep | None:
        """The step of ``requirement`` that goes next, or ``None`` if none waits for it."""
        if requirement not in self.groups:
            return None
        return self.pick([requirement], epoch)

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
            for lines in group.subs.values()
            for line in lines.values()
            for s in line.steps
            if s.live
        ]

    def _leave(self, step: WaitingStep) -> None:
        step.live = False
        self._count -= 1
        priority = step.priority
        left = self.by_priority[priority] - 1
        if left:
            self.by_priority[priority] = left
        else:
            del self.by_priority[priority]
        left = self.submitters[step.submitter] - 1
        if left:
            self.submitters[step.submitter] = left
        else:
            del self.submitters[step.submitter]
        group = self.groups[step.requirement]
        group.count -= 1
        if not group.count:
            del self.groups[step.requirement]
            return
        left = group.priorities[priority] - 1
        if left:
            group.priorities[priority] = left
        else:
            del group.priorities[priority]
        lines = group.subs[step.submitter]
        line = lines[priority]
        line.live -= 1
        if not line.live:
            del lines[priority]
            if not lines:
                del group.subs[step.submitter]
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
