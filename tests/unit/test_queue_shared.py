"""Review of issue 28: the dispatch queue with a shared queue behind it (a stand-in for
``Peers``), on a real SQLite store and pool."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from swamp.bookkeeping.leases import LeaseBook
from swamp.domain.placement import Placement
from swamp.errors import DatabaseUnavailable
from swamp.orchestrator.bookkeeper import Bookkeeper
from swamp.orchestrator.queue import DispatchQueue
from tests.unit.test_dispatch_queue import INFO, ignore, live_tokens, member, store  # noqa: F401


class BlinkingPeers:
    """The shared queue while the database blinks: publishing fails."""

    me = "me"

    def __init__(self) -> None:
        self.withdrawn: list[str] = []

    async def publish(self, queue_id, placement, priority, submitter):
        await trio.lowlevel.checkpoint()
        raise DatabaseUnavailable("the database is away (a blink)")

    async def withdraw_or_claim(self, queue_id):
        return None

    def withdraw_soon(self, queue_id):
        self.withdrawn.append(queue_id)

    def slot_freed(self):
        pass

    def hint(self, requirement):
        return None  # no claim of its kind yet: it waits, and is published


@pytest.fixture
async def queue(store, live_tokens):  # noqa: F811
    bookkeeper = Bookkeeper(LeaseBook(live_tokens.tokens.db))
    service = DispatchQueue(
        live_tokens.pool,
        bookkeeper.leases.db,
        bookkeeper,
        tokens=live_tokens.token,
        peers=BlinkingPeers(),  # type: ignore[arg-type]
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(bookkeeper.run)
        yield service
        nursery.cancel_scope.cancel()


async def test_a_database_blink_does_not_fail_a_step_a_local_worker_would_take(queue):
    """Publishing to the shared queue is awaited inside acquire's try: a failed INSERT makes
    the step fail with DatabaseUnavailable, although the local worker it waits for frees up a
    moment later (before, waiting needed no synchronous write)."""
    w = member("w", labels={"gpu": "true"})
    queue.pool.put(w)
    first = await queue.acquire(Placement(labels={"gpu": "true"}), INFO, deadline=None, emit=ignore)
    got = []

    async def second() -> None:
        got.append(
            await queue.acquire(
                Placement(labels={"gpu": "true"}),
                INFO,
                deadline=trio.current_time() + 5,
                emit=ignore,
            )  # fmt: skip
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(second)
        await trio.testing.wait_all_tasks_blocked()
        queue.release(first.member, first.dispatch_id)
    assert got and got[0].member is w
