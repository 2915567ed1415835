"""One port, two servers, on a real ``swamp serve``: what the listener hands to whom, and what a
peer that never finishes its request head costs everyone else."""

from __future__ import annotations

import json
import select
import time
from urllib.parse import urlsplit

import h11
import trio
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, Request, TextMessage

from swamp import client
from swamp.orchestrator.listener import HEAD_LIMIT, HEAD_TIMEOUT
from swamp.repo import Repo


async def _open(url: str) -> tuple[trio.SocketStream, str]:
    parts = urlsplit(url)
    return await trio.open_tcp_stream(parts.hostname, parts.port), parts.netloc


async def _http_response(stream: trio.SocketStream, conn: h11.Connection) -> tuple[int, bytes]:
    """Read one HTTP response (status, body) from ``stream``."""
    status, body = None, b""
    while True:
        event = conn.next_event()
        if event is h11.NEED_DATA:
            conn.receive_data(await stream.receive_some(65536))
        elif isinstance(event, h11.Response):
            status = event.status_code
        elif isinstance(event, h11.Data):
            body += event.data
        elif isinstance(event, (h11.EndOfMessage, h11.ConnectionClosed)):
            return status, body


async def _status_of(url: str, head: bytes) -> int | None:
    """Send ``head`` raw; the status of the answer, or ``None`` if the server just closed."""
    stream, _ = await _open(url)
    async with stream:
        await stream.send_all(head)
        received = b""
        with trio.fail_after(10):
            while b"\r\n" not in received:
                data = await stream.receive_some(65536)
                if not data:
                    return None
                received += data
    return int(received.split(b" ", 2)[1])


async def test_a_kept_alive_http_connection_may_still_upgrade(cluster):
    """HTTP goes to Hypercorn, and stays there for the connection's life: an upgrade that comes
    as its second request is answered by Hypercorn — and runs the same control plane."""
    cluster.serve("--auth", "none")
    stream, netloc = await _open(cluster.url)
    async with stream:
        http = h11.Connection(h11.CLIENT)
        await stream.send_all(
            http.send(h11.Request(method="GET", target="/health", headers=[("Host", netloc)]))
        )
        await stream.send_all(http.send(h11.EndOfMessage()))
        status, body = await _http_response(stream, http)
        assert status == 200, body
        ws = WSConnection(ConnectionType.CLIENT)
        await stream.send_all(ws.send(Request(host=netloc, target="/")))
        request = {"type": "request", "id": "1", "method": "worker.list", "params": {}}
        reply = None
        with trio.fail_after(10):
            while reply is None:
                ws.receive_data(await stream.receive_some(65536))
                for event in ws.events():
                    if isinstance(event, AcceptConnection):
                        await stream.send_all(ws.send(TextMessage(json.dumps(request))))
                    elif isinstance(event, TextMessage):
                        reply = json.loads(event.data)
    assert reply["type"] == "response" and reply["result"]["workers"] == [], reply


async def test_heads_the_websocket_server_does_not_take_are_still_answered(cluster):
    cluster.serve()
    port = urlsplit(cluster.url).port
    upgrade = (
        f"GET / HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nUpgrade: websocket\r\n"
        "Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
    )
    # no Sec-WebSocket-Key: not a handshake; Hypercorn answers it as it always did
    assert 400 <= await _status_of(cluster.url, (upgrade + "\r\n").encode()) < 500
    # a head past the listener's limit is not buffered further by it: Hypercorn reads the
    # rest and answers (h11 takes a head that arrives whole, so this one is accepted)
    huge = upgrade + "Sec-WebSocket-Key: abc\r\nX-Pad: " + "x" * HEAD_LIMIT + "\r\n\r\n"
    assert await _status_of(cluster.url, huge.encode()) == 101
    # still serving, both ways
    assert cluster.cli_json("worker", "list", "--server", cluster.url)["workers"] == []


async def test_a_peer_that_never_finishes_its_head_holds_nothing_up(cluster):
    """Sockets that send half a request head and stall (slowloris) do not delay anyone else,
    and each is closed once its time for the head is up."""
    serve = cluster.serve()
    credential = Repo(cluster.repo).admin_credential_for(cluster.url)
    stalled = []
    for _ in range(50):
        stream, netloc = await _open(cluster.url)
        await stream.send_all(f"GET / HTTP/1.1\r\nHost: {netloc}\r\nUpgr".encode())
        stalled.append(stream)
    started = time.monotonic()
    with trio.fail_after(60):  # only a safety net: the order below is the check
        listed = await client.call(cluster.url, "worker.list", server_token=credential)
    assert listed["workers"] == []
    # answered while every stalled socket still waits for its head's time to be up: nobody
    # waited behind them
    answered = select.select([s.socket.fileno() for s in stalled], [], [], 0)[0]
    assert answered == [], f"{len(answered)} stalled sockets were closed before the answer"
    with trio.fail_after(HEAD_TIMEOUT + 30):
        for stream in stalled:
            try:
                assert await stream.receive_some(65536) == b""
            except trio.BrokenResourceError:
                pass  # a reset is a close too
            await stream.aclose()
    assert time.monotonic() - started >= HEAD_TIMEOUT - 1
    assert "Traceback" not in serve.log.read_text()
