"""What waits to be written to one socket: the :class:`Outbox` of an :class:`RpcChannel`
(``swamp.protocol.rpc``), bounded, with the writer's batches taken from it.

Kept apart from the channel because it is the one structure every frame of the dispatch path
passes through and the one bound a slow peer presses against; its rules (what waits, what is
refused, what one write carries) read best on their own.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import trio

OUTBOX_FRAMES = 1024  # requests, answers, pongs waiting for the writer; more wait for room
WRITE_FRAMES, WRITE_BYTES = 64, 256 * 1024  # what one write to the socket may carry at most
OUTBOX_EVENT_BYTES = 16 * 1024 * 1024  # streamed events waiting; more are dropped or wait


class Outbox:
    """Frames waiting for the writer, bounded two ways: streamed events by bytes (a burst of
    output from a fast command should reach a client that reads a little slower), everything
    else by count. A frame that does not fit waits (:meth:`put`) or is refused (:meth:`offer`).
    """

    __slots__ = (
        "max_frames",
        "max_event_bytes",
        "_queue",
        "frames",
        "event_bytes",
        "closed",
        "_changed",
        "_waiting",
        "_released",
        "_kicked",
        "on_item",
    )

    def __init__(
        self, *, max_frames: int = OUTBOX_FRAMES, max_event_bytes: int = OUTBOX_EVENT_BYTES
    ) -> None:
        self.max_frames = max_frames
        self.max_event_bytes = max_event_bytes
        # made for the first frame and dropped when the writer is let go: an idle socket's
        # outbox holds no queue (a deque is 600 bytes, and an orchestrator holds thousands)
        self._queue: deque[tuple[str, bool]] | None = None
        self.frames = 0
        self.event_bytes = 0
        self.closed = False
        self._changed: trio.Event | None = None  # made when someone waits
        self._waiting = 0  # tasks in put() or get(): only they need waking
        self._released = False  # get() returns None once, when it finds nothing to send
        self._kicked = False  # get() returns "" once, when it finds nothing to send
        self.on_item: Callable[[], None] | None = None  # a frame came in (start a writer)

    def __repr__(self) -> str:
        return f"<Outbox frames={self.frames} eventBytes={self.event_bytes}>"

    def _fits(self, text: str, event: bool) -> bool:
        if event:
            return self.event_bytes + len(text) <= self.max_event_bytes
        return self.frames < self.max_frames

    def _append(self, text: str, event: bool) -> None:
        if self._queue is None:
            self._queue = deque()
        self._queue.append((text, event))
        if event:
            self.event_bytes += len(text)
        else:
            self.frames += 1
        self._wake()

    def _wake(self) -> None:
        if self._waiting and self._changed is not None:
            self._changed.set()
            self._changed = None

    async def _wait(self) -> None:
        if self._changed is None:
            self._changed = trio.Event()
        self._waiting += 1
        try:
            await self._changed.wait()
        finally:
            self._waiting -= 1

    def offer(self, text: str, *, event: bool) -> bool:
        if self.closed or not self._fits(text, event):
            return False
        self._append(text, event)
        if self.on_item is not None:
            self.on_item()
        return True

    async def put(self, text: str, *, event: bool) -> None:
        while not self._fits(text, event):
            if self.closed:
                raise trio.ClosedResourceError
            await self._wait()
        if self.closed:
            raise trio.ClosedResourceError
        self._append(text, event)
        if self.on_item is not None:
            self.on_item()

    @property
    def waiting(self) -> bool:
        """Frames are waiting for the writer (a new one must go after them)."""
        return bool(self._queue)

    async def get(self) -> str | None:
        """The next frame to send; ``None`` after :meth:`release` and ``""`` after
        :meth:`kick`, if there is none."""
        while not self._queue:
            if self.closed:
                raise trio.EndOfChannel
            if self._kicked:
                self._kicked = False
                return ""
            if self._released:
                self._released = False
                self._queue = None
                return None
            await self._wait()
        text, event = self._queue.popleft()
        if event:
            self.event_bytes -= len(text)
        else:
            self.frames -= 1
        self._wake()
        return text

    def take_ready(self, *, max_frames: int, max_bytes: int) -> list[str]:
        """More frames already waiting, in order, to go out in the same write as the one just
        taken (within ``max_frames`` and about ``max_bytes``); never waits."""
        out: list[str] = []
        size = 0
        queue = self._queue
        while queue and len(out) < max_frames and size < max_bytes:
            text, event = queue.popleft()
            if event:
                self.event_bytes -= len(text)
            else:
                self.frames -= 1
            out.append(text)
            size += len(text)
        if out:
            self._wake()
        return out

    def kick(self) -> None:
        """Wake the writer though no frame came (it has something else to send)."""
        self._kicked = True
        self._wake()

    def release(self) -> None:
        """Let the writer go the next time it finds nothing to send (an idle socket need not
        keep a task waiting; the next frame starts one)."""
        self._released = True
        self._wake()

    def close(self) -> None:
        self.closed = True
        self._wake()
