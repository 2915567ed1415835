"""The owned websocket against a hostile or unusual peer, in memory: what a server sends in the
same read as its 101, undecodable handshake headers (either side), a refusal whose body comes
in a later read, duplicate headers a server answers, and a trickling peer that must not hold a
stopping server's close for longer than the server waits."""

from __future__ import annotations

import base64
import hashlib
import math
import struct

import pytest
import trio
import trio.testing

from swamp.protocol.websocket import Handshake, HandshakeError, TransportClosed, connect

GUID = b"258EAFA5-E914-47DA-95CA-C5AB0DC85B11"


def _answer(request: bytes, *extra: bytes) -> bytes:
    key = next(
        line.split(b":", 1)[1].strip()
        for line in request.split(b"\r\n")
        if line.lower().startswith(b"sec-websocket-key:")
    )
    accept = base64.b64encode(hashlib.sha1(key + GUID).digest())
    lines = [
        b"HTTP/1.1 101 Switching Protocols",
        b"Upgrade: websocket",
        b"Connection: Upgrade",
        b"Sec-WebSocket-Accept: " + accept,
        *extra,
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def _server_frame(opcode: int, payload: bytes) -> bytes:
    assert len(payload) < 126
    return bytes((0x80 | opcode, len(payload))) + payload


async def _request(stream: trio.abc.Stream) -> bytes:
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    return data


async def _client_against(answer) -> tuple[list[str], BaseException | None]:
    """Our client's pump against a server that writes ``answer(request)`` (the 101 head and
    whatever follows it, in ONE write), then ends its stream."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    taken: list[str] = []
    raised: BaseException | None = None

    async def server():
        request = await _request(server_stream)
        await server_stream.send_all(answer(request))
        await server_stream.aclose()

    async def take(message: str) -> None:
        taken.append(message)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server)
        with trio.fail_after(5):
            ws = await connect(client_stream, "example", "/", max_message_size=65536)
            try:
                await ws.pump(take)
            except TransportClosed as exc:
                raised = exc
    return taken, raised


# -- finding 1 (regression): what came in the same read as the 101 is never parsed ---------


async def test_a_message_that_came_with_the_101_is_delivered():
    taken, raised = await _client_against(
        lambda request: _answer(request) + _server_frame(1, b'{"type":"hello"}')
    )
    assert taken == ['{"type":"hello"}']


async def test_a_close_that_came_with_the_101_keeps_its_code_and_reason():
    taken, raised = await _client_against(
        lambda request: (
            _answer(request) + _server_frame(8, struct.pack("!H", 1008) + b"too many pending")
        )
    )
    assert raised is not None and "1008: too many pending" in str(raised), raised


# -- finding 2 (not new): a peer's bytes make wsproto raise something other than its errors --


@pytest.mark.parametrize(
    "header",
    [
        b"Host: xn--zz",  # not IDNA: UnicodeError from wsproto's host.decode("idna")
        b"Sec-WebSocket-Extensions: \xff",  # UnicodeDecodeError from split_comma_header
        b"Sec-WebSocket-Protocol: \xff",
    ],
)
def test_a_server_handshake_with_undecodable_headers_is_a_handshake_error(header):
    lines = [
        b"GET / HTTP/1.1",
        b"Host: example",
        b"Upgrade: websocket",
        b"Connection: Upgrade",
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        b"Sec-WebSocket-Version: 13",
    ]
    if header.startswith(b"Host:"):
        lines[1] = header
    else:
        lines.append(header)
    head = b"\r\n".join(lines) + b"\r\n\r\n"
    stream, _ = trio.testing.memory_stream_pair()
    with pytest.raises(HandshakeError) as refused:
        Handshake(stream, head, max_message_size=65536)
    assert refused.value.answer is not None and refused.value.answer.startswith(b"HTTP/1.1 400 ")


@pytest.mark.parametrize(
    "extra", [b"Sec-WebSocket-Protocol: \xff", b"Sec-WebSocket-Extensions: \xff"]
)
async def test_a_client_handshake_with_undecodable_headers_is_a_handshake_error(extra):
    client_stream, server_stream = trio.testing.memory_stream_pair()

    async def server():
        await server_stream.send_all(_answer(await _request(server_stream), extra))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server)
        with pytest.raises(HandshakeError):
            await connect(client_stream, "example", "/", max_message_size=65536)


# -- finding 3 (regression): a refusal's body is dropped unless it came with the head ---------


async def test_a_refusal_body_in_a_later_segment_is_read():
    from swamp.protocol.websocket import Rejected

    client_stream, server_stream = trio.testing.memory_stream_pair()
    body = b'{"error": {"code": "forbidden", "message": "Origin not allowed"}}'

    async def server():
        await _request(server_stream)
        await server_stream.send_all(
            b"HTTP/1.1 403 Forbidden\r\ncontent-type: application/json\r\n"
            b"content-length: %d\r\n\r\n" % len(body)
        )
        await trio.sleep(0.05)  # the body in a later segment (a proxy, TLS records, a network)
        await server_stream.send_all(body)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(server)
        with pytest.raises(Rejected) as refused:
            await connect(client_stream, "example", "/", max_message_size=65536)
    assert refused.value.body == body


# -- a server answers what it refuses: the version it speaks, or a 400 -------------------------


def _upgrade_head(*extra: bytes) -> bytes:
    lines = [
        b"GET / HTTP/1.1",
        b"Host: example",
        b"Upgrade: websocket",
        b"Connection: Upgrade",
        b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
        b"Sec-WebSocket-Version: 13",
        *extra,
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n"


def test_a_second_version_header_is_answered_426_with_the_version_spoken():
    stream, _ = trio.testing.memory_stream_pair()
    with pytest.raises(HandshakeError) as refused:
        Handshake(stream, _upgrade_head(b"Sec-WebSocket-Version: 8"), max_message_size=65536)
    answer = refused.value.answer or b""
    assert answer.startswith(b"HTTP/1.1 426 "), answer
    assert b"Sec-WebSocket-Version: 13\r\n" in answer and answer.endswith(b"\r\n\r\n")


# -- a stopping server waits for a closing socket's drain only as long as for its connections ---


async def test_a_trickling_peer_holds_a_close_only_until_the_server_stops_waiting(autojump_clock):
    server_stream, client_stream = trio.testing.memory_stream_pair()
    stop = [math.inf]  # when the server stops waiting for its connections
    started = trio.current_time()
    handshake_head = _upgrade_head()
    request = Handshake(
        server_stream,
        handshake_head,
        max_message_size=65536,
        idle=lambda: 0.0,  # it never goes quiet
        stop_at=lambda: stop[0],
    )
    ws = await request.accept()

    async def trickle():
        with trio.move_on_after(60):
            while True:  # one byte of a frame that never ends, every half second
                await client_stream.send_all(b"\x81")
                await trio.sleep(0.5)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(trickle)
        stop[0] = started + 3.0
        await ws.aclose(1001, "going away")
        closed_after = trio.current_time() - started
        nursery.cancel_scope.cancel()
    assert 3.0 <= closed_after < 3.0 + 2.0  # by the server's deadline (within one look), not 10 s
