"""The channel's view of a websocket: send text, receive text, close. Two adapters.

Keeping the RPC channel independent of the server means the ASGI server (Hypercorn) and the
client library (trio-websocket) can each be swapped without touching the protocol.
"""

from __future__ import annotations

import json
import os
import ssl
from collections.abc import Awaitable, Callable
from contextlib import asynccontextmanager, suppress
from typing import Protocol
from urllib.parse import urlsplit

import trio
import trio_websocket
from wsproto.connection import ConnectionState
from wsproto.events import TextMessage

from swamp.concurrency import open_unwrapping_nursery
from swamp.errors import ChannelClosed
from swamp.protocol import wsframes

# What the orchestrator answers, as plain-text HTTP 400, to a client that speaks the other
# scheme on its port (the listener sends it; open_websocket recognizes it).
SPEAKS_TLS = "this port speaks TLS: use wss:// (or https://)"
SPEAKS_PLAIN = "this port does not speak TLS: use ws:// (or http://)"


class TransportClosed(ChannelClosed):
    """The socket is gone; ``message`` says why (close code and reason when known)."""


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
    if isinstance(exc, trio_websocket.ConnectionRejected):
        said = ""
        try:  # the orchestrator's own refusals carry a coded error
            said = json.loads(exc.body or b"{}").get("error", {}).get("message", "")
        except (ValueError, AttributeError):
            pass
        return f"the server answered HTTP {exc.status_code}" + (f": {said[:200]}" if said else "")
    return str(exc) or str(exc.__cause__ or "") or type(exc).__name__


def _close_reason(reason: str) -> str:
    """A close frame's reason is at most 123 bytes of UTF-8."""
    return reason.encode("utf-8")[:120].decode("utf-8", "ignore")


def _describe(code: int | None, reason: str | None) -> str:
    if code in (None, 1000, 1005) and not reason:
        return "connection closed"
    text = f"connection closed (code {code}"
    return text + (f": {reason})" if reason else ")")


def _text(message: str | bytes) -> str:
    return message if isinstance(message, str) else message.decode("utf-8", "replace")


def _closed(exc: trio_websocket.ConnectionClosed) -> str:
    """Why a trio-websocket connection closed (it may have no close reason at all)."""
    if exc.reason is None:
        return _describe(1006, "")
    return _describe(exc.reason.code, exc.reason.reason)


class WebSocketTransport:
    """A trio-websocket connection: a client's, or one the orchestrator's listener accepted.

    An accepted one is given ``idle`` (seconds since its socket last received anything): closing
    it then drains like :class:`AsgiTransport` — after the close frame, what the peer still
    sends is dropped until it answers the close, goes quiet for :data:`DRAIN_QUIET` seconds, or
    :data:`DRAIN_MAX` seconds have passed — so a peer still busy sending is not cut off with a
    reset before it has read why it was closed."""

    __slots__ = ("ws", "idle", "_plain", "_rest", "_fragments")

    def __init__(
        self, ws: trio_websocket.WebSocketConnection, *, idle: Callable[[], float] | None = None
    ) -> None:
        self.ws = ws
        self.idle = idle
        self._plain: trio.SocketStream | None | bool = None  # found at the first write_now
        self._rest = b""  # what the socket did not take of a write_now
        self._fragments: int | None = None  # frames a message may come in (None: any)

    @property
    def unflushed(self) -> bool:
        return bool(self._rest)

    def _plain_stream(self) -> trio.SocketStream | None:
        """The TCP stream the websocket's bytes go to unchanged, if there is one: not under TLS
        (bytes are encrypted on the way), nor without trio-websocket's internals."""
        if self._plain is None:
            self._plain = False
            stream = getattr(self.ws, "_stream", None)
            while stream is not None and not isinstance(stream, trio.SocketStream):
                stream = getattr(stream, "plain_stream", None)  # a wrapper that adds nothing
            ws = self.ws
            if stream is not None and all(
                hasattr(ws, name) for name in ("_wsproto", "_stream_lock", "_close_reason")
            ):
                self._plain = stream
        return self._plain or None

    def write_now(self, text: str) -> bool | None:
        """Write one message straight to the socket, as trio-websocket would but without
        waiting: nothing is written if another send holds the socket, part of a message is
        still unsent, the socket is TLS or is closing. A socket with no room takes part or
        none of it; the rest goes first with the next send (pinned trio-websocket internals,
        as :meth:`send_many`)."""
        stream = self._plain_stream()
        ws = self.ws
        if (
            stream is None
            or self._rest
            or ws._close_reason is not None
            or ws._stream_lock.locked()
            or ws._wsproto.state is not ConnectionState.OPEN
        ):
            return None
        fd = stream.socket.fileno()
        if fd < 0:
            return None
        data = _encode(ws, text)
        try:
            sent = os.write(fd, data)
        except OSError:  # no room (BlockingIOError), or the socket is gone: the next send says
            sent = 0
        if sent < len(data):
            self._rest = data[sent:]
            return False
        return True

    def limit_messages(self, size: int, *, fragments: int | None = None) -> None:
        """trio-websocket checks each message against the limit it was opened with, as the
        message's pieces arrive; raised or lowered here (the version is pinned in
        ``constraints.txt``; a test fails should the attribute go). The frames of a message
        are counted where they are read (``wsframes``)."""
        if not hasattr(self.ws, "_max_message_size"):
            raise RuntimeError("this trio-websocket has no message limit to change")
        self.ws._max_message_size = size
        self._fragments = fragments
        # counted from now on: the frame reader goes in at once (not at the first pump), so no
        # frame of a peer that sends as soon as it is accepted is read without being counted
        wsframes.install(self.ws, max_fragments=fragments)  # if it cannot yet, pump() tries

    async def send(self, text: str) -> None:
        if self._rest:
            await self.send_many([text])
            return
        try:
            await self.ws.send_message(text)
        except trio_websocket.ConnectionClosed as exc:
            raise TransportClosed(_closed(exc)) from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise TransportClosed(f"connection lost: {exc}") from None

    async def send_many(self, texts: list[str]) -> None:
        """Several messages in one write to the socket, in order: one system call (and one
        wake-up of the peer) instead of one each, when frames queued up while the last write
        was going out. The rest of a :meth:`write_now` goes first (``texts`` may be empty).
        trio-websocket has no call for it, so this does what its own ``send_message`` does,
        for several messages under one hold of its lock (the version is pinned in
        ``constraints.txt``; without those internals it sends them one by one)."""
        ws = self.ws
        try:
            lock, stream = ws._stream_lock, ws._stream
        except AttributeError:  # another trio-websocket: one message at a time
            for text in texts:
                await self.send(text)
            return
        if ws._close_reason:
            raise TransportClosed(_closed(trio_websocket.ConnectionClosed(ws._close_reason)))
        try:
            async with lock:
                data = self._rest + b"".join(_encode(ws, text) for text in texts)
                self._rest = b""
                try:
                    await stream.send_all(data)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    await ws._abort_web_socket()
                    raise trio_websocket.ConnectionClosed(ws._close_reason) from None
        except trio_websocket.ConnectionClosed as exc:
            raise TransportClosed(_closed(exc)) from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise TransportClosed(f"connection lost: {exc}") from None

    async def receive(self) -> str:
        try:
            message = await self.ws.get_message()
        except trio_websocket.ConnectionClosed as exc:
            raise TransportClosed(_closed(exc)) from None
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            raise TransportClosed(f"connection lost: {exc}") from None
        return _text(message)

    async def pump(self, take: Callable[[str], Awaitable[None]]) -> None:
        """Hand each message to ``take`` inside trio-websocket's reader task, as it is parsed:
        no queue and no second task to wake per message. Messages that arrived before this was
        called are taken first, in order. What ``take`` raises ends the pump and is raised
        here, in the caller's task (the reader, which belongs to the socket's nursery, goes on
        to the close and drops what else arrives). Needs trio-websocket's internals (pinned in
        ``constraints.txt``); without them it receives one message at a time."""
        ws = self.ws
        queued = getattr(ws, "_recv_channel", None)
        if queued is None or not hasattr(ws, "_send_channel"):
            while True:
                await take(await self.receive())
        while True:  # what came before: the reader put it in the queue
            try:
                message = queued.receive_nowait()
            except (trio.WouldBlock, trio.EndOfChannel, trio.ClosedResourceError):
                break
            await take(_text(message))
        # the common frames read (and written) without wsproto's machinery
        installed = wsframes.install(ws, max_fragments=self._fragments)
        if not installed and self._fragments is not None:
            # frames this socket may send are counted where they are read; the reader could
            # not take over from wsproto (a frame begun and more behind it, never seen from
            # a client that waits for the handshake's answer as it must): not served
            reason = "the websocket's frames could not be counted; connect again"
            await self.aclose(1008, reason)
            raise TransportClosed(_describe(1008, reason))
        taker = ws._send_channel = _Taker(take, ws._send_channel)
        try:  # the reader closes the queue when it stops, whatever the cause
            await queued.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            pass
        if taker.failed is not None:
            raise taker.failed
        raise TransportClosed(_closed(trio_websocket.ConnectionClosed(ws._close_reason)))

    async def aclose(self, code: int = 1000, reason: str = "") -> None:
        with trio.CancelScope(shield=True):
            if self._rest:  # a message cut in two would garble the close frame behind it
                with trio.move_on_after(2), suppress(TransportClosed):
                    await self.send_many([])
            if self.idle is None:
                with trio.move_on_after(2):
                    with suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        await self.ws.aclose(code, _close_reason(reason))
                return
            # trio-websocket drops what arrives after the close frame while it waits for the
            # peer's close; whichever way the wait ends, the socket is closed
            with trio.move_on_after(DRAIN_MAX):
                async with trio.open_nursery() as nursery:
                    since = trio.current_time()
                    nursery.start_soon(self._give_up_when_quiet, nursery.cancel_scope, since)
                    with suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        await self.ws.aclose(code, _close_reason(reason))
                    nursery.cancel_scope.cancel()

    async def _give_up_when_quiet(self, scope: trio.CancelScope, since: float) -> None:
        """Quiet is counted from the close at the earliest: a peer that had been quiet for
        longer before it must still get the close frame (and its reason), and time to answer.
        Counted from its last frame alone, the wait could end before the close frame went
        out — and the peer saw the socket cut with no reason."""
        while (quiet := min(self.idle(), trio.current_time() - since)) < DRAIN_QUIET:
            await trio.sleep(DRAIN_QUIET - quiet)
        scope.cancel()


DRAIN_QUIET = 2.0
DRAIN_MAX = 10.0


def _encode(ws: trio_websocket.WebSocketConnection, text: str) -> bytes:
    """One message's frame, as trio-websocket's ``send_message`` would write it."""
    proto = ws._wsproto
    if isinstance(proto, wsframes.FastFrames) and proto.state is ConnectionState.OPEN:
        return wsframes.text_frame(text, client=proto.client)
    return proto.send(TextMessage(data=text))


class _Taker:
    """Stands in for trio-websocket's message queue (its reader ``send``s each message and
    ``aclose``s the queue on a close frame): each message goes straight to ``take``."""

    __slots__ = ("take", "queue", "failed")

    def __init__(self, take: Callable[[str], Awaitable[None]], queue) -> None:
        self.take = take
        self.queue = queue  # the real queue: closing it wakes pump() to say the socket closed
        self.failed: Exception | None = None  # raised by take: pump() raises it for its caller

    async def send(self, message: str | bytes) -> None:
        if self.failed is not None:
            return
        try:
            await self.take(_text(message))
        except Exception as exc:  # the caller's bug, not the reader's: it surfaces there
            self.failed = exc
            await self.queue.aclose()

    async def aclose(self) -> None:
        await self.queue.aclose()


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
        message = await self._receive()
        kind = message.get("type")
        if kind == "websocket.receive":
            if message.get("text") is not None:
                return message["text"]
            return (message.get("bytes") or b"").decode("utf-8", "replace")
        self.closed = True
        raise TransportClosed(_describe(message.get("code"), message.get("reason")))

    async def pump(self, take: Callable[[str], Awaitable[None]]) -> None:
        while True:
            await take(await self.receive())

    def write_now(self, text: str) -> bool | None:
        return None  # an ASGI server takes a message only by awaiting it

    def limit_messages(self, size: int, *, fragments: int | None = None) -> None:
        pass  # Hypercorn's limit is its configuration's, one for every socket

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
):
    """A client websocket to ``url``, with TLS errors reported as TLS errors.

    trio-websocket turns a failed TLS handshake into a silent wait and then a timeout; doing
    the TCP connect and the TLS handshake here first gives the operator the real reason
    ("certificate verify failed ...") and only then hands the stream to trio-websocket.
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
            stream = await trio.open_tcp_stream(host, port)
            if secure:
                first = _FirstBytes(stream)
                stream = trio.SSLStream(
                    first,
                    ssl_context or ssl.create_default_context(),
                    server_hostname=host,
                    https_compatible=True,
                )
                try:
                    await stream.do_handshake()
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
        # A refusal (an auth proxy's 401, a load balancer's 503) surfaces from trio-websocket's
        # reader task, so it is caught around the whole nursery, not only around the handshake.
        async with open_unwrapping_nursery() as nursery:
            try:
                with trio.fail_after(connect_timeout):
                    ws = await trio_websocket.wrap_client_stream(
                        nursery,
                        stream,
                        host_header,
                        resource,
                        extra_headers=extra_headers,
                        max_message_size=max_message_size,
                    )
            except trio.TooSlowError:
                await stream.aclose()
                raise PeerError(f"the websocket handshake with {host_header} timed out") from None
            try:
                yield ws
            finally:
                with trio.CancelScope(shield=True), trio.move_on_after(2):
                    await ws.aclose()
    except trio_websocket.HandshakeError as exc:
        if (
            isinstance(exc, trio_websocket.ConnectionRejected)
            and exc.status_code == 400
            and (exc.body or b"").startswith(SPEAKS_TLS.encode())
        ):
            raise WrongScheme(
                f"the server at {host_header} speaks TLS on this port: use {other}"
            ) from None
        raise PeerError(
            f"the websocket handshake with {host_header} failed: {describe(exc)}"
        ) from None


class _FirstBytes(trio.abc.Stream):
    """A TCP stream under TLS that keeps the first bytes the server sent: a handshake that
    fails on ``HTTP/…`` met a server that answered in plain text."""

    __slots__ = ("transport_stream", "received")

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.transport_stream = stream
        self.received = b""

    async def receive_some(self, max_bytes: int | None = None) -> bytes:
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
