"""One dispatch episode: a step on one worker — lease, credential, frame, relay, result.

:meth:`Episodes.run` performs the I/O and reports how the episode ended as an
:class:`~swamp.domain.episodes.EpisodeEnd`; the lease is ended as
:func:`~swamp.domain.episodes.lease_ending` decides. What becomes of the step afterwards is the
caller's (the dispatch service, or the verifier for a probe). Running dispatches are kept in
:attr:`Episodes.active` for the data plane and the capability verbs.

A lease's row is written behind: :meth:`Episodes.write_leases` inserts it once the dispatch has
run for :data:`LEASE_WRITE_DELAY` (several in one commit). A dispatch that ends sooner — most
do — writes its row once, already ended, before its result goes anywhere; one that writes data
inserts it, marked write-bearing, before its first write is persisted. What a crash can lose
is the row of a dispatch younger than the delay, whose result nobody has seen.
"""

from __future__ import annotations

import logging
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
from swamp.store.retry import retry_busy

log = logging.getLogger("swamp.dispatch")
CANCEL_SETTLE = 30  # how long a cancelled dispatch waits for the worker to report it stopped
LEASE_WRITE_DELAY = 0.05  # a running dispatch's lease row is in the store by then
LEASE_RETRY_CAP = 5.0  # the longest wait between attempts while the store refuses writes
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


@dataclass
class ActiveDispatch:
    """What the data plane and the capability verbs need to know of a running dispatch."""

    id: str
    member: Member
    model_type: ModelType
    model_name: str
    read_scope: ReadScope
    has_writes: bool = False
    outputs: list[dict] = field(default_factory=list)
    credential: str | None = None
    lease: Record | None = None  # the latest lease record this process wrote
    opened: dict | None = None  # the lease's attributes, while its row is not written yet
    opened_at: float = 0.0  # trio time


@dataclass(frozen=True)
class Episode:
    end: EpisodeEnd
    result: DispatchResult | None = None  # when the method ran (succeeded or failed)


class Episodes:
    def __init__(self, store: Datastore, credentials: Credentials, *, clock=time.time) -> None:
        self.store = store
        self.credentials = credentials
        self.leases = LeaseBook(store, clock=clock)
        self.active: dict[str, ActiveDispatch] = {}
        self.completed = 0
        # leases whose row is not written yet, oldest first (see write_leases)
        self._unwritten: dict[str, ActiveDispatch] = {}
        self._lease_opened: trio.Event | None = None  # made while write_leases has nothing

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
            if self._lease_opened is not None:
                self._lease_opened.set()
                self._lease_opened = None
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
            episode = await self._call(member, active, params, emit)
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

    async def _call(self, member: Member, active: ActiveDispatch, params: dict, emit) -> Episode:
        channel = member.channel
        if channel is None or channel.closed:
            return Episode(
                EpisodeEnd(
                    Ending.LOST,
                    member.name,
                    "the worker disconnected before the dispatch was sent",
                )
            )
        try:
            reply = await channel.call(
                "worker.dispatch",
                params,
                timeout=None,
                on_event=lambda event: _relay(emit, event, active),
                # cancelled: the slot stays taken until the worker says the method stopped
                settle=CANCEL_SETTLE,
            )
        except ChannelClosed as exc:
            return Episode(EpisodeEnd(Ending.LOST, member.name, exc.message, active.has_writes))
        except (WorkerBusy, WorkerDraining) as exc:  # it took nothing: back to the queue
            return Episode(EpisodeEnd(Ending.BUSY, member.name, exc.message))
        except WorkerStopped as exc:
            return Episode(EpisodeEnd(Ending.STOPPED, member.name, exc.message))
        except SwampError as exc:
            return Episode(EpisodeEnd(Ending.REFUSED, member.name, f"({exc.code}) {exc.message}"))
        try:
            result = DispatchResult.decode(reply)
        except MalformedFrame as exc:
            return Episode(EpisodeEnd(Ending.MALFORMED, member.name, exc.message))
        if active.outputs:  # what the data plane saw written is the truth
            result = replace(result, outputs=[OutputHandle(**o) for o in active.outputs])
        how = Ending.SUCCEEDED if result.status == "succeeded" else Ending.FAILED
        return Episode(EpisodeEnd(how, member.name, str(result.error or "")), result)

    async def _end_lease(self, active: ActiveDispatch, state, error: str | None) -> None:
        """End the lease durably (retried while the database is locked); a lease that cannot be
        ended is expired by the next boot's reconciliation, so the step's outcome stands."""
        try:
            if not await self._insert_lease(
                active, lambda opened: self.leases.ended(opened, state, error=error)
            ):
                active.lease = await retry_busy(
                    lambda: self.leases.end(active.id, state, error=error, current=active.lease)
                )
        except SwampError as exc:
            log.warning("could not end lease %s as %s: %s", active.id, state.value, exc)

    async def record_write(self, active: ActiveDispatch) -> None:
        """Durably mark the lease write-bearing *before* the first write is persisted."""
        if not active.has_writes:
            if not await self._insert_lease(active, self.leases.write_bearing):
                active.lease = await retry_busy(
                    lambda: self.leases.mark_writes(active.id, current=active.lease)
                )
            active.has_writes = True

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
        """Insert the row of every lease that has been running for :data:`LEASE_WRITE_DELAY`,
        those due together in one transaction. Sleeps until the oldest is due, or until a lease
        opens when there is none: no timer per dispatch, nothing done when idle."""
        task_status.started()
        pause = 0.0  # after a failed write (a broken store): waits longer each time, said once
        while True:
            if not self._unwritten:
                self._lease_opened = trio.Event()
                await self._lease_opened.wait()
                continue
            oldest = next(iter(self._unwritten.values()))
            due = oldest.opened_at + LEASE_WRITE_DELAY
            if trio.current_time() < due:
                await trio.sleep_until(due)
                continue  # the oldest may have ended meanwhile: look again
            try:
                await retry_busy(self._write_due_leases)
            except SwampError as exc:
                if not pause:
                    log.warning("could not write the leases of running dispatches: %s", exc)
                pause = min(LEASE_RETRY_CAP, max(LEASE_WRITE_DELAY, pause * 2))
                await trio.sleep(pause)  # they stay due: their dispatches' ends try too
                continue
            if pause:
                log.info("the leases of running dispatches are written again")
                pause = 0.0

    def write_unwritten_leases(self) -> None:
        """At shutdown: the rows not written yet go in as they are (active), so the next boot
        finds and expires them, as it does any lease a stopped orchestrator left running."""
        try:
            self._insert_rows(list(self._unwritten.values()))
        except SwampError as exc:
            log.warning("could not write the leases of running dispatches: %s", exc)
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
        self._insert_rows(due)

    def _insert_rows(self, leases: list[ActiveDispatch]) -> None:
        """Their rows, as opened, in one transaction; each is then written (not before)."""
        if not leases:
            return
        records = self.leases.insert_many([active.opened for active in leases])
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


async def _relay(emit: Emit, event: object, active: ActiveDispatch) -> None:
    """What a worker says mid-dispatch, checked: a log line goes, with the worker's name, to
    whoever runs the step; word that the method had an effect marks the dispatch (if the worker
    is lost now, the step must not run again). Nothing else is a worker's to say."""
    worker = active.member.name
    try:
        decoded = decode_event(event)
        if isinstance(decoded, Effects):
            active.has_writes = True
            return
        if not isinstance(decoded, LogLine):
            raise MalformedFrame(f"a worker does not send {decoded.kind!r} events")
    except MalformedFrame as exc:
        log.warning("dropped a malformed event from worker %s: %s", worker, exc.message)
        return
    await safe_emit(emit, replace(decoded, worker=worker).to_json())


async def safe_emit(emit: Emit, event: dict) -> None:
    """Events are best effort: a client that went away must not break the dispatch."""
    try:
        await emit(event)
    except ChannelClosed:
        pass
