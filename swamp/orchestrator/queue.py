"""The elastic queue, as a service: a placed step acquires a worker here.

:meth:`DispatchQueue.acquire` puts the step in the waiting queue and runs the assignment at once;
when a free matching worker exists the step leaves with it in the same call (no record, no
event). Otherwise the step *waits*: a ``swamp/pending-dispatch`` record is written behind (by
the bookkeeper, ``swamp.orchestrator.bookkeeper``),
the caller is told ``queued``, and the step sleeps on its own event until one of these wakes it:

- a pool event that can unblock it — an enrollment, a verify pass, a freed slot (the pool calls
  :meth:`DispatchQueue.member_changed`, which runs the assignment for the requirements that
  member satisfies and hands out the slots it assigned);
- its target's token dies, so the target can never return (it fails at once);
- its deadline passes (it fails: ``queue_timeout``), or whoever waits for it goes away
  (``cancelled``).

No timer is involved in waking a step: the assignment runs on the event itself. Which waiting
step a freed slot goes to is the queue's order (``swamp.domain.queue``): priority raised by
aging, then fair share between submitters (each server token, the local credential), then age.
The queue counts each submitter's running steps as it gives slots and gets them back, and
keeps each slot's step until then (``holders``): ``/metrics`` counts the running steps per
requirement from those when it is scraped (:meth:`DispatchQueue.demand`), so a dispatch pays
nothing for it.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple

import trio

from swamp.bookkeeping.pending import PendingBook
from swamp.domain.demand import Demand
from swamp.domain.placement import Placement
from swamp.domain.priority import DEFAULT_AGING, effective, epoch
from swamp.domain.queue import (
    MAX_WAITING,
    PendingState,
    WaitingQueue,
    WaitingStep,
    requirement_text,
)
from swamp.domain.scheduler import (
    Assignment,
    Dispatch,
    Refuse,
    Requirement,
    admit,
    assign,
    requirements_of,
)
from swamp.domain.tokens import Token
from swamp.domain.workers import WorkerStatus
from swamp.errors import NoMatchingWorker, QueueFull, QueueTimeout, SwampError
from swamp.ids import new_id, ordered_id
from swamp.orchestrator.bookkeeper import Bookkeeper, Stream
from swamp.orchestrator.episode import Emit, safe_emit
from swamp.orchestrator.peers import Claim
from swamp.orchestrator.pool import Member, Pool

if TYPE_CHECKING:
    from swamp.orchestrator.peers import Peers
from swamp.protocol.messages import PlacementSpec, Queued, QueueItem
from swamp.store.datastore import iso
from swamp.store.records import Records

log = logging.getLogger("swamp.queue")
ANY = Requirement()  # a ticket's requirement until acquire() sets it


@dataclass(frozen=True)
class StepInfo:
    """What the queue shows of a step (``worker queue``, its record)."""

    model_type: str
    model_name: str
    method: str
    workflow: str | None = None
    job: str | None = None
    step: str | None = None
    priority: int = 0  # higher goes first (swamp.domain.priority)
    submitter: str = ""  # who asked: fair share is between submitters


class Grant(NamedTuple):
    """What a step acquired: a slot of ``member``, reserved for ``dispatch_id``
    (``queue_id``: the episode it waited in, if it had to); or, on a shared database, a slot
    another orchestrator claimed for it (``claim``; ``member`` None)."""

    member: Member | None
    dispatch_id: str
    queue_id: str | None = None
    claim: Claim | None = None


@dataclass(eq=False)
class Ticket:
    """A step's place in the queue, and what it was given."""

    placement: Placement
    info: StepInfo
    requirement: Requirement = ANY  # the placement as scheduling sees it (/metrics counts by it)
    woken: trio.Event | None = None  # made when it has to wait
    member: Member | None = None
    dispatch_id: str | None = None
    failure: SwampError | None = None
    queue_id: str | None = None  # set when it had to wait (it has a record)
    queued_at: float = 0.0  # epoch seconds, when it started waiting
    step: WaitingStep | None = None  # its place while it waits
    claim: Claim | None = None  # another orchestrator's worker takes it (a shared database)


class DispatchQueue:
    def __init__(
        self,
        pool: Pool,
        db: Records,
        bookkeeper: Bookkeeper,
        *,
        tokens: Callable[[str], Token | None],
        clock=time.time,
        max_waiting: int = MAX_WAITING,
        aging: float = DEFAULT_AGING,
        observe: Callable[[str, float], None] = lambda what, value: None,
        peers: Peers | None = None,
    ) -> None:
        self.pool = pool
        self.waiting = WaitingQueue()
        # on a database several orchestrators share: a step that waits waits in the shared
        # queue too, and the others' workers may claim it (swamp.orchestrator.peers)
        self.peers = peers
        self.published: dict[str, Ticket] = {}  # queue id → a waiting step the others see
        self.pending = PendingBook(db, clock=clock, owner=peers.me if peers else "")
        # a token by name, from memory (LiveTokens.token): asked in the middle of a decision,
        # so never a wait on the store
        self.tokens = tokens
        self.bookkeeper = bookkeeper  # writes the queue episodes behind
        self.clock = clock
        self.max_waiting = max_waiting
        self.aging = aging  # seconds a waiting step takes to gain a point of priority
        self.holders: dict[str, Ticket] = {}  # dispatch id → its step, while it holds a slot
        # metrics and the pages: ("waited", seconds), ("timed_out", 1); ("queued", 1) and
        # ("left", 1) as a step starts and stops waiting
        self.observe = observe
        pool.subscribe(self.member_changed)

    def __repr__(self) -> str:
        return f"<DispatchQueue {self.waiting!r}>"

    # -- a step acquires a worker ------------------------------------------------------------

    async def acquire(
        self,
        placement: Placement,
        info: StepInfo,
        *,
        deadline: float | None,
        emit: Emit,
        straight: bool = True,
    ) -> Grant:
        """Wait for a free worker matching ``placement`` until ``deadline`` (trio time;
        ``None``: forever). Returns the member, whose slot is reserved for the grant's
        ``dispatch_id``; the caller gives it back with :meth:`release`. On a shared database,
        a step that would wait may be sent straight to the orchestrator that claimed the last
        of its kind (``straight``: a step that came back from one waits for a claim)."""
        ticket = Ticket(placement, info)
        ticket.requirement = requirement = Requirement.of(placement)
        decision = admit(
            requirement,
            self.waiting,
            self.pool.index,
            max_waiting=self.max_waiting,
            ticket=ticket,
            priority=info.priority,
            submitter=info.submitter,
            epoch=epoch(trio.current_time(), self.aging),
        )
        if isinstance(decision, Refuse):
            raise QueueFull(decision.reason)
        if decision.handed:
            self._hand_out(decision.handed)
        if isinstance(decision, Dispatch):
            return self._give(ticket, decision.worker)
        step = ticket.step = decision.step
        ticket.woken = woken = trio.Event()
        gone = self.never_returns(placement)
        if gone is not None:
            self.waiting.discard(step)
            raise NoMatchingWorker(gone)
        there = None
        group = self.waiting.groups.get(requirement)
        if straight and self.peers is not None and group is not None and group.count == 1:
            # the last of its kind was claimed there, and no step of its kind waits here
            # ahead of it (they wait for a claim, in the queue's order): straight to it
            there = self.peers.hint(requirement)
        if there is not None:
            self.waiting.discard(step)
            return Grant(None, "", None, Claim("", there, "", "", direct=True))
        queue_id = self._start_waiting(ticket)
        await safe_emit(
            emit,
            Queued(
                requirement=placement.describe(),
                queue_id=queue_id,
                detail=self._why_target_waits(placement),
            ).to_json(),
        )
        try:
            if self.peers is not None and not woken.is_set():
                await self._publish(ticket, queue_id)
            with trio.move_on_at(math.inf if deadline is None else deadline):
                await woken.wait()
            if ticket.claim is None and ticket.member is not None and queue_id in self.published:
                del self.published[queue_id]  # it got a worker here: the others may not
                await self._withdraw_or_claim(ticket, queue_id)
        except BaseException:  # cancelled: whoever waited for it has gone
            self._stop_waiting(step, ticket, PendingState.CANCELLED)
            raise
        if ticket.claim is not None:
            claim = ticket.claim
            self.published.pop(queue_id, None)
            if ticket.member is not None and ticket.dispatch_id is not None:
                self.release(ticket.member, ticket.dispatch_id)  # a slot here came too late
                ticket.member = None
            self._ended(ticket, PendingState.DISPATCHED, dispatch_id=claim.dispatch_id)
            self.observe("waited", self.clock() - ticket.queued_at)
            return Grant(None, claim.dispatch_id, queue_id, claim)
        if ticket.member is not None and ticket.dispatch_id is not None:  # even if late
            self._ended(ticket, PendingState.DISPATCHED, dispatch_id=ticket.dispatch_id)
            self.observe("waited", self.clock() - ticket.queued_at)
            return Grant(ticket.member, ticket.dispatch_id, queue_id)
        if ticket.failure is not None:
            self._unpublish(ticket)
            self._ended(ticket, PendingState.CANCELLED, reason=ticket.failure.message)
            raise ticket.failure
        self._stop_waiting(step, ticket, PendingState.TIMED_OUT)
        self.observe("timed_out", 1)
        raise QueueTimeout(
            f"timed out waiting for a worker matching {placement.describe()} to become available"
        )

    async def _publish(self, ticket: Ticket, queue_id: str) -> None:
        """The others may claim it from now on; the database away, it waits here only (a
        worker of ours may still come: a blink of the database fails no step)."""
        assert self.peers is not None
        self.published[queue_id] = ticket
        info = ticket.info
        try:
            await self.peers.publish(queue_id, ticket.placement, info.priority, info.submitter)
        except SwampError as exc:
            log.warning("step %s waits for this orchestrator's workers only: %s", queue_id, exc)
            self.published.pop(queue_id, None)
            self.peers.withdraw_soon(queue_id)  # in case the row went in after all

    async def _withdraw_or_claim(self, ticket: Ticket, queue_id: str) -> None:
        """A published step got a worker here: it leaves the shared queue, unless another
        orchestrator claimed it first (then it goes there, and the slot here goes back)."""
        assert self.peers is not None
        try:
            claim = await self.peers.withdraw_or_claim(queue_id)
        except SwampError as exc:  # the database is away: nobody can take the claim either
            log.warning("could not withdraw step %s from the shared queue: %s", queue_id, exc)
            self.peers.withdraw_soon(queue_id)  # (again, with the next pass)
            return
        if claim is not None:
            ticket.claim = claim

    def claimed(self, ticket: Ticket, claim: Claim) -> None:
        """Another orchestrator claimed a step of ours and we took the claim: it goes there
        (and the next step of its kind goes straight there: ``Claim``)."""
        ticket.claim = claim
        if self.peers is not None:
            self.peers.learn(ticket.requirement, claim.orchestrator)
        if ticket.step is not None:
            self.waiting.discard(ticket.step)
        if ticket.woken is not None:
            ticket.woken.set()

    def reserve_for_peer(self, requirement: Requirement) -> tuple[Member, str] | None:
        """A free slot here for another orchestrator's step, reserved (it claims the step
        next), or ``None``. A step waiting here is never robbed: a slot it could take would
        have been given to it already."""
        slots = self.pool.index.choose(requirement)
        if slots is None:
            return None
        self.pool.index.take(slots.name)
        member = self.pool.members[slots.name]
        dispatch_id = ordered_id()
        self.pool.reserve(member, dispatch_id, indexed=True)
        return member, dispatch_id

    def _start_waiting(self, ticket: Ticket) -> str:
        ticket.queue_id = queue_id = new_id()
        ticket.queued_at = self.clock()
        placement, info = ticket.placement, ticket.info
        attrs = {
            "queueId": ticket.queue_id,
            "requirement": requirement_text(placement.to_json()),
            **placement.to_json(),
            "modelType": info.model_type,
            "modelName": info.model_name,
            "methodName": info.method,
            "queuedAt": iso(ticket.queued_at),
            "priority": info.priority,
        }
        for field_name, value in (
            ("workflowName", info.workflow),
            ("jobName", info.job),
            ("stepName", info.step),
            ("submitter", info.submitter),
        ):
            if value:
                attrs[field_name] = value
        self.bookkeeper.put(
            Stream.QUEUE, f"queue episode {queue_id}", lambda: self.pending.enqueue(attrs)
        )
        self.observe("queued", 1)
        return queue_id

    def _stop_waiting(self, step: WaitingStep, ticket: Ticket, state: PendingState) -> None:
        """It leaves the queue unassigned; a slot handed out in the same instant goes back."""
        self.waiting.discard(step)
        if ticket.member is not None and ticket.dispatch_id is not None:
            self.release(ticket.member, ticket.dispatch_id)
            ticket.member = None
        self._unpublish(ticket)
        self._ended(ticket, state)
        self.observe("left", 1)

    def _unpublish(self, ticket: Ticket) -> None:
        """It stopped waiting unassigned: out of the shared queue, claimed or not."""
        if self.peers is not None and ticket.queue_id is not None:
            self.published.pop(ticket.queue_id, None)
            self.peers.withdraw_soon(ticket.queue_id)

    def _ended(self, ticket: Ticket, state: PendingState, **details) -> None:
        queue_id = ticket.queue_id
        if queue_id is not None:
            self.bookkeeper.put(
                Stream.QUEUE,
                f"queue episode {queue_id} as {state.value}",
                lambda: self.pending.end(queue_id, state, **details),
            )

    def release(self, member: Member, dispatch_id: str) -> None:
        """The dispatch is over: its slot goes back, and to the waiting step that goes next."""
        holder = self.holders.pop(dispatch_id, None)
        if holder is not None:
            self.waiting.finished(holder.info.submitter)
        if self.pool.release(member, dispatch_id):
            self.member_changed(member)

    # -- events ------------------------------------------------------------------------------

    def member_changed(self, member: Member) -> None:
        """The pool changed around ``member`` (called synchronously by the pool)."""
        if self.peers is not None:
            self.peers.slot_freed()
        if not len(self.waiting):
            return
        try:
            slots = self.pool.index.get(member.name)
            if slots is not None and self.pool.get(member.name) is member and slots.free > 0:
                self._hand_out(
                    assign(
                        self.waiting,
                        self.pool.index,
                        requirements_of(slots, self.waiting),
                        epoch=epoch(trio.current_time(), self.aging),
                    )
                )
            if not member.connected:
                self._fail_unreachable(member)
        except Exception:  # a bug here must not break membership or a dispatch's cleanup
            log.exception("the queue failed to handle a change of worker %s", member.name)

    def _hand_out(self, assignments: Iterable[Assignment]) -> None:
        for assignment in assignments:
            ticket: Ticket = assignment.step.ticket
            self._give(ticket, assignment.worker)
            if ticket.woken is not None:
                ticket.woken.set()

    def _give(self, ticket: Ticket, name: str) -> Grant:
        """The member's slot, already taken in the index, is the ticket's."""
        member = self.pool.members[name]
        ticket.dispatch_id = dispatch_id = ordered_id()
        self.holders[dispatch_id] = ticket
        ticket.member = member
        self.pool.reserve(member, dispatch_id, indexed=True)
        return Grant(member, dispatch_id)

    def _fail_unreachable(self, member: Member) -> None:
        """Steps targeting a member whose token is dead fail now, not at their deadline."""
        for requirement in list(self.waiting.groups):
            if requirement.target not in (member.name, member.instance_id):
                continue
            gone = self.never_returns(Placement(target=requirement.target))
            if gone is None:
                continue
            for step in self.waiting.steps_of(requirement):
                self.waiting.discard(step)
                step.ticket.failure = NoMatchingWorker(gone)
                step.ticket.woken.set()

    def never_returns(self, placement: Placement) -> str | None:
        """Why a targeted worker can never come back (its token is dead, as last read), or
        ``None``."""
        if not placement.target:
            return None
        member = self.pool.resolve(placement.target)
        if member is None or member.connected:
            return None
        token = self.tokens(member.token_name)
        now = self.clock()
        if token is None or not token.live(now):
            state = token.effective_state(now).value if token else "deleted"
            return (
                f"its target {member.name!r} can never return: token {member.token_name!r} "
                f"has been {state}"
            )
        return None

    def _why_target_waits(self, placement: Placement) -> str | None:
        member = self.pool.resolve(placement.target) if placement.target else None
        if member is None:
            return None
        if not member.connected:
            return (
                f"worker {member.name!r} is disconnected (it keeps its place for the grace "
                "window); the step runs when it is back"
            )
        if member.status == WorkerStatus.UNVERIFIED.value:
            return (
                f"worker {member.name!r} is unverified ({member.verify_failure_reason}); the "
                f"step runs if it passes: see 'swamp worker verify {member.name}'"
            )
        return None

    # -- the demand view ---------------------------------------------------------------------

    def items(self) -> list[QueueItem]:
        """Every waiting step, oldest first, with its priority as given and as aged."""
        now, now_epoch = self.clock(), epoch(trio.current_time(), self.aging)
        out = []
        for step in self.waiting.waiting():
            ticket: Ticket = step.ticket
            if ticket.queue_id is None:
                continue  # being assigned in this very instant: it never waited
            info, placement = ticket.info, ticket.placement
            out.append(
                QueueItem(
                    queue_id=ticket.queue_id,
                    requirement=requirement_text(placement.to_json()),
                    placement=PlacementSpec.decode(placement.to_json()),
                    model_type=info.model_type,
                    model_name=info.model_name,
                    method_name=info.method,
                    workflow_name=info.workflow,
                    job_name=info.job,
                    step_name=info.step,
                    queued_at=iso(ticket.queued_at),
                    age_ms=max(0, round((now - ticket.queued_at) * 1000)),
                    priority=step.priority,
                    effective_priority=effective(step.priority, step.epoch, now_epoch),
                    submitter=step.submitter or None,
                )
            )
        return out

    def supply(self, placement: Placement) -> tuple[int, int]:
        return self.pool.index.supply(Requirement.of(placement))

    def demand(self) -> dict[Requirement, Demand]:
        """Steps waiting and running per requirement, and the oldest wait (for /metrics).
        From the queue's groups and the slots it gave — a step per running dispatch, a line
        head per waiting group — never a walk over the waiting steps."""
        now = self.clock()
        running = Counter(holder.requirement for holder in self.holders.values())
        out: dict[Requirement, Demand] = {}
        for requirement, group in self.waiting.groups.items():
            ticket: Ticket = group.oldest().ticket
            waited = now - ticket.queued_at if ticket.queue_id is not None else 0.0
            out[requirement] = Demand(group.count, running.pop(requirement, 0), max(0.0, waited))
        for requirement, count in running.items():
            out[requirement] = Demand(0, count)
        return out
