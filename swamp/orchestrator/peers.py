"""Several orchestrators on one PostgreSQL: who serves it, who died, and steps run on a
worker another orchestrator holds.

Each orchestrator (``serve --database``) gets an id at its start, holds a session advisory
lock on it for its life (*liveness*: the lock frees itself when its process or its connection
dies) and registers in ``swamp_orchestrator`` (``swamp.store.pg_peers``) with the URL its peers
reach it at and the hash of a *peer credential* it made. Its lease rows, worker records,
queue episodes and workflow runs name it (``orchestrator``), so what it leaves when it dies
can be told from what the living hold.

**Death.** Every orchestrator waits on every peer's liveness lock (the server queues waiters;
nothing polls). Whoever gets it first looks again a moment later (a peer whose connection to
the database dropped takes its lock back within seconds), then reconciles what the dead one
left — its active leases expire, the workers it held are marked disconnected unless another
took them meanwhile, its queue episodes are orphaned, its running workflow runs interrupted —
and only then deletes its row: a row whose lock is free names a dead orchestrator.

**Steps across orchestrators.** A step no worker of its orchestrator (its *origin*) can take
waits in the origin's queue and in the shared queue, and a coalesced ``NOTIFY`` wakes the
others (``swamp.store.pg_wake``). One with a free worker that matches reserves the slot and
claims the step by compare-and-swap; the origin, woken in turn, takes the claim and sends the
step — its arguments and environment, which never go through the database — to the claimer
over the frame protocol (``peer.dispatch``, with its peer credential). The claimer runs the
episode on its own socket and relays the step's events (its output, live) back as they come;
cancelling the call cancels the step there. Only the holder ever dispatches to a worker.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import secrets
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import trio

from swamp.bookkeeping.workers import key as worker_key
from swamp.client import connect
from swamp.concurrency import open_unwrapping_nursery
from swamp.domain.episodes import Ending, EpisodeEnd
from swamp.domain.peers import (
    CLAIMS_PREFIX,
    FEATURES,
    PeerRow,
    SharedStep,
    claims_channel,
    credential_hash,
    credential_orchestrator,
    dead_fence,
    liveness_lock,
    peer_credential,
    recorded_heartbeat,
)
from swamp.domain.placement import Placement
from swamp.domain.read_scope import ReadScope
from swamp.domain.scheduler import Requirement, Slots
from swamp.domain.step_logs import LogOwner
from swamp.errors import (
    Busy,
    CallTimeout,
    ChannelClosed,
    ClaimGone,
    Conflict,
    DatabaseUnavailable,
    Forbidden,
    LockHeld,
    MalformedFrame,
    MalformedReply,
    SwampError,
    Unauthorized,
    UnknownMethod,
    UserError,
)
from swamp.ids import new_id
from swamp.orchestrator.outliving import NotStarted, Outliving
from swamp.protocol.messages import DispatchResult
from swamp.protocol.rpc import RpcChannel, no_events

if TYPE_CHECKING:
    from swamp.orchestrator.pool import Member
    from swamp.orchestrator.queue import DispatchQueue
    from swamp.store.pg_peers import PgPeers
    from swamp.store.pg_wake import Waker

log = logging.getLogger("swamp.peers")

PEER = "orchestrator"  # a principal's kind: another orchestrator, by its peer credential
# what a peer may call: the steps it claimed, and the admin verbs about what this one holds
# (a worker's socket, a workflow run's task) asked through another orchestrator
PEER_ADMIN = {
    "peer.worker.drain": "worker.drain.ask",
    "peer.worker.verify": "worker.verify",
    "peer.workflow.cancel": "workflow.cancel",
}
# …and, about a step it sent here whose link broke: does it still run, and cancel it
PEER_OUTCOMES = frozenset({"peer.outcome", "peer.cancel", "peer.step.wait"})
PEER_VERBS = frozenset({"peer.dispatch", *PEER_ADMIN, *PEER_OUTCOMES})
CHANNEL = "swamp_orchestrators"  # the NOTIFY channel: a wake-up for every orchestrator
# the lock an orchestrator of an earlier version held for its life (one per database, then)
EARLIER_VERSION_LOCK = "swamp serve: the database's orchestrator"
REFRESH = 2.0  # seconds between reads of the registry (newcomers, their URLs)
HINT_LIFE = 30.0  # seconds a claim makes its claimer the first asked for the same requirement
MAX_HINTS = 1024  # requirements remembered so (past it, the oldest goes)
MAX_OFFERS = 10_000  # published steps heard and not yet looked at (past it: a pass)
CLAIM_PAGE = 500  # others' waiting steps read at a time (all of them, page by page)
CLAIM_HOLD = 10.0  # seconds a claimed slot waits for its origin to send the step
MAX_REMEMBERED = 1024  # orchestrators whose told heartbeat is remembered (the oldest go)
DEATH_GRACE = 5.0  # a free liveness lock is looked at again after this: a peer whose
# connection dropped takes its own back within seconds (serve's retry is at most 2 s)
LIVENESS_RETRY = 1.0
LINK_RETRY = 2.0  # seconds a peer that could not be reached is not tried again
ASK_AGAIN = 2.0  # seconds between asks after a broken link: does our step still run there?
ASK_WAIT = 10.0  # seconds such an ask may take
OUTCOME_LIFE = 600.0  # seconds a kept outcome waits to be taken (it is, within seconds)
UNKNOWN: dict = {}  # a claimer's word: the step does not run there, and nothing was kept
CLAIMED, NO_SLOT, PASSED = "claimed", "no slot", "passed"  # what a claim attempt came to
CANCEL_SETTLE = 30.0  # as an episode's: a cancelled step's slot is free when the call returns

Reconcile = Callable[[str], Awaitable[dict]]  # a dead orchestrator's id → what was changed


@dataclass
class _Linking:
    """An attempt to link to a peer, which callers arriving meanwhile wait for."""

    done: trio.Event = field(default_factory=trio.Event)
    failure: str | None = None  # why it failed (every waiter is told the same)


@dataclass(frozen=True)
class Claim:
    """Another orchestrator claimed a step of ours: which, for which of its workers. A
    *direct* one was claimed by nobody yet: the step goes straight to ``orchestrator``, whose
    worker took the last step of its kind, which runs it if a worker of its own is free now
    (else the step comes back at once and waits in the shared queue)."""

    queue_id: str
    orchestrator: str
    worker: str
    dispatch_id: str
    direct: bool = False


@dataclass
class Held:
    """A slot of ours reserved for another orchestrator's step until it sends it."""

    member: Member
    dispatch_id: str
    origin: str
    until: float  # trio time
    taken: bool = False


def _held(url: str, name: str, *, wait: bool = True):
    from swamp.store import pg_locks  # (PostgreSQL's driver: only when serving one)

    return pg_locks.held(url, name, wait=wait)


class Peers:
    """This orchestrator among the others on the database (see the module)."""

    def __init__(
        self,
        table: PgPeers,
        database: str,
        *,
        reconcile: Reconcile,
        ca_pem: str | None = None,
        clock: Callable[[], float] = time.time,
        me: str | None = None,
        heartbeat: float = 0.0,
    ) -> None:
        self.table = table
        self.database = database  # the URL: liveness locks and LISTEN take connections of their own
        self.reconcile = reconcile
        self.ca_pem = ca_pem  # our own CA's certificate, when serve made one (peers trust it)
        self.clock = clock
        self.me = me or new_id()  # (given: what opened the database names it already)
        self.credential = peer_credential(self.me, secrets.token_hex(32))
        self.url = ""  # set once listening
        self.known: dict[str, PeerRow] = {}  # the orchestrators registered, as last read
        from swamp.store.pg_wake import Waker  # (PostgreSQL's driver: only when serving one)

        self.waker = Waker(table.pool, CHANNEL, self.me)
        self._watched: set[str] = set()
        self._gone: dict[str, trio.Event] = {}  # set once each is buried (until_gone)
        self._wake = trio.Event()
        self._links: dict[str, RpcChannel] = {}
        self._linking: dict[str, _Linking] = {}  # a link being made, per orchestrator
        self._unreachable: dict[str, tuple[float, str]] = {}  # until when, and why
        self._nursery: trio.Nursery | None = None
        self._withdrawn: list[str] = []  # our steps to take out of the shared queue
        self._done: list[str] = []  # claims of ours sent to us: their rows to delete
        self._taking: set[str] = set()  # claims heard of and sent on: to mark taken
        self._offers: deque[SharedStep] = deque()  # others' steps just published
        self._offered = trio.Event()
        # steps claimed here, which outlive a broken link to their origin; and ours, sent to
        # a claimer whose link broke: waiting for its outcome (woken by its notification)
        self.outliving = Outliving(keep=self._keep_outcome)
        self._outcomes: dict[str, trio.Event] = {}
        # handed to run(): the queue (its tickets and slots), and how to run a claimed step
        self.queue: DispatchQueue | None = None
        self.run_claimed: Callable[..., Awaitable[dict]] | None = None
        self.held: dict[str, Held] = {}  # queue id → our slot reserved for a peer's step
        self.reconciled = 0  # dead orchestrators this one reconciled
        # whether our liveness lock is held now (``swamp.orchestrator.self_fence`` lets our
        # workers go when it stays lost)
        self.holding = False
        # the heartbeat our workers are told (serve's, until the pool grows), as the registry
        # keeps it; and every orchestrator's, as last read
        self.base_heartbeat = heartbeat
        self._told = heartbeat
        self._heartbeats: dict[str, float] = {}
        self._holding_changed = trio.Event()
        self.others_waiting = 0  # others' steps left unclaimed by the last pass
        self.waiting_kinds: dict[Requirement, set[str]] = {}  # …what they need, whose they are
        # which orchestrator last claimed a step of each requirement of ours, until when
        # (trio time): the next such step is sent straight to it (see Claim)
        self.hints: dict[Requirement, tuple[str, float]] = {}
        self._refresh_at = 0.0  # trio time: when the registry is read again
        self._collect_at = 0.0  # …and when the kept outcomes nobody took are collected
        self.lost_liveness: trio.Event = trio.Event()

    def __repr__(self) -> str:
        return f"<Peers {self.me[:8]} known={len(self.known)} held={len(self.held)}>"

    # -- start: liveness, then the row ---------------------------------------------------------

    async def hold_liveness(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Hold our liveness lock for our life, registered once it is held. Lost with its
        connection, it is taken back as soon as the database answers (while the server still
        holds it for our dropped session, or a peer looks at it, we go on asking) — unless a
        peer took us for dead meanwhile (our row is gone): then we stop, saying so."""
        await self._no_earlier_version()
        started = False
        pause = LIVENESS_RETRY
        while True:
            try:
                async with _held(self.database, liveness_lock(self.me), wait=False):
                    if not started:
                        await self.table.register(
                            PeerRow(
                                self.me,
                                self.url,
                                credential_hash(self.credential),
                                self.ca_pem,
                                self.clock(),
                                FEATURES,
                                self._told,
                            )
                        )
                        started = True
                        task_status.started()
                    elif await self.table.get(self.me) is None:
                        raise self._taken_for_dead()
                    else:
                        log.info("holds its liveness lock again")
                    self._hold(True)
                    pause = LIVENESS_RETRY
                    await trio.sleep_forever()
            except LockHeld:
                if not started:
                    raise
                self._hold(False)
                if await self._forgotten():
                    raise self._taken_for_dead() from None
                log.warning(
                    "its liveness lock is still held (its dropped session's, or a peer "
                    "looking): asking again in %gs",
                    pause,
                )
            except DatabaseUnavailable as exc:  # LockLost too
                if not started:
                    raise
                self._hold(False)
                log.warning("lost the liveness lock (%s): taking it again in %gs", exc, pause)
            await trio.sleep(pause)
            pause = min(pause * 2, 2.0)

    async def telling(self, heartbeat: float) -> None:
        """A worker is about to be told ``heartbeat``: longer than the registry says, it is
        written first (a peer that takes us for dead waits as long as our workers do)."""
        if heartbeat <= self._told:
            return
        told = recorded_heartbeat(heartbeat, self.base_heartbeat)
        await self.table.told(self.me, told)
        self._told = max(self._told, told)

    def told_by(self, orchestrator: str) -> float:
        """The longest heartbeat ``orchestrator`` told its workers, as last read (ours, at
        least: the same ``--heartbeat`` everywhere)."""
        return max(self.base_heartbeat, self._heartbeats.get(orchestrator, 0.0))

    def longest_fence(self, fence: float) -> float:
        """The longest :meth:`fence_of` among the orchestrators serving (as last read): a step
        whose run a worker carried to any of them waits as long as that worker would."""
        return max([fence, *(self.fence_of(o, fence) for o in self.known)])

    def fence_of(self, orchestrator: str, fence: float) -> float:
        """How long a step of ``orchestrator``'s, taken for dead, waits before it runs again
        here (``fence``: our own)."""
        told = self._heartbeats.get(orchestrator, 0.0)
        return dead_fence(fence, told, death_grace=DEATH_GRACE)

    def _hold(self, holding: bool) -> None:
        if holding != self.holding:
            self.holding = holding
            self._holding_changed.set()
            self._holding_changed = trio.Event()

    async def until_holding(self, holding: bool = True) -> None:
        """Until our liveness lock is held (``holding``) or not."""
        while self.holding != holding:
            await self._holding_changed.wait()

    async def _forgotten(self) -> bool:
        try:
            return await self.table.get(self.me) is None
        except SwampError:
            return False  # unknown: ask again

    def _taken_for_dead(self) -> UserError:
        return UserError(
            "another orchestrator took this one for dead while its connection to the database "
            "was down, and reconciled what it held: stopping (start it again)"
        )

    async def _no_earlier_version(self) -> None:
        """An orchestrator of an earlier version holds the database alone (it reconciles as if
        it were): this one does not start beside it."""
        try:
            async with _held(self.database, EARLIER_VERSION_LOCK, wait=False):
                pass
        except LockHeld:
            raise UserError(
                "an orchestrator of an earlier swamp version serves this database alone: stop "
                "it (or upgrade it) before starting this one"
            ) from None

    async def listening(self, url: str) -> None:
        """Peers reach us at ``url`` from now on."""
        self.url = url
        async with self.table.pool.connection() as conn:
            await conn.execute(
                "UPDATE swamp_orchestrator SET url = $2 WHERE id = $1", (self.me, url)
            )
        self.waker.wake()

    async def run(
        self,
        queue: DispatchQueue,
        run_claimed: Callable[..., Awaitable[dict]],
        *,
        task_status=trio.TASK_STATUS_IGNORED,
    ) -> None:
        """The wake-ups, the watch on every peer's liveness, claims and their holds: ``queue``
        is ours (its waiting steps, its slots), ``run_claimed`` runs a step we claimed."""

        self.queue, self.run_claimed = queue, run_claimed
        async with open_unwrapping_nursery() as nursery:
            self._nursery = nursery
            await nursery.start(self.outliving.serve)
            await nursery.start(self.waker.run)
            await nursery.start(self._hear)
            await self._refresh()
            nursery.start_soon(self._passes)
            nursery.start_soon(self._claim_offers)
            task_status.started()

    async def _hear(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """What the others say: a step published (its notification carries it: claimed
        without reading the table first), a claim of one of ours (taken at once: the step
        goes to its claimer), a plain wake-up (a pass). A notification is a hint: when some
        may have been missed (a full queue, a connection made again), a full pass."""
        from swamp.store import pg

        mine = claims_channel(self.me)
        started = False
        pause = LIVENESS_RETRY
        while True:
            try:
                async with await pg.connect(self.database) as conn:
                    await conn.listen(CHANNEL)
                    await conn.listen(mine)
                    if started:
                        self._wake.set()  # what was said meanwhile is not coming: rescan
                    else:
                        started = True
                        task_status.started()
                    pause = LIVENESS_RETRY
                    while True:
                        batch = await conn.wait_notifications()
                        if batch.missed:
                            self._wake.set()
                        for note in batch.received:
                            try:
                                self._heard(note.channel == mine, note.payload)
                            except Exception:  # a payload is anyone's on the database
                                log.warning("ignored a notification it could not read")
                                self._wake.set()
            except SwampError as exc:
                if not started:
                    raise
                log.warning("stopped hearing the others (%s): again in %gs", exc, pause)
                await trio.sleep(pause)
                pause = min(pause * 2, 10.0)

    def _heard(self, claim: bool, payload: str) -> None:
        try:
            said = json.loads(payload)
        except ValueError:
            said = None
        if not isinstance(said, dict):  # a plain wake-up: its sender's id
            if payload != self.me:
                self._wake.set()
            return
        if claim and "outcome" in said:  # a step of ours, whose link broke, has ended there
            waiting = self._outcomes.get(str(said["outcome"]))
            if waiting is not None:
                waiting.set()
            return
        step = published(said)
        if claim and step is None:  # (else a step for a worker of ours, told to us alone)
            self._claimed_now(said)
            return
        if step is None or step.origin == self.me:
            return
        if len(self._offers) >= MAX_OFFERS:
            self._wake.set()  # too many at once: a pass reads them from the table
            return
        self._offers.append(step)
        self._offered.set()

    def _claimed_now(self, said: dict) -> None:
        """Another orchestrator claimed a step of ours: it goes there, if it still waits here
        (else a pass withdraws it)."""
        fields = [said.get(k) for k in ("step", "claimer", "worker", "dispatch")]
        if self.queue is None or not all(isinstance(v, str) and v for v in fields):
            self._wake.set()
            return
        queue_id, claimer, worker, dispatch_id = (str(v) for v in fields)
        claim = Claim(queue_id, claimer, worker, dispatch_id)
        ticket = self.queue.published.get(claim.queue_id)
        if ticket is None or ticket.claim is not None or ticket.member is not None:
            self._wake.set()  # (a pass withdraws it, or it is being given a worker here)
            return
        self.queue.claimed(ticket, claim)
        self._taking.add(queue_id)  # marked taken in the table by the next pass
        self._wake.set()

    async def _claim_offers(self) -> None:
        """Claim what was just published, as the notifications said it (no read first)."""
        while True:
            await self._offered.wait()
            self._offered = trio.Event()
            while self._offers:
                step = self._offers.popleft()
                if self.queue is None or not self.queue.pool.members:
                    continue
                try:
                    # (in its turn: one heard now never takes a slot an older one waits for)
                    if await self._claim_one(self.queue, step, in_turn=True) == NO_SLOT:
                        _note_kind(self.waiting_kinds, step)  # (a pass looks again)
                        self.others_waiting += 1
                except SwampError as exc:
                    log.warning("could not claim step %s: %s", step.queue_id[:12], exc)
                    self._wake.set()

    def waker_on(self, channel: str) -> Waker:
        """A coalesced wake-up of every other orchestrator on ``channel`` (run it)."""
        from swamp.store.pg_wake import Waker

        return Waker(self.table.pool, channel, self.me)

    async def listen(
        self, channel: str, on_wake: Callable[[], None], *, task_status=trio.TASK_STATUS_IGNORED
    ) -> None:
        """``on_wake`` for every batch of others' wake-ups on ``channel`` (and when some may
        have been missed)."""
        from swamp.store import pg_wake

        await pg_wake.listen(self.database, channel, self.me, on_wake, task_status=task_status)

    def woken(self) -> None:
        self._wake.set()

    def learn(self, requirement: Requirement, orchestrator: str) -> None:
        """``orchestrator`` claimed a step of ours that needs ``requirement``."""
        self.hints.pop(requirement, None)  # learned again: the newest, last in line to go
        if len(self.hints) >= MAX_HINTS:
            self.hints.pop(next(iter(self.hints)))  # the oldest goes
        self.hints[requirement] = (orchestrator, trio.current_time() + HINT_LIFE)

    def hint(self, requirement: Requirement) -> str | None:
        """The orchestrator to send a step of ``requirement`` straight to, if any."""
        found = self.hints.get(requirement)
        if found is None:
            return None
        orchestrator, until = found
        if trio.current_time() > until or orchestrator not in self.known:
            del self.hints[requirement]
            return None
        return orchestrator

    def missed(self, requirement: Requirement, orchestrator: str) -> None:
        """A step sent straight to ``orchestrator`` did not run there: the next one of its
        kind waits for a claim (unless another orchestrator claimed one meanwhile)."""
        found = self.hints.get(requirement)
        if found is not None and found[0] == orchestrator:
            del self.hints[requirement]

    def slot_freed(self) -> None:
        """A slot here came free (or a worker came): look at others' waiting steps, if the
        last look saw any (never waits; costs nothing while nobody else waits)."""
        if self.others_waiting:
            self._wake.set()

    async def _passes(self) -> None:
        """On every wake-up (and every second, for the holds' deadlines): who serves the
        database, what others claimed of ours, what of theirs we can claim."""
        while True:
            with trio.move_on_after(1.0):
                await self._wake.wait()
            self._wake = trio.Event()
            try:
                if trio.current_time() >= self._refresh_at:
                    await self._refresh()
                await self._withdraw_pending()
                await self._mark_taken()
                await self._take_claims()
                await self._claim()
                await self._expire_holds()
            except SwampError as exc:  # the database is away: the next pass
                self.waiting_kinds = {}  # (what a pass noted goes stale: straight sends go)
                log.warning("the shared queue's pass failed: %s", exc)
                await trio.sleep(1.0)

    async def _refresh(self) -> None:
        """Who serves the database (a newcomer is watched from now on): read at most every
        :data:`REFRESH` seconds, not at every wake-up. (And now and then, the outcomes kept
        that nobody took.)"""
        now = trio.current_time()
        self._refresh_at = now + REFRESH
        if now >= self._collect_at:
            self._collect_at = now + OUTCOME_LIFE / 10
            await self.table.collect_outcomes(self.clock() - OUTCOME_LIFE)
        rows = await self.table.orchestrators()
        self.known = {row.id: row for row in rows}
        for row in rows:  # (kept after its row goes: a dead claimer's steps wait its fence)
            self._heartbeats[row.id] = row.heartbeat
        while len(self._heartbeats) > MAX_REMEMBERED:
            del self._heartbeats[next(iter(self._heartbeats))]
        assert self._nursery is not None
        for row in rows:
            if row.id != self.me and row.id not in self._watched:
                self._watched.add(row.id)
                self._nursery.start_soon(self._watch, row.id)

    def url_of(self, orchestrator: str) -> str | None:
        if orchestrator == self.me:
            return self.url
        row = self.known.get(orchestrator)
        return row.url if row is not None else None

    # -- death ---------------------------------------------------------------------------------

    async def _watch(self, orchestrator: str) -> None:
        """Wait for ``orchestrator``'s liveness lock; once it is free (and still free a moment
        later), reconcile what it left and forget it."""
        name = liveness_lock(orchestrator)
        try:
            while True:
                try:
                    async with _held(self.database, name):
                        pass  # free: dead, or its connection dropped; look again in a moment
                    if await self.table.get(orchestrator) is None:
                        return  # another peer buried it (it held the lock while it did)
                    await trio.sleep(DEATH_GRACE)
                    await self._bury(orchestrator)
                    return
                except LockHeld:
                    continue  # it took its lock back: alive
                except DatabaseUnavailable as exc:
                    log.warning("watching orchestrator %s: %s", orchestrator[:12], exc)
                    await trio.sleep(LIVENESS_RETRY)
                except Exception:  # what it left could not be reconciled: again, later
                    log.exception(
                        "reconciling what orchestrator %s left failed; trying again in %gs",
                        orchestrator[:12],
                        DEATH_GRACE,
                    )
                    await trio.sleep(DEATH_GRACE)
        finally:
            self._watched.discard(orchestrator)
            gone = self._gone.pop(orchestrator, None)
            if gone is not None:
                gone.set()

    async def until_gone(self, orchestrator: str) -> None:
        """Until ``orchestrator`` is buried (here or by another peer), or no longer watched
        here (this one stops): a carried run waits for it (``swamp.orchestrator.adoption``)."""
        gone = self._gone.setdefault(orchestrator, trio.Event())
        if orchestrator not in self._watched:
            if await self.table.get(orchestrator) is None:
                self._gone.pop(orchestrator, None)
                return
            assert self._nursery is not None
            self._watched.add(orchestrator)
            self._nursery.start_soon(self._watch, orchestrator)
        await gone.wait()

    async def _bury(self, orchestrator: str) -> dict:
        """Reconcile what the dead ``orchestrator`` left and forget it, holding its liveness
        lock (:class:`LockHeld` if it is alive after all)."""
        async with _held(self.database, liveness_lock(orchestrator), wait=False):
            row = await self.table.get(orchestrator)
            if row is None:
                return {}  # another peer reconciled it already
            changed = await self.reconcile(orchestrator)
            await self.table.forget(orchestrator)
        self.reconciled += 1
        log.warning(
            "orchestrator %s (%s) is gone: reconciled what it left (%s)",
            orchestrator[:12],
            row.url or "never listened",
            ", ".join(f"{k} {v}" for k, v in changed.items() if v) or "nothing",
        )
        self.waker.wake()  # its steps may be claimed again; its claims are gone
        return changed

    async def bury_at_boot(self) -> dict:
        """Before this one serves: the orchestrators registered whose liveness lock is free
        (and still free a moment later) are dead; what they left is reconciled now."""
        free = []
        for row in await self.table.orchestrators():
            if row.id == self.me:
                continue
            try:
                async with _held(self.database, liveness_lock(row.id), wait=False):
                    free.append(row.id)
            except LockHeld:
                continue
        total: dict[str, int] = {}
        if free:
            await trio.sleep(DEATH_GRACE)
        for orchestrator in free:
            try:
                changed = await self._bury(orchestrator)
            except LockHeld:
                continue  # it took its lock back
            for what, count in changed.items():
                total[what] = total.get(what, 0) + count
        return total

    # -- the origin's side: publish, take claims, send the step ---------------------------------

    async def publish(self, queue_id: str, placement: Placement, priority: int, submitter: str):
        """A step of ours waits: every orchestrator may claim it from now on. One for a named
        worker wakes only the orchestrator holding that worker (none if it is held here: its
        slot comes free here; the others' passes still see it should the worker move)."""
        record = worker_key(placement.target) if placement.target else None
        await self.table.publish(
            SharedStep(queue_id, self.me, placement.to_json(), priority, submitter, self.clock()),
            wake=CHANNEL,
            holder=None if record is None else (record.model_type, record.model_name, record.name),
            holder_prefix=CLAIMS_PREFIX,
        )

    def withdraw_soon(self, queue_id: str) -> None:
        """Ours no longer waits (never waits: the next pass deletes it, claimed or not)."""
        self._withdrawn.append(queue_id)
        self._wake.set()

    async def _withdraw_pending(self) -> None:
        while self._withdrawn:
            await self.table.withdraw(self._withdrawn[0])
            self._withdrawn.pop(0)
            self.waker.wake()  # a claimer holding a slot for it lets it go
        while self._done:
            await self.table.done(self._done[0], self.me)
            self._done.pop(0)

    async def withdraw_or_claim(self, queue_id: str) -> Claim | None:
        """A step of ours got a worker here: withdrawn, unless another orchestrator claimed
        it first — then the claim, taken (the step goes there)."""
        if await self.table.withdraw_unclaimed(queue_id):
            return None
        for step in await self.table.claimed_for(self.me):
            if step.queue_id == queue_id:
                return await self._take(step)
        return None  # the claim went meanwhile, and its row: nobody else runs it

    async def _mark_taken(self) -> None:
        """The claims heard of in their notifications (and sent on) are marked taken."""
        if self._taking:
            taking = set(self._taking)
            await self.table.mark_taken(sorted(taking), self.me)
            self._taking -= taking

    async def _take_claims(self) -> None:
        """Others claimed steps of ours: each goes to its claimer (one statement takes them
        all), or, nobody here waiting for it any more, is withdrawn."""
        if self.queue is None or not self.queue.published:
            return
        for step in await self.table.take_claims(self.me):
            assert step.claimed_by and step.worker and step.dispatch_id
            if step.queue_id in self._taking:
                continue  # heard of meanwhile, and sent on: not withdrawn under its sending
            ticket = self.queue.published.get(step.queue_id)
            if ticket is None or ticket.claim is not None:
                if ticket is None:
                    self.withdraw_soon(step.queue_id)  # nobody waits for it any more
                continue
            self.queue.claimed(
                ticket, Claim(step.queue_id, step.claimed_by, step.worker, step.dispatch_id)
            )

    async def _take(self, step: SharedStep) -> Claim | None:
        assert step.claimed_by and step.worker and step.dispatch_id
        if not await self.table.take(step.queue_id, step.claimed_by):
            return None
        return Claim(step.queue_id, step.claimed_by, step.worker, step.dispatch_id)

    async def run_there(
        self, claim: Claim, params: dict, emit
    ) -> tuple[EpisodeEnd, dict | None, str]:
        """Send a claimed step to its claimer and relay what it says; how it ended there, its
        result, and its dispatch's id there."""
        had_effect = False
        worker, dispatch_id = claim.worker, claim.dispatch_id  # a direct one's: once told

        async def relay(event) -> None:
            nonlocal had_effect, worker, dispatch_id
            if isinstance(event, dict) and event.get("kind") == "effects":
                had_effect = True  # for us: running it again would repeat it
                return
            if isinstance(event, dict) and event.get("kind") == "dispatched":
                told_worker, told_id = event.get("worker"), event.get("dispatchId")
                if isinstance(told_worker, str) and isinstance(told_id, str):
                    worker, dispatch_id = told_worker, told_id
            await emit(event)

        # this sending's own id: how we ask after it should the link break (a straight
        # send's dispatch id is chosen there, and told only once it runs)
        send_id = new_id()
        sent = (
            {**params, "sendId": send_id}
            if claim.direct
            else {
                **params,
                "queueId": claim.queue_id,
                "dispatchId": claim.dispatch_id,
                "sendId": send_id,
            }
        )
        try:
            channel = await self._link(claim.orchestrator)
        except SwampError as exc:  # nothing was sent (unreachable, or its URL unreadable)
            return EpisodeEnd(Ending.BUSY, worker, exc.message), None, dispatch_id
        try:
            reply = await channel.call(
                "peer.dispatch",
                sent,
                timeout=None,
                on_event=relay,
                settle=CANCEL_SETTLE,
            )
        except (ClaimGone, Busy) as exc:  # nothing ran there: queue it again
            return EpisodeEnd(Ending.BUSY, worker, exc.message), None, dispatch_id
        except ChannelClosed as exc:
            # the link broke: the step runs on there and its outcome is kept for us, unless
            # the orchestrator holding the worker is gone (its worker stops the step when its
            # socket drops) — then it runs again after the fence, unless it had an effect
            where = self.url_of(claim.orchestrator) or claim.orchestrator[:12]
            answer = await self._after_break(claim.orchestrator, send_id)
            if answer is UNKNOWN:
                # it does not run there and nothing was kept: its answer went as the link
                # broke, and what it did cannot be told (its effects went with the relay)
                # — never run twice on a doubt
                lost = (
                    f"the link to the orchestrator running it ({where}) broke as it answered: "
                    "whether it ran to its end is not known, so it is not run again"
                )
                return EpisodeEnd(Ending.LOST, worker, lost, has_writes=True), None, dispatch_id
            if answer is None:
                lost = f"the orchestrator holding it ({where}) was lost: {exc.message}"
                end = EpisodeEnd(Ending.LOST, worker, lost, has_writes=had_effect)
                return end, None, dispatch_id
            reply = answer.get("reply")
            if not isinstance(reply, dict):  # refused before anything ran, or it failed there
                return *answer_ending(answer, worker), dispatch_id
        except SwampError as exc:
            refused = f"({exc.code}) {exc.message}"
            return EpisodeEnd(Ending.REFUSED, worker, refused), None, dispatch_id
        end, result = decode_ending(reply)
        told = reply.get("dispatchId") if isinstance(reply, dict) else None
        return end, result, told if isinstance(told, str) and told else dispatch_id

    async def _after_break(self, orchestrator: str, send_id: str) -> dict | None:
        """Our step ran at ``orchestrator`` when the link to it broke: its kept outcome once
        it is written (``{"reply": …}`` or ``{"error": …}``); ``None`` when it will not be —
        that orchestrator died, or is of a version that stops such a step (the lease rules);
        :data:`UNKNOWN` when it says the step does not run there and kept nothing. Nothing
        else decides: while it cannot be asked, we wait. Cancelled (our caller left), the step is
        cancelled there if that can be asked."""
        woken = self._outcomes[send_id] = trio.Event()
        try:
            while True:
                try:
                    # gone first, from the registry itself (ours may be a pass old): what it
                    # kept before it died is read after, never missed
                    row = await self.table.get(orchestrator)
                    kept = await self.table.take_outcome(send_id, self.me)
                    if kept is not None or row is None:
                        return kept
                    if "outliving" not in row.features:
                        return None  # an earlier version's: it stopped the step (lease rules)
                    if await self._asked_outcome(orchestrator, send_id) == "unknown":
                        # not running there: kept just before it said so, or not known there
                        kept = await self.table.take_outcome(send_id, self.me)
                        return UNKNOWN if kept is None else kept
                except SwampError as exc:  # the database is away: nothing is decided
                    log.warning("step %s waits for the database: %s", send_id[:12], exc)
                with trio.move_on_after(ASK_AGAIN):
                    await woken.wait()
                woken = self._outcomes[send_id] = trio.Event()
        except trio.Cancelled:
            with trio.CancelScope(shield=True), trio.move_on_after(ASK_WAIT):
                await self._cancel_there(orchestrator, send_id)
            raise
        finally:
            self._outcomes.pop(send_id, None)

    async def _asked_outcome(self, orchestrator: str, send_id: str) -> str:
        """``running``, ``unknown``, or ``""`` when it could not say (unreachable, or any
        refusal: only its own word that the step does not run there decides anything)."""
        try:
            channel = await self._link(orchestrator)
            said = await channel.call("peer.outcome", {"sendId": send_id}, timeout=ASK_WAIT)
        except SwampError as exc:
            log.info("could not ask %s about step %s: %s", orchestrator[:12], send_id[:12], exc)
            return ""
        state = said.get("state") if isinstance(said, dict) else None
        return state if state in ("running", "unknown") else ""

    async def _cancel_there(self, orchestrator: str, send_id: str) -> None:
        try:
            channel = await self._link(orchestrator)
            await channel.call("peer.cancel", {"sendId": send_id}, timeout=ASK_WAIT)
        except SwampError as exc:
            log.info("could not cancel step %s at %s: %s", send_id[:12], orchestrator[:12], exc)
        with contextlib.suppress(SwampError):
            await self.table.drop_outcome(send_id, self.me)

    async def _keep_outcome(self, origin: str, send_id: str, answer: dict) -> bool:
        return await self.table.write_outcome(
            send_id, origin, self.me, answer, wake=claims_channel(origin), at=self.clock()
        )

    def outcome_asked(self, caller: str, params: dict) -> dict:
        """``peer.outcome`` / ``peer.cancel``: about a step ``caller`` sent here."""
        send_id = params.get("sendId")
        if not isinstance(send_id, str) or not send_id:
            raise MalformedFrame("a step's outcome is asked by its sendId")
        return self.outliving.outcome(caller, send_id)

    async def step_wait_asked(self, caller: str, params: dict) -> dict:
        """``peer.step.wait``: ``caller`` took the steps of an origin that died; did one run
        here? (:meth:`Outliving.wait_step`)."""
        step_id = params.get("stepId")
        if not isinstance(step_id, str) or not 0 < len(step_id) <= 64:
            raise MalformedFrame("a step is asked after by its stepId")
        return await self.outliving.wait_step(step_id)

    async def ask_step(self, orchestrator: str, step_id: str) -> dict | None:
        """Ask ``orchestrator`` whether it ran an episode of ``step_id`` for another: its
        answer once the run ends, ``None`` if no run of it is known there. A ``SwampError``
        when it could not be asked (nothing is decided then)."""
        channel = await self._link(orchestrator)
        said = await channel.call("peer.step.wait", {"stepId": step_id}, timeout=None)
        if isinstance(said, dict) and said.get("state") == "ended":
            answer = said.get("answer")
            if isinstance(answer, dict):
                return answer
        if isinstance(said, dict) and said.get("state") == "unknown":
            return None
        raise MalformedReply(f"peer.step.wait answered {str(said)[:80]!r}")

    def cancel_asked(self, caller: str, params: dict) -> dict:
        send_id = params.get("sendId")
        if not isinstance(send_id, str) or not send_id:
            raise MalformedFrame("a step is cancelled by its sendId")
        return {"cancelled": self.outliving.cancel(caller, send_id)}

    def serving(self, orchestrator: str | None) -> str | None:
        """``orchestrator`` if it is another one serving the database now (a record naming it
        is held there), else ``None`` (ours, unnamed, or one that died)."""
        if not orchestrator or orchestrator == self.me or orchestrator not in self.known:
            return None
        return orchestrator

    async def ask(self, orchestrator: str, verb: str, params: dict, *, wait: float | None) -> dict:
        """Perform an admin verb (a ``peer.*`` of :data:`PEER_ADMIN`) at ``orchestrator``,
        which holds what it is about; its reply. Its own errors come back as they are (the
        same code, the same words); one that cannot be reached is a :class:`Conflict`."""
        where = self.url_of(orchestrator) or orchestrator[:12]
        try:
            channel = await self._link(orchestrator)
            reply = await channel.call(verb, params, timeout=wait)
        except (ChannelClosed, CallTimeout) as exc:
            raise Conflict(
                f"the orchestrator holding it ({where}) did not answer: {exc.message}"
            ) from None
        except (Forbidden, UnknownMethod):  # an earlier version's: it takes steps, no more
            raise Conflict(
                f"the orchestrator holding it ({where}) cannot be asked through another "
                "(an earlier version): ask it directly with --server"
            ) from None
        if not isinstance(reply, dict):
            raise Conflict(f"the orchestrator holding it ({where}) gave no answer to read")
        return reply

    async def _link(self, orchestrator: str) -> RpcChannel:
        """Our channel to ``orchestrator`` (made once, again after it closed). One attempt at
        a time, whose failure every caller waiting on it shares, and which later callers get
        at once for :data:`LINK_RETRY` seconds: a peer that does not answer (stopped, cut off)
        costs one connect timeout, not one per step that wanted to go there."""
        while True:
            channel = self._links.get(orchestrator)
            if channel is not None and not channel.closed:
                return channel
            failed = self._unreachable.get(orchestrator)
            if failed is not None and trio.current_time() < failed[0]:
                raise ChannelClosed(failed[1])
            making = self._linking.get(orchestrator)
            if making is None:
                break
            await making.done.wait()
            if making.failure is not None:
                raise ChannelClosed(making.failure)
        made = self._linking[orchestrator] = _Linking()
        try:
            row = self.known.get(orchestrator)
            if row is None or not row.url:  # a newcomer, or one that was not listening yet
                row = await self.table.get(orchestrator)
            if row is None or not row.url:
                made.failure = f"orchestrator {orchestrator[:12]} is not serving"
                raise ChannelClosed(made.failure)
            assert self._nursery is not None
            try:
                channel = await self._nursery.start(self._keep_link, row)
            except (SwampError, OSError) as exc:
                made.failure = f"cannot reach orchestrator {row.url}: {exc}"
                self._unreachable_until(orchestrator, made.failure)
                raise ChannelClosed(made.failure) from None
            self._unreachable.pop(orchestrator, None)
            self._links[orchestrator] = channel
            return channel
        except trio.Cancelled:
            raise  # (its caller left: a waiter tries for itself)
        except Exception as exc:
            if made.failure is None:  # (the registry could not be read: the same for all)
                made.failure = f"no link to orchestrator {orchestrator[:12]}: {exc}"
            raise
        finally:
            del self._linking[orchestrator]
            made.done.set()

    def _unreachable_until(self, orchestrator: str, why: str) -> None:
        now = trio.current_time()
        self._unreachable = {k: v for k, v in self._unreachable.items() if v[0] > now}
        self._unreachable[orchestrator] = (now + LINK_RETRY, why)

    async def _keep_link(self, row: PeerRow, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """A channel to a peer for as long as it stays open (a failure to open it is the
        caller's, from ``nursery.start``; a failure afterwards closes it, nothing more)."""
        started = False
        try:
            async with connect(row.url, server_token=self.credential, ca_pem=row.ca_pem) as channel:
                started = True
                task_status.started(channel)
                await channel.wait_closed()
        except Exception as exc:
            if not started:
                raise
            log.info("the link to orchestrator %s closed: %s", row.url, exc)
        finally:
            if self._links.get(row.id) is not None and self._links[row.id].closed:
                self._links.pop(row.id, None)

    # -- the claimer's side ----------------------------------------------------------------------

    async def _claim(self) -> None:
        """Claim what our free workers can take of others' waiting steps (and note the kinds
        of those left waiting: a step sent straight here does not go before them)."""
        queue = self.queue
        if queue is None or not queue.pool.members:
            self.waiting_kinds = {}
            return  # no worker here: nothing to claim with
        self.others_waiting = 0
        kinds: dict[Requirement, set[str]] = {}
        after: SharedStep | None = None
        while True:
            page = await self.table.claimable(self.me, after=after, limit=CLAIM_PAGE)
            self.others_waiting += len(page)
            for step in page:
                said = await self._claim_one(queue, step)
                if said == CLAIMED:
                    self.others_waiting -= 1
                elif said == NO_SLOT:  # (not one lost to another claimer, nor unreadable)
                    _note_kind(kinds, step)
            if len(page) < CLAIM_PAGE:
                self.waiting_kinds = kinds
                return
            after = page[-1]

    def _older_waits_for(self, member: Member, sender: str, requirement: Requirement) -> bool:
        """Whether a step that ``member`` could take was left waiting in the shared queue by
        the last look (a pass, or a publication heard) — of a living orchestrator, and not
        of ``sender``'s own of ``requirement`` (it sends none straight past one of those)."""
        if not self.waiting_kinds:
            return False
        slots = Slots(
            member.name,
            member.instance_id,
            labels=member.labels,
            platform=member.platform,
            arch=member.arch,
        )
        for kind, origins in self.waiting_kinds.items():
            waiting = {o for o in origins if o in self.known}  # (a dead one's: not for long)
            if kind == requirement:
                waiting.discard(sender)
            if waiting and slots.satisfies(kind):
                return True
        return False

    async def _claim_one(
        self, queue: DispatchQueue, step: SharedStep, *, in_turn: bool = False
    ) -> str:
        """Claim ``step`` if a free worker here matches it: :data:`CLAIMED`, :data:`NO_SLOT`,
        or :data:`PASSED` (unreadable here, another claimed it first, or — ``in_turn`` —
        an older step the worker could take waits: the slot goes back, a pass decides)."""
        placement = placement_of(step.placement)
        if placement is None:
            return PASSED  # not a placement this version reads: another's to claim
        requirement = Requirement.of(placement)
        slot = queue.reserve_for_peer(requirement)
        if slot is None:
            return NO_SLOT
        member, dispatch_id = slot
        if in_turn and self._older_waits_for(member, step.origin, requirement):
            queue.release(member, dispatch_id)
            _note_kind(self.waiting_kinds, step)
            self._wake.set()
            return PASSED
        try:
            won = await self.table.claim(
                step.queue_id, self.me, member.name, dispatch_id, wake=CLAIMS_PREFIX
            )
        except BaseException:
            queue.release(member, dispatch_id)
            raise
        if not won:
            queue.release(member, dispatch_id)
            return PASSED
        self.held[step.queue_id] = Held(
            member, dispatch_id, step.origin, trio.current_time() + CLAIM_HOLD
        )  # (the claim woke its origin, which takes it)
        return CLAIMED

    async def _expire_holds(self) -> None:
        """A claim its origin withdrew, or did not send within :data:`CLAIM_HOLD`, lets its
        slot go."""
        if not self.held or self.queue is None:
            return
        rows = await self.table.claims_of(self.me)
        now = trio.current_time()
        for queue_id, held in list(self.held.items()):
            if held.taken:
                continue
            if queue_id not in rows or now > held.until:
                del self.held[queue_id]
                self.queue.release(held.member, held.dispatch_id)  # first: whatever follows
                if queue_id in rows:
                    self._done.append(queue_id)  # its row goes (a claim sent later is refused)

    async def dispatch(
        self, caller: str, params: dict, emit, *, link_closed: Callable[[], bool] = lambda: False
    ) -> dict:
        """``peer.dispatch``: a step we claimed, sent by its origin: run it on the slot we
        reserved, relaying its events; the reply says how it ended. Without a ``queueId`` it
        is sent straight (a direct claim): run at once if a worker here is free for it — a
        step waiting here is never robbed —, else :class:`ClaimGone` and nothing ran."""
        queue_id = params.get("queueId")
        if queue_id is None:
            return await self._direct(caller, params, emit, link_closed)
        if not isinstance(queue_id, str):
            raise MalformedFrame("peer.dispatch needs queueId as text")
        held = self.held.get(queue_id)
        if held is None or held.origin != caller or held.dispatch_id != params.get("dispatchId"):
            raise ClaimGone("this orchestrator no longer holds a slot for that step")
        held.taken = True
        del self.held[queue_id]
        assert self.run_claimed is not None
        self._done.append(queue_id)  # its row goes with the next pass (nobody needs it now)
        self._wake.set()
        return await self._run_outliving(
            caller, held.member, held.dispatch_id, params, emit, link_closed
        )

    async def _run_outliving(self, caller, member, dispatch_id, params, emit, link_closed) -> dict:
        """Run it so that a broken link to ``caller`` does not stop it (:mod:`outliving`),
        known by the id its sender gave this sending. One sent without (an earlier version's
        origin, which runs the step again when the link breaks) runs inside the call, as that
        version expects: a broken link stops it."""
        run_claimed = self.run_claimed
        assert run_claimed is not None
        send_id = params.get("sendId")
        if not isinstance(send_id, str) or not send_id or len(send_id) > 64:
            return await run_claimed(member, dispatch_id, params, emit or no_events)
        try:
            return await self.outliving.run(
                caller,
                send_id,
                lambda relay: run_claimed(member, dispatch_id, params, relay),
                emit,
                link_closed,
                step_id=step_id if isinstance(step_id := params.get("stepId"), str) else "",
            )
        except NotStarted as exc:
            assert self.queue is not None
            self.queue.release(member, dispatch_id)
            raise ClaimGone(str(exc)) from None

    async def _direct(self, caller: str, params: dict, emit, link_closed) -> dict:
        placement = params.get("placement")
        placement = placement_of(placement) if isinstance(placement, dict) else None
        if placement is None or not placement.is_remote():
            raise MalformedFrame("a step sent straight needs its placement")
        assert self.queue is not None and self.run_claimed is not None
        slot = self.queue.reserve_for_peer(Requirement.of(placement))
        if slot is None:
            raise ClaimGone("no worker of this orchestrator is free for it now")
        member, dispatch_id = slot
        if self._older_waits_for(member, caller, Requirement.of(placement)):  # came first
            self.queue.release(member, dispatch_id)
            self._wake.set()  # a pass claims them with this slot
            raise ClaimGone("steps of its kind wait in the shared queue: it waits its turn")
        return await self._run_outliving(caller, member, dispatch_id, params, emit, link_closed)

    async def identify(self, credential: str) -> str | Unauthorized:
        """The id of the orchestrator a peer credential is, or why it is none (never raises;
        the same words whatever was wrong)."""
        refused = Unauthorized("the credential was not accepted")
        orchestrator = credential_orchestrator(credential)
        if orchestrator is None:
            return refused
        try:
            row = await self.table.get(orchestrator)
        except SwampError as exc:
            return Unauthorized(exc.message)
        if row is None or not secrets.compare_digest(
            credential_hash(credential), row.credential_hash
        ):
            return refused
        return row.id


def _note_kind(kinds: dict[Requirement, set[str]], step: SharedStep) -> None:
    placement = placement_of(step.placement)
    if placement is not None:
        kinds.setdefault(Requirement.of(placement), set()).add(step.origin)


def published(said: dict) -> SharedStep | None:
    """A step as its publication's notification carries it (``PgPeers.publish``), checked."""
    queue_id, origin, placement = said.get("step"), said.get("origin"), said.get("placement")
    priority, queued = said.get("priority"), said.get("queued")
    if not (
        isinstance(queue_id, str)
        and isinstance(origin, str)
        and isinstance(placement, dict)
        and isinstance(priority, int)
        and isinstance(queued, (int, float))
    ):
        return None
    return SharedStep(queue_id, origin, placement, priority, "", float(queued))


def placement_of(data: dict) -> Placement | None:
    """A shared step's placement as written by its origin, or ``None`` if it is not one this
    version reads (text where text belongs): a row is another process's data."""
    target, labels, platform = data.get("target"), data.get("labels") or {}, data.get("platform")
    if not (
        (target is None or isinstance(target, str))
        and (platform is None or isinstance(platform, str))
        and isinstance(labels, dict)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
    ):
        return None
    return Placement(target=target, labels=dict(labels), platform=platform)


# -- the step on the wire ------------------------------------------------------------------------


def encode_step(
    *,
    model_type: str,
    model_name: str,
    method: str,
    args: dict,
    environment: dict[str, str],
    read_scope: ReadScope,
    timeout: float | None,
    owner: LogOwner | None,
    step_id: str,
    attempt: int,
) -> dict:
    return {
        "modelType": model_type,
        "modelName": model_name,
        "method": method,
        "args": args,
        "environment": environment,
        "reads": sorted([list(item) for item in read_scope.items]),
        "readPatterns": list(read_scope.type_patterns),
        "timeout": timeout,
        "owner": None
        if owner is None
        else {
            "runId": owner.run_id,
            "workflow": owner.workflow,
            "job": owner.job,
            "step": owner.step,
        },
        "stepId": step_id,
        "attempt": attempt,
    }


@dataclass(frozen=True)
class SentStep:
    """A step as a peer sent it, checked."""

    model_type: str
    model_name: str
    method: str
    args: dict
    environment: dict[str, str]
    read_scope: ReadScope
    timeout: float | None
    owner: LogOwner | None
    step_id: str
    attempt: int


def decode_step(params: dict) -> SentStep:
    def text(name: str) -> str:
        value = params.get(name)
        if not isinstance(value, str) or not value:
            raise MalformedFrame(f"peer.dispatch needs {name} as text")
        return value

    args, env = params.get("args"), params.get("environment")
    if not isinstance(args, dict) or not isinstance(env, dict):
        raise MalformedFrame("peer.dispatch needs args and environment as objects")
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
        raise MalformedFrame("peer.dispatch's environment maps names to text")
    reads = params.get("reads") or []
    patterns = params.get("readPatterns") or []
    if not (
        isinstance(reads, list)
        and all(
            isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r)
            for r in reads
        )
        and isinstance(patterns, list)
        and all(isinstance(p, str) for p in patterns)
    ):
        raise MalformedFrame("peer.dispatch's reads are pairs of text")
    timeout = params.get("timeout")
    if timeout is not None and (
        not isinstance(timeout, (int, float))
        or isinstance(timeout, bool)
        or timeout <= 0
        or not math.isfinite(timeout)
    ):
        raise MalformedFrame("peer.dispatch's timeout is a positive number of seconds")
    attempt = params.get("attempt")
    if not isinstance(attempt, int) or isinstance(attempt, bool) or attempt < 1:
        raise MalformedFrame("peer.dispatch's attempt is a whole number from 1")
    owner_data = params.get("owner")
    owner = None
    if isinstance(owner_data, dict):
        fields = {k: owner_data.get(k) for k in ("runId", "workflow", "job", "step")}
        if not all(v is None or isinstance(v, str) for v in fields.values()):
            raise MalformedFrame("peer.dispatch's owner holds text")
        owner = LogOwner(
            text("modelType"),
            text("modelName"),
            text("method"),
            run_id=fields["runId"],
            workflow=fields["workflow"],
            job=fields["job"],
            step=fields["step"],
        )
    return SentStep(
        text("modelType"),
        text("modelName"),
        text("method"),
        args,
        dict(env),
        ReadScope(frozenset((a, b) for a, b in reads), tuple(patterns)),
        None if timeout is None else float(timeout),
        owner,
        text("stepId"),
        attempt,
    )


def encode_ending(
    end: EpisodeEnd, result: DispatchResult | None, dispatch_id: str | None = None
) -> dict:
    return {
        **({"dispatchId": dispatch_id} if dispatch_id else {}),
        "how": end.how.value,
        "worker": end.worker,
        "reason": end.reason,
        "hasWrites": end.has_writes,
        "result": result.to_json() if result is not None else None,
    }


def answer_ending(answer: dict, worker: str) -> tuple[EpisodeEnd, dict | None]:
    """How a step ended as a claimer answered for it outside the link (kept, or told to the
    one that took its origin's steps over): ``{"reply": …}`` as on the link, or ``{"error":
    …}`` — refused before anything ran, or failed there."""
    reply = answer.get("reply")
    if isinstance(reply, dict):
        try:
            return decode_ending(reply)
        except MalformedFrame as exc:
            return EpisodeEnd(Ending.MALFORMED, worker, exc.message), None
    error = answer.get("error")
    code = error.get("code") if isinstance(error, dict) else None
    said = error.get("message") if isinstance(error, dict) else None
    if code in (ClaimGone.code, Busy.code):  # as on the link: queue it again
        return EpisodeEnd(Ending.BUSY, worker, str(said)), None
    return EpisodeEnd(Ending.REFUSED, worker, f"({code}) {said or 'no answer'}"), None


def decode_ending(reply: object) -> tuple[EpisodeEnd, dict | None]:
    if not isinstance(reply, dict):
        raise MalformedFrame("peer.dispatch answered something else than an object")
    try:
        how = Ending(reply.get("how"))
    except ValueError:
        raise MalformedFrame(
            "peer.dispatch answered an ending this version does not know"
        ) from None
    worker, reason = reply.get("worker"), reply.get("reason")
    if not isinstance(worker, str) or not isinstance(reason, str):
        raise MalformedFrame("peer.dispatch's answer names its worker and reason as text")
    result = reply.get("result")
    if result is not None and not isinstance(result, dict):
        raise MalformedFrame("peer.dispatch's result is an object")
    return EpisodeEnd(how, worker, reason, bool(reply.get("hasWrites"))), result
