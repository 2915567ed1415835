"""The websocket transport over a real loopback socket (trio-websocket on both ends): several
messages written at once arrive as the same messages, in order, and a closed socket says so;
messages taken where the socket is read arrive in order, queued ones first, until the close."""

import pytest
import trio
from trio_websocket import serve_websocket

from swamp.protocol.transport import TransportClosed, WebSocketTransport, open_websocket


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
        transport = WebSocketTransport(ws)
        await transport.send_many(texts[:150])
        await transport.send("lone")
        await transport.send_many(texts[150:])
        echoed = [await transport.receive() for _ in range(201)]
    assert received == [*texts[:150], "lone", *texts[150:]]
    assert echoed == received


async def test_several_messages_to_a_closed_socket_fail_as_closed(echo_server):
    url, _ = echo_server
    async with open_websocket(url, ssl_context=None, max_message_size=1 << 20) as ws:
        transport = WebSocketTransport(ws)
        await transport.aclose()
        with pytest.raises(TransportClosed):
            await transport.send_many(["a", "b"])


async def test_pump_takes_every_message_in_order_then_says_why_the_socket_closed(echo_server):
    url, received = echo_server
    texts = [f"m{n}" for n in range(50)]
    taken: list[str] = []
    async with open_websocket(url, ssl_context=None, max_message_size=1 << 20) as ws:
        transport = WebSocketTransport(ws)
        await transport.send_many(texts)
        # the reader has queued the first echo and waits to hand over the next before pump()
        while ws._recv_channel.statistics().current_buffer_used == 0:
            await trio.sleep(0.001)
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
        transport = WebSocketTransport(ws)
        await transport.send_many(["good", "bad", "after"])
        with pytest.raises(ValueError, match="take failed on bad"):
            await transport.pump(take)


async def test_pump_ends_on_a_message_past_the_size_limit(echo_server):
    url, _ = echo_server
    taken: list[str] = []

    async def take(text):
        taken.append(text)

    async with open_websocket(url, ssl_context=None, max_message_size=100) as ws:
        transport = WebSocketTransport(ws)
        await transport.send_many(["small", "x" * 200])
        with pytest.raises(TransportClosed, match="1009"):
            await transport.pump(take)
    assert taken == ["small"]
