"""The admin client: how the CLI talks to a running orchestrator over the control socket."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from swamp.concurrency import open_unwrapping_nursery
from swamp.errors import UnknownMethod, UserError
from swamp.protocol.frames import MAX_FRAME_BYTES
from swamp.protocol.rpc import IncomingCall, RpcChannel
from swamp.protocol.transport import open_websocket
from swamp.tls.trust import client_context


async def _no_requests(call: IncomingCall):
    raise UnknownMethod(f"a client does not serve {call.method!r}")


@asynccontextmanager
async def connect(
    url: str,
    *,
    server_token: str | None = None,
    ca_cert: Path | None = None,
    ca_pem: str | None = None,
) -> AsyncIterator[RpcChannel]:
    """An admin channel to the orchestrator at ``url``; closed on exit. ``ca_pem`` is the
    orchestrator's own CA, already proven (see :func:`swamp.repo.Repo.own_ca_for`)."""
    if not url.startswith(("ws://", "wss://")):
        raise UserError(f"the server URL must start with ws:// or wss:// (got {url!r})")
    ssl_context = None
    if url.startswith("wss://"):
        ssl_context = client_context(ca_file=ca_cert, ca_pem=None if ca_cert else ca_pem)
    headers = [(b"authorization", f"Bearer {server_token}".encode())] if server_token else None
    async with open_websocket(
        url, ssl_context=ssl_context, extra_headers=headers, max_message_size=MAX_FRAME_BYTES * 2
    ) as ws:
        channel = RpcChannel(ws, _no_requests, name="orchestrator")
        async with open_unwrapping_nursery() as nursery:
            await nursery.start(channel.serve)
            yield channel
            nursery.cancel_scope.cancel()


async def call(
    url: str,
    method: str,
    params: dict | None = None,
    *,
    server_token=None,
    ca_cert=None,
    timeout: float | None = 60,
    on_event=None,
):
    async with connect(url, server_token=server_token, ca_cert=ca_cert) as channel:
        return await channel.call(method, params or {}, timeout=timeout, on_event=on_event)
