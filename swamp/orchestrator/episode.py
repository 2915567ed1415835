"""One dispatch episode: a step on one worker — lease, credential, frame, relay, result.

:meth:`Episodes.run` performs the I/O and reports how the episode ended as an
:class:`~swamp.domain.episodes.EpisodeEnd`; the lease is ended as
:func:`~swamp.domain.episodes.lease_ending` decides. What becomes of the step afterwards is the
caller's (the dispatch service, or the verifier for a probe). Running dispatches are kept in
:attr:`Episodes.active` for the data plane and the capability verbs.

A lease's row is the bookkeeper's to write (``swamp.orchestrator.bookkeeper`` says when it is
durable): the episode opens it, marks it when the dispatch writes data or has an effect, and
ends it before the result goes anywhere.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

import trio

from swamp.domain.episodes import Ending, EpisodeEnd, lease_ending
from swamp.domain.read_scope import ReadScope
from swamp.domain.step_logs import LogOwner
from swamp.errors import (
    ChannelClosed,
    MalformedFrame,
    SwampError,
    WorkerBusy,
    WorkerDraining,
    WorkerLostError,
    WorkerStopped,
)
from swamp.models.framework import ModelType
from swamp.orchestrator.bookkeeper import Bookkeeper, Lease
from swamp.orchestrator.credentials import Credentials
from swamp.orchestrator.pool import Member
from swamp.orchestrator.step_logs import StepLogs
from swamp.protocol.messages import (
    Accepted,
    AdoptRequest,
    Dispatched,
    DispatchRequest,
    DispatchResult,
    Effects,
    LogLine,
    OutputHandle,
    decode_event,
)
from swamp.protocol.rpc import no_events
from swamp.store.datastore import Record

log = logging.getLogger("swamp.dispatch")
CANCEL_SETTLE = 30  # how long a cancelled dispatch waits for the worker to report it stopped
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
    owner: LogOwner | None = None  # whose output it prints (None: not kept, e.g. a probe)
    # another orchestrator sent it (a shared database): it is told, as an ``effects`` event,
    # once the step has had an effect — if this one is lost, the step must not run again
    tell_effects: bool = False


@dataclass
class ActiveDispatch:
    """What the data plane and the capability verbs need to know of a running dispatch."""

    id: str
    member: Member
    model_type: ModelType
    model_name: str
    read_scope: ReadScope
    has_writes: bool = False  # it had an effect: if its worker is lost, it must not run again
    outputs: list[dict] = field(default_factory=list)
    written_bytes: int = 0  # through the data plane, against the dispatch's quota
    written_records: int = 0
    writing: int = 0  # data-plane writes under way
    credential: str | None = None
    lease: Lease | None = None  # its row, as the bookkeeper keeps it
    sent_at: float = 0.0  # trio time: when the dispatch went to the worker
    # the worker has said something of it (an event, a write, a query, its answer); until
    # then it may be taken back (see Episodes.watch_acknowledgements)
    acknowledged: bool = False
    abandoned: str | None = None  # why it was taken back
    abandon: trio.CancelScope | None = None
    tell: Emit | None = None  # where its first effect is told (another orchestrator's step)
    log_id: str = ""  # where its lines are kept ("": under its id)


@dataclass(frozen=True)
class Episode:
    end: EpisodeEnd
    result: DispatchResult | None = None  # when the method ran (succeeded or failed)
    # its lease was ended here (not: the store could not be written, or the lease had moved
    # to another orchestrator — a shared database took this one for dead meanwhile)
    lease_ended: bool = True
    lease: Lease | None = None  # (to end it again: Episodes.end_again)


class Episodes:
    def __init__(
        self,
        bookkeeper: Bookkeeper,
        credentials: Credentials,
        *,
        on_unacknowledged: Callable[[Member, str], None] = lambda member, reason: None,
        logs: StepLogs | None = None,
    ) -> None:
        self.logs = logs  # every line a dispatch prints is kept there (None: not kept)
        self.bookkeeper = bookkeeper  # writes the lease rows (and says when they are durable)
        self.on_unacknowledged = on_unacknowledged  # marks the worker (membership's to say)
        self.credentials = credentials
        self.active: dict[str, ActiveDispatch] = {}
        self.completed = 0
        self.unacknowledged = 0  # dispatches taken back from a worker that said nothing of them
        # sent and not yet acknowledged, oldest first (entries acknowledged since are skipped)
        self._awaiting_ack: dict[str, ActiveDispatch] = {}

    def __repr__(self) -> str:
        return f"<Episodes active={len(self.active)} completed={self.completed}>"

    async def run(
        self, member: Member, dispatch_id: str, work: Work, step: Step, emit: Emit
    ) -> Episode:
        active = ActiveDispatch(
            dispatch_id, member, work.model_type, work.model_name, read_scope=work.read_scope
        )
        if work.tell_effects:
            active.tell = emit
        try:
            active.lease = self.bookkeeper.open_lease(
                dispatch_id,
                worker=member.name,
                model_type=work.model_type.type,
                model_name=work.model_name,
                method=work.method,
                step_id=step.id,
            )
            credential = self.credentials.issue_dispatch(member.name, dispatch_id)
            active.credential = credential
            self.active[dispatch_id] = active
            if self.logs is not None and work.owner is not None:
                self.logs.open(dispatch_id, work.owner, worker=member.name, attempt=step.attempt)
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
            said = Dispatched(member.name, dispatch_id).to_json() if emit is not no_events else None
            return await self._hear(
                member, active, "worker.dispatch", params, emit, work.timeout, announce=said
            )
        finally:
            self._forget(active)

    async def adopt(
        self, member: Member, record: Record, work: Work, step: Step, *, log_id: str
    ) -> Episode:
        """A run ``member`` carried here from an orchestrator that died, whose lease (``record``)
        its burial moved to this one (``swamp.domain.carrying``): linked to us
        (``worker.adopt``) and heard to its end as any episode; its lines go to a log of their
        own (``log_id``)."""
        dispatch_id = record.attributes["leaseId"]
        active = ActiveDispatch(
            dispatch_id,
            member,
            work.model_type,
            work.model_name,
            read_scope=work.read_scope,
            has_writes=bool(record.attributes.get("hasWrites")),
            log_id=log_id,
        )
        active.lease = self.bookkeeper.adopted_lease(record)
        try:
            active.credential = self.credentials.issue_dispatch(member.name, dispatch_id)
            self.active[dispatch_id] = active
            if self.logs is not None and work.owner is not None:
                self.logs.open(log_id, work.owner, worker=member.name, attempt=step.attempt)
            params = AdoptRequest(dispatch_id, active.credential).to_json()
            return await self._hear(member, active, "worker.adopt", params, no_events, work.timeout)
        finally:
            self._forget(active)

    async def _hear(
        self,
        member: Member,
        active: ActiveDispatch,
        verb: str,
        params: dict,
        emit: Emit,
        may_run: float | None,
        *,
        announce: dict | None = None,
    ) -> Episode:
        """Send ``verb`` and hear the dispatch to its end (``announce`` told first); its lease
        ends as the end says."""
        try:
            if announce is not None:
                await safe_emit(emit, announce)
            active.sent_at = trio.current_time()
            self._awaiting_ack[active.id] = active
            episode = await self._call(member, active, verb, params, emit, may_run)
            state, error = lease_ending(episode.end)
            if not await self._end_lease(active, state, error):
                episode = replace(episode, lease_ended=False, lease=active.lease)
            if episode.end.how in (Ending.SUCCEEDED, Ending.FAILED):
                self.completed += 1
            return episode
        except trio.Cancelled:
            state, error = lease_ending(EpisodeEnd(Ending.CANCELLED, member.name))
            with trio.CancelScope(shield=True):
                await self._end_lease(active, state, error)
            raise

    def _forget(self, active: ActiveDispatch) -> None:
        if active.credential is not None:
            self.credentials.revoke(active.credential)
        if self.logs is not None:
            self.logs.close(active.log_id or active.id)
        self.active.pop(active.id, None)
        self._awaiting_ack.pop(active.id, None)

    async def _call(
        self,
        member: Member,
        active: ActiveDispatch,
        verb: str,
        params: dict,
        emit,
        may_run: float | None,
    ) -> Episode:
        channel = member.channel
        if channel is None or channel.closed:
            return Episode(
                EpisodeEnd(
                    Ending.LOST,
                    member.name,
                    "the worker disconnected before the dispatch was sent",
                    active.has_writes,  # (an adopted run's lease may say it had an effect)
                )
            )
        reply = _NO_REPLY
        with trio.move_on_after(math.inf if may_run is None else may_run):
            with trio.CancelScope() as abandon:
                active.abandon = abandon
                try:
                    reply = await channel.call(
                        verb,
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
                except WorkerLostError as exc:  # a carried run gone before it was adopted
                    return Episode(
                        EpisodeEnd(Ending.LOST, member.name, exc.message, active.has_writes)
                    )
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
                EpisodeEnd(Ending.TIMED_OUT, member.name, f"its timeout is {may_run:g}s")
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

    async def end_again(self, episode: Episode) -> bool:
        """Try again to end the lease of an episode whose end could not be written (see
        :attr:`Episode.lease_ended`); whether it is ended here now."""
        if episode.lease is None:
            return True
        state, error = lease_ending(episode.end)
        return await self.bookkeeper.end_lease(episode.lease, state, error)

    async def _end_lease(self, active: ActiveDispatch, state, error: str | None) -> bool:
        if active.lease is None:
            return True
        active.lease.has_writes = active.lease.has_writes or active.has_writes
        return await self.bookkeeper.end_lease(active.lease, state, error)

    async def record_write(self, active: ActiveDispatch) -> None:
        """Durably mark the lease write-bearing *before* the first write is persisted."""
        active.acknowledged = active.has_writes = True  # it is running the method
        if active.lease is not None:
            await self.bookkeeper.mark_writes(active.lease)
        await _tell_effect(active)

    def record_effects(self, active: ActiveDispatch) -> None:
        """The worker says the method had an effect (a command exited): the step must not run
        again, and its lease says so (see :meth:`Bookkeeper.mark_effects`)."""
        active.acknowledged = active.has_writes = True
        if active.lease is not None:
            self.bookkeeper.mark_effects(active.lease)

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
            await _tell_effect(active)
            return
        if not isinstance(decoded, LogLine):
            raise MalformedFrame(f"a worker does not send {decoded.kind!r} events")
    except MalformedFrame as exc:
        log.warning("dropped a malformed event from worker %s: %s", worker, exc.message)
        return
    active.acknowledged = True
    if episodes.logs is not None:
        episodes.logs.append(active.log_id or active.id, decoded.line, decoded.stream)
    await safe_emit(emit, replace(decoded, worker=worker).to_json())


async def _tell_effect(active: ActiveDispatch) -> None:
    """The orchestrator that sent the step learns it had an effect (once)."""
    tell, active.tell = active.tell, None
    if tell is not None:
        await safe_emit(tell, Effects().to_json())


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
