"""The pool index and the assignment of waiting steps to workers: decide, then act.

:class:`PoolIndex` is what scheduling knows of the pool — each member's labels, platform, slots
and whether it may get work — indexed so that a decision does not scan the pool: members by
``(label key, value)`` (platform and arch are keys too), by instance id, and, per key, a heap in
least-loaded order (most free slots, then name). Heaps are lazy: a change pushes a fresh entry
and makes the old one stale; stale entries are dropped when they surface, and a heap is rebuilt
when they outnumber the live ones. A decision at 10,000 workers costs a heap peek.

:func:`admit` is the one decision for a step that asks for a worker: dispatch it to a worker
now, let it wait, or refuse it (with the reason). :func:`assign` is the one decision when the
pool changes: given the waiting steps and the index, which step goes to which worker, in the
queue's order (priority — raised by aging up to the highest given — then fair share between
submitters, then age). Both take
each slot they give in the index before they return, so decisions that follow (in the same
call or the next) never overbook. The shell performs the dispatches after.
:func:`swamp.domain.placement.choose_worker` — a plain scan — is the specification the index is
tested against.
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from swamp.domain.placement import Placement
from swamp.domain.queue import WaitingQueue, WaitingStep
from swamp.domain.workers import INSTANCE_ID

Key = tuple[str, str]
ALL: Key = ("\0all", "")  # every member has it: the heap for "any worker"
_OS, _ARCH = "\0os", "\0arch"  # label keys cannot contain NUL: no clash with a real label


@dataclass(frozen=True)
class Requirement:
    """A placement as scheduling sees it: hashable, so waiting steps group by it."""

    target: str | None = None
    keys: frozenset[Key] = frozenset()

    @classmethod
    def of(cls, placement: Placement) -> Requirement:
        if placement.target:
            return cls(target=placement.target)
        keys = set(placement.labels.items())
        if placement.platform:
            os_part, _, arch_part = placement.platform.partition("/")
            if os_part:
                keys.add((_OS, os_part))
            if arch_part:
                keys.add((_ARCH, arch_part))
        return cls(keys=frozenset(keys))

    def text(self) -> str:
        """How ``/metrics`` and ``worker queue`` name it: ``target=t``, or each ``k=v`` in key
        order then ``platform=os/arch``, or ``any worker`` — what
        :func:`swamp.domain.queue.requirement_text` says of the placement it came from (a
        target's labels aside: scheduling ignores them, and so does this)."""
        if self.target:
            return f"target={self.target}"
        labels = sorted(pair for pair in self.keys if pair[0] not in (_OS, _ARCH))
        parts = [f"{k}={v}" for k, v in labels]
        os_part = next((v for k, v in self.keys if k == _OS), "")
        arch_part = next((v for k, v in self.keys if k == _ARCH), "")
        if arch_part:
            parts.append(f"platform={os_part}/{arch_part}")
        elif os_part:
            parts.append(f"platform={os_part}")
        return ", ".join(parts) or "any worker"


@dataclass(eq=False, slots=True)
class Slots:
    """One member as scheduling sees it. ``schedulable``: connected, verified, not draining.
    (One per worker, so slotted; its labels never change once it is in an index.)"""

    name: str
    instance_id: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    platform: str = ""
    arch: str = ""
    capacity: int = 1
    active: int = 0
    schedulable: bool = True
    # every key the index files it under (its labels, platform, arch and ``ALL``); worked out
    # once, as every change of its load re-files it
    index_keys: tuple[Key, ...] = field(init=False, repr=False, default=())

    @property
    def free(self) -> int:
        return max(0, self.capacity - self.active) if self.schedulable else 0

    def __post_init__(self) -> None:
        keys = (*self.labels.items(), (_OS, self.platform), (_ARCH, self.arch), ALL)
        self.index_keys = tuple(dict.fromkeys(keys))

    def satisfies(self, requirement: Requirement) -> bool:
        """Labels and platform, regardless of load (a target is resolved by the index)."""
        if requirement.target:
            return requirement.target in (self.name, self.instance_id)
        have: str | None
        for key, value in requirement.keys:
            if key == _OS:
                have = self.platform
            elif key == _ARCH:
                have = self.arch
            else:
                have = self.labels.get(key)
            if have != value:
                return False
        return True


class PoolIndex:
    def __init__(self) -> None:
        self._members: dict[str, Slots] = {}
        self._by_key: dict[Key, set[str]] = {}
        self._by_instance: dict[str, set[str]] = {}
        self._heaps: dict[Key, list[tuple[int, str, int]]] = {}
        self._stamps: dict[str, int] = {}  # a member's current heap entries carry its stamp
        self._stamp = itertools.count(1)

    def __repr__(self) -> str:
        return f"<PoolIndex members={len(self._members)} keys={len(self._by_key)}>"

    def __len__(self) -> int:
        return len(self._members)

    def __contains__(self, name: str) -> bool:
        return name in self._members

    def get(self, name: str) -> Slots | None:
        return self._members.get(name)

    def members(self) -> Iterable[Slots]:
        return self._members.values()

    # -- changes -----------------------------------------------------------------------------

    def put(self, slots: Slots) -> None:
        """Add a member, or replace the one of that name (a re-enrollment)."""
        if slots.name in self._members:
            self.remove(slots.name)
        self._members[slots.name] = slots
        for key in slots.index_keys:
            self._by_key.setdefault(key, set()).add(slots.name)
        self._by_instance.setdefault(slots.instance_id, set()).add(slots.name)
        self._restamp(slots)

    def remove(self, name: str) -> None:
        slots = self._members.pop(name, None)
        if slots is None:
            return
        self._stamps.pop(name, None)  # every heap entry of it is stale now
        for key in slots.index_keys:
            names = self._by_key.get(key)
            if names is not None:
                names.discard(name)
                if not names:
                    del self._by_key[key]
                    self._heaps.pop(key, None)
        same = self._by_instance.get(slots.instance_id)
        if same is not None:
            same.discard(name)
            if not same:
                del self._by_instance[slots.instance_id]

    def update(
        self, name: str, *, active: int | None = None, schedulable: bool | None = None
    ) -> None:
        slots = self._members.get(name)
        if slots is None:
            return
        if active is not None:
            slots.active = active
        if schedulable is not None:
            slots.schedulable = schedulable
        self._restamp(slots)

    def take(self, name: str) -> None:
        slots = self._members[name]
        slots.active += 1
        self._restamp(slots)

    def release(self, name: str) -> None:
        slots = self._members.get(name)
        if slots is not None and slots.active > 0:
            slots.active -= 1
            self._restamp(slots)

    def _restamp(self, slots: Slots) -> None:
        stamp = next(self._stamp)
        self._stamps[slots.name] = stamp
        if slots.free <= 0:
            return  # no entry: it cannot take a step
        entry = (-slots.free, slots.name, stamp)
        for key in slots.index_keys:
            heap = self._heaps.setdefault(key, [])
            heapq.heappush(heap, entry)
            if len(heap) > 64 + 4 * len(self._by_key.get(key, ())):
                self._rebuild(key)

    def _rebuild(self, key: Key) -> None:
        heap = []
        for name in self._by_key.get(key, ()):
            slots = self._members[name]
            if slots.free > 0:
                heap.append((-slots.free, name, self._stamps[name]))
        heapq.heapify(heap)
        self._heaps[key] = heap

    # -- decisions ---------------------------------------------------------------------------

    def resolve_target(self, target: str) -> Slots | None:
        """The one member a target names: its name, or an instance id that is well formed and
        held by exactly one member (see :func:`swamp.domain.placement.resolve_target`)."""
        slots = self._members.get(target)
        if slots is not None:
            return slots
        if INSTANCE_ID.fullmatch(target) is None:
            return None
        same = self._by_instance.get(target, ())
        return self._members[next(iter(same))] if len(same) == 1 else None

    def choose(self, requirement: Requirement) -> Slots | None:
        """The least-loaded member with a free slot that satisfies ``requirement``, or ``None``."""
        if requirement.target:
            slots = self.resolve_target(requirement.target)
            return slots if slots is not None and slots.free > 0 else None
        keys = requirement.keys or frozenset([ALL])
        smallest: Key | None = None
        for key in keys:
            names = self._by_key.get(key)
            if not names:
                return None  # nobody has this label at all
            if smallest is None or len(names) < len(self._by_key[smallest]):
                smallest = key
        heap = self._heaps.get(smallest) if smallest is not None else None
        if not heap:
            return None
        aside = []
        found = None
        while heap:
            _, name, stamp = heap[0]
            if self._stamps.get(name) != stamp:
                heapq.heappop(heap)  # stale: its member changed or left
                continue
            slots = self._members[name]
            if slots.satisfies(requirement):
                found = slots
                break
            aside.append(heapq.heappop(heap))
        for entry in aside:
            heapq.heappush(heap, entry)
        return found

    def supply(self, requirement: Requirement) -> tuple[int, int]:
        """(schedulable members that satisfy it, their free slots): the queue's summary."""
        if requirement.target:
            slots = self.resolve_target(requirement.target)
            found = [slots] if slots is not None else []
        else:
            keys = requirement.keys or frozenset([ALL])
            sets = [self._by_key.get(k, set()) for k in keys]
            names = set.intersection(*sets) if sets else set()
            found = [self._members[n] for n in names]
        found = [s for s in found if s.schedulable]
        return len(found), sum(s.free for s in found)

    def idle_slots(self, requirements: Iterable[Requirement]) -> dict[Requirement, int]:
        """The free slots of schedulable members that satisfy each requirement (a member that
        satisfies several counts in each): for a scrape of ``/metrics``, not for scheduling.

        Each requirement reads only the members filed under its rarest key — the index's own
        sets, as :meth:`choose` does — so a label nobody has costs nothing, one that a fleet
        shares costs that fleet's members, and a requirement of several keys checks the
        others on those members only. ``any worker`` reads every member."""
        members, by_key = self._members, self._by_key
        out: dict[Requirement, int] = {}
        for requirement in requirements:
            if requirement.target:
                named = self.resolve_target(requirement.target)
                out[requirement] = named.free if named is not None else 0
                continue
            wanted = requirement.keys or frozenset([ALL])
            rarest = min((by_key.get(key, ()) for key in wanted), key=len)
            single = len(wanted) == 1
            total = 0
            for name in rarest:
                slots = members[name]
                free = slots.capacity - slots.active if slots.schedulable else 0
                if free > 0 and (single or slots.satisfies(requirement)):
                    total += free
            out[requirement] = total
        return out


@dataclass(frozen=True)
class Assignment:
    step: WaitingStep
    worker: str


def assign(
    queue: WaitingQueue,
    index: PoolIndex,
    requirements: Iterable[Requirement] | None = None,
    *,
    epoch: int = 0,
) -> list[Assignment]:
    """Give waiting steps to free workers, the best step first among the requirements
    considered (``requirements``: those an event can have unblocked; ``None``: all) in aging
    tick ``epoch``: the highest priority given to any of those with a free worker is the top;
    of the steps given it or raised to it by aging, fair share between submitters, then the
    oldest (``WaitingQueue.pick``); the least-loaded worker for each. Every assigned slot is
    taken in ``index`` and every assigned step leaves ``queue`` before this returns."""
    groups = queue.groups
    considered = list(groups) if requirements is None else [r for r in requirements if r in groups]
    out: list[Assignment] = []
    while considered:
        open_ = []  # (requirement, the worker it would get)
        for requirement in considered:
            if requirement in groups:
                slots = index.choose(requirement)
                if slots is not None:
                    open_.append((requirement, slots))
        # blocked stays blocked: no slot is given back inside this call
        considered = [requirement for requirement, _ in open_]
        if not open_:
            break
        step = queue.pick(considered, epoch)
        assert step is not None  # a step given the top always contends
        slots = dict(open_)[step.requirement]
        queue.take(step)
        index.take(slots.name)
        out.append(Assignment(step, slots.name))
    return out


def requirements_of(slots: Slots, queue: WaitingQueue) -> list[Requirement]:
    """The waiting requirements this member satisfies: what its free slot can unblock."""
    return [r for r in queue.groups if slots.satisfies(r)]


class Dispatch(NamedTuple):
    """Admitted: the step goes to ``worker`` now (its slot is taken in the index)."""

    worker: str
    handed: tuple[Assignment, ...] = ()  # older steps the same decision gave a worker


class Wait(NamedTuple):
    """No free worker can take it yet: ``step`` is in the queue, waiting."""

    step: WaitingStep
    handed: tuple[Assignment, ...] = ()  # older steps the same decision gave a worker


class Refuse(NamedTuple):
    """It may not even wait (the queue is full): ``reason`` says so."""

    reason: str


# (named tuples: a decision is made on every dispatch, and one costs a third of a dataclass)
Admission = Dispatch | Wait | Refuse


def admit(
    requirement: Requirement,
    queue: WaitingQueue,
    index: PoolIndex,
    *,
    max_waiting: int,
    ticket: Any = None,
    priority: int = 0,
    submitter: str = "",
    epoch: int = 0,
) -> Admission:
    """What becomes of a step that asks for a worker matching ``requirement``: it goes at
    once only when no step is waiting at all (the least-loaded free worker, a heap peek);
    otherwise it joins the queue — at its ``priority`` as of the aging ``epoch`` it starts
    waiting in, for its ``submitter`` — and :func:`assign` runs for its requirement, which may
    give it a worker too, in the queue's order. Whatever this decides is already done in
    ``queue`` and ``index``; ``ticket`` is the shell's handle."""
    if len(queue) >= max_waiting:
        return Refuse(
            f"{len(queue)} steps are already waiting for workers (the most this "
            "orchestrator holds); retry later, or add workers"
        )
    if not len(queue):  # nobody is ahead of it: what assign() decides, directly
        slots = index.choose(requirement)
        if slots is not None:
            index.take(slots.name)
            queue.started(submitter)
            return Dispatch(slots.name)
    step = WaitingStep(
        requirement,
        ticket=ticket,
        priority=priority,
        submitter=submitter,
        epoch=epoch,
    )
    queue.add(step)
    handed = assign(queue, index, [requirement], epoch=epoch)
    for n, assignment in enumerate(handed):
        if assignment.step is step:
            return Dispatch(assignment.worker, tuple(handed[:n] + handed[n + 1 :]))
    return Wait(step, tuple(handed))
