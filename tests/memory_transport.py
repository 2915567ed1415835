"""A Transport pair in memory: two channels, each message a whole string. The RPC tests run on it;
the conformance suite (``tests/unit/test_transport_conformance.py``) holds it to the same
contract as the real websocket — a close carries its code and reason to the peer, a message
past the limit closes with 1009."""

from __future__ import annotations

from dataclasses import dataclass

import trio

from swamp.protocol.transport import TransportClosed, _describe


@dataclass(frozen=True)
class Close:
    """What a closing end sends last: its code and reason."""

    code: int
    reason: str


class MemoryTransport:
    """One end. ``immediate``: ``write_now`` hands a message to the peer when the channel has
    room (as a socket with room takes it); otherwise every message goes through ``send``."""

    def __init__(self, send_channel, receive_channel, *, immediate: bool = False):
        self.tx, self.rx = send_channel, receive_channel
        self.immediate = immediate
        self.closed_with = None
        self.writes: list[int] = []  # frames per write, for the writes of several
        self.why: str | None = None  # set once closed: what receive and send raise
        self.limit: int | None = None

    async def send(self, text):
        if self.why is not None:
            raise TransportClosed(self.why)
        try:
            await self.tx.send(text)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise TransportClosed("connection closed") from None

    async def send_many(self, texts):
        self.writes.append(len(texts))
        for text in texts:
            await self.send(text)

    async def receive(self):
        if self.why is not None:
            raise TransportClosed(self.why)
        try:
            message = await self.rx.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            self.why = "connection closed"
            raise TransportClosed(self.why) from None
        if isinstance(message, Close):
            self.why = _describe(message.code, message.reason)
            await self._send_close(message.code, message.reason)  # the answer
            raise TransportClosed(self.why)
        if self.limit is not None and len(message) > self.limit:
            reason = f"Exceeded maximum message size: {self.limit} bytes"
            self.why = _describe(1009, reason)
            await self._send_close(1009, reason)
            raise TransportClosed(self.why)
        return message

    unflushed = False

    def write_now(self, text):
        if not self.immediate or self.why is not None:
            return None  # every frame through the writer: what the RPC tests watch
        try:
            self.tx.send_nowait(text)
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            return None
        return True

    def limit_messages(self, size, *, fragments=None):
        self.limit = size  # a message is one piece here: no fragments to count

    async def pump(self, take):
        while True:
            await take(await self.receive())

    async def _send_close(self, code, reason):
        try:
            self.tx.send_nowait(Close(code, reason))
        except (trio.WouldBlock, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        await self.tx.aclose()

    async def aclose(self, code=1000, reason=""):
        self.closed_with = self.closed_with or (code, reason)
        if self.why is None:
            self.why = "connection closed"
        await self._send_close(code, reason)


def pair(size: int = 100, *, immediate: bool = False) -> tuple[MemoryTransport, MemoryTransport]:
    a_tx, b_rx = trio.open_memory_channel(size)
    b_tx, a_rx = trio.open_memory_channel(size)
    return (
        MemoryTransport(a_tx, a_rx, immediate=immediate),
        MemoryTransport(b_tx, b_rx, immediate=immediate),
    )
