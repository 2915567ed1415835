"""Waking the other orchestrators: PostgreSQL NOTIFY, coalesced, and a listener that rescans.

A step that no worker of this orchestrator can take waits in the shared queue; the others must
look at it now, not at their next timer. :class:`Waker` tells them: :meth:`Waker.wake` only
marks that something changed (it never waits), and one task sends a single ``pg_notify`` for
every mark since its last — a burst of a thousand changes is one or two notifications, and a
notifying transaction's commit-order lock (every NOTIFY takes it) stays off the write path. The
payload is the sender's name, so a listener skips its own.

:func:`listen` is the other end: one connection of its own, LISTEN, and ``on_wake`` for every
batch of notifications from others. A notification is a hint, never the message: the tables
are the truth. So whenever notifications may have been lost — the listener's queue
overflowed, its connection dropped and was made again — ``on_wake`` is called as well: the
caller rescans what it watches.
"""

from __future__ import annotations

from collections.abc import Callable

import trio

from swamp.errors import SwampError
from swamp.store import pg

RECONNECT_START = 0.5  # seconds before the first reconnection; doubling to
RECONNECT_CAP = 10.0


class Waker:
    """Coalesced NOTIFY on ``channel``, sent by :meth:`run` (a task) from ``pool``."""

    def __init__(self, pool: pg.Pool, channel: str, sender: str) -> None:
        self.pool = pool
        self.channel = channel
        self.sender = sender
        self.sent = 0
        self.marked = 0
        self._pending = trio.Event()
        self._sending = trio.Event()  # set after each notification sent

    def __repr__(self) -> str:
        return f"<Waker {self.channel!r} marked={self.marked} sent={self.sent}>"

    def wake(self) -> None:
        """Something the others watch changed: they are told soon (never waits)."""
        self.marked += 1
        self._pending.set()

    async def sent_at_least(self, count: int) -> None:
        """Wait until ``count`` notifications have gone (a listener may hear one before its
        sender has read the reply to its statement)."""
        while self.sent < count:
            await self._sending.wait()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self._pending.wait()
            self._pending = trio.Event()  # marks from now on make the next notification
            try:
                async with self.pool.connection() as conn:
                    await conn.execute("SELECT pg_notify($1, $2)", (self.channel, self.sender))
                self.sent += 1
                self._sending.set()
                self._sending = trio.Event()
            except SwampError:
                # the database is away: the others rescan when their listeners reconnect,
                # and this mark is sent with the next one
                self._pending.set()
                await trio.sleep(RECONNECT_START)


async def listen(
    url: str,
    channel: str,
    me: str,
    on_wake: Callable[[], None],
    *,
    task_status=trio.TASK_STATUS_IGNORED,
) -> None:
    """Call ``on_wake`` for every batch of notifications on ``channel`` from others than
    ``me``, and whenever some may have been missed (a full queue, a connection made again):
    for ever, reconnecting with a doubling pause."""
    started = False
    pause = RECONNECT_START
    while True:
        try:
            async with await pg.connect(url) as conn:
                await conn.listen(channel)
                if started:
                    on_wake()  # what was sent while it was away is not coming: rescan
                else:
                    started = True
                    task_status.started()
                pause = RECONNECT_START
                while True:
                    batch = await conn.wait_notifications()
                    if batch.missed or any(n.payload != me for n in batch.received):
                        on_wake()
        except SwampError:
            if not started:
                raise  # the first connection: the caller is told, as at any start
            await trio.sleep(pause)
            pause = min(RECONNECT_CAP, pause * 2)
