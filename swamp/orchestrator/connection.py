"""One websocket on the control plane, and what it may call.

A socket starts *pending*, without a role, and must earn one within a few seconds (see
``admission``). Its first call decides: ``worker.enroll`` makes it a worker socket (which may
then call only worker verbs), an admin frame makes it an admin socket — if the credential it
presented at the upgrade was accepted — which may never enroll. Before enrollment a socket may
call nothing but ``worker.enroll`` and admin frames, one at a time. Each admin frame is checked
against the credential's scope before anything else: a refused call earns the socket no trust.
"""

from __future__ import annotations

import logging

import trio

from swamp.domain.scopes import Scope
from swamp.errors import Conflict, Forbidden, Unauthorized, UnknownMethod
from swamp.orchestrator import capabilities
from swamp.orchestrator.admin import Admin
from swamp.orchestrator.admin_auth import Principal, authorize
from swamp.orchestrator.admission import (
    ADMIN_IN_FLIGHT,
    CLOSE_POLICY,
    PENDING_FRAGMENTS,
    PENDING_FRAMES,
    PENDING_IN_FLIGHT,
    PENDING_MESSAGE_BYTES,
    TRUSTED_FRAGMENTS,
    TRUSTED_MESSAGE_BYTES,
    Admission,
    worker_in_flight,
)
from swamp.orchestrator.dispatch import DispatchService
from swamp.orchestrator.enrollment import Enrollment
from swamp.orchestrator.membership import Membership
from swamp.orchestrator.peers import PEER, PEER_VERBS
from swamp.orchestrator.pool import Member
from swamp.protocol.rpc import IncomingCall, RpcChannel, SilenceSweeper
from swamp.protocol.transport import Transport

log = logging.getLogger("swamp.connection")

WORKER_VERBS = frozenset({"capability.queryData", "worker.drain"})
PEER_IN_FLIGHT = 4096  # steps another orchestrator may have running here at once


class Connection:
    __slots__ = (  # one per socket
        "enrollment",
        "membership",
        "dispatch",
        "admin",
        "admission",
        "identity",
        "peer",
        "role",
        "member",
        "enrolling",
        "_enrolled_or_failed",
        "_deadline",
        "channel",
        "__weakref__",
    )

    def __init__(
        self,
        transport: Transport,
        *,
        enrollment: Enrollment,
        membership: Membership,
        sweeper: SilenceSweeper,
        dispatch: DispatchService,
        admin: Admin,
        admission: Admission,
        identity: Principal | Unauthorized,
        peer: str,
    ) -> None:
        self.enrollment = enrollment
        self.membership = membership
        self.dispatch = dispatch
        self.admin = admin
        self.admission = admission
        self.identity = identity
        self.peer = peer
        self.role: str | None = None
        self.member: Member | None = None
        self.enrolling = False
        self._enrolled_or_failed: trio.Event | None = None  # made while the deadline waits
        self._deadline = trio.CancelScope()  # cancelled once the socket has a role
        self.channel = RpcChannel(
            transport,
            self.handle,
            heartbeat=membership.heartbeat_seconds,
            name=f"client {peer}",
            max_in_flight=PENDING_IN_FLIGHT,
            pings=False,  # the peer pings; we answer (and watch its silence, all in one task)
            sweeper=sweeper,
        )
        self.channel.frame_budget = PENDING_FRAMES
        if isinstance(identity, Principal) and identity.kind == PEER:
            # another orchestrator, known by its credential at the upgrade: a peer from the
            # start (it sends every step it claimed here at once, one call each)
            self.role = "peer"
            self.channel.max_in_flight, self.channel.frame_budget = PEER_IN_FLIGHT, None
            self.channel.name = f"orchestrator {identity.name[:12]} ({peer})"
            transport.limit_messages(TRUSTED_MESSAGE_BYTES, fragments=TRUSTED_FRAGMENTS)
        elif isinstance(identity, Principal) and identity.scope is Scope.ADMIN:
            # an admin credential was accepted at the upgrade: its first call may be large (a
            # read or metrics token's calls never are, and it stays as small as a stranger)
            transport.limit_messages(TRUSTED_MESSAGE_BYTES, fragments=TRUSTED_FRAGMENTS)
        else:
            transport.limit_messages(PENDING_MESSAGE_BYTES, fragments=PENDING_FRAGMENTS)

    def __repr__(self) -> str:
        return f"<Connection {self.peer} role={self.role}>"

    async def serve(self) -> None:
        evicted = self.admission.arrived(self)
        if evicted is not None:
            log.warning(
                "evicting %s: too many sockets waiting to enroll or authenticate", evicted.peer
            )
            evicted.channel.abort(
                CLOSE_POLICY,
                "too many connections are waiting to enroll or "
                "authenticate; this one was the oldest",
            )
        self.channel.on_close(self._closed)
        if self.role == "peer":
            self.admission.trusted(self)  # it has its role: no deadline to earn one
            self._deadline.cancel()
        await self.channel.serve(alongside=self._pending_deadline)

    def _closed(self, reason: str) -> None:
        """The socket is gone (or given up on): forget it now, whatever its tasks still do."""
        self.admission.left(self)
        if self.member is not None:
            self.membership.disconnected(self.member, self.channel)
        identity, peers = self.identity, self.dispatch.peers
        if isinstance(identity, Principal) and identity.kind == PEER and peers is not None:
            peers.outliving.link_lost(identity.name)  # what it was just told may not arrive

    async def _pending_deadline(self) -> None:
        """Close the socket if it has not earned a role in time (an enrollment under way is
        allowed to finish: its time is the orchestrator's, not the peer's)."""
        with self._deadline:
            await trio.sleep(self.admission.deadline)
        if self._deadline.cancelled_caught:
            return
        while self.enrolling:
            if self._enrolled_or_failed is None:
                self._enrolled_or_failed = trio.Event()
            await self._enrolled_or_failed.wait()
        if self.admission.is_pending(self):
            self.admission.timed_out += 1
            log.info(
                "closing %s: it neither enrolled nor authenticated within %gs",
                self.peer,
                self.admission.deadline,
            )
            self.channel.abort(
                CLOSE_POLICY,
                f"enroll or authenticate within {self.admission.deadline:g}s of connecting",
            )

    async def handle(self, call: IncomingCall):
        method = call.method
        member = self.member  # a worker's socket: set with its role, at enrollment
        if member is not None:
            if method == "capability.queryData":
                return await capabilities.query_data(self.dispatch, member, call.params)
            if method == "worker.drain":
                return self.membership.drain(member, call.params)
            if method in self.admin.handlers or method == "worker.enroll":
                raise Forbidden(f"a worker socket cannot call {method}")
            raise UnknownMethod(f"unknown method {method!r}")
        identity = self.identity
        if isinstance(identity, Principal) and identity.kind == PEER:
            # another orchestrator (a shared database): it sends the steps we claimed, and
            # nothing else — never an admin frame, never an enrollment
            if method not in PEER_VERBS:
                raise Forbidden(f"an orchestrator's peer credential cannot call {method}")
            return await self._peer_dispatch(call, identity)
        if method in PEER_VERBS:
            raise Forbidden(f"only another orchestrator serving this database may call {method}")
        if method == "worker.enroll":
            return await self._enroll(call)
        handler = self.admin.handlers.get(method)
        if handler is not None:
            if isinstance(self.identity, Unauthorized):
                raise Unauthorized(self.identity.message)
            authorize(self.identity, method)
            if self.role is None:
                self.role = "admin"
                self.admission.trusted(self, self.identity)
                self._deadline.cancel()
                self.channel.max_in_flight, self.channel.frame_budget = ADMIN_IN_FLIGHT, None
                # A client that stops reading (piped into a pager, suspended) is slow, not
                # gone: its runs go on and it misses streamed lines (counted) rather than being
                # dropped for silence. It is gone when its socket closes.
                self.channel.drop_silent, self.channel.drop_events = False, True
                self.channel.name = f"admin {self.peer} ({self.identity.describe()})"
            return await handler(call, self.identity)
        if method in WORKER_VERBS:
            raise Forbidden(
                f"enroll first: before enrollment a socket may only call "
                f"worker.enroll, not {method}"
            )
        raise UnknownMethod(f"unknown method {method!r}")

    async def _peer_dispatch(self, call: IncomingCall, identity: Principal) -> dict:
        peers = self.dispatch.peers
        if peers is None:
            raise Forbidden("this orchestrator serves no shared database")
        if call.method == "peer.outcome":  # a step it sent, whose link broke: still running?
            return peers.outcome_asked(identity.name, call.params)
        if call.method == "peer.cancel":
            return peers.cancel_asked(identity.name, call.params)
        if call.method == "peer.step.wait":  # it took over the steps of one that died
            return await peers.step_wait_asked(identity.name, call.params)
        if call.method != "peer.dispatch":  # an admin verb about what this one holds
            return await self.admin.here(call.method, call.params)
        channel = self.channel
        return await peers.dispatch(
            identity.name,
            call.params,
            None if call.quiet else call.emit,
            # its socket went — not its caller's cancel, even one read just before the close
            link_closed=lambda: channel.closed and not call.cancel_asked,
        )

    async def _enroll(self, call: IncomingCall) -> dict:
        """The first call of a worker socket (its payload is decoded by the enrollment)."""
        if self.role == "admin":
            raise Forbidden("an admin socket cannot enroll as a worker")
        if self.enrolling:
            raise Conflict("an enrollment is already in progress on this socket")
        self.enrolling = True
        self.admission.engaged(self, True)
        try:
            result, member = await self.enrollment.enroll(self.channel, call.params)
        finally:
            self.enrolling = False
            self.admission.engaged(self, False)
            if self._enrolled_or_failed is not None:
                self._enrolled_or_failed.set()
                self._enrolled_or_failed = None
        self.role, self.member = "worker", member
        self.admission.trusted(self)
        self._deadline.cancel()
        self.channel.max_in_flight = worker_in_flight(member.capacity)
        self.channel.frame_budget = None
        self.channel.transport.limit_messages(TRUSTED_MESSAGE_BYTES, fragments=TRUSTED_FRAGMENTS)
        self.channel.name = f"worker {member.name}"
        return result.to_json()
