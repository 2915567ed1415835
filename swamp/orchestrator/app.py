"""The app: websocket upgrades are the control plane, plain HTTP the data plane.

Upgrades arrive from the listener (:meth:`App.websocket`, our own websocket) or, rarely, through
Hypercorn (the ASGI ``websocket`` scope); plain HTTP always through Hypercorn (ASGI).

Every request first passes the request policy (browsers are not clients; the Host header must
name this orchestrator), then the credential in its ``Authorization`` header is identified once.
What a socket may do with that identity is the connection's business; how much an untrusted
socket may cost is admission's.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Awaitable, Callable

from swamp.domain.request_policy import RequestPolicy, is_page
from swamp.domain.text import printable
from swamp.errors import Unauthorized
from swamp.orchestrator.admin import Admin
from swamp.orchestrator.admin_auth import AdminAuth
from swamp.orchestrator.admission import Admission
from swamp.orchestrator.connection import Connection
from swamp.orchestrator.dataplane import DataPlane
from swamp.orchestrator.dispatch import DispatchService
from swamp.orchestrator.enrollment import Enrollment
from swamp.orchestrator.listener import Upgrade
from swamp.orchestrator.membership import Membership
from swamp.protocol.rpc import SilenceSweeper
from swamp.protocol.transport import AsgiTransport

log = logging.getLogger("swamp.app")


def _headers(scope) -> dict[str, str]:
    """Lowercase header names to their first value (latin-1, as HTTP defines them)."""
    out: dict[str, str] = {}
    for name, value in scope.get("headers") or []:
        out.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))
    return out


class App:
    def __init__(
        self,
        *,
        enrollment: Enrollment,
        membership: Membership,
        sweeper: SilenceSweeper,
        dispatch: DispatchService,
        admin: Admin,
        dataplane: DataPlane,
        auth: AdminAuth,
        policy: RequestPolicy,
        admission: Admission,
    ) -> None:
        self.enrollment = enrollment
        self.membership = membership
        self.sweeper = sweeper
        self.dispatch = dispatch
        self.admin = admin
        self.dataplane = dataplane
        self.auth = auth
        self.policy = policy
        self.admission = admission

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind in ("http", "websocket"):
            headers = _headers(scope)
            if kind == "http" and is_page(scope["path"]):  # the web pages: browsers welcome
                reason = self.policy.page_refusal(headers)
            else:
                reason = self.policy.refusal(headers)
            if reason is not None:
                client = scope.get("client") or ("?", 0)
                log.warning("refused a %s request from %s: %s", kind, client[0], printable(reason))
                page = kind == "http" and is_page(scope["path"])
                await _refuse(kind, receive, send, reason, page=page)
                return
        if kind == "http":
            await self.dataplane(scope, receive, send)
        elif kind == "websocket":
            await self._websocket(scope, receive, send)
        elif kind == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    await send({"type": "lifespan.shutdown.complete"})
                    return

    async def _websocket(self, scope, receive, send) -> None:
        """An upgrade Hypercorn took (one on a kept-alive HTTP connection); most come straight
        from the listener (:meth:`websocket`)."""
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        client = scope.get("client") or ("?", 0)
        log.info(
            "a websocket from %s came as an upgrade of a kept-alive HTTP connection (a proxy "
            "reusing its connections?): its messages may be at most 64 KiB",
            client[0],
        )
        transport = AsgiTransport(receive, send)
        connection = await self.connection(
            transport, _headers(scope), peer=f"{client[0]}:{client[1]}"
        )
        await connection.serve()

    async def websocket(self, upgrade: Upgrade) -> Callable[[], Awaitable[None]] | None:
        """An upgrade from the listener: the same policy as every request; accepted, it is
        served by what this returns (the listener keeps nothing of the handshake meanwhile)."""
        reason = self.policy.refusal(upgrade.headers)
        if reason is not None:
            log.warning("refused a websocket request from %s: %s", upgrade.peer, printable(reason))
            body, content_headers = _refusal(reason)
            await upgrade.request.reject(403, extra_headers=content_headers, body=body)
            return None
        transport = await upgrade.request.accept()  # drains on close (it knows the idle time)
        return (await self.connection(transport, upgrade.headers, peer=upgrade.peer)).serve

    async def connection(self, transport, headers: dict[str, str], *, peer: str) -> Connection:
        """The connection that serves an accepted socket: identified once, by its upgrade's
        ``Authorization`` header."""
        authorization = headers.get("authorization")
        identity = await self.auth.identify(authorization)
        if authorization and isinstance(identity, Unauthorized):
            log.info("refused an admin credential: %s", printable(identity.message))
        return Connection(
            transport,
            enrollment=self.enrollment,
            membership=self.membership,
            sweeper=self.sweeper,
            dispatch=self.dispatch,
            admin=self.admin,
            admission=self.admission,
            identity=identity,
            peer=peer,
        )


def _refusal(reason: str) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    body = json.dumps({"error": {"code": "forbidden", "message": reason}}).encode()
    return body, [(b"content-type", b"application/json")]


#: a refusal of a web page's request is a browser's to show: nothing in it may run, be framed,
#: be sniffed as another type or be kept (the pages' own answers say the same, swamp.ui.routes)
PAGE_REFUSAL_HEADERS = [
    (b"content-security-policy", b"default-src 'none'; frame-ancestors 'none'"),
    (b"x-frame-options", b"DENY"),
    (b"x-content-type-options", b"nosniff"),
    (b"cache-control", b"no-store"),
]


async def _refuse(kind: str, receive, send, reason: str, *, page: bool = False) -> None:
    body, content_type = _refusal(reason)
    headers = [*content_type, (b"content-length", str(len(body)).encode())]
    if page:
        headers += PAGE_REFUSAL_HEADERS
    if kind == "http":
        await send({"type": "http.response.start", "status": 403, "headers": headers})
        await send({"type": "http.response.body", "body": body})
    else:
        await receive()  # websocket.connect
        await send({"type": "websocket.http.response.start", "status": 403, "headers": headers})
        await send({"type": "websocket.http.response.body", "body": body})
