"""The channel's view of a websocket: send text, receive text, close. Two implementations.

:class:`~swamp.protocol.websocket.WebSocket` is ours (a trio shell over wsproto and the fast
frame codec): every client's socket, and every socket the orchestrator's listener accepts.
:class:`AsgiTransport` is an ASGI server's websocket (Hypercorn's, for an upgrade that came on
a kept-alive HTTP connection). Every implementation passes the same conformance suite
(``tests/unit/test_transport_conformance.py``).
"""

from __future__ import annotations

import json
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Protocol
from urllib.parse import urlsplit

import trio

from swamp.protocol.websocket import (
    DRAIN_MAX,
    DRAIN_QUIET,
    HandshakeError,
    Rejected,
    TransportClosed,
    WebSocket,
    connect,
)
from swamp.protocol.websocket import close_reason as _close_reason
from swamp.protocol.websocket import describe_close as _describe

# What the orchestrator answers, as plain-text HTTP 400, to a client that speaks the other
# scheme on its port (the listener sends it; open_websocket recognizes it).
SPEAKS_TLS = "this port speaks TLS: use wss:// (or https://)"
SPEAKS_PLAIN = "this port does not speak TLS: use ws:// (or http://)"


class Transport(Protocol):
    async def send(self, text: str) -> None: ...

    async def send_many(self, texts: list[str]) -> None: ...

    def write_now(self, text: str) -> bool | None:
        """Write a message without waiting, if the socket can take it now: ``True`` when all of
        it went, ``False`` when part did (the next ``send``/``send_many`` sends the rest first;
        :attr:`unflushed` until then), ``None`` when nothing was written."""

    @property
    def unflushed(self) -> bool:
        """Part of a message written by :meth:`write_now` still waits to be sent."""

    async def receive(self) -> str: ...

    async def pump(self, take: Callable[[str], Awaitable[None]]) -> None:
        """Hand every message to ``take``, in order, until the socket closes (then raise
        :class:`TransportClosed`). ``take`` may run in the task that reads the socket."""

    async def aclose(self, code: int = 1000, reason: str = "") -> None: ...

    def limit_messages(self, size: int, *, fragments: int | None = None) -> None:
        """From now on a message larger than ``size`` bytes, or in more than ``fragments``
        frames (``None``: any number), closes the socket (code 1009)."""


def describe(exc: BaseException) -> str:
    """A one-line reason for a failed websocket handshake (the cause is where the detail is)."""
    if isinstance(exc, Rejected):
        said = ""
        try:  # the orchestrator's own refusals carry a coded error
            said = json.loads(exc.body or b"{}").get("error", {}).get("message", "")
        except (ValueError, AttributeError):
            pass
        return f"the server answered HTTP {exc.status_code}" + (f": {said[:200]}" if said else "")
    return str(exc) or str(exc.__cause__ or "") or type(exc).__name__


WebSocketTransport = WebSocket  # our websocket is a Transport itself


class AsgiTransport:
    """An accepted ASGI websocket (Hypercorn).

    Closing drains: after the close frame, whatever the peer still sends is read and dropped
    until it disconnects, goes quiet for :data:`DRAIN_QUIET` seconds, or :data:`DRAIN_MAX`
    seconds have passed. Hypercorn feeds an app through a small queue that nobody empties once
    the app has returned; a peer that keeps sending would otherwise fill it and leave the
    connection stuck open, holding its buffers, instead of being closed.
    """

    def __init__(self, receive, send) -> None:
        self._receive = receive
        self._send = send
        self.closed = False
        self.limit: int | None = None  # set by limit_messages
        self.why = "connection closed"  # what receive raises once closed

    async def send(self, text: str) -> None:
        if self.closed:
            raise TransportClosed("connection closed")
        try:
            await self._send({"type": "websocket.send", "text": text})
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self.closed = True
            raise TransportClosed(f"connection lost: {exc}") from None
        except Exception as exc:  # Hypercorn raises its own errors once the client is gone
            self.closed = True
            raise TransportClosed(f"connection lost: {exc}") from None

    async def send_many(self, texts: list[str]) -> None:
        for text in texts:  # an ASGI server takes one message at a time
            await self.send(text)

    async def receive(self) -> str:
        if self.closed:
            raise TransportClosed(self.why)
        message = await self._receive()
        kind = message.get("type")
        if kind == "websocket.receive":
            if message.get("text") is not None:
                text = message["text"]
            else:
                text = (message.get("bytes") or b"").decode("utf-8", "replace")
            if self.limit is not None and len(text) > self.limit:
                reason = f"Exceeded maximum message size: {self.limit} bytes"
                await self.aclose(1009, reason)
                self.why = _describe(1009, reason)
                raise TransportClosed(self.why)
            return text
        self.closed = True
        self.why = _describe(message.get("code"), message.get("reason"))
        raise TransportClosed(self.why)

    async def pump(self, take: Callable[[str], Awaitable[None]]) -> None:
        while True:
            await take(await self.receive())

    def write_now(self, text: str) -> bool | None:
        return None  # an ASGI server takes a message only by awaiting it

    def limit_messages(self, size: int, *, fragments: int | None = None) -> None:
        """Hypercorn's own limit (its configuration's, one for every socket) holds first; a
        message within it but past ``size`` closes the socket here. Hypercorn puts a
        fragmented message together before it hands it over: its frames are not counted."""
        self.limit = size

    unflushed = False

    async def aclose(self, code: int = 1000, reason: str = "") -> None:
        if self.closed:
            return
        self.closed = True
        with trio.CancelScope(shield=True):
            with trio.move_on_after(2):
                try:
                    await self._send(
                        {"type": "websocket.close", "code": code, "reason": _close_reason(reason)}
                    )
                except Exception:  # already gone: nothing left to close
                    return
            with trio.move_on_after(DRAIN_MAX):
                while True:
                    with trio.move_on_after(DRAIN_QUIET) as quiet:
                        message = await self._receive()
                    if quiet.cancelled_caught or message.get("type") == "websocket.disconnect":
                        return


@asynccontextmanager
async def open_websocket(
    url: str,
    *,
    ssl_context: ssl.SSLContext | None,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
    max_message_size: int,
    connect_timeout: float = 10,
) -> AsyncIterator[WebSocket]:
    """A client websocket to ``url``, with TLS errors reported as TLS errors.

    The TCP connect and the TLS handshake come first, on their own, so the operator gets the
    real reason ("certificate verify failed ...") rather than a silent wait and a timeout;
    then the websocket handshake (:func:`swamp.protocol.websocket.connect`).
    A port that speaks the other scheme (``ws://`` to TLS, ``wss://`` to plain) is
    :class:`WrongScheme` at once, naming the URL to use.
    """
    from swamp.domain.urls import redact
    from swamp.errors import PeerError, WrongScheme

    parts = urlsplit(url)
    secure = parts.scheme == "wss"
    host = parts.hostname or ""
    port = parts.port or (443 if secure else 80)
    resource = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host_header = host if port in (80, 443) else f"{host}:{port}"
    other = redact(("ws" if secure else "wss") + url[len(parts.scheme) :])
    try:
        with trio.fail_after(connect_timeout):
            stream: trio.abc.Stream = await trio.open_tcp_stream(host, port)
            if secure:
                first = _FirstBytes(stream)
                tls = trio.SSLStream(
                    first,
                    ssl_context or ssl.create_default_context(),
                    server_hostname=host,
                    https_compatible=True,
                )
                stream = tls
                try:
                    await tls.do_handshake()
                except trio.BrokenResourceError as exc:
                    if first.received.startswith(b"HTTP/"):  # an answer in plain text
                        raise WrongScheme(
                            f"the server at {host_header} does not speak TLS on this port: "
                            f"use {other}"
                        ) from None
                    raise PeerError(
                        f"TLS handshake with {host_header} failed: "
                        f"{exc.__cause__ or exc} (pass --ca-cert if the server "
                        "uses a private CA)"
                    ) from None
    except trio.TooSlowError:
        raise PeerError(
            f"connecting to {host_header} timed out after {connect_timeout:g}s"
        ) from None
    except OSError as exc:
        raise PeerError(f"cannot connect to {host_header}: {exc}") from None
    try:
        with trio.fail_after(connect_timeout):
            ws = await connect(
                stream,
                host_header,
                resource,
                extra_headers=extra_headers,
                max_message_size=max_message_size,
            )
    except trio.TooSlowError:
        await trio.aclose_forcefully(stream)
        raise PeerError(f"the websocket handshake with {host_header} timed out") from None
    except HandshakeError as exc:
        await trio.aclose_forcefully(stream)
        if (
            isinstance(exc, Rejected)
            and exc.status_code == 400
            and (exc.body or b"").startswith(SPEAKS_TLS.encode())
        ):
            raise WrongScheme(
                f"the server at {host_header} speaks TLS on this port: use {other}"
            ) from None
        raise PeerError(
            f"the websocket handshake with {host_header} failed: {describe(exc)}"
        ) from None
    try:
        yield ws
    finally:
        await ws.aclose()


class _FirstBytes(trio.abc.Stream):
    """A TCP stream under TLS that keeps the first bytes the server sent: a handshake that
    fails on ``HTTP/…`` met a server that answered in plain text."""

    __slots__ = ("transport_stream", "received")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.transport_stream = stream
        self.received = b""

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        data = await self.transport_stream.receive_some(max_bytes)
        if len(self.received) < 16:
            self.received += data[:16]
        return data

    async def send_all(self, data) -> None:
        await self.transport_stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self.transport_stream.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.transport_stream.aclose()
