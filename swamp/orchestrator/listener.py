"""One port, two servers: a websocket upgrade is ours (:mod:`swamp.protocol.websocket`), anything
else goes to Hypercorn.

Every dispatch crosses the control plane four times (client → orchestrator → worker → back), so
its websocket path is the hot one. Measured with ``python3 build.py bench --floors``, the same
hop behind Hypercorn's ASGI websockets reaches about 0.7 of the floor's throughput, behind our
own websocket all of it; an idle socket also costs less there (no reader task of its own).
HTTP — downloads, the data plane, ``/metrics`` — stays with Hypercorn, on the same port: users
and firewalls see one address.

Who serves a new connection is decided from its first request head, read here (bounded in size
and time) and then handed on, unread, with the rest of the stream. Only a complete, well-formed
websocket upgrade is answered here; anything else — an HTTP request, a malformed or
oversized head, an HTTP/2 preface — goes to Hypercorn exactly as it arrived, and Hypercorn
answers it as it always did (a later upgrade on a kept-alive HTTP connection too).

Before either, the first byte says whether the peer speaks the port's scheme. A ``ws://`` or
``http://`` client on a TLS port (or a ``wss://`` one on a plain port) would otherwise wait for
an answer it can never read — a websocket client until its own timeout, ten seconds — so
it gets a plain-text HTTP 400 at once naming the scheme to use, and the connection is closed.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from functools import partial

import trio

from swamp.protocol.transport import SPEAKS_PLAIN, SPEAKS_TLS, TransportClosed
from swamp.protocol.websocket import Handshake, HandshakeError

log = logging.getLogger("swamp.listener")

HEAD_LIMIT = 16 * 1024  # h11's own limit on a request head
HEAD_TIMEOUT = 10.0  # the TLS handshake and the first request head, together
SINGLE = frozenset({"host", "origin", "authorization"})  # what the policy and auth read
TLS_HANDSHAKE = 0x16  # the content type of the record every TLS client starts with


def upgrade_headers(head: bytes) -> dict[str, str] | None:
    """The headers (lowercase names to their first values) of ``head``, a complete HTTP/1.1
    request head, if it asks for a websocket with every header the handshake needs; ``None``
    otherwise (Hypercorn's to answer). The request policy is checked on these, the exact bytes
    the peer sent: the websocket library keeps some headers (``Host``) to itself."""
    lines = head.decode("latin-1").split("\r\n")
    request_line = lines[0].split(" ")
    if len(request_line) != 3 or request_line[0] != "GET" or request_line[2] != "HTTP/1.1":
        return None
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if not line:
            break
        name, sep, value = line.partition(":")
        name = name.lower()
        if not sep or not name or name != name.strip() or (name in headers and name in SINGLE):
            return None  # malformed or ambiguous: Hypercorn (h11) says how
        headers.setdefault(name, value.strip(" \t"))

    def tokens(name: str) -> set[str]:
        return {t.strip().lower() for t in headers.get(name, "").split(",")}

    if (
        "websocket" in tokens("upgrade")
        and "upgrade" in tokens("connection")
        and headers.get("host")
        and headers.get("sec-websocket-key")
        and headers.get("sec-websocket-version") == "13"
    ):
        return headers
    return None


async def read_head(stream: trio.abc.Stream) -> bytes:
    """What the peer sent until the end of its first request head (``\\r\\n\\r\\n``), the limit,
    or the end of the stream — whichever comes first. The caller bounds the time."""
    buffered = bytearray()
    while b"\r\n\r\n" not in buffered and len(buffered) < HEAD_LIMIT:
        data = await stream.receive_some(HEAD_LIMIT - len(buffered))
        if not data:
            break
        buffered += data
    return bytes(buffered)


async def read_tls_record(stream: trio.abc.Stream) -> None:
    """Read (and drop) the first TLS record the peer sent: its ClientHello. Closing a socket
    with unread bytes resets it, and the peer would never read the answer."""
    buffered = bytearray()
    wanted = 5  # the record header: type, version, length
    while len(buffered) < min(wanted, HEAD_LIMIT):
        data = await stream.receive_some(HEAD_LIMIT - len(buffered))
        if not data:
            return
        buffered += data
        if len(buffered) >= 5:
            wanted = 5 + int.from_bytes(buffered[3:5], "big")


def wrong_scheme_answer(message: str) -> bytes:
    """A plain-text HTTP 400 that closes the connection: readable by curl, a browser, and by a
    TLS client's error (``open_websocket`` recognizes it)."""
    body = f"{message}\n".encode()
    head = (
        "HTTP/1.1 400 Bad Request\r\n"
        "Content-Type: text/plain; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


async def refuse_wrong_scheme(stream: trio.SocketStream, *, secure: bool) -> bool:
    """Whether the peer was answered already (the caller then closes): it sent nothing at all,
    or it speaks the other scheme and was told which one to use. Looks at the first byte
    without taking it, so a peer that speaks the port's scheme reads on unchanged."""
    first = await stream.socket.recv(1, socket.MSG_PEEK)
    if not first:
        return True
    if (first[0] == TLS_HANDSHAKE) == secure:
        return False
    if secure:  # plain text on a TLS port: read its request head, then answer in plain text
        await read_head(stream)
        await stream.send_all(wrong_scheme_answer(SPEAKS_TLS))
    else:  # a TLS handshake on a plain port: its client will read the answer as not TLS
        await read_tls_record(stream)
        await stream.send_all(wrong_scheme_answer(SPEAKS_PLAIN))
    return True


class Prefaced(trio.abc.HalfCloseableStream):
    """The accepted stream with the bytes already read from it put back in front.

    Everything else (``socket``, ``transport_stream``, ``do_handshake``...) is the wrapped
    stream's, so Hypercorn sees the socket, or the TLS stream, it would have seen."""

    __slots__ = ("_stream", "_preface", "_last_received")

    def __init__(self, stream: trio.abc.Stream, preface: bytes) -> None:
        self._stream = stream
        self._preface = preface
        self._last_received = trio.current_time()

    @property
    def plain_stream(self) -> trio.abc.Stream:
        """What this passes written bytes to unchanged (a write may go straight to it)."""
        return self._stream

    def idle(self) -> float:
        """Seconds since the peer last sent anything (how a close knows it has gone quiet)."""
        return trio.current_time() - self._last_received

    def __getattr__(self, name: str):
        if name.startswith("_"):  # our own slots are never the wrapped stream's
            raise AttributeError(name)
        return getattr(self._stream, name)

    async def receive_some(self, max_bytes: int | None = None) -> bytes | bytearray:
        if self._preface:
            await trio.lowlevel.checkpoint()
            size = len(self._preface) if max_bytes is None else max_bytes
            preface, self._preface = self._preface[:size], self._preface[size:]
            return preface
        data = await self._stream.receive_some(max_bytes)
        self._last_received = trio.current_time()
        return data

    async def send_all(self, data) -> None:
        await self._stream.send_all(data)

    async def wait_send_all_might_not_block(self) -> None:
        await self._stream.wait_send_all_might_not_block()

    async def send_eof(self) -> None:
        if not isinstance(self._stream, trio.abc.HalfCloseableStream):
            raise AttributeError("send_eof")  # TLS cannot half-close, as Hypercorn expects
        await self._stream.send_eof()

    async def aclose(self) -> None:
        await self._stream.aclose()


def peer_of(stream: trio.abc.Stream) -> str:
    socket = getattr(stream, "socket", None)
    if socket is None:  # a TLS stream: the socket is its transport's
        socket = getattr(stream, "transport_stream", stream).socket  # type: ignore[union-attr]
    try:
        host, port, *_ = socket.getpeername()
    except OSError:
        return "?:0"
    return f"{host}:{port}"


@dataclass
class Upgrade:
    """A websocket upgrade, for the app to accept or reject."""

    request: Handshake  # accept() it (the open websocket) or reject() it
    headers: dict[str, str]  # as the peer sent them, lowercase names, first values
    peer: str  # host:port
    idle: Callable[[], float]  # seconds since the peer last sent anything (a draining close)


async def serve(
    app,
    websocket: Callable[[Upgrade], Awaitable[Callable[[], Awaitable[None]] | None]],
    config,
    *,
    max_message_size: int,
    shutdown_trigger: Callable[[], Awaitable[None]],
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Listen on ``config.bind`` until ``shutdown_trigger`` returns; then stop accepting and
    give open connections ``config.graceful_timeout`` seconds before they are cancelled.

    ``app`` is the ASGI app Hypercorn serves; ``websocket(upgrade)`` gets each upgrade, accepts
    or rejects it, and returns what then serves the socket (``None`` if nothing does).
    Binding errors (``OSError``) are raised before anything starts."""
    from hypercorn.statsd import StatsdLogger
    from hypercorn.trio.tcp_server import TCPServer
    from hypercorn.trio.worker_context import WorkerContext
    from hypercorn.typing import ConnectionState
    from hypercorn.utils import repr_socket_addr, wrap_app

    config.set_statsd_logger_class(StatsdLogger)
    asgi = wrap_app(app, config.wsgi_max_body_size, "asgi")
    context = WorkerContext(None)
    ssl_context = config.create_ssl_context()
    sockets = config.create_sockets()
    bound = [(s, True) for s in sockets.secure_sockets] + [
        (s, False) for s in sockets.insecure_sockets
    ]
    binds = []
    listeners = []
    for sock, secure in bound:
        sock.listen(config.backlog)
        listeners.append(trio.SocketListener(trio.socket.from_stdlib_socket(sock)))
        address = repr_socket_addr(sock.family, sock.getsockname())
        binds.append(f"{'https' if secure else 'http'}://{address}")

    async def handle(stream: trio.SocketStream) -> None:
        peer = peer_of(stream)
        try:
            served: trio.abc.Stream = stream
            if ssl_context is not None:
                served = trio.SSLStream(
                    stream, ssl_context, server_side=True, https_compatible=True
                )
            with trio.move_on_after(HEAD_TIMEOUT) as waited:
                try:
                    if await refuse_wrong_scheme(stream, secure=ssl_context is not None):
                        return  # told to use the other scheme, or gone without a word
                    head = await read_head(served)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                    return  # a failed TLS handshake, or gone before it said anything
            if waited.cancelled_caught:
                return
            end = head.find(b"\r\n\r\n")
            headers = upgrade_headers(head[: end + 4]) if end >= 0 else None
            if headers is None:
                prefaced = Prefaced(served, head)
                del head  # this frame lives as long as the socket; the head need not
                # Hypercorn reads and writes any trio stream; its annotation names only one
                server = TCPServer(asgi, config, context, ConnectionState({}), prefaced)  # type: ignore[arg-type]
                await server.run()
                return
            # the handshake gets its head; what came after it is the websocket's first frames
            prefaced = Prefaced(served, head[end + 4 :])
            run = await _upgrade(prefaced, head[: end + 4], headers, peer)
            del head, headers
            if run is not None:
                await run()
        except Exception:  # the orchestrator never dies of what one peer did
            log.exception("a connection from %s failed", peer)
        finally:
            await trio.aclose_forcefully(stream)

    async def _upgrade(prefaced: Prefaced, head: bytes, headers: dict, peer: str):
        """The handshake, and the app's answer to it: what serves the socket from now on, or
        ``None``. Its own frame, so that what the handshake needed goes when it is done."""
        with trio.move_on_after(HEAD_TIMEOUT):  # the handshake is answered at once, or never
            try:
                request = Handshake(
                    prefaced,
                    head,
                    max_message_size=max_message_size,
                    idle=prefaced.idle,
                    stop_at=stop_at,
                )
                return await websocket(Upgrade(request, headers, peer, prefaced.idle))
            except HandshakeError as exc:
                if exc.answer is not None:  # the peer learns why (400, or 426 and the version)
                    with suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                        await prefaced.send_all(exc.answer)
            except TransportClosed:
                pass
        return None

    def stop_at() -> float:
        """When open connections stop being waited for: a closing websocket's drain ends then."""
        return connections.cancel_scope.deadline

    async with trio.open_nursery() as connections:
        async with trio.open_nursery() as accepting:
            accepting.start_soon(
                partial(trio.serve_listeners, handle, listeners, handler_nursery=connections)
            )
            task_status.started(binds)
            await shutdown_trigger()
            accepting.cancel_scope.cancel()
        await context.terminated.set()  # kept-alive HTTP connections close now
        connections.cancel_scope.deadline = trio.current_time() + config.graceful_timeout
