"""One websocket on the control plane, and what it may call.

A socket starts without a role. Its first call decides: ``worker.enroll`` makes it a worker
socket (which may then call only worker verbs), an admin frame makes it an admin socket (which
needs a server token when auth is on, and may never enroll). Before enrollment a worker socket
may call nothing but ``worker.enroll``.
"""

from __future__ import annotations

import logging

from swamp.errors import Forbidden, SwampError, UserError
from swamp.orchestrator import capabilities
from swamp.orchestrator.admin import Admin
from swamp.orchestrator.dispatch import DispatchService
from swamp.orchestrator.gateway import Gateway
from swamp.orchestrator.pool import Member
from swamp.protocol.rpc import IncomingCall, RpcChannel
from swamp.protocol.transport import Transport

log = logging.getLogger("swamp.connection")

WORKER_VERBS = frozenset({"worker.session.refresh", "capability.queryData"})


class Connection:
    def __init__(self, transport: Transport, *, gateway: Gateway, dispatch: DispatchService,
                 admin: Admin, admin_authorized: bool, peer: str) -> None:
        self.gateway = gateway
        self.dispatch = dispatch
        self.admin = admin
        self.admin_authorized = admin_authorized
        self.peer = peer
        self.role: str | None = None
        self.member: Member | None = None
        self.enrolling = False
        self.channel = RpcChannel(transport, self.handle, heartbeat=gateway.heartbeat_seconds,
                                  name=f"client {peer}")

    async def serve(self) -> None:
        try:
            await self.channel.serve()
        finally:
            if self.member is not None:
                self.gateway.disconnected(self.member, self.channel)

    async def handle(self, call: IncomingCall):
        method = call.method
        if self.role == "worker":
            if method == "worker.session.refresh":
                return self.gateway.refresh_session(self.member)
            if method == "capability.queryData":
                return capabilities.query_data(self.dispatch, self.member, call.params)
            if method in self.admin.handlers or method == "worker.enroll":
                raise Forbidden(f"a worker socket cannot call {method}")
            raise UserError(f"unknown method {method!r}", code="unknown_method")
        if method == "worker.enroll":
            if self.role == "admin":
                raise Forbidden("an admin socket cannot enroll as a worker")
            if self.enrolling:
                raise SwampError("an enrollment is already in progress on this socket",
                                 code="conflict")
            self.enrolling = True
            try:
                result, member = await self.gateway.enroll(self.channel, call.params)
            finally:
                self.enrolling = False
            self.role, self.member = "worker", member
            self.channel.name = f"worker {member.name}"
            return result
        handler = self.admin.handlers.get(method)
        if handler is not None:
            if not self.admin_authorized:
                raise Forbidden("admin frames need a server token: pass --server-token or set "
                                "SWAMP_SERVER_TOKEN", code="unauthorized")
            self.role = "admin"
            return await handler(call)
        if method in WORKER_VERBS:
            raise Forbidden(f"enroll first: before enrollment a socket may only call "
                            f"worker.enroll, not {method}")
        raise UserError(f"unknown method {method!r}", code="unknown_method")
