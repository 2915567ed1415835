"""Waking the other orchestrators (``swamp.store.pg_wake``) on a real server: a burst of
changes is one or two notifications, a listener skips its own, and a listener whose
connection the server ends makes it again and rescans."""

from __future__ import annotations

import trio
import trio.testing

from swamp.store import pg
from swamp.store.pg_wake import Waker, listen

CHANNEL = "swamp_queue"


class Woken:
    def __init__(self) -> None:
        self.count = 0
        self.event = trio.Event()

    def __call__(self) -> None:
        self.count += 1
        self.event.set()

    async def next(self) -> None:
        with trio.fail_after(30):
            await self.event.wait()
        self.event = trio.Event()


async def test_a_burst_of_changes_is_one_or_two_notifications(pg_url):
    woken = Woken()
    async with pg.Pool(pg_url, size=2) as pool, trio.open_nursery() as nursery:
        await nursery.start(listen, pg_url, CHANNEL, "orch-b", woken)
        waker = Waker(pool, CHANNEL, "orch-a")
        await nursery.start(waker.run)
        for _ in range(1000):  # a thousand steps queued at once
            waker.wake()
        await woken.next()
        with trio.fail_after(30):  # (heard, maybe before its sender read the reply)
            await waker.sent_at_least(1)
        await trio.testing.wait_all_tasks_blocked()
        assert waker.marked == 1000 and 1 <= waker.sent <= 2
        nursery.cancel_scope.cancel()


async def test_a_listener_skips_its_own_notifications(pg_url):
    mine, theirs = Woken(), Woken()
    async with pg.Pool(pg_url, size=2) as pool, trio.open_nursery() as nursery:
        await nursery.start(listen, pg_url, CHANNEL, "orch-a", mine)
        await nursery.start(listen, pg_url, CHANNEL, "orch-b", theirs)
        waker = Waker(pool, CHANNEL, "orch-a")
        await nursery.start(waker.run)
        waker.wake()
        await theirs.next()
        # a notification from b: a hears it; its own never woke it
        async with pool.connection() as conn:
            await conn.execute("SELECT pg_notify($1, 'orch-b')", (CHANNEL,))
        await mine.next()
        assert mine.count == 1
        nursery.cancel_scope.cancel()


async def test_a_listener_whose_connection_is_ended_reconnects_and_rescans(pg_url):
    woken = Woken()
    async with pg.Pool(pg_url, size=2) as pool, trio.open_nursery() as nursery:
        await nursery.start(listen, pg_url, CHANNEL, "orch-b", woken)
        async with pool.connection() as conn:
            await conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE query LIKE "
                "'LISTEN%' AND pid <> pg_backend_pid()"
            )
        await woken.next()  # made again: a rescan, for what it may have missed
        assert woken.count == 1
        waker = Waker(pool, CHANNEL, "orch-a")
        await nursery.start(waker.run)
        waker.wake()
        await woken.next()  # and the new LISTEN hears the others
        assert woken.count == 2
        nursery.cancel_scope.cancel()
