"""The fast frame path against wsproto itself: the same bytes, cut anywhere, give the same
events — messages, pings, closes and every refusal — and frames written here read back whole."""

import os
import random
import struct

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    Request,
    TextMessage,
)

from swamp.protocol.wsframes import FAST_LIMIT, FastFrames, text_frame


def opened() -> tuple[WSConnection, WSConnection]:
    client, server = WSConnection(ConnectionType.CLIENT), WSConnection(ConnectionType.SERVER)
    server.receive_data(client.send(Request(host="example", target="/")))
    next(server.events())
    client.receive_data(server.send(AcceptConnection()))
    list(client.events())
    return client, server


def frame(opcode: int, payload: bytes, *, fin=True, mask=None, rsv=0, length_form=None) -> bytes:
    """A frame as a peer might send it, well formed or not."""
    n = len(payload)
    form = length_form or (7 if n < 126 else 16 if n < 65536 else 64)
    first = (0x80 if fin else 0) | rsv | opcode
    flag = 0x80 if mask is not None else 0
    if form == 7:
        head = bytes((first, flag | n))
    elif form == 16:
        head = struct.pack("!BBH", first, flag | 126, n)
    else:
        head = struct.pack("!BBQ", first, flag | 127, n)
    if mask is None:
        return head + payload
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def some_frame(rng: random.Random, *, to_server: bool) -> bytes:
    """One frame from the kinds the fast path takes and the kinds it must hand on."""
    right = os.urandom(4) if to_server else None  # the masking the direction requires
    wrong = None if to_server else os.urandom(4)
    text = "".join(rng.choice('ab{}"é字😀') for _ in range(rng.choice([0, 3, 40, 200, 1000])))
    kind = rng.choice(
        ["text"] * 8
        + ["big", "binary", "fragments", "ping", "pong", "close", "badclose", "wrongmask"]
        + ["badutf8", "longform", "rsv", "reserved", "fragmentedping", "interleaved"]
    )
    if kind == "text":
        return frame(1, text.encode(), mask=right)
    if kind == "big":
        return frame(1, b"x" * (FAST_LIMIT + rng.choice([1, 5000])), mask=right)
    if kind == "binary":
        return frame(2, b"\x00\x01", mask=right)
    if kind == "fragments":
        return frame(1, b"one ", fin=False, mask=right) + frame(0, b"two", mask=right)
    if kind == "fragmentedping":  # a control frame may come between fragments
        return (
            frame(1, b"one ", fin=False, mask=right)
            + frame(9, b"hi", mask=right)
            + frame(0, b"two", mask=right)
        )
    if kind == "interleaved":  # a new message before the last one ended: refused
        return frame(1, b"one ", fin=False, mask=right) + frame(1, b"two", mask=right)
    if kind == "ping":
        return frame(9, b"are you there", mask=right)
    if kind == "pong":
        return frame(10, b"yes", mask=right)
    if kind == "close":
        return frame(8, struct.pack("!H", 1000) + b"bye", mask=right)
    if kind == "badclose":
        return frame(8, b"\x03", mask=right)
    if kind == "wrongmask":
        return frame(1, b"hello", mask=wrong)
    if kind == "badutf8":
        return frame(1, b"ok \xff\xfe", mask=right)
    if kind == "longform":
        return frame(1, b"short", mask=right, length_form=16)
    if kind == "rsv":
        return frame(1, b"hello", mask=right, rsv=0x40)
    return frame(3, b"?", mask=right)  # a reserved opcode


def normalized(events) -> list:
    """Messages whole (wsproto hands a long or split one over in pieces), the rest as is; an
    error close by its code (its reason quotes where the decoder stopped in the chunk it had)."""
    out, parts = [], []
    for event in events:
        if isinstance(event, (TextMessage, BytesMessage)):
            parts.append(event.data)
            if event.message_finished:
                joined = "".join(parts) if isinstance(event, TextMessage) else b"".join(parts)
                out.append((type(event).__name__, joined))
                parts = []
        elif isinstance(event, CloseConnection):
            reason = event.reason if event.code == 1000 else None
            out.append(("close", event.code, reason))
        elif isinstance(event, (Ping, Pong)):
            out.append((type(event).__name__, bytes(event.payload)))
        else:
            out.append((type(event).__name__,))
    return out


def feed(receiver, data: bytes, rng: random.Random) -> list:
    events, at = [], 0
    while at < len(data):
        cut = min(len(data), at + rng.choice([1, 2, 3, 7, 100, 4096, 70000]))
        receiver.receive_data(data[at:cut])
        events.extend(receiver.events())
        at = cut
    return events


@pytest.mark.parametrize("to_server", [True, False])
@pytest.mark.parametrize("seed", range(40))
def test_the_same_bytes_give_the_same_events_as_wsproto(seed, to_server):
    rng = random.Random(seed)
    data = b"".join(some_frame(rng, to_server=to_server) for _ in range(rng.randint(1, 12)))
    plain = opened()[1 if to_server else 0]
    fast_side = opened()[1 if to_server else 0]
    fast = FastFrames(fast_side)
    chunks = random.Random(seed * 7 + 1)
    assert normalized(feed(fast, data, chunks)) == normalized(
        feed(plain, data, random.Random(seed * 7 + 1))
    )


def test_the_end_of_the_socket_is_said_as_wsproto_says_it():
    fast, plain = FastFrames(opened()[1]), opened()[1]
    partial = frame(1, b"cut short", mask=b"abcd")[:5]
    for receiver in (fast, plain):
        receiver.receive_data(partial)
        list(receiver.events())
        receiver.receive_data(None)
    assert normalized(fast.events()) == normalized(plain.events()) == [("close", 1006, None)]


@pytest.mark.parametrize("client", [True, False])
@pytest.mark.parametrize("size", [0, 1, 125, 126, 65535, 65536, 200_000])
def test_a_frame_written_here_reads_back_whole(client, size):
    sender, receiver = opened() if client else opened()[::-1]
    text = ("é字" * size)[:size]
    receiver.receive_data(text_frame(text, client=client))
    assert normalized(receiver.events()) == [("TextMessage", text)]
    # and byte for byte what wsproto writes, but for the masking key
    theirs = sender.send(TextMessage(data=text))
    ours = text_frame(text, client=client)
    assert len(ours) == len(theirs)
    head = 2 + (2 if 126 <= len(text.encode()) < 65536 else 8 if len(text.encode()) >= 65536 else 0)
    assert ours[:head] == theirs[:head]
    if not client:
        assert ours == theirs


@pytest.mark.parametrize("seed", range(60))
def test_the_fast_reader_reads_from_the_first_frame_after_the_handshake(seed):
    """The websocket gives wsproto's handshake exactly its head and the fast reader everything
    after it (a peer may send frames the moment the upgrade is answered, in the same read):
    cut anywhere, the events are the same as wsproto's alone, in order."""
    rng = random.Random(seed)
    data = b"".join(some_frame(rng, to_server=True) for _ in range(rng.randint(1, 12)))
    expected = normalized(feed(opened()[1], data, random.Random(seed)))
    cut = rng.randint(0, len(data))
    fast = FastFrames(opened()[1])
    fast.receive_data(data[:cut])  # what came with the handshake
    events = list(fast.events())
    fast.receive_data(data[cut:])
    events.extend(fast.events())
    assert normalized(events) == expected


def test_a_limit_set_inside_a_fragmented_message_counts_its_frames():
    server = opened()[1]
    mask = b"abcd"
    fast = FastFrames(server)
    fast.receive_data(frame(1, b"one ", fin=False, mask=mask))
    assert [type(e).__name__ for e in fast.events()] == ["TextMessage"]
    fast.max_fragments = 1  # the limit comes (the socket's trust changed); the next is the second
    fast.receive_data(frame(0, b"two", mask=mask))
    closes = [e for e in fast.events() if isinstance(e, CloseConnection)]
    assert closes and closes[0].code == 1009


def test_a_stream_cut_mid_frame_every_time_keeps_only_the_unread_part():
    fast = FastFrames(opened()[1])
    data = b"".join(frame(1, b"x" * 300, mask=b"abcd") for _ in range(2000))
    received = 0
    for at in range(0, len(data), 1000):  # every read ends inside a frame
        fast.receive_data(data[at : at + 1000])
        received += sum(1 for _ in fast.events())
        assert len(fast._buffer) < 400  # a frame's beginning, not everything read so far
    assert received == 2000


@pytest.mark.parametrize("limit", [1, 3])
def test_a_message_in_more_frames_than_allowed_ends_the_connection_with_1009(limit):
    """Before a socket is trusted its messages come in one frame: a message sent as thousands
    of 2-byte frames made wsproto and trio-websocket keep an object per piece (128 sockets:
    41 → 244 MB, and seconds of the event loop)."""
    _, server = opened()
    fast = FastFrames(server, max_fragments=limit)
    mask = os.urandom(4)
    pieces = [frame(1, b"ab", fin=False, mask=mask)]
    pieces += [frame(0, b"cd", fin=False, mask=mask) for _ in range(2000)]
    fast.receive_data(b"".join(pieces))
    events = list(fast.events())
    closes = [e for e in events if isinstance(e, CloseConnection)]
    assert closes and closes[0].code == 1009 and f"at most {limit}" in closes[0].reason
    assert not [e for e in events if isinstance(e, TextMessage) and e.message_finished]
    fast.receive_data(frame(1, b"after", mask=mask))  # dropped: the connection is closing
    assert not [e for e in fast.events() if isinstance(e, TextMessage)]
    # the control: within the limit a fragmented message is read whole; without one, any
    _, server = opened()
    fast = FastFrames(server, max_fragments=3)
    fast.receive_data(b"".join(pieces[:2]) + frame(0, b"ef", mask=mask))
    assert normalized(fast.events()) == [("TextMessage", "abcdef")]
    _, server = opened()
    fast = FastFrames(server)
    fast.receive_data(b"".join(pieces) + frame(0, b"!", mask=mask))
    assert normalized(fast.events()) == [("TextMessage", "ab" + "cd" * 2000 + "!")]


def test_frames_after_a_close_are_not_counted_against_the_limit():
    """A close in the middle of a fragmented message: what follows it is never read, and
    never refused (wsproto, closed, takes nothing more)."""
    _, server = opened()
    mask = b"abcd"
    fast = FastFrames(server, max_fragments=1)
    fast.receive_data(
        frame(1, b"one ", fin=False, mask=mask)
        + frame(8, struct.pack("!H", 1000) + b"bye", mask=mask)
        + frame(0, b"two", mask=mask)
    )
    events = list(fast.events())
    closes = [e for e in events if isinstance(e, CloseConnection)]
    assert [c.code for c in closes] == [1000]
