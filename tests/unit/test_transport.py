"""The websocket transport over a real loopback socket (trio-websocket on both ends): several
messages written at once arrive as the same messages, in order, and a closed socket says so."""

import pytest
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
