"""The Transport contract, one set of tests for every implementation (as trio's
``check_two_way_stream`` is for streams): our websocket over a real loopback TCP socket and over
a trio memory stream pair (each end in turn the client and the server), the ASGI adapter over an
ASGI server's messages, and the in-memory pair the RPC tests run on.

Each test gets a pair: ``a`` and ``b``, two ends of one connection."""

from __future__ import annotations

import math
import struct
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import pytest
import trio
import trio.testing

from swamp.orchestrator.listener import Prefaced, read_head
from swamp.protocol.transport import AsgiTransport, Transport, TransportClosed
from swamp.protocol.websocket import Handshake, WebSocket, connect
from tests.memory_transport import pair as memory_pair

LIMIT = 1 << 20


@dataclass
class Pair:
    a: Transport
    b: Transport
    plain: bool = False  # a writes to a plain TCP socket: write_now can write
    # a's end writes one message to b in these frames (raw): only where there are frames
    fragments_to_b: Callable[[list[str]], Awaitable[None]] | None = None


def _frame(opcode: int, payload: bytes, *, fin: bool, masked: bool) -> bytes:
    n = len(payload)
    first = (0x80 if fin else 0) | opcode
    flag = 0x80 if masked else 0
    head = bytes((first, flag | n)) if n < 126 else struct.pack("!BBH", first, flag | 126, n)
    if not masked:
        return head + payload
    key = b"\x01\x02\x03\x04"
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def _raw_fragments(end: WebSocket) -> Callable[[list[str]], Awaitable[None]]:
    async def send(parts: list[str]) -> None:
        data = b"".join(
            _frame(0 if i else 1, part.encode(), fin=i == len(parts) - 1, masked=end.client)
            for i, part in enumerate(parts)
        )
        await end.stream.send_all(data)

    return send


async def _server_end(stream: trio.abc.Stream) -> WebSocket:
    """What the listener does with an upgrade: the head to the handshake, the rest after."""
    head = await read_head(stream)
    end = head.find(b"\r\n\r\n") + 4
    prefaced = Prefaced(stream, head[end:])
    handshake = Handshake(prefaced, head[:end], max_message_size=LIMIT, idle=prefaced.idle)
    return await handshake.accept()


async def _websocket_ends(
    client_stream: trio.abc.Stream, server_stream_of: Callable[[], Awaitable[trio.abc.Stream]]
) -> tuple[WebSocket, WebSocket]:
    ends: dict[str, WebSocket] = {}

    async def serve() -> None:
        ends["server"] = await _server_end(await server_stream_of())

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        ends["client"] = await connect(client_stream, "example", "/", max_message_size=LIMIT)
    return ends["client"], ends["server"]


async def _tcp() -> tuple[WebSocket, WebSocket]:
    [listener] = await trio.open_tcp_listeners(0, host="127.0.0.1")
    port = listener.socket.getsockname()[1]
    try:
        return await _websocket_ends(await trio.open_tcp_stream("127.0.0.1", port), listener.accept)
    finally:
        await listener.aclose()


async def _memory_streams() -> tuple[WebSocket, WebSocket]:
    one, other = trio.testing.memory_stream_pair()

    async def other_end() -> trio.abc.Stream:
        return other

    return await _websocket_ends(one, other_end)


def _asgi() -> tuple[AsgiTransport, AsgiTransport]:
    """Two ASGI apps' websockets joined by a server that passes messages on, and whose far
    end answers a close at once (as a websocket client does)."""
    a_tx, a_rx = trio.open_memory_channel[dict](math.inf)
    b_tx, b_rx = trio.open_memory_channel[dict](math.inf)

    def sender(own, peer):
        async def send(message: dict) -> None:
            if message["type"] == "websocket.send":
                peer.send_nowait(
                    {"type": "websocket.receive", "text": message.get("text"), "bytes": None}
                )
            elif message["type"] == "websocket.close":
                code, reason = message.get("code", 1000), message.get("reason", "")
                peer.send_nowait({"type": "websocket.disconnect", "code": code, "reason": reason})
                own.send_nowait({"type": "websocket.disconnect", "code": code})

        return send

    return (
        AsgiTransport(a_rx.receive, sender(a_tx, b_tx)),
        AsgiTransport(b_rx.receive, sender(b_tx, a_tx)),
    )


FRAMED = ["tcp-client", "tcp-server", "streams-client", "streams-server"]
KINDS = [*FRAMED, "asgi", "memory"]


@pytest.fixture(params=KINDS)
async def pair(request) -> Pair:
    return await _pair(request.param)


@pytest.fixture(params=FRAMED)
async def framed(request) -> Pair:
    """A pair whose messages travel as websocket frames (the others carry whole messages)."""
    return await _pair(request.param)


async def _pair(kind: str) -> Pair:
    if kind == "asgi":
        return Pair(*_asgi())
    if kind == "memory":
        return Pair(*memory_pair())
    client, server = await (_tcp() if kind.startswith("tcp") else _memory_streams())
    a, b = (client, server) if kind.endswith("client") else (server, client)
    return Pair(a, b, plain=kind.startswith("tcp"), fragments_to_b=_raw_fragments(a))


async def _receive_all(transport: Transport, count: int) -> list[str]:
    return [await transport.receive() for _ in range(count)]


async def test_messages_arrive_whole_and_in_order(pair):
    texts = [f'{{"n":{n},"pad":"{"é" * n}"}}' for n in range(120)] + ["", "x" * 70_000]
    async with trio.open_nursery() as nursery:
        got: list[str] = []

        async def read() -> None:
            got.extend(await _receive_all(pair.b, len(texts) + 1))

        nursery.start_soon(read)
        for text in texts[:60]:
            await pair.a.send(text)
        await pair.a.send_many(texts[60:])
        await pair.a.send_many([])  # nothing: nothing arrives
        await pair.a.send("last")
    assert got == [*texts, "last"]


async def test_what_write_now_wrote_arrives_before_what_is_sent_next(pair):
    result = pair.a.write_now("now")
    assert result in (True, False, None)
    if pair.plain:
        assert result is True  # a small message, an empty socket
    await pair.a.send("next")
    expected = ["now", "next"] if result is not None else ["next"]
    assert await _receive_all(pair.b, len(expected)) == expected
    assert not pair.a.unflushed


async def test_the_rest_of_a_partial_write_goes_first(pair):
    if not pair.plain:
        assert pair.a.write_now("x") is None  # only a plain socket is written without waiting
        return
    big = [f"{n:04d}" + "x" * 65_536 for n in range(400)]
    written = []
    for text in big:  # until the socket takes only part of one: the peer is not reading
        result = pair.a.write_now(text)
        assert result is not None
        written.append(text)
        if result is False:
            break
    else:
        pytest.fail("the socket never filled up")
    assert pair.a.unflushed
    assert pair.a.write_now("refused while a rest waits") is None
    async with trio.open_nursery() as nursery:
        got: list[str] = []

        async def read() -> None:
            got.extend(await _receive_all(pair.b, len(written) + 1))

        nursery.start_soon(read)
        await pair.a.send("after the rest")
    assert not pair.a.unflushed
    assert got == [*written, "after the rest"]


async def test_pump_takes_queued_messages_first_then_the_rest_then_says_why(pair):
    texts = [f"m{n}" for n in range(50)]
    taken: list[str] = []

    async def take(text: str) -> None:
        taken.append(text)

    await pair.a.send_many(texts)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pair.a.aclose, 4001, "bye")
        taken.append(await pair.b.receive())  # what came with it waits for the pump
        with pytest.raises(TransportClosed, match=r"code 4001: bye\)"):
            await pair.b.pump(take)
    assert taken == texts


async def test_what_take_raises_ends_the_pump_in_the_callers_task(pair):
    async def take(text: str) -> None:
        if text == "bad":
            raise ValueError("take failed on bad")

    await pair.a.send_many(["good", "bad", "after"])
    with pytest.raises(ValueError, match="take failed on bad"):
        await pair.b.pump(take)


async def test_the_peer_sees_the_close_code_and_reason(pair):
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pair.a.aclose, 4002, "going away")
        with pytest.raises(TransportClosed) as closed:
            await pair.b.receive()
    assert closed.value.message == "connection closed (code 4002: going away)"
    # and again, the same words; sending fails as closed too
    with pytest.raises(TransportClosed, match=r"^connection closed \(code 4002: going away\)$"):
        await pair.b.receive()
    with pytest.raises(TransportClosed):
        await pair.b.send("late")
    await pair.b.aclose()


async def test_after_its_own_close_an_end_neither_receives_nor_sends(pair):
    async with trio.open_nursery() as nursery:
        nursery.start_soon(pair.a.aclose)

        async def answer() -> None:
            with pytest.raises(TransportClosed, match="^connection closed$"):
                await pair.b.receive()

        nursery.start_soon(answer)
    with pytest.raises(TransportClosed, match="^connection closed"):
        await pair.a.receive()
    with pytest.raises(TransportClosed, match="^connection closed"):
        await pair.a.send("late")
    with pytest.raises(TransportClosed, match="^connection closed"):
        await pair.a.send_many(["late"])
    await pair.a.aclose()  # twice is harmless


async def test_a_message_past_the_limit_closes_with_1009(pair):
    pair.b.limit_messages(100)
    taken: list[str] = []

    async def take(text: str) -> None:
        taken.append(text)

    await pair.a.send_many(["small", "x" * 100, "y" * 101, "never taken"])
    with pytest.raises(TransportClosed, match="1009"):
        await pair.b.pump(take)
    assert taken == ["small", "x" * 100]
    with pytest.raises(TransportClosed, match="1009"):  # the peer is told why
        await pair.a.receive()
    with pytest.raises(TransportClosed, match="1009"):
        await pair.b.receive()
    await pair.b.aclose()


async def test_a_message_in_more_frames_than_allowed_closes_with_1009(framed):
    pair = framed
    assert pair.fragments_to_b is not None
    pair.b.limit_messages(LIMIT, fragments=2)
    await pair.fragments_to_b(["ab", "cd"])
    assert await pair.b.receive() == "abcd"
    await pair.fragments_to_b(["a", "b", "c"])
    with pytest.raises(TransportClosed, match=r"code 1009: a message may come in at most 2"):
        await pair.b.receive()
    with pytest.raises(TransportClosed, match="1009"):
        await pair.a.receive()


async def test_concurrent_senders_never_interleave_their_frames(pair):
    senders, each = 6, 12
    got: list[str] = []

    async def send(who: int) -> None:
        for n in range(0, each, 3):
            texts = [f"{who}:{n + k}:" + chr(97 + who) * (n * 7_001 + k) for k in range(3)]
            if n % 2:
                await pair.a.send_many(texts)
            else:
                for text in texts:
                    await pair.a.send(text)

    async with trio.open_nursery() as nursery:

        async def read() -> None:
            got.extend(await _receive_all(pair.b, senders * each))

        nursery.start_soon(read)
        for who in range(senders):
            nursery.start_soon(send, who)
    for who in range(senders):
        mine = [t.split(":", 2) for t in got if t.startswith(f"{who}:")]
        assert [int(n) for _, n, _ in mine] == list(range(each))  # each sender's, in order
        assert all(pad == chr(97 + who) * len(pad) for _, _, pad in mine)  # and whole
