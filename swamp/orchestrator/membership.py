"""Membership: an enrolled worker's life in the pool, from joining to leaving.

A member joins (``Enrollment`` admitted it), may be probed before it gets work (``--verify-on-
enroll``), drains, is held back for a while when it leaves a dispatch unacknowledged, and
disconnects. A disconnected member stays in the pool, unschedulable, for a grace window, so a
blip reconnects as the same member; when the window lapses it leaves the pool (its record stays,
``disconnected``). Every change of status is a version of its record and a pool refresh, so
waiting work sees it on the event itself.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable

import trio

from swamp.concurrency import open_unwrapping_nursery
from swamp.domain.enrollment import VERIFYING
from swamp.domain.workers import WorkerStatus, heartbeat_interval, is_schedulable
from swamp.errors import UserError
from swamp.orchestrator.credentials import Credentials
from swamp.orchestrator.pool import Member, Pool
from swamp.orchestrator.records import WorkerRecords
from swamp.orchestrator.timers import Deadlines
from swamp.protocol.messages import DrainRequest, Verdict
from swamp.protocol.rpc import RpcChannel
from swamp.store.datastore import iso

log = logging.getLogger("swamp.gateway")

CLOSE_SHUTDOWN = 1001
CLOSE_LET_GO = 1013  # "try again later": this orchestrator lost its hold on the database
# (a close reason holds 120 bytes: the enrollment's refusal says the rest)
LET_GO_REASON = "this orchestrator lost its hold on its database: try another"
DRAIN_REASONS = ("signal", "max-dispatches", "idle-timeout", "asked")  # asked: worker drain
HOLD_BACK = 300.0  # seconds a machine that left a dispatch unacknowledged gets no work

Prober = Callable[[str], Awaitable[Verdict]]


class Membership:
    def __init__(
        self,
        pool: Pool,
        credentials: Credentials,
        records: WorkerRecords,
        *,
        grace_seconds: float,
        heartbeat_seconds: float,
        verify_on_enroll: bool = False,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.pool = pool
        self.credentials = credentials
        self.records = records
        self.grace_seconds = grace_seconds
        self.heartbeat_seconds = heartbeat_seconds  # serve --heartbeat: the shortest interval
        # --verify-on-enroll: probe each enrolling worker before it becomes schedulable (the
        # probe itself is given to run(): it dispatches through episodes, which report here)
        self.verify_on_enroll = verify_on_enroll
        # why workers are refused now (``let_go``: this orchestrator lost its hold on a shared
        # database), or None
        self.letting_go: str | None = None
        # told the heartbeat a joining worker is about to be told (``Peers.telling``: a shared
        # database keeps the longest), or None
        self.telling: Callable[[float], Awaitable[None]] | None = None
        self.clock = clock
        self.grace = Deadlines("grace windows")
        # machines that left a dispatch unacknowledged: held back for a while, reconnected or
        # not (a worker that reconnects is fresh and least loaded: it would get it all again)
        self.held_back = Deadlines("unresponsive machines")
        self._held_back: dict[str, str] = {}  # machine id → why
        # at most one entry per member that joined or was released (both bounded by the pool)
        self._to_verify_send, self._to_verify = trio.open_memory_channel[Member](math.inf)

    def __repr__(self) -> str:
        return f"<Membership {self.pool!r} {self.grace!r} {self.held_back!r}>"

    # -- joining -----------------------------------------------------------------------------

    def held_back_reason(self, machine_id: str) -> str | None:
        """Why this machine gets no work, if it is still held back."""
        held = self._held_back.get(machine_id)
        return held if held is not None and machine_id in self.held_back else None

    def channel_heartbeat(self) -> float:
        """The interval a joining worker is told (and held to): it grows with the pool."""
        return heartbeat_interval(self.heartbeat_seconds, len(self.pool.members) + 1)

    def pool_heartbeat(self) -> float:
        return heartbeat_interval(self.heartbeat_seconds, len(self.pool.members))

    def joined(self, member: Member, *, verify: bool) -> None:
        """An admitted member enters the pool (an unverified one wakes nothing: it is not
        schedulable)."""
        self.grace.cancel(member.name)
        self.pool.put(member)
        if (
            member.status == WorkerStatus.UNRESPONSIVE.value
            and member.machine_id not in self.held_back
        ):
            self._release(member)  # its time was up while the enrollment was written
        if verify:
            self._to_verify_send.send_nowait(member)
        if self.letting_go is not None and member.channel is not None:
            # its enrollment was under way as the workers were let go: it goes too
            member.channel.abort(CLOSE_LET_GO, LET_GO_REASON)

    # -- drains, disconnects and the grace window --------------------------------------------

    def drain(self, member: Member, raw: dict) -> dict:
        """The worker's drain has started: it gets nothing new from now on (a version of its
        record says so, with the reason); it leaves when its last dispatch ends."""
        request = DrainRequest.decode(raw)
        reason = request.reason
        if reason not in DRAIN_REASONS:
            raise UserError(f"unknown drain reason {reason[:40]!r}: {', '.join(DRAIN_REASONS)}")
        if member.status != WorkerStatus.DRAINING.value:
            member.status, member.drain_reason = WorkerStatus.DRAINING.value, reason
            self.records.status(
                member, WorkerStatus.DRAINING.value, reason=reason, active=sorted(member.active)
            )
            log.info(
                "worker %s is draining (%s): %d dispatch(es) still running",
                member.name,
                reason,
                len(member.active),
            )
            self.pool.refresh(member)
        return {}

    def unresponsive(self, member: Member, reason: str) -> None:
        """It said nothing of a dispatch it was sent (see ``Episodes.watch_acknowledgements``):
        its machine gets no more work for :data:`HOLD_BACK` seconds, reconnects included; a
        version of its record says why."""
        if not member.connected or not is_schedulable(member.status):
            return  # already getting no work (draining, unverified, unresponsive)
        member.status, member.unresponsive_reason = WorkerStatus.UNRESPONSIVE.value, reason
        self.records.status(
            member, WorkerStatus.UNRESPONSIVE.value, reason=reason, active=sorted(member.active)
        )
        log.warning(
            "worker %s gets no more work for %gs, reconnects included: %s",
            member.name,
            HOLD_BACK,
            reason,
        )
        self._held_back[member.machine_id] = reason
        self.held_back.set(member.machine_id, trio.current_time() + HOLD_BACK)
        self.pool.refresh(member)

    async def _hold_lapsed(self, machine_id: str) -> None:
        """Its time out is over: a member of that machine that is connected and held back
        gets work again."""
        self._held_back.pop(machine_id, None)
        for member in list(self.pool.members.values()):
            if member.machine_id == machine_id:
                self._release(member)

    def _release(self, member: Member) -> None:
        """A held-back member gets work again: at once, or — under ``--verify-on-enroll`` —
        once it passes the probe it was spared when it reconnected."""
        if not member.connected or member.status != WorkerStatus.UNRESPONSIVE.value:
            return
        member.unresponsive_reason = None
        if self.verify_on_enroll:
            member.status = WorkerStatus.UNVERIFIED.value
            member.verify_failure_reason = VERIFYING
            self.records.status(
                member, member.status, reason=member.verify_failure_reason, active=[]
            )
            self.pool.refresh(member)
            self._to_verify_send.send_nowait(member)
            return
        member.status = WorkerStatus.BUSY.value if member.active else WorkerStatus.IDLE.value
        self.records.status(member, member.status, active=sorted(member.active))
        log.info("worker %s may get work again", member.name)
        self.pool.refresh(member)

    def disconnected(self, member: Member, channel: RpcChannel) -> None:
        """The control socket of an enrolled worker ended (whatever the reason)."""
        if self.pool.get(member.name) is not member or member.channel is not channel:
            return  # replaced by a newer connection already
        drained = member.status == WorkerStatus.DRAINING.value
        member.channel = None
        member.status = WorkerStatus.DISCONNECTED.value
        member.last_seen_at = iso(self.clock())
        reason = f"drained ({member.drain_reason})" if drained else channel.close_reason
        self.records.status(member, WorkerStatus.DISCONNECTED.value, reason=reason)
        if drained:  # it said goodbye: no grace window to wait out
            log.info("worker %s left the pool: %s", member.name, reason)
            self.pool.remove(member.name)
            self.credentials.revoke_worker(member.name)
            return
        self.grace.set(member.name, trio.current_time() + self.grace_seconds)
        log.info("worker %s disconnected: %s", member.name, channel.close_reason)
        self.pool.refresh(member)

    async def _grace_lapsed(self, name: str) -> None:
        member = self.pool.get(name)
        if member is not None and not member.connected:
            self.pool.remove(name)
            self.credentials.revoke_worker(name)
            log.info(
                "worker %s left the pool (grace window of %ss lapsed)", name, self.grace_seconds
            )

    async def shutdown(self) -> None:
        self._close_all(CLOSE_SHUTDOWN, "orchestrator shutting down")

    def let_go(self, reason: str) -> int:
        """Close every worker's socket and take none until :meth:`take_again` (``reason``
        refuses them meanwhile): their running steps stop, and they move to another
        orchestrator. How many were let go."""
        self.letting_go = reason
        return self._close_all(CLOSE_LET_GO, LET_GO_REASON)

    def take_again(self) -> None:
        self.letting_go = None

    def _close_all(self, code: int, reason: str) -> int:
        closed = 0
        for member in list(self.pool.members.values()):
            if member.connected and member.channel is not None:
                member.channel.abort(code, reason)
                closed += 1
        return closed

    # -- running -----------------------------------------------------------------------------

    async def run(
        self, prober: Prober | None = None, *, task_status=trio.TASK_STATUS_IGNORED
    ) -> None:
        """The grace windows, the held-back machines, and — given ``prober`` — the probes of
        ``--verify-on-enroll``, each in a task of this nursery."""
        if self.verify_on_enroll and prober is None:
            raise ValueError("--verify-on-enroll needs a prober")
        async with open_unwrapping_nursery() as nursery:
            await nursery.start(self.grace.run, self._grace_lapsed)
            await nursery.start(self.held_back.run, self._hold_lapsed)
            if prober is not None:
                nursery.start_soon(self._verify_enrollments, prober, nursery)
            task_status.started()

    async def _verify_enrollments(self, prober: Prober, nursery: trio.Nursery) -> None:
        async for member in self._to_verify:
            nursery.start_soon(self._verify, prober, member)

    async def _verify(self, prober: Prober, member: Member) -> None:
        try:
            verdict = await prober(member.name)
        except Exception as exc:  # a bug in probing must not take the orchestrator down
            log.exception("verifying %s failed unexpectedly", member.name)
            verdict = Verdict(member.name, "error", error=f"the probe crashed: {exc}")
        if self.pool.get(member.name) is not member or not member.connected:
            return  # it left (or reconnected) meanwhile: this verdict is about nobody
        if verdict.status == "pass":
            member.status, member.verify_failure_reason = WorkerStatus.IDLE.value, None
            log.info("worker %s passed verification: now schedulable", member.name)
        else:
            member.verify_failure_reason = verdict.reason
            log.warning(
                "worker %s failed verification, kept unverified: %s", member.name, verdict.reason
            )
        self.records.status(member, member.status, reason=member.verify_failure_reason)
        if verdict.status == "pass":
            self.pool.refresh(member)  # only now may waiting work see this worker
