"""Bookkeeping written behind, in order, by one task.

Status versions and queue episodes change where nothing may wait on the disk — a socket's close
callback, the moment a step is assigned — so each change is queued here as a small write and
performed by one task, in the order the changes happened, retried while another process holds
the database (``retry_busy``). Nothing is coalesced. The queue is bounded: past ``limit`` the
oldest change is dropped with a warning (these records are history; the live state is in
memory and the next boot reconciles what the disk says).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import Any

import trio

from swamp.errors import SwampError
from swamp.store.retry import retry_busy

log = logging.getLogger("swamp.records")


class WriteBehind:
    def __init__(self, name: str, *, limit: int = 250_000) -> None:
        self.name = name
        self.limit = limit
        self._queue: deque[tuple[str, Callable[[], Any], Callable[[Any], None] | None]] = deque()
        self._changed = trio.Event()
        self._idle = trio.Event()
        self._idle.set()
        self.written = 0
        self.failed = 0
        self.dropped = 0

    def __repr__(self) -> str:
        return f"<WriteBehind {self.name} queued={len(self._queue)} written={self.written}>"

    def put(
        self, what: str, write: Callable[[], Any], then: Callable[[Any], None] | None = None
    ) -> None:
        """Queue ``write`` (a synchronous store call; never waits here); ``then`` gets its
        result once written."""
        if len(self._queue) >= self.limit:
            dropped, _, _ = self._queue.popleft()
            self.dropped += 1
            log.warning("%s: too many writes behind; dropped %s", self.name, dropped)
        self._queue.append((what, write, then))
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        self._changed.set()

    async def settled(self) -> None:
        """Wait until everything queued so far is written (or given up on)."""
        await self._idle.wait()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            while not self._queue:
                self._idle.set()
                self._changed = trio.Event()
                await self._changed.wait()
            what, write, then = self._queue.popleft()
            try:
                result = await retry_busy(write)
            except SwampError as exc:
                self.failed += 1
                log.warning("could not record %s: %s", what, exc)
                continue
            self.written += 1
            if then is not None:
                then(result)
