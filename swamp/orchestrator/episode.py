"""One dispatch episode: a step on one worker — lease, credential, frame, relay, result.

:meth:`Episodes.run` performs the I/O and reports how the episode ended as an
:class:`~swamp.domain.episodes.EpisodeEnd`; the lease is ended as
:func:`~swamp.domain.episodes.lease_ending` decides. What becomes of the step afterwards is the
caller's (the dispatch service, or the verifier for a probe). Running dispatches are kept in
:attr:`Episodes.active` for the data plane and the capability verbs.

A lease's row is written behind: :meth:`Episodes.write_leases` inserts it once the dispatch has
run for :data:`LEASE_WRITE_DELAY` (several in one commit). A dispatch that ends sooner — most
do — makes its row durable once, already ended, before its result goes anywhere: appended to the
journal (``swamp.store.journal``), which ``write_leases`` takes into the store within
:data:`JOURNAL_DELAY`, many rows to a transaction (without a journal, or with
:data:`MAX_JOURNALED` rows waiting, it inserts the row itself). One that writes data inserts
its row, marked write-bearing, before its first write is persisted. What a crash can lose is
the row of a dispatch younger than the delay, whose result nobody has seen.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

import trio

from swamp.bookkeeping.leases import LeaseBook
from swamp.domain.episodes import Ending, EpisodeEnd, lease_ending
from swamp.domain.read_scope import ReadScope
from swamp.errors import (
    ChannelClosed,
    MalformedFrame,
    SwampError,
    WorkerBusy,
    WorkerDraining,
    WorkerStopped,
)
from swamp.models.framework import ModelType
from swamp.orchestrator.credentials import Credentials
from swamp.orchestrator.pool import Member
from swamp.protocol.messages import (
    Accepted,
    Dispatched,
    DispatchRequest,
    DispatchResult,
    Effects,
    LogLine,
    OutputHandle,
    decode_event,
)
from swamp.protocol.rpc import no_events
from swamp.store.datastore import Datastore, Record
from swamp.store.journal import Entry, Journal
from swamp.store.retry import retry_busy

log = logging.getLogger("swamp.dispatch")
CANCEL_SETTLE = 30  # how long a cancelled dispatch waits for the worker to report it stopped
LEASE_WRITE_DELAY = 0.05  # a running dispatch's lease row is in the store by then
LEASE_RETRY_CAP = 5.0  # the longest wait between attempts while the store refuses writes
JOURNAL_BATCH = 4  # journaled rows taken into the store together, right after a reply
JOURNAL_DELAY = 0.05  # fewer than that are taken in by then
MAX_JOURNALED = 1024  # rows journaled and not in the store yet; beyond, a row is inserted at once
ACK_TICK = 1.0  # how often dispatches are checked for an acknowledgement overdue
_NO_REPLY = object()
Emit = Callable[[dict], Awaitable[None]]


@dataclass(frozen=True)
class Step:
    """Which step a dispatch runs, and which run of it this is (after a lost worker a step is
    dispatched again: same id, next attempt)."""

    id: str
    attempt: int = 1


@dataclass(frozen=True)
class Work:
    """What an episode sends: the method, its checked arguments and its environment."""

    model_type: ModelType
    model_name: str
    method: str
    args: dict
    environment: dict[str, str]
    read_scope: ReadScope
    takes_slot: bool = True  # False for the fleet probe: it runs beside the worker's dispatches
    timeout: float | None = None  # seconds it may run on the worker; None: as long as it takes


@dataclass
class ActiveDispatch:
    """What the data plane and the capability verbs need to know of a running dispatch."""

    id: str
    member: Member
    model_type: ModelType
    model_name: str
    read_scope: ReadScope
    has_writes: bool = False  # it had an effect: if its worker is lost, it must not run again
    writes_stored: bool = False  # the lease's row in the store says so
    outputs: list[dict] = field(default_factory=list)
    written_bytes: int = 0  # through the data plane, against the dispatch's quota
    written_records: int = 0
    writing: int = 0  # data-plane writes under way
    credential: str | None = None
    lease: Record | None = None  # the latest lease record this process wrote
    opened: dict | None = None  # the lease's attributes, while its row is not written yet
    opened_at: float = 0.0  # trio time
    sent_at: float = 0.0  # trio time: when the dispatch went to the worker
    # the worker has said something of it (an event, a write, a query, its answer); until
    # then it may be taken back (see Episodes.watch_acknowledgements)
    acknowledged: bool = False
    abandoned: str | None = None  # why it was taken back
    abandon: trio.CancelScope | None = None


@dataclass(frozen=True)
class Episode:
    end: EpisodeEnd
    result: DispatchResult | None = None  # when the method ran (succeeded or failed)


class Episodes:
    def __init__(
        self,
        store: Datastore,
        credentials: Credentials,
        *,
        journal: Journal | None = None,
        on_unacknowledged: Callable[[Member, str], None] = lambda member, reason: None,
        clock=time.time,
    ) -> None:
        self.store = store
        self.on_unacknowledged = on_unacknowledged  # marks the worker (the gateway's to say)
        self.credentials = credentials
        self.journal = journal
        self.leases = LeaseBook(store, clock=clock)
        self.active: dict[str, ActiveDispatch] = {}
        self.completed = 0
        self.unacknowledged = 0  # dispatches taken back from a worker that said nothing of them
        # sent and not yet acknowledged, oldest first (entries acknowledged since are skipped)
        self._awaiting_ack: dict[str, ActiveDispatch] = {}
        # leases whose row is not written yet, oldest first (see write_leases)
        self._unwritten: dict[str, ActiveDispatch] = {}
        # ended rows in the journal and not in the store yet, with when each was journaled
        self._journaled: list[tuple[Entry, float]] = []
        self._journal_failed = False  # said once, until an append works again
        # write_leases sleeps until this (trio time; infinite when nothing waits), and wakes
        # early on the event: for a lease that opens while it is idle, or a row due sooner
        self._writer_until = math.inf
        self._writer_wakes: trio.Event | None = None

    def __repr__(self) -> str:
        return f"<Episodes active={len(self.active)} completed={self.completed}>"

    async def run(
        self, member: Member, dispatch_id: str, work: Work, step: Step, emit: Emit
    ) -> Episode:
        active = ActiveDispatch(
            dispatch_id, member, work.model_type, work.model_name, read_scope=work.read_scope
        )
        credential = None
        try:
            active.opened = self.leases.opened(
                lease_id=dispatch_id,
                worker=member.name,
                model_type=work.model_type.type,
                model_name=work.model_name,
                method=work.method,
            )
            active.opened_at = trio.current_time()
            self._unwritten[dispatch_id] = active
            if self._writer_until == math.inf:
                self._wake_writer()
            credential = self.credentials.issue_dispatch(member.name, dispatch_id)
            active.credential = credential
            self.active[dispatch_id] = active
            params = DispatchRequest(
                dispatch_id=dispatch_id,
                model_type=work.model_type.type,
                model_name=work.model_name,
                method=work.method,
                args=work.args,
                environment=work.environment,
                credential=credential,
                takes_slot=work.takes_slot,
                step_id=step.id,
                attempt=step.attempt,
            ).to_json()
            if emit is not no_events:
                await safe_emit(emit, Dispatched(member.name, dispatch_id).to_json())
            active.sent_at = trio.current_time()
            self._awaiting_ack[dispatch_id] = active
            episode = await self._call(member, active, params, emit, work.timeout)
            state, error = lease_ending(episode.end)
            await self._end_lease(active, state, error)
            if episode.end.how in (Ending.SUCCEEDED, Ending.FAILED):
                self.completed += 1
            return episode
        except trio.Cancelled:
            state, error = lease_ending(EpisodeEnd(Ending.CANCELLED, member.name))
            with trio.CancelScope(shield=True):
                await self._end_lease(active, state, error)
            raise
        finally:
            if credential is not None:
                self.credentials.revoke(credential)
            self.active.pop(dispatch_id, None)
            self._awaiting_ack.pop(dispatch_id, None)

    async def _call(
        self, member: Member, active: ActiveDispatch, params: dict, emit, timeout: float | None
    ) -> Episode:
        channel = member.channel
        if channel is None or channel.closed:
            return Episode(
                EpisodeEnd(
                    Ending.LOST,
                    member.name,
                    "the worker disconnected before the dispatch was sent",
                )
            )
        reply = _NO_REPLY
        with trio.move_on_after(math.inf if timeout is None else timeout):
            with trio.CancelScope() as abandon:
                active.abandon = abandon
                try:
                    reply = await channel.call(
                        "worker.dispatch",
                        params,
                        timeout=None,
                        on_event=lambda event: _relay(emit, event, active, self),
                        # cancelled: the slot stays taken until the worker says the method
                        # stopped — unless it was taken back from a worker that said nothing
                        settle=lambda: 0 if active.abandoned else CANCEL_SETTLE,
                    )
                except ChannelClosed as exc:
                    return Episode(
                        EpisodeEnd(Ending.LOST, member.name, exc.message, active.has_writes)
                    )
                except (WorkerBusy, WorkerDraining) as exc:  # it took nothing: back to the queue
                    return Episode(EpisodeEnd(Ending.BUSY, member.name, exc.message))
                except WorkerStopped as exc:
                    return Episode(EpisodeEnd(Ending.STOPPED, member.name, exc.message))
                except SwampError as exc:
                    return Episode(
                        EpisodeEnd(Ending.REFUSED, member.name, f"({exc.code}) {exc.message}")
                    )
        if reply is _NO_REPLY:
            if active.abandoned is not None:
                return Episode(
                    EpisodeEnd(
                        Ending.UNACKNOWLEDGED, member.name, active.abandoned, active.has_writes
                    )
                )
            return Episode(
                EpisodeEnd(Ending.TIMED_OUT, member.name, f"its timeout is {timeout:g}s")
            )
        try:
            result = DispatchResult.decode(reply)
        except MalformedFrame as exc:
            return Episode(EpisodeEnd(Ending.MALFORMED, member.name, exc.message))
        if active.outputs:  # what the data plane saw written is the truth
            result = replace(result, outputs=[OutputHandle(**o) for o in active.outputs])
        how = Ending.SUCCEEDED if result.status == "succeeded" else Ending.FAILED
        return Episode(EpisodeEnd(how, member.name, str(result.error or "")), result)

    async def watch_acknowledgements(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Take back every dispatch its worker has said nothing of — no event, no write, no
        query, no answer — within :func:`ack_deadline`: the worker is marked (its machine gets
        no more work for a while, reconnects included) and the step goes back to the queue
        after the fence, as for
        a lost worker. A worker that pings but never answers would otherwise hold every step
        it is sent for good. One timer for all dispatches; a dispatch that ends sooner costs
        nothing (its worker acknowledges only what still runs after a moment)."""
        task_status.started()
        while True:
            await trio.sleep(ACK_TICK)
            now = trio.current_time()
            for dispatch_id, active in list(self._awaiting_ack.items()):
                if active.acknowledged:
                    self._awaiting_ack.pop(dispatch_id, None)
                elif now - active.sent_at > ack_deadline(active.member):
                    self._abandon(active, now - active.sent_at)

    def _abandon(self, active: ActiveDispatch, waited: float) -> None:
        self._awaiting_ack.pop(active.id, None)
        reason = f"it said nothing of dispatch {active.id[:12]} for {waited:.0f}s"
        active.abandoned = reason
        self.unacknowledged += 1
        log.warning("taking a dispatch back from worker %s: %s", active.member.name, reason)
        if active.abandon is not None:
            active.abandon.cancel()
        self.on_unacknowledged(active.member, reason)

    async def _end_lease(self, active: ActiveDispatch, state, error: str | None) -> None:
        """End the lease durably (retried while the database is locked); a lease that cannot be
        ended is expired by the next boot's reconciliation, so the step's outcome stands."""
        if active.has_writes and active.opened is not None:
            active.opened = self.leases.write_bearing(active.opened)
        if self._journal_end(active, state, error):
            return
        try:
            if not await self._insert_lease(
                active, lambda opened: self.leases.ended(opened, state, error=error)
            ):
                active.lease = await retry_busy(
                    lambda: self.leases.end(
                        active.id,
                        state,
                        error=error,
                        current=active.lease,
                        has_writes=active.has_writes,
                    )
                )
        except SwampError as exc:
            log.warning("could not end lease %s as %s: %s", active.id, state.value, exc)

    def _journal_end(self, active: ActiveDispatch, state, error: str | None) -> bool:
        """A lease whose row is not written yet ends with one append to the journal, if there is
        one and it takes it; ``write_leases`` puts the row in the store. Says whether it did."""
        if (
            self.journal is None
            or active.id not in self._unwritten
            or len(self._journaled) >= MAX_JOURNALED
        ):
            return False
        entry = self.leases.journaled(self.leases.ended(active.opened, state, error=error))
        try:
            self.journal.append(entry)
        except SwampError as exc:
            if not self._journal_failed:
                log.warning("%s: lease rows go straight to the store meanwhile", exc)
                self._journal_failed = True
            return False
        if self._journal_failed:
            log.info("the journal takes lease rows again")
            self._journal_failed = False
        del self._unwritten[active.id]
        active.opened = None
        now = trio.current_time()
        self._journaled.append((entry, now))
        if len(self._journaled) >= JOURNAL_BATCH or self._writer_until > now + JOURNAL_DELAY:
            self._wake_writer()
        return True

    def _wake_writer(self) -> None:
        if self._writer_wakes is not None:
            self._writer_wakes.set()
            self._writer_wakes = None

    async def record_write(self, active: ActiveDispatch) -> None:
        """Durably mark the lease write-bearing *before* the first write is persisted."""
        active.acknowledged = active.has_writes = True  # it is running the method
        if not active.writes_stored:
            if not await self._insert_lease(active, self.leases.write_bearing):
                active.lease = await retry_busy(
                    lambda: self.leases.mark_writes(active.id, current=active.lease)
                )
            active.writes_stored = True

    def record_effects(self, active: ActiveDispatch) -> None:
        """The worker says the method had an effect (a command exited): the step must not run
        again, and its lease says so — in the row still to be written, or now in the stored
        one (a write that cannot be made now is made with the lease's end)."""
        active.acknowledged = active.has_writes = True
        if active.writes_stored:
            return
        if active.id in self._unwritten:
            active.opened = self.leases.write_bearing(active.opened)
            return
        try:
            active.lease = self.leases.mark_writes(active.id, current=active.lease)
        except SwampError as exc:
            log.info("lease %s: its effect is recorded with its end (%s)", active.id, exc)
            return
        active.writes_stored = True

    async def _insert_lease(self, active: ActiveDispatch, change: Callable[[dict], dict]) -> bool:
        """If the lease's row is not written yet, write it now as ``change`` makes it, and say
        so. Should that fail, the row goes back to be written behind, as it was opened."""
        if self._unwritten.pop(active.id, None) is None:
            return False
        try:
            active.lease = await retry_busy(lambda: self.leases.insert(change(active.opened)))
        except BaseException:
            self._unwritten[active.id] = active
            raise
        active.opened = None
        return True

    async def write_leases(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Insert the row of every lease that has been running for :data:`LEASE_WRITE_DELAY`, and
        take in every journaled row once the oldest has waited :data:`JOURNAL_DELAY` — all that
        is due together in one transaction. Sleeps until the next is due, or until a lease opens
        or is journaled when there is none: no timer per dispatch, nothing done when idle."""
        task_status.started()
        pause = 0.0  # after a failed write (a broken store): waits longer each time, said once
        while True:
            due = self._next_due()
            if due is None or trio.current_time() < due:
                self._writer_wakes = wakes = trio.Event()
                self._writer_until = math.inf if due is None else due
                with trio.move_on_at(self._writer_until):
                    await wakes.wait()
                self._writer_until = -math.inf  # awake: nothing needs to wake it
                continue  # the oldest may have ended meanwhile: look again
            try:
                await retry_busy(self._write_due_leases)
            except SwampError as exc:
                if not pause:
                    log.warning("could not write the leases of dispatches: %s", exc)
                pause = min(LEASE_RETRY_CAP, max(LEASE_WRITE_DELAY, pause * 2))
                await trio.sleep(pause)  # they stay due: their dispatches' ends try too
                continue
            if pause:
                log.info("the leases of dispatches are written again")
                pause = 0.0

    def _next_due(self) -> float | None:
        """When the next write is due (trio time), or ``None`` when nothing waits."""
        due = None
        if self._unwritten:
            due = next(iter(self._unwritten.values())).opened_at + LEASE_WRITE_DELAY
        if len(self._journaled) >= JOURNAL_BATCH:
            return -math.inf  # now: this task runs once the step that filled it has replied
        if self._journaled:
            journaled = self._journaled[0][1] + JOURNAL_DELAY
            due = journaled if due is None else min(due, journaled)
        return due

    def write_unwritten_leases(self) -> None:
        """At shutdown: the journaled rows go in, and the rows not written yet go in as they are
        (active), so the next boot finds and expires them, as it does any lease a stopped
        orchestrator left running."""
        leases = list(self._unwritten.values())
        try:
            self._written(leases, self._insert_with_journaled(leases))
        except SwampError as exc:
            log.warning("could not write the leases of dispatches: %s", exc)
        self._unwritten.clear()

    def _write_due_leases(self) -> None:
        """One transaction; nothing changes here unless it commits (then no dispatch can have
        moved on meanwhile: this does not wait)."""
        now = trio.current_time()
        due = []
        for active in self._unwritten.values():
            if active.opened_at + LEASE_WRITE_DELAY > now:
                break
            due.append(active)
        self._written(due, self._insert_with_journaled(due))

    def _insert_with_journaled(self, leases: list[ActiveDispatch]) -> list[Record]:
        """The rows of ``leases``, as opened, and every journaled row (all of them: the journal
        is emptied after the commit, so none may stay behind in it), in one transaction."""
        journaled = [entry for entry, _ in self._journaled]
        if not leases and not journaled:
            return []
        records = self.leases.insert_many([active.opened for active in leases], journaled=journaled)
        if journaled and self.journal is not None:
            self._journaled.clear()
            try:
                self.journal.clear()
            except SwampError as exc:  # its rows are in: the next boot skips them
                log.warning("%s", exc)
        return records

    def _written(self, leases: list[ActiveDispatch], records: list[Record]) -> None:
        """After the commit: these rows are in the store."""
        for active, record in zip(leases, records, strict=True):
            active.lease, active.opened = record, None
            del self._unwritten[active.id]

    async def keep_credentials_fresh(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Slide every running dispatch's credential expiry, so a dispatch keeps its data-plane
        access for as long as it runs (one timer for all of them, not a task per dispatch)."""
        task_status.started()
        while True:
            await trio.sleep(self.credentials.ttl / 3)
            for active in list(self.active.values()):
                if active.credential:
                    self.credentials.extend(active.credential)


async def _relay(emit: Emit, event: object, active: ActiveDispatch, episodes: Episodes) -> None:
    """What a worker says mid-dispatch, checked: a log line goes, with the worker's name, to
    whoever runs the step; word that the method had an effect marks the dispatch (if the worker
    is lost now, the step must not run again). Nothing else is a worker's to say."""
    worker = active.member.name
    try:
        decoded = decode_event(event)
        if isinstance(decoded, Accepted):
            active.acknowledged = True
            return
        if isinstance(decoded, Effects):
            episodes.record_effects(active)
            return
        if not isinstance(decoded, LogLine):
            raise MalformedFrame(f"a worker does not send {decoded.kind!r} events")
    except MalformedFrame as exc:
        log.warning("dropped a malformed event from worker %s: %s", worker, exc.message)
        return
    active.acknowledged = True
    await safe_emit(emit, replace(decoded, worker=worker).to_json())


def ack_deadline(member: Member) -> float:
    """How long a worker may say nothing of a dispatch: as long as it may say nothing at all
    before it is dropped (its heartbeats missed), so one rule covers both."""
    channel = member.channel
    return member.heartbeat * (channel.missed if channel is not None else 3)


async def safe_emit(emit: Emit, event: dict) -> None:
    """Events are best effort: a client that went away must not break the dispatch."""
    try:
        await emit(event)
    except ChannelClosed:
        pass
