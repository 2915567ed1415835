"""The one ASGI app: websocket upgrades are the control plane, plain HTTP the data plane."""

from __future__ import annotations

import logging

from swamp.bookkeeping.server_tokens import ServerTokenBook
from swamp.errors import Forbidden
from swamp.orchestrator.admin import Admin
from swamp.orchestrator.connection import Connection
from swamp.orchestrator.dataplane import DataPlane
from swamp.orchestrator.dispatch import DispatchService
from swamp.orchestrator.gateway import Gateway
from swamp.protocol.transport import AsgiTransport

log = logging.getLogger("swamp.app")


class App:
    def __init__(self, *, gateway: Gateway, dispatch: DispatchService, admin: Admin,
                 dataplane: DataPlane, require_auth: bool) -> None:
        self.gateway = gateway
        self.dispatch = dispatch
        self.admin = admin
        self.dataplane = dataplane
        self.require_auth = require_auth
        self.server_tokens = ServerTokenBook(dispatch.store)

    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
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

    def _admin_authorized(self, scope) -> bool:
        if not self.require_auth:
            return True
        header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
        scheme, _, token = header.partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        try:
            self.server_tokens.authenticate(token.strip())
        except Forbidden:
            return False
        return True

    async def _websocket(self, scope, receive, send) -> None:
        message = await receive()
        if message["type"] != "websocket.connect":
            return
        await send({"type": "websocket.accept"})
        client = scope.get("client") or ("?", 0)
        connection = Connection(
            AsgiTransport(receive, send), gateway=self.gateway, dispatch=self.dispatch,
            admin=self.admin, admin_authorized=self._admin_authorized(scope),
            peer=f"{client[0]}:{client[1]}")
        await connection.serve()
