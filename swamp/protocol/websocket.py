"""A websocket connection, owned here: a small trio shell over sans-IO cores.

wsproto (its public API: ``WSConnection`` and its events) does the handshake, both ends, and
every frame but the common one — close, ping, pong, binary and fragmented messages, anything
malformed; :mod:`swamp.protocol.wsframes` reads and writes that common one, a whole text
message in one frame, the four frames of every dispatch. This shell owns the rest: the
stream, the reading (in the task that receives — no reader task per socket), one write lock,
a write that does not wait (:meth:`WebSocket.write_now`), several messages in one write
(:meth:`WebSocket.send_many`), the message-size and fragment limits, and a close that drains.

The handshake is given exactly its own bytes (up to the blank line ending the head); what
came after them goes to the frame reader, which is therefore in front of wsproto from the
first frame on. A :class:`WebSocket` is a :class:`swamp.protocol.transport.Transport`.
"""

from __future__ import annotations

import math
import os
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import suppress

import trio
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Event,
    Ping,
    RejectConnection,
    RejectData,
    Request,
    TextMessage,
)
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import RemoteProtocolError

from swamp.errors import ChannelClosed
from swamp.protocol.wsframes import FastFrames, text_frame

RECEIVE_BYTES = 16 * 1024  # one read of the socket (and the most a read's messages queue up)
HEAD_LIMIT = 16 * 1024  # h11's own limit on a head
BODY_LIMIT = 64 * 1024  # of a refusal's body: the start says why
DRAIN_QUIET = 2.0
DRAIN_MAX = 10.0

_OPEN = ConnectionState.OPEN
_STREAM_ERRORS = (trio.BrokenResourceError, trio.ClosedResourceError, OSError)


class HandshakeError(Exception):
    """The websocket handshake did not complete. On a server, ``answer`` is the HTTP answer the
    request deserves (a 400, or a 426 naming the version spoken), or ``None``."""

    def __init__(self, message: str, *, answer: bytes | None = None) -> None:
        super().__init__(message)
        self.answer = answer


def _http_answer(status_code: int, headers: list[tuple[bytes, bytes]] | None = None) -> bytes:
    """A refusal with no body, and the connection closed after it."""
    lines = [b"HTTP/1.1 %d \r\n" % status_code]
    lines += [name + b": " + value + b"\r\n" for name, value in headers or ()]
    return b"".join([*lines, b"content-length: 0\r\nconnection: close\r\n\r\n"])


class Rejected(HandshakeError):
    """The server answered the upgrade with another HTTP status (and maybe a body)."""

    def __init__(self, status_code: int, headers: list[tuple[bytes, bytes]], body: bytes | None):
        super().__init__(f"the server answered HTTP {status_code}")
        self.status_code = status_code
        self.headers = headers
        self.body = body


class TransportClosed(ChannelClosed):
    """The socket is gone; ``message`` says why (close code and reason when known). Every
    :class:`~swamp.protocol.transport.Transport` raises it."""


def _transport_closed(message: str) -> Exception:
    return TransportClosed(message)


def describe_close(code: int | None, reason: str | None) -> str:
    if code in (None, 1000, 1005) and not reason:
        return "connection closed"
    text = f"connection closed (code {code}"
    return text + (f": {reason})" if reason else ")")


def close_reason(reason: str) -> str:
    """A close frame's reason is at most 123 bytes of UTF-8."""
    return reason.encode("utf-8")[:120].decode("utf-8", "ignore")


class WebSocket:
    """One open websocket over a trio stream (a client's, or one a listener accepted).

    Messages are read in the task that receives: :meth:`receive` queues what one read of the
    socket brought beyond its first message (bounded by :data:`RECEIVE_BYTES`); :meth:`pump`
    hands each to ``take`` as it is parsed, the queued ones first. Writes hold one lock; the
    rest of a :meth:`write_now` goes first with the next write.

    An accepted one is given ``idle`` (seconds since its socket last received anything):
    closing it then drains — after the close frame, what the peer still sends is dropped until
    it answers the close, goes quiet for :data:`DRAIN_QUIET` seconds, or :data:`DRAIN_MAX`
    seconds have passed — so a peer still busy sending is not cut off with a reset before it
    has read why it was closed."""

    __slots__ = (
        "stream",
        "client",
        "frames",
        "max_message_size",
        "idle",
        "_lock",
        "_inbox",
        "_parts",
        "_size",
        "_close",
        "_done",
        "_reading",
        "_read_waiter",
        "_stream_closed",
        "_rest",
        "_plain",
        "_plain_known",
        "_unread",
        "stop_at",
        "closed_by_peer",
    )

    def __init__(
        self,
        stream: trio.abc.Stream,
        connection: WSConnection,
        *,
        max_message_size: int,
        idle: Callable[[], float] | None = None,
        stop_at: Callable[[], float] | None = None,
        buffered: bytes = b"",
    ) -> None:
        self.stream = stream
        # when the server stops waiting for its connections (trio time): a drain ends by then
        self.stop_at = stop_at
        self.closed_by_peer = False  # a close frame came from the peer (a decision of its)
        self.client = connection.client
        self.frames = FastFrames(connection)
        self.max_message_size = max_message_size
        self.idle = idle
        self._lock = trio.Lock()  # one writer at a time: frames never interleave
        self._inbox: deque[str] = deque()  # read, not received yet
        self._parts: list[str | bytes | bytearray] = []  # of a message in several frames
        self._size = 0
        self._close: tuple[int, str | None] | None = None  # why no message is taken any more
        self._done = False  # nothing more to read: the peer's close came, or the stream ended
        self._reading = False  # a task is in the stream's receive_some
        self._read_waiter: trio.Event | None = None  # set when that read returns
        self._stream_closed = False
        self._rest = b""  # what the socket did not take of a write_now
        self._plain: trio.SocketStream | None = None  # found at the first write_now
        self._plain_known = False
        # bytes that came with the handshake: parsed before the first read of the stream (it
        # may bring nothing more: a close, or a message, right behind the 101, then EOF)
        self._unread = bool(buffered)
        if buffered:
            self.frames.receive_data(buffered)

    # -- what the peer sees ------------------------------------------------------------------

    @property
    def unflushed(self) -> bool:
        """Part of a message written by :meth:`write_now` still waits to be sent."""
        return bool(self._rest)

    def _why(self) -> str:
        if self._close is None:
            return describe_close(1006, None)
        return describe_close(*self._close)

    def _plain_stream(self) -> trio.SocketStream | None:
        """The TCP stream the websocket's bytes go to unchanged, if there is one: not under
        TLS (bytes are encrypted on the way)."""
        if not self._plain_known:
            stream: object = self.stream
            while stream is not None and not isinstance(stream, trio.SocketStream):
                stream = getattr(stream, "plain_stream", None)  # a wrapper that adds nothing
            self._plain = stream if isinstance(stream, trio.SocketStream) else None
            self._plain_known = True
        return self._plain

    def write_now(self, text: str) -> bool | None:
        """Write one message straight to the socket without waiting: ``True`` when all of it
        went, ``False`` when part did (the rest goes first with the next write), ``None`` when
        nothing was written — another send holds the socket, part of a message is still
        unsent, the socket is TLS or is closing."""
        if self._rest or self._close is not None or self._lock.locked():
            return None
        stream = self._plain_stream()
        if stream is None:
            return None
        fd = stream.socket.fileno()
        if fd < 0:
            return None
        data = text_frame(text, client=self.client)
        try:
            sent = os.write(fd, data)
        except OSError:  # no room (BlockingIOError), or the socket is gone: the next send says
            sent = 0
        if sent < len(data):
            self._rest = data[sent:]
            return False
        return True

    def limit_messages(self, size: int, *, fragments: int | None = None) -> None:
        """From now on a message longer than ``size``, or in more than ``fragments`` frames
        (``None``: any number), closes the socket (code 1009)."""
        self.max_message_size = size
        self.frames.max_fragments = fragments

    async def send(self, text: str) -> None:
        if self._close is not None:
            raise _transport_closed(self._why())
        await self._write(text_frame(text, client=self.client))

    async def send_many(self, texts: list[str]) -> None:
        """Several messages in one write to the socket, in order: one system call (and one
        wake-up of the peer) instead of one each. The rest of a :meth:`write_now` goes first
        (``texts`` may be empty)."""
        if self._close is not None:
            raise _transport_closed(self._why())
        client = self.client
        await self._write(b"".join([text_frame(text, client=client) for text in texts]))

    async def _write(self, data: bytes) -> None:
        async with self._lock:
            if self._rest:
                data, self._rest = self._rest + data, b""
            try:
                await self.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self._abort()
                raise _transport_closed(self._why()) from None
            except OSError as exc:
                self._abort()
                raise _transport_closed(f"connection lost: {exc}") from None

    async def _send_event(self, event: Event) -> None:
        """A control frame (a pong, a close): best effort, the stream may be gone."""
        if self.frames.state is not _OPEN and not isinstance(event, CloseConnection):
            return
        with suppress(Exception):
            await self._write(self.frames.send(event))

    def _abort(self) -> None:
        if self._close is None:
            self._close = (1006, None)
        self._done = True

    # -- reading -----------------------------------------------------------------------------

    async def _read(self) -> bool:
        """Read once from the stream into the frame reader; ``False`` when the stream ended."""
        if self._unread:  # what came with the handshake is in the reader already
            self._unread = False
            return True
        if self._reading:
            raise trio.BusyResourceError("another task is receiving from this websocket")
        self._reading = True
        try:
            data = await self.stream.receive_some(RECEIVE_BYTES)
        except _STREAM_ERRORS:
            data = b""
        finally:
            self._reading = False
            if self._read_waiter is not None:
                self._read_waiter.set()
                self._read_waiter = None
        if not data:
            self._abort()
            return False
        self.frames.receive_data(data)
        return True

    async def receive(self) -> str:
        inbox = self._inbox
        while not inbox:
            if self._close is not None:
                raise _transport_closed(self._why())
            if await self._read():
                await self._handle(inbox.append)
        return inbox.popleft()

    async def pump(self, take: Callable[[str], Awaitable[None]]) -> None:
        """Hand every message to ``take``, in order, as it is parsed — in this task, with no
        queue between — until the socket closes (then raise ``TransportClosed``). Messages
        read before (by :meth:`receive`) go first. What ``take`` raises ends the pump and is
        raised here."""
        inbox = self._inbox
        while inbox:
            await take(inbox.popleft())
        frames = self.frames
        while self._close is None:
            if not await self._read():
                break
            for event in frames.events():
                if (
                    type(event) is TextMessage
                    and event.message_finished
                    and not self._parts
                    and len(event.data) <= self.max_message_size
                ):
                    if self._close is None:
                        await take(event.data)
                else:
                    await self._event(event, take)
        while inbox:  # what came with the peer's close
            await take(inbox.popleft())
        raise _transport_closed(self._why())

    async def _handle(self, deliver: Callable[[str], object]) -> None:
        for event in self.frames.events():
            await self._event(event, deliver)

    async def _event(self, event: Event, deliver: Callable[[str], object]) -> None:
        """Everything but a whole small text message (and those too, from :meth:`receive`)."""
        if isinstance(event, (TextMessage, BytesMessage)):
            if self._close is not None:
                return  # closing: what still comes is dropped
            self._size += len(event.data)
            self._parts.append(event.data)
            if self._size > self.max_message_size:
                reason = f"Exceeded maximum message size: {self.max_message_size} bytes"
                self._parts, self._size = [], 0
                self._close = (1009, reason)
                await self._send_event(CloseConnection(code=1009, reason=reason))
            elif event.message_finished:
                parts, self._parts, self._size = self._parts, [], 0
                if isinstance(event, TextMessage):
                    message = "".join(parts)  # type: ignore[arg-type]
                else:
                    message = _text(b"".join(parts))  # type: ignore[arg-type]
                result = deliver(message)
                if isinstance(result, Awaitable):
                    await result
        elif isinstance(event, CloseConnection):
            # (1006 is never sent: it stands for a connection that ended without a close frame)
            self.closed_by_peer = event.code != CloseReason.ABNORMAL_CLOSURE
            if self.frames.state is ConnectionState.REMOTE_CLOSING:
                self._close = (int(event.code), event.reason or None)
                await self._send_event(event.response())
            self._close = (int(event.code), event.reason or None)
            self._done = True
            if not self.client:  # a server closes the TCP connection at once (RFC 6455 §7.1.1)
                await self._close_stream()
        elif isinstance(event, Ping):
            await self._send_event(event.response())
        # a pong answers nothing we asked

    # -- closing -----------------------------------------------------------------------------

    async def aclose(self, code: int = 1000, reason: str = "") -> None:
        with trio.CancelScope(shield=True):
            if self._rest:  # a message cut in two would garble the close frame behind it
                with trio.move_on_after(2), suppress(Exception):
                    await self._write(b"")
            try:
                if self.idle is None:
                    with trio.move_on_after(2):
                        await self._close_handshake(code, reason)
                    return
                with trio.move_on_after(DRAIN_MAX):
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(
                            self._give_up_when_quiet, nursery.cancel_scope, trio.current_time()
                        )
                        await self._close_handshake(code, reason)
                        nursery.cancel_scope.cancel()
            finally:
                with trio.move_on_after(2):
                    await self._close_stream()

    async def _close_handshake(self, code: int, reason: str) -> None:
        """Send the close frame (unless one went already), then read and drop what the peer
        still sends until its close comes or the stream ends."""
        if self._stream_closed:
            return
        if self._close is None and self.frames.state is _OPEN:
            self._close = (1000, None)
            self._inbox.clear()
            await self._send_event(CloseConnection(code=code, reason=close_reason(reason)))
        while not self._done and not self._stream_closed:
            if self._reading:  # another task reads: its read ends, then this one goes on
                waiter = self._read_waiter = trio.Event()
                await waiter.wait()
                continue
            if await self._read():
                await self._handle(_drop)

    async def _give_up_when_quiet(self, scope: trio.CancelScope, since: float) -> None:
        """Quiet is counted from the close at the earliest: a peer that had been quiet for
        longer before it must still get the close frame (and its reason), and time to answer.
        Counted from its last frame alone, the wait could end before the close frame went
        out — and the peer saw the socket cut with no reason."""
        assert self.idle is not None
        # the idle clock moves with every byte read; no event says "quiet", so it is looked at
        # again when the quiet it last saw would have run out
        # (and a server that stops waits for its connections only so long: ``stop_at``)
        stop_at = self.stop_at or (lambda: math.inf)
        while (quiet := min(self.idle(), trio.current_time() - since)) < DRAIN_QUIET:
            left = stop_at() - trio.current_time()
            if left <= 0:
                break
            await trio.sleep(min(DRAIN_QUIET - quiet, left))
        scope.cancel()

    async def _close_stream(self) -> None:
        if self._stream_closed:
            return
        self._stream_closed = True
        self._done = True
        if self._close is None:
            self._close = (1006, None)
        with suppress(*_STREAM_ERRORS):
            await self.stream.aclose()


def _drop(message: str) -> None:
    """What arrives after this end's close frame: nobody takes it."""


def _text(message: str | bytes | bytearray) -> str:
    return message if isinstance(message, str) else message.decode("utf-8", "replace")


# -- the handshake -----------------------------------------------------------------------------


async def _read_head(stream: trio.abc.Stream, buffered: bytearray) -> int:
    """Read until ``buffered`` holds a whole head; where the head ends (after its blank
    line)."""
    while (end := buffered.find(b"\r\n\r\n")) < 0:
        if len(buffered) >= HEAD_LIMIT:
            raise HandshakeError("the answer to the upgrade has a head too long")
        try:
            data = await stream.receive_some(RECEIVE_BYTES)
        except _STREAM_ERRORS as exc:
            raise HandshakeError(f"the connection failed: {exc}") from None
        if not data:
            raise HandshakeError("the connection closed before the upgrade was answered")
        buffered += data
    return end + 4


async def connect(
    stream: trio.abc.Stream,
    host: str,
    resource: str,
    *,
    extra_headers: list[tuple[bytes, bytes]] | None = None,
    max_message_size: int,
) -> WebSocket:
    """The client's handshake on ``stream``: the open websocket, or :class:`Rejected` (the
    status, headers and body the server answered) or :class:`HandshakeError`."""
    connection = WSConnection(ConnectionType.CLIENT)
    request = Request(host=host, target=resource, extra_headers=extra_headers or [])
    try:
        await stream.send_all(connection.send(request))
    except _STREAM_ERRORS as exc:
        raise HandshakeError(f"the connection failed: {exc}") from None
    buffered = bytearray()
    end = await _read_head(stream, buffered)
    try:
        connection.receive_data(bytes(buffered[:end]))
        events = list(connection.events())
    except (RemoteProtocolError, UnicodeError) as exc:
        raise HandshakeError(f"the answer to the upgrade is not valid: {exc}") from None
    for event in events:
        if isinstance(event, AcceptConnection):
            return WebSocket(
                stream,
                connection,
                max_message_size=max_message_size,
                buffered=bytes(buffered[end:]),
            )
        if isinstance(event, RejectConnection):
            body = None
            if event.has_body:
                body = await _rejection_body(stream, connection, bytes(buffered[end:]))
            raise Rejected(event.status_code, list(event.headers), body)
    raise HandshakeError("the upgrade was answered with something else")


async def _rejection_body(
    stream: trio.abc.Stream, connection: WSConnection, data: bytes | bytearray
) -> bytes:
    body = bytearray()
    ended = False  # the stream said EOF: the body is what came
    while True:
        try:
            # wsproto takes empty data as the end of the stream: only a read that returned
            # nothing is (none of the body may have come with the head)
            if ended or data:
                connection.receive_data(None if ended else bytes(data))
            for event in connection.events():
                if isinstance(event, RejectData):
                    body += event.data
                    if event.body_finished:
                        return bytes(body)
        except RemoteProtocolError:
            return bytes(body)
        if ended or len(body) >= BODY_LIMIT:
            return bytes(body)
        try:
            data = await stream.receive_some(RECEIVE_BYTES)
        except _STREAM_ERRORS:
            data = b""
        ended = not data


class Handshake:
    """A server's side of an upgrade whose request head was read: :meth:`accept` or
    :meth:`reject` it. ``head`` is exactly the request head; bytes after it are the stream's."""

    __slots__ = ("stream", "connection", "request", "max_message_size", "idle", "stop_at")

    def __init__(
        self,
        stream: trio.abc.Stream,
        head: bytes,
        *,
        max_message_size: int,
        idle: Callable[[], float] | None = None,
        stop_at: Callable[[], float] | None = None,
    ) -> None:
        self.stream = stream
        self.connection = WSConnection(ConnectionType.SERVER)
        self.max_message_size = max_message_size
        self.idle = idle
        self.stop_at = stop_at
        try:
            self.connection.receive_data(head)
            requests = [e for e in self.connection.events() if isinstance(e, Request)]
        except RemoteProtocolError as exc:
            hint = exc.event_hint
            answer = (
                _http_answer(hint.status_code, list(hint.headers))
                if isinstance(hint, RejectConnection)
                else _http_answer(400)
            )
            raise HandshakeError(f"not a websocket upgrade: {exc}", answer=answer) from None
        except UnicodeError as exc:  # a header wsproto cannot decode (IDNA, non-ASCII)
            raise HandshakeError(
                f"not a websocket upgrade: {exc}", answer=_http_answer(400)
            ) from None
        if not requests:
            raise HandshakeError("not a websocket upgrade")
        self.request = requests[0]

    async def accept(self) -> WebSocket:
        try:
            await self.stream.send_all(self.connection.send(AcceptConnection()))
        except _STREAM_ERRORS as exc:
            raise _transport_closed(f"connection lost: {exc}") from None
        return WebSocket(
            self.stream,
            self.connection,
            max_message_size=self.max_message_size,
            idle=self.idle,
            stop_at=self.stop_at,
        )

    async def reject(
        self,
        status_code: int,
        *,
        extra_headers: list[tuple[bytes, bytes]] | None = None,
        body: bytes = b"",
    ) -> None:
        """Answer with ``status_code`` (and ``body``); a peer already gone is not an error."""
        headers = list(extra_headers or [])
        if body:
            headers.append((b"content-length", str(len(body)).encode("ascii")))
        data = self.connection.send(
            RejectConnection(status_code=status_code, headers=headers, has_body=bool(body))
        )
        if body:
            data += self.connection.send(RejectData(data=body))
        with suppress(*_STREAM_ERRORS):
            await self.stream.send_all(data)
