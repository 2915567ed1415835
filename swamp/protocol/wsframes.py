"""Websocket frames of the common kind — one whole text message each — without wsproto's
general machinery, which is most of what a small frame costs to read or write.

Every dispatch is four frames for the orchestrator and two for a worker, nearly all of them a
single unfragmented text frame of a few hundred bytes. wsproto reads each through a frame
decoder, a message decoder, an incremental UTF-8 decoder and a generator chain (≈ 7–8 µs a
frame here), and writes each through its frame protocol with a masking key from
``os.urandom`` (≈ 2.5 µs for a server's frame, 4.5 µs for a client's). The same work for that
one kind of frame is a few lines.

:class:`FastFrames` stands in front of a wsproto connection once it is open. It reads a
frame's header itself; a whole, final, unextended text frame of at most :data:`FAST_LIMIT`
bytes, masked as its direction requires, with a minimal length and valid UTF-8, it decodes at
once. Anything else — control frames (close, ping, pong), binary or fragmented messages,
anything malformed, anything larger — it hands to wsproto exactly as it arrived, byte for
byte, at a frame boundary, so wsproto answers it as it always did: the same events, the same
errors and close codes. Sending, :func:`text_frame` does what wsproto's
``send(TextMessage(...))`` does for an open connection without extensions.

The websocket shell (:mod:`swamp.protocol.websocket`) puts it in front of wsproto's connection
the moment the handshake is done: wsproto was given the handshake's bytes and nothing after
them, so every frame passes here first. Only wsproto's public API is used (``receive_data``,
``events``, ``send``, ``state``).
"""

from __future__ import annotations

import struct
from collections.abc import Generator

from wsproto import WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import CloseConnection, Event, TextMessage

from swamp.ids import random_bytes

FAST_LIMIT = 64 * 1024  # larger frames go to wsproto, which reads them in pieces
_FIN_TEXT = 0x81  # FIN, no reserved bits, opcode 1 (text)
_OPEN = ConnectionState.OPEN


def text_frame(text: str, *, client: bool) -> bytes:
    """One whole text message as a single final frame; a client's is masked (RFC 6455 §5.3),
    with a key from the operating system's random source."""
    payload = text.encode("utf-8")
    n = len(payload)
    mask = 0x80 if client else 0
    if n < 126:
        head = bytes((_FIN_TEXT, mask | n))
    elif n < 65536:
        head = struct.pack("!BBH", _FIN_TEXT, mask | 126, n)
    else:
        head = struct.pack("!BBQ", _FIN_TEXT, mask | 127, n)
    if not client:
        return head + payload
    key = random_bytes(4)
    return head + key + _unmask(payload, key)


def _unmask(payload: bytes | bytearray, key: bytes) -> bytes:
    """XOR with the repeated 4-byte key (masking and unmasking are the same)."""
    n = len(payload)
    if not n:
        return b""
    stream = (key * ((n + 3) // 4))[:n]
    return (int.from_bytes(payload, "big") ^ int.from_bytes(stream, "big")).to_bytes(n, "big")


class FastFrames:
    """A wsproto connection, read the fast way where a frame allows (see the module docstring).
    Everything but ``receive_data`` and ``events`` is the wrapped connection's."""

    __slots__ = (
        "real",
        "client",
        "max_fragments",
        "_buffer",
        "_at",
        "_owed",
        "_fragmented",
        "_pieces",
        "_handed",
        "_ended",
        "_refused",
    )

    def __init__(self, real: WSConnection, *, max_fragments: int | None = None) -> None:
        self.real = real
        self.client = real.client
        # the most frames one message may come in (None: any): a message in thousands of tiny
        # frames makes wsproto keep an object for each piece
        self.max_fragments = max_fragments
        self._pieces = 0  # frames of the data message being read
        self._refused = False  # a message broke the limit: nothing more reaches wsproto
        self._buffer = bytearray()  # received, not yet read
        self._at = 0  # how much of the buffer has been read
        self._owed = 0  # bytes of a frame handed to wsproto that have not arrived yet
        self._fragmented = False  # wsproto is inside a fragmented message
        self._handed = False  # wsproto was given something: ask it for events
        self._ended = False  # wsproto said the connection closes: it reads everything now

    def __getattr__(self, name: str):
        return getattr(self.real, name)

    @property
    def state(self) -> ConnectionState:
        return self.real.state

    def send(self, event: Event) -> bytes:
        return self.real.send(event)

    def receive_data(self, data: bytes | bytearray | None) -> None:
        if data is None:  # the socket ended: wsproto says how (after what it was owed)
            if not self._refused:
                self._hand(len(self._buffer) - self._at)
            self.real.receive_data(None)
            self._handed = True
            return
        if self._refused:  # wsproto has the close it needs: the rest is never read
            return
        if self._at and self._at == len(self._buffer):
            self._buffer.clear()
            self._at = 0
        self._buffer += data

    def events(self) -> Generator[Event, None, None]:
        while True:
            if self._handed:
                self._handed = False
                for event in self.real.events():
                    if isinstance(event, CloseConnection):
                        self._ended = True
                    yield event
            if self._owed:
                if not self._hand(min(self._owed, len(self._buffer) - self._at)):
                    break
                continue
            frame = self._next()
            if frame is None:
                break
            if isinstance(frame, int):  # not ours: wsproto reads this one
                self._owed = frame
                continue
            yield frame
        if self._at:  # keep only what is not read yet: at most a frame's beginning
            del self._buffer[: self._at]
            self._at = 0

    def _hand(self, count: int) -> bool:
        """Give wsproto the next ``count`` bytes (what it is owed of a frame). Once it is
        closed it takes nothing more: what is left is dropped, as it would have dropped it."""
        if count <= 0:
            return False
        if self.real.state is ConnectionState.CLOSED:
            self._at, self._owed = len(self._buffer), 0
            return False
        at = self._at
        self.real.receive_data(bytes(self._buffer[at : at + count]))
        self._at = at + count
        self._owed = max(0, self._owed - count)
        self._handed = True
        return True

    def _refuse(self, reason: str) -> None:
        """End the connection as if the peer had closed it with 1009 (message too big): wsproto
        answers the close, and what the peer sends after it is dropped unread."""
        payload = struct.pack("!H", 1009) + reason.encode("utf-8")[:120]
        if self.client:  # a server's frames are unmasked
            frame = bytes((0x88, len(payload))) + payload
        else:
            key = random_bytes(4)
            frame = bytes((0x88, 0x80 | len(payload))) + key + _unmask(payload, key)
        self._buffer.clear()
        self._at = self._owed = 0
        self.real.receive_data(frame)
        self._handed = self._ended = self._refused = True

    def _next(self) -> TextMessage | int | None:
        """The next frame: read here (a message), or the length of one for wsproto, or
        ``None`` until more has arrived."""
        buffer, at = self._buffer, self._at
        available = len(buffer) - at
        if available < 2:
            return None
        b0, b1 = buffer[at], buffer[at + 1]
        length = b1 & 0x7F
        head = 2
        if length == 126:
            if available < 4:
                return None
            (length,) = struct.unpack_from("!H", buffer, at + 2)
            head = 4
            minimal = length >= 126
        elif length == 127:
            if available < 10:
                return None
            (length,) = struct.unpack_from("!Q", buffer, at + 2)
            head = 10
            minimal = 65536 <= length < 1 << 63
        else:
            minimal = True
        masked = bool(b1 & 0x80)
        if masked:
            head += 4
        total = head + length
        opcode = b0 & 0x0F
        if (
            b0 != _FIN_TEXT
            or masked == self.client  # a client reads unmasked frames, a server masked ones
            or not minimal
            or length > FAST_LIMIT
            or self._fragmented
            or self._ended
            or self.real.state is not _OPEN
        ):
            if opcode < 8:  # a data frame: does it start, or end, a fragmented message?
                self._pieces = self._pieces + 1 if self._fragmented else 1
                if (
                    self.max_fragments is not None
                    and self._pieces > self.max_fragments
                    and not self._ended  # closing already: wsproto takes nothing more
                    and self.real.state is _OPEN
                ):
                    self._refuse(f"a message may come in at most {self.max_fragments} frame(s)")
                    return 0  # nothing owed: wsproto's close is read next
                self._fragmented = not (b0 & 0x80)
            return total
        if available < total:
            return None
        payload: bytes | bytearray = buffer[at + head : at + total]
        if masked:
            payload = _unmask(payload, bytes(buffer[at + head - 4 : at + head]))
        try:
            text = payload.decode("utf-8")
        except UnicodeDecodeError:
            return total  # wsproto refuses it, with the close code for it
        self._at = at + total
        return TextMessage(data=text, frame_finished=True, message_finished=True)
