"""Who serves a new connection: the head that decides, and the stream handed on unread."""

import trio
import trio.testing
from wsproto import ConnectionType, WSConnection
from wsproto.events import Request

from swamp.orchestrator.listener import Prefaced, upgrade_headers


def _client_head(**extra) -> bytes:
    """The head a real websocket client (wsproto, as trio-websocket uses it) sends."""
    ws = WSConnection(ConnectionType.CLIENT)
    headers = [(k.replace("_", "-"), v) for k, v in extra.items()]
    return ws.send(Request(host="127.0.0.1:7420", target="/", extra_headers=headers))


def _head(*lines: str) -> bytes:
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


UPGRADE = (
    "Host: localhost:7420",
    "Upgrade: websocket",
    "Connection: Upgrade",
    "Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==",
    "Sec-WebSocket-Version: 13",
)


def test_a_real_clients_upgrade_goes_to_the_websocket_server_with_its_headers():
    headers = upgrade_headers(_client_head(Origin="https://evil.example", authorization="x"))
    assert headers is not None
    assert headers["host"] == "127.0.0.1:7420"  # the policy sees Host
    assert headers["origin"] == "https://evil.example"
    assert headers["authorization"] == "x"


def test_token_lists_and_case_do_not_matter():
    head = _head(
        "GET /ws HTTP/1.1",
        "host: localhost",
        "UPGRADE: WebSocket",
        "connection: keep-alive, Upgrade",
        "sec-websocket-key: abc",
        "sec-websocket-version: 13",
    )
    assert upgrade_headers(head) == {
        "host": "localhost",
        "upgrade": "WebSocket",
        "connection": "keep-alive, Upgrade",
        "sec-websocket-key": "abc",
        "sec-websocket-version": "13",
    }


def test_anything_else_is_hypercorns_to_answer():
    assert upgrade_headers(_head("GET /health HTTP/1.1", "Host: localhost")) is None
    assert upgrade_headers(_head("POST / HTTP/1.1", *UPGRADE)) is None
    assert upgrade_headers(_head("GET / HTTP/1.0", *UPGRADE)) is None
    assert upgrade_headers(_head("GET /  HTTP/1.1", *UPGRADE)) is None
    assert upgrade_headers(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") is None  # an HTTP/2 preface
    without = [line for line in UPGRADE if not line.startswith("Sec-WebSocket-Key")]
    assert upgrade_headers(_head("GET / HTTP/1.1", *without)) is None
    old = [line.replace(": 13", ": 8") for line in UPGRADE]
    assert upgrade_headers(_head("GET / HTTP/1.1", *old)) is None
    no_host = [line for line in UPGRADE if not line.startswith("Host")]
    assert upgrade_headers(_head("GET / HTTP/1.1", *no_host)) is None


def test_an_ambiguous_or_malformed_head_is_not_guessed_at():
    # two Hosts (or Origins): which one the policy should judge is not ours to pick
    assert upgrade_headers(_head("GET / HTTP/1.1", *UPGRADE, "Host: evil.example")) is None
    assert upgrade_headers(_head("GET / HTTP/1.1", "Origin: a", "Origin: b", *UPGRADE)) is None
    assert upgrade_headers(_head("GET / HTTP/1.1", *UPGRADE, " folded: line")) is None
    assert upgrade_headers(_head("GET / HTTP/1.1", *UPGRADE, "no colon here")) is None
    assert upgrade_headers(_head("GET / HTTP/1.1", *UPGRADE, ": empty name")) is None


async def test_the_stream_is_handed_on_with_what_was_read_put_back():
    ours, theirs = trio.testing.memory_stream_pair()
    await theirs.send_all(b"rest")
    prefaced = Prefaced(ours, b"head\r\n\r\n")
    assert await prefaced.receive_some(4) == b"head"
    assert await prefaced.receive_some() == b"\r\n\r\n"
    assert await prefaced.receive_some(100) == b"rest"
    await prefaced.send_all(b"answer")
    assert await theirs.receive_some(100) == b"answer"


async def test_idle_counts_from_the_last_bytes_received(autojump_clock):
    ours, theirs = trio.testing.memory_stream_pair()
    prefaced = Prefaced(ours, b"")
    await trio.sleep(5)
    assert prefaced.idle() == 5
    await theirs.send_all(b"x")
    await prefaced.receive_some(1)
    assert prefaced.idle() == 0
