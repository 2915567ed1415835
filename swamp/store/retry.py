"""Writing while another process holds the database's lock, without blocking the event loop.

The orchestrator's connection fails a contended write at once (:class:`StoreBusy`); this retries
it with growing pauses that yield to trio, so heartbeats, ``/health`` and every socket carry on
while, say, a CLI holds a long transaction. A write is a compare-and-swap or an insert, so
running it again is safe. After :data:`BUSY_DEADLINE` seconds it gives up with one line.

The operation may be a plain call on the store or one awaited through the record store's seam
(``swamp.store.records``): a transaction refused as busy has rolled back whole, so its body is
run again from the start, as a plain call is.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import TypeVar, overload

import trio

from swamp.errors import StoreBusy, StoreError

T = TypeVar("T")
BUSY_DEADLINE = 120.0
FIRST_PAUSE = 0.005
LONGEST_PAUSE = 0.25


@overload
async def retry_busy(
    operation: Callable[[], Awaitable[T]], *, deadline: float = BUSY_DEADLINE
) -> T: ...


@overload
async def retry_busy(operation: Callable[[], T], *, deadline: float = BUSY_DEADLINE) -> T: ...


async def retry_busy(operation, *, deadline=BUSY_DEADLINE):
    """``operation()`` (awaited, when it gives an awaitable), again and again while the
    database is locked by someone else."""
    pause = FIRST_PAUSE
    give_up = trio.current_time() + deadline
    while True:
        try:
            result = operation()
            if inspect.isawaitable(result):
                result = await result
            return result
        except StoreBusy:
            if trio.current_time() >= give_up:
                raise StoreError(
                    f"the database has been locked by another process for {deadline:g}s; "
                    "nothing was written"
                ) from None
        await trio.sleep(pause)
        pause = min(pause * 2, LONGEST_PAUSE)
