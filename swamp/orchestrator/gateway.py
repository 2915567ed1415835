"""The gateway: enrollment, the pool's lifecycle, and token deadlines enforced live.

Enrollment: validate the handshake, check the protocol version, redeem the token (a compare-and-
swap transition in the store), name the worker, grant the labels and slots its token allows,
persist its record, put it in the pool, reply. A disconnected worker stays in the pool,
unschedulable, for a grace window, so a blip reconnects as the same member; when the window
lapses it leaves the pool (its record stays, ``disconnected``).

Tokens are enforced while workers run: when a token's deadline passes its workers are
disconnected and it is stored ``expired``; when it is revoked (through this server, or by the CLI
writing straight to the repo, which the repo watcher notices) its workers are disconnected at once.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable

import trio

from swamp import __version__
from swamp.bookkeeping.tokens import TokenBook
from swamp.concurrency import open_unwrapping_nursery
from swamp.domain.claims import FLEET_LABEL, MAX_CAPACITY
from swamp.domain.labels import check_labels
from swamp.domain.text import is_printable
from swamp.domain.tokens import TokenState
from swamp.domain.workers import (
    WorkerStatus,
    check_instance_id,
    check_machine_id,
    check_platform_word,
    check_version,
    heartbeat_interval,
    is_schedulable,
)
from swamp.errors import (
    AlreadyConnected,
    Conflict,
    ProtocolMismatch,
    SwampError,
    TokenInvalid,
    UserError,
)
from swamp.orchestrator.credentials import Credentials
from swamp.orchestrator.pool import Member, Pool
from swamp.orchestrator.records import WorkerRecords
from swamp.orchestrator.timers import Deadlines
from swamp.protocol.frames import PROTOCOL_VERSION
from swamp.protocol.messages import DrainRequest, EnrollReply, EnrollRequest, Verdict
from swamp.protocol.rpc import RpcChannel, SilenceSweeper
from swamp.store.datastore import Datastore, iso
from swamp.store.retry import retry_busy

log = logging.getLogger("swamp.gateway")

CLOSE_REVOKED = 4001
CLOSE_EXPIRED = 4002
CLOSE_REPLACED = 4003
CLOSE_SHUTDOWN = 1001
REPO_WATCH_INTERVAL = 0.25
DRAIN_REASONS = ("signal", "max-dispatches", "idle-timeout")
HOLD_BACK = 300.0  # seconds a machine that left a dispatch unacknowledged gets no work


def check_enrollment(raw: dict) -> EnrollRequest:
    """Decode the handshake, then check every value with full matches: all of it ends up in the
    pool, in records, in terminals and in logs. The protocol version is checked first, so a
    worker of another version is told that, whatever else changed in its handshake."""
    version = raw.get("protocolVersion") if isinstance(raw, dict) else None
    if isinstance(version, int) and not isinstance(version, bool) and version != PROTOCOL_VERSION:
        raise ProtocolMismatch(
            f"the worker speaks protocol {version} but this orchestrator speaks "
            f"{PROTOCOL_VERSION}: run the same swamp version on both"
        )
    request = EnrollRequest.decode(raw)
    if not 0 < len(request.token) <= 512 or not is_printable(request.token):
        raise UserError("enrollment needs 'token': <name>.<secret>, at most 512 characters")
    if not 1 <= request.capacity <= MAX_CAPACITY:
        raise UserError(f"enrollment 'capacity' must be an integer from 1 to {MAX_CAPACITY}")
    check_instance_id(request.instance_id)
    check_machine_id(request.machine_id)
    check_version(request.version)
    check_platform_word(request.platform, "platform")
    check_platform_word(request.arch, "arch")
    check_labels(request.labels, source="enrollment labels")
    return request


def _instance_in_use(instance_id: str) -> SwampError:
    return Conflict(
        f"instance id {instance_id} is already in use by another worker of the "
        "pool; each process must use a fresh one"
    )


class Gateway:
    def __init__(
        self,
        store: Datastore,
        pool: Pool,
        credentials: Credentials,
        *,
        grace_seconds: float,
        heartbeat_seconds: float,
        records: WorkerRecords,
        clock=time.time,
        prober: Callable[[str], Awaitable[Verdict]] | None = None,
    ) -> None:
        self.store = store
        self.tokens = TokenBook(store, clock=clock)
        self.workers = records.workers
        self.records = records
        self.pool = pool
        self.credentials = credentials
        self.grace_seconds = grace_seconds
        self.heartbeat_seconds = heartbeat_seconds  # serve --heartbeat: the shortest interval
        # every socket's silence deadline, checked by one task (see RpcChannel)
        self.sweeper = SilenceSweeper(tick=min(1.0, heartbeat_seconds / 2))
        self.clock = clock
        self.grace = Deadlines("grace windows")
        self.token_deadlines = Deadlines("token deadlines")
        # machines that left a dispatch unacknowledged: held back for a while, reconnected or
        # not (a worker that reconnects is fresh and least loaded: it would get it all again)
        self.held_back = Deadlines("unresponsive machines")
        self._held_back: dict[str, str] = {}  # machine id → why
        # --verify-on-enroll: probe each enrolling worker before it becomes schedulable
        self.prober = prober
        # told the error code of every refused enrollment (metrics)
        self.on_rejection: Callable[[str], None] = lambda code: None
        # called after another process wrote to the repo (e.g. revoked a server token)
        self.repo_listeners: list[Callable[[], None]] = []
        self._to_verify_send, self._to_verify = trio.open_memory_channel[Member](math.inf)

    def __repr__(self) -> str:
        return f"<Gateway {self.pool!r} {self.grace!r} {self.token_deadlines!r}>"

    # -- enrollment --------------------------------------------------------------------------

    async def enroll(self, channel: RpcChannel, raw: dict) -> tuple[EnrollReply, Member]:
        params = check_enrollment(raw)
        twin = self.pool.by_instance_id(params.instance_id)
        if twin is not None and twin.machine_id != params.machine_id:
            raise _instance_in_use(params.instance_id)  # before anything is bound
        try:
            redeemed = await retry_busy(
                lambda: self.tokens.redeem(
                    params.token,
                    machine_id=params.machine_id,
                    labels=params.labels,
                    capacity=params.capacity,
                )
            )
        except TokenInvalid as exc:
            log.warning("refused an enrollment with token %r: %s", exc.name, exc.detail)
            raise
        token, name, granted = redeemed.token, redeemed.binding.worker_name, redeemed.granted
        if granted.kept_own_fleet:
            log.warning(
                "worker %s supplies its own fleet label %r; keeping it instead of fleet=%s",
                name,
                params.labels["fleet"],
                token.name,
            )
        if granted.capacity_capped:
            log.info(
                "worker %s asked for %d slots; token %s allows %d",
                name,
                params.capacity,
                token.name,
                granted.capacity,
            )
        if twin is not None and twin.name != name:
            raise _instance_in_use(params.instance_id)
        existing = self.pool.get(name)
        if existing is not None and existing.connected:
            if existing.instance_id != params.instance_id:
                raise AlreadyConnected(
                    f"worker {name!r} is already connected from another process; if that "
                    "process is gone, its connection is dropped after missed heartbeats"
                )
            existing.channel.abort(CLOSE_REPLACED, "replaced by a newer connection")
        reconnect = existing is not None and existing.instance_id == params.instance_id
        verify = self.prober is not None
        status = WorkerStatus.UNVERIFIED.value if verify else WorkerStatus.IDLE.value
        pending = "verification in progress" if verify else None
        held = self._held_back.get(params.machine_id)
        if held is not None and params.machine_id in self.held_back:
            # it left no dispatch of it unanswered by reconnecting: held back as it was
            verify, status = False, WorkerStatus.UNRESPONSIVE.value
            pending = f"{held} (held back for {HOLD_BACK:g}s from then, reconnects included)"
        await self.records.settled()  # the previous connection's last status goes first
        record = await retry_busy(
            lambda: self.workers.enrolled(
                name=name,
                instance_id=params.instance_id,
                machine_id=params.machine_id,
                token=token.name,
                labels=granted.labels,
                platform=params.platform,
                arch=params.arch,
                capacity=granted.capacity,
                version=params.version,
                status=status,
                reason=pending,
            )
        )
        self.grace.cancel(name)
        member = Member(
            name=name,
            instance_id=params.instance_id,
            machine_id=params.machine_id,
            token_name=token.name,
            labels=granted.labels,
            platform=params.platform,
            arch=params.arch,
            capacity=granted.capacity,
            version=params.version,
            channel=channel,
            enrolled_at=record.attributes["enrolledAt"],
            last_seen_at=record.attributes["lastSeenAt"],
            record=record,
            status=status,
            verify_failure_reason=pending if status == WorkerStatus.UNVERIFIED.value else None,
            unresponsive_reason=pending if status == WorkerStatus.UNRESPONSIVE.value else None,
            fleet=token.claims.pinned.get(FLEET_LABEL, token.name),
        )
        self.token_deadlines.set(token.name, self._trio_time(token.expires_at_epoch))
        # the interval this worker is told (and held to) grows with the pool: at enrollment,
        # and later in the answer to a ping, for the members that enrolled while it was smaller
        channel.heartbeat = heartbeat_interval(self.heartbeat_seconds, len(self.pool.members) + 1)
        channel.heartbeat_source = self.pool_heartbeat
        self.pool.put(member)  # an unverified member wakes nothing: it is not schedulable
        if status == WorkerStatus.UNRESPONSIVE.value and params.machine_id not in self.held_back:
            self._release(member)  # its time was up while the enrollment was written
        if verify:
            self._to_verify_send.send_nowait(member)
        if params.version and params.version != __version__:
            log.warning(
                "worker %s runs swamp %s, this orchestrator %s: it can download this build "
                "from /swamp.pyz",
                name,
                params.version,
                __version__,
            )
        log.info(
            "worker %s enrolled (%s) platform=%s/%s capacity=%d",
            name,
            "reconnect" if reconnect else "first connect",
            params.platform,
            params.arch,
            granted.capacity,
        )
        return EnrollReply(
            worker_name=name,
            capacity=granted.capacity,
            labels=granted.labels,
            token_expires_at=token.expires_at,
            token_expires_at_epoch=token.expires_at_epoch,
            reconnect=reconnect,
            heartbeat_seconds=channel.heartbeat,
            protocol_version=PROTOCOL_VERSION,
            orchestrator_version=__version__,
        ), member

    def pool_heartbeat(self) -> float:
        return heartbeat_interval(self.heartbeat_seconds, len(self.pool.members))

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
        if self.prober is not None:
            member.status = WorkerStatus.UNVERIFIED.value
            member.verify_failure_reason = "verification in progress"
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

    # -- tokens enforced live ----------------------------------------------------------------

    def _trio_time(self, epoch: float) -> float:
        return trio.current_time() + max(0.0, epoch - self.clock())

    async def _token_deadline(self, name: str) -> None:
        token = self.tokens.get(name)
        if token is None:
            return
        if token.expires_at_epoch > self.clock():  # re-minted with a later deadline
            self.token_deadlines.set(name, self._trio_time(token.expires_at_epoch))
            return
        if await retry_busy(lambda: self.tokens.expire(name)):
            log.info("token %s expired", name)
        await self.disconnect_token(name, CLOSE_EXPIRED, f"token {name!r} has expired")

    async def disconnect_token(self, name: str, code: int, reason: str) -> int:
        members = [m for m in self.pool.of_token(name) if m.connected]
        for member in members:
            log.info("disconnecting %s: %s", member.name, reason)
            member.channel.abort(code, reason)
        for member in self.pool.of_token(name):  # steps waiting for one learn it cannot return
            self.pool.refresh(member)
        return len(members)

    async def token_changed(self, name: str) -> None:
        """Re-check one token (after a revoke): disconnect its workers if it is no longer live."""
        token = self.tokens.get(name)
        now = self.clock()
        if token is None or not token.live(now):
            state = token.effective_state(now).value if token else "deleted"
            code = CLOSE_EXPIRED if state == "expired" else CLOSE_REVOKED
            await self.disconnect_token(name, code, f"token {name!r} has been {state}")

    async def _watch_repo(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Notice writes by other processes (the CLI on the repo) without a server round trip.

        ``PRAGMA data_version`` only changes when another connection commits, so this costs one
        tiny query per tick and does nothing when the repo is quiet. It is the one periodic
        check in the orchestrator, and it is not on any dispatch path.
        """
        try:  # the baseline is taken before the server listens: no change can slip past
            seen: int | None = self.store.data_version()
        except SwampError:
            seen = None  # unknown: the first tick re-checks everything
        task_status.started()
        broken = None
        while True:
            await trio.sleep(REPO_WATCH_INTERVAL)
            if broken is None and (broken := self.store.check_file()):
                log.error("%s", broken)  # said once; every write is refused from now on
            try:
                current = self.store.data_version()
                if current == seen:
                    continue
                seen = current
                self.arm_token_deadlines()
                for name in {m.token_name for m in self.pool.members.values() if m.connected}:
                    await self.token_changed(name)
                for listener in self.repo_listeners:
                    listener()
            except SwampError as exc:  # e.g. the database is locked: try again next tick
                log.warning("could not re-check the repo after a change: %s", exc)
                seen = None
            except Exception:  # a bug here must not take the orchestrator down with it
                log.exception("the repo watcher failed; it carries on")
                seen = None

    def arm_token_deadline(self, token) -> None:
        """Store the token ``expired`` (and cut off its workers) when its deadline passes."""
        self.token_deadlines.set(token.name, self._trio_time(token.expires_at_epoch))

    def arm_token_deadlines(self) -> None:
        """Arm the deadline of every live token, so each is stored ``expired`` when it lapses,
        whether or not a worker ever used it (tokens may be minted by the CLI on the repo)."""
        for token in self.tokens.all():
            if (
                token.state in (TokenState.UNUSED, TokenState.ENROLLED)
                and token.name not in self.token_deadlines
            ):
                self.token_deadlines.set(token.name, self._trio_time(token.expires_at_epoch))

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        self.arm_token_deadlines()
        async with open_unwrapping_nursery() as nursery:
            await nursery.start(self.grace.run, self._grace_lapsed)
            await nursery.start(self.held_back.run, self._hold_lapsed)
            await nursery.start(self.token_deadlines.run, self._token_deadline)
            await nursery.start(self._watch_repo)
            await nursery.start(self.sweeper.run)
            nursery.start_soon(self._verify_enrollments, nursery)
            task_status.started()

    # -- verify on enroll ----------------------------------------------------------------------

    async def _verify_enrollments(self, nursery: trio.Nursery) -> None:
        """Each enrolled member is probed in a task of the gateway's own nursery."""
        async for member in self._to_verify:
            nursery.start_soon(self._verify, member)

    async def _verify(self, member: Member) -> None:
        try:
            verdict = await self.prober(member.name)
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

    async def shutdown(self) -> None:
        for member in list(self.pool.members.values()):
            if member.connected:
                member.channel.abort(CLOSE_SHUTDOWN, "orchestrator shutting down")
