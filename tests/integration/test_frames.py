"""Websocket frames made by hand against a real orchestrator: the common frame is read by
swamp itself, everything else by wsproto, and a peer cannot tell which — fragments and pings
are understood, a broken frame ends its socket (as wsproto and trio-websocket always did: the
stream is closed, and nothing sent behind it is answered), and the orchestrator goes on
serving everyone else. Which close code wsproto chose is checked in-process, against wsproto
itself (``tests/unit/test_wsframes.py``)."""

import json
import os
import struct

import pytest
import trio

from swamp.repo import Repo
from tests.integration.hostile import RawSocket

pytestmark = pytest.mark.integration


def frame(opcode: int, payload: bytes, *, fin: bool = True, masked: bool = True) -> bytes:
    """A client's frame, well formed or not (a client must mask; ``masked=False`` does not)."""
    n = len(payload)
    first = (0x80 if fin else 0) | opcode
    flag = 0x80 if masked else 0
    if n < 126:
        head = bytes((first, flag | n))
    elif n < 65536:
        head = struct.pack("!BBH", first, flag | 126, n)
    else:
        head = struct.pack("!BBQ", first, flag | 127, n)
    if not masked:
        return head + payload
    key = os.urandom(4)
    return head + key + bytes(b ^ key[i % 4] for i, b in enumerate(payload))


def request(frame_id: str) -> bytes:
    return json.dumps(
        {"type": "request", "id": frame_id, "method": "server.info", "params": {}}
    ).encode()


async def admin_socket(cluster) -> RawSocket:
    credential = Repo(cluster.repo).admin_credential_for(cluster.url)
    return await RawSocket.open(cluster.url, headers=[("authorization", f"Bearer {credential}")])


async def replies(sock: RawSocket, *frame_ids: str) -> dict[str, dict]:
    """The replies to these requests, in whatever order they come."""
    got: dict[str, dict] = {}
    while set(got) != set(frame_ids):
        frame_ = await sock.next_frame()
        if frame_ is None:
            raise AssertionError(f"closed before the replies: {sock.closed}")
        if frame_.get("id") in frame_ids:
            got[frame_["id"]] = frame_
    return got


async def test_fragments_pings_and_big_frames_are_understood(cluster):
    cluster.serve()
    sock = await admin_socket(cluster)
    whole = request("one")
    # one request in three fragments, a ping between two of them, all in one write
    await sock._send_bytes(
        frame(1, whole[:10], fin=False)
        + frame(9, b"still there?")
        + frame(0, whole[10:20], fin=False)
        + frame(0, whole[20:])
    )
    assert (await replies(sock, "one"))["one"]["result"]["pool"]["members"] == 0
    await sock._send_bytes(frame(1, request("two")))  # an admin socket: one call at a time
    assert (await replies(sock, "two"))["two"]["type"] == "response"
    # a request larger than the fast path reads (padded with spaces), cut across writes
    big = request("big")[:-1] + b" " * 100_000 + b"}"
    data = frame(1, big)
    for at in range(0, len(data), 7001):
        await sock._send_bytes(data[at : at + 7001])
    assert (await replies(sock, "big"))["big"]["type"] == "response"
    await sock.aclose()


@pytest.mark.parametrize(
    "bad",
    [
        frame(1, b'{"type": "ping" \xff}'),  # not UTF-8
        frame(1, request("x"), masked=False),  # a client's frame must be masked
        frame(1, request("x")[:5], fin=False) + frame(1, request("y")),  # no continuation
        frame(3, b"?"),  # a reserved opcode
        bytes((0xC1, 0x80 | 5)) + os.urandom(4) + b"hello",  # a reserved bit set
    ],
    ids=["not-utf8", "unmasked", "no-continuation", "reserved-opcode", "reserved-bit"],
)
async def test_a_broken_frame_ends_its_socket_and_serving_goes_on(cluster, bad):
    cluster.serve()
    sock = await admin_socket(cluster)
    await sock._send_bytes(frame(1, request("before")))
    assert (await replies(sock, "before"))["before"]["type"] == "response"
    await sock._send_bytes(bad + frame(1, request("after")))
    answered = []
    with trio.fail_after(10):  # the server ends it: a socket still open here is a failure
        while (frame_ := await sock.next_frame()) is not None:
            answered.append(frame_.get("id"))
    assert "after" not in answered and sock.closed is not None
    # others are served as before
    other = await admin_socket(cluster)
    await other._send_bytes(frame(1, request("fine")))
    assert (await replies(other, "fine"))["fine"]["type"] == "response"
    await other.aclose()
