"""Our websocket against another implementation (trio-websocket's server) over a real loopback
socket: several
messages written at once arrive as the same messages, in order, and a closed socket says so;
messages taken where the socket is read arrive in order, queued ones first, until the close."""

import math
import ssl
from functools import partial

import pytest
import trio
import trio.testing
from trio_websocket import serve_websocket
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request

from swamp.orchestrator.listener import Prefaced
from swamp.protocol import frames
from swamp.protocol.rpc import RpcChannel
from swamp.protocol.transport import TransportClosed, open_websocket
from swamp.protocol.websocket import WebSocket


@pytest.fixture
async def echo_server(nursery):
    """A websocket server that sends back every message it gets, one by one."""
    received: list[str] = []

    async def handler(request):
        ws = await request.accept()
        try:
            while True:
                message = await ws.get_message()
                if message.startswith("close "):  # "close CODE": the server closes, saying why
                    await ws.aclose(int(message.split()[1]), "server says bye")
                    return
                received.append(message)
                await ws.send_message(message)
        except Exception:
            pass

    server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
    return f"ws://127.0.0.1:{server.port}/", received


async def test_several_messages_in_one_write_arrive_as_themselves_in_order(echo_server):
    url, received = echo_server
    texts = [f'{{"n":{n},"pad":"{"é" * n}"}}' for n in range(200)]
    async with open_websocket(url, ssl_context=None, max_message_size=1 << 20) as ws:
        transport = ws
        await transport.send_many(texts[:150])
        await transport.send("lone")
        await transport.send_many(texts[150:])
        echoed = [await transport.receive() for _ in range(201)]
    assert received == [*texts[:150], "lone", *texts[150:]]
    assert echoed == received


async def test_several_messages_to_a_closed_socket_fail_as_closed(echo_server):
    url, _ = echo_server
    async with open_websocket(url, ssl_context=None, max_message_size=1 << 20) as ws:
        transport = ws
        await transport.aclose()
        with pytest.raises(TransportClosed):
            await transport.send_many(["a", "b"])


async def test_pump_takes_every_message_in_order_then_says_why_the_socket_closed(echo_server):
    url, received = echo_server
    texts = [f"m{n}" for n in range(50)]
    taken: list[str] = []
    async with open_websocket(url, ssl_context=None, max_message_size=1 << 20) as ws:
        transport = ws
        await transport.send_many(texts)
        # the first echoes are read (and the rest of their read queued) before pump()
        taken.append(await transport.receive())
        await transport.send("close 4001")

        async def take(text):
            taken.append(text)

        with pytest.raises(TransportClosed, match="4001: server says bye"):
            await transport.pump(take)
    assert taken == texts == received


async def test_pump_raises_what_take_raised(echo_server):
    url, _ = echo_server

    async def take(text):
        if text == "bad":
            raise ValueError("take failed on bad")

    async with open_websocket(url, ssl_context=None, max_message_size=1 << 20) as ws:
        transport = ws
        await transport.send_many(["good", "bad", "after"])
        with pytest.raises(ValueError, match="take failed on bad"):
            await transport.pump(take)


async def test_pump_ends_on_a_message_past_the_size_limit(echo_server):
    url, _ = echo_server
    taken: list[str] = []

    async def take(text):
        taken.append(text)

    async with open_websocket(url, ssl_context=None, max_message_size=100) as ws:
        transport = ws
        await transport.send_many(["small", "x" * 200])
        with pytest.raises(TransportClosed, match="1009"):
            await transport.pump(take)
    assert taken == ["small"]


@pytest.fixture
async def slow_reader(nursery):
    """A websocket server that reads nothing until told to, then collects every message."""
    received: list[str] = []
    start = trio.Event()
    done = trio.Event()

    async def handler(request):
        ws = await request.accept()
        await start.wait()
        try:
            while (message := await ws.get_message()) != "end":
                received.append(message)
        finally:
            done.set()

    server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
    return f"ws://127.0.0.1:{server.port}/", received, start, done


async def test_a_message_written_at_once_arrives_whole(echo_server):
    url, received = echo_server
    async with open_websocket(url, ssl_context=None, max_message_size=1 << 20) as ws:
        transport = ws
        assert transport.write_now("at once") is True
        assert not transport.unflushed
        assert await transport.receive() == "at once"
    assert received == ["at once"]


async def test_what_a_full_socket_did_not_take_goes_first_with_the_next_send(slow_reader):
    url, received, start, done = slow_reader
    big = [f"{n:04d}" + "x" * 65_536 for n in range(200)]
    async with open_websocket(url, ssl_context=None, max_message_size=1 << 20) as ws:
        transport = ws
        written = []
        for text in big:  # until the socket takes only part of one: the peer is not reading
            result = transport.write_now(text)
            assert result is not None
            written.append(text)
            if result is False:
                break
        else:
            pytest.fail("the socket never filled up")
        assert transport.unflushed
        assert transport.write_now("refused while a rest waits") is None
        start.set()
        await transport.send("after the rest")
        assert not transport.unflushed
        await transport.send("end")
        await done.wait()
    assert received == [*written, "after the rest"]


async def test_only_a_plain_tcp_socket_is_written_at_once():
    one, other = trio.socket.socketpair()
    plain = trio.SocketStream(one)

    def Ws(stream):  # an open websocket over ``stream``
        client, server = WSConnection(ConnectionType.CLIENT), WSConnection(ConnectionType.SERVER)
        server.receive_data(client.send(Request(host="example", target="/")))
        next(server.events())
        client.receive_data(server.send(AcceptConnection()))
        list(client.events())
        return WebSocket(stream, client, max_message_size=1 << 20)

    tls = trio.SSLStream(plain, ssl.create_default_context(), server_hostname="x")
    assert Ws(tls).write_now("x") is None  # bytes are encrypted first
    assert Ws(Prefaced(tls, b"")).write_now("x") is None
    assert Ws(Prefaced(plain, b""))._plain_stream() is plain
    assert Ws(plain)._plain_stream() is plain
    one.close()
    other.close()


async def test_a_channel_finishes_a_frame_the_socket_took_part_of(nursery):
    """Requests to a peer that is not reading yet: the first are written at once until the
    socket takes only part of one; the writer sends its rest before the queued ones."""
    received: list[str] = []
    start, got_all = trio.Event(), trio.Event()
    count = 40

    async def handler(request):
        ws = await request.accept()
        await start.wait()
        while len(received) < count:
            received.append(await ws.get_message())
        got_all.set()

    server = await nursery.start(serve_websocket, handler, "127.0.0.1", 0, None)
    async with open_websocket(
        f"ws://127.0.0.1:{server.port}/", ssl_context=None, max_message_size=1 << 20
    ) as ws:
        written_at_once: list[bool | None] = []

        class Recording:  # the websocket, its writes at once recorded
            def __getattr__(self, name):
                return getattr(ws, name)

            def write_now(self, text):
                written_at_once.append(ws.write_now(text))
                return written_at_once[-1]

        transport = Recording()

        async def no_requests(call):
            raise AssertionError("the peer sends none")

        channel = RpcChannel(transport, no_requests, heartbeat=math.inf)
        async with trio.open_nursery() as calls:
            await calls.start(channel.serve)
            for n in range(count):
                calls.start_soon(
                    partial(channel.call, "big", {"n": n, "pad": "x" * 65_536}, timeout=None)
                )
            await trio.testing.wait_all_tasks_blocked()
            # written at once until the socket took part of one; the writer is sending its
            # rest, and the frames after it wait in the outbox
            first_partial = written_at_once.index(False)
            assert first_partial > 0 and all(written_at_once[:first_partial])
            assert set(written_at_once[first_partial + 1 :]) <= {None}
            assert channel._sending and channel.outbox.frames > 0
            start.set()
            await got_all.wait()
            calls.cancel_scope.cancel()
    requests = [frames.decode(text) for text in received]
    # whole, and in the order they were sent (ids are given in that order)
    assert [r.id for r in requests] == [str(n) for n in range(1, count + 1)]
    assert sorted(r.params["n"] for r in requests) == list(range(count))
    assert all(r.params["pad"] == "x" * 65_536 for r in requests)
