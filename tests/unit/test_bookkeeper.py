"""The bookkeeper in-process: one task writes everything behind — ordered writes (status
versions, queue episodes) in the order they were queued, lease rows as they fall due — each
stream with its own bound, and says what waits and what was written."""

import pytest
import trio
import trio.testing

from swamp.bookkeeping.leases import LeaseBook
from swamp.domain.leases import LeaseState
from swamp.errors import StoreError
from swamp.orchestrator.bookkeeper import (
    JOURNAL_DELAY,
    Bookkeeper,
    BookkeeperStatistics,
    Stream,
)
from swamp.store.datastore import Datastore
from swamp.store.journal import Journal
from swamp.store.records import SqliteRecords


@pytest.fixture
def store(tmp_path):
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    yield store
    store.close()


async def test_ordered_writes_go_in_the_order_they_were_queued_and_settle(store):
    bookkeeper = Bookkeeper(LeaseBook(SqliteRecords(store)))
    done: list[int] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(bookkeeper.run)
        for n in range(5):
            bookkeeper.put(Stream.WORKERS, f"write {n}", lambda n=n: n, done.append)
        assert done == []  # put never waits, and never writes
        await bookkeeper.settled()
        assert done == [0, 1, 2, 3, 4]
        nursery.cancel_scope.cancel()
    assert bookkeeper.statistics().written == 5 and bookkeeper.statistics().pending == 0


async def test_past_the_bound_the_oldest_queued_write_is_dropped_and_said(store, caplog):
    bookkeeper = Bookkeeper(
        LeaseBook(SqliteRecords(store)), limits={Stream.WORKERS: 2, Stream.QUEUE: 2}
    )
    done: list[int] = []
    for n in range(3):  # the task is not running: all three wait
        bookkeeper.put(Stream.WORKERS, f"write {n}", lambda n=n: n, done.append)
    assert bookkeeper.statistics().pending == 2 and bookkeeper.statistics().dropped == 1
    assert "dropped write 0" in caplog.text
    async with trio.open_nursery() as nursery:
        await nursery.start(bookkeeper.run)
        await bookkeeper.settled()
        nursery.cancel_scope.cancel()
    assert done == [1, 2]


async def test_a_flood_of_one_stream_drops_its_own_oldest_never_another_streams(store, caplog):
    bookkeeper = Bookkeeper(
        LeaseBook(SqliteRecords(store)), limits={Stream.WORKERS: 4, Stream.QUEUE: 4}
    )
    done: list[str] = []
    bookkeeper.put(Stream.WORKERS, "w1 as disconnected", lambda: "w1", done.append)
    for n in range(5):  # the task is not running: one more than the queue's bound
        bookkeeper.put(Stream.QUEUE, f"queue episode {n}", lambda n=n: f"q{n}", done.append)
    assert bookkeeper.statistics().dropped == 1
    assert "queue episodes: too many writes behind; dropped queue episode 0" in caplog.text
    async with trio.open_nursery() as nursery:
        await nursery.start(bookkeeper.run)
        await bookkeeper.settled()
        nursery.cancel_scope.cancel()
    assert done == ["w1", "q1", "q2", "q3", "q4"]  # the order they happened in, across streams


async def test_a_stream_settles_without_waiting_for_another(store):
    """Enrollment waits for a worker's last status version, not behind a queue's backlog."""
    bookkeeper = Bookkeeper(LeaseBook(SqliteRecords(store)))
    for n in range(500):  # the task is not running: these wait
        bookkeeper.put(Stream.QUEUE, f"queue episode {n}", lambda: None)
    settled: list[Stream] = []

    async def wait(stream: Stream) -> None:
        await bookkeeper.settled(stream)
        settled.append(stream)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait, Stream.WORKERS)
        nursery.start_soon(wait, Stream.QUEUE)
        await trio.testing.wait_all_tasks_blocked()
        assert settled == [Stream.WORKERS]  # nothing of its own queued: settled at once
        await nursery.start(bookkeeper.run)
        await trio.testing.wait_all_tasks_blocked()
        assert settled == [Stream.WORKERS, Stream.QUEUE]
        nursery.cancel_scope.cancel()


async def test_a_write_the_store_refuses_is_counted_and_the_next_goes_on(store, caplog):
    bookkeeper = Bookkeeper(LeaseBook(SqliteRecords(store)))

    def refuse():
        raise StoreError("the database file was deleted")

    done: list[str] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(bookkeeper.run)
        bookkeeper.put(Stream.WORKERS, "a worker as idle", refuse)
        bookkeeper.put(Stream.QUEUE, "a queue episode", lambda: "ok", done.append)
        await bookkeeper.settled()
        nursery.cancel_scope.cancel()
    assert done == ["ok"] and bookkeeper.statistics().failed == 1
    assert "could not record a worker as idle" in caplog.text


async def test_lease_rows_and_ordered_writes_share_one_task_and_the_statistics_say_so(
    store, tmp_path, autojump_clock
):
    journal = Journal(tmp_path / "swamp.journal")
    bookkeeper = Bookkeeper(LeaseBook(SqliteRecords(store)), journal)
    async with trio.open_nursery() as nursery:
        await nursery.start(bookkeeper.run)
        lease = bookkeeper.open_lease(
            "d1", worker="w", model_type="swamp/echo", model_name="default", method="echo"
        )
        await bookkeeper.end_lease(lease, LeaseState.COMPLETED, None)
        bookkeeper.put(Stream.WORKERS, "a worker as busy", lambda: None)
        stats = bookkeeper.statistics()
        assert stats.leases_journaled == 1 and stats.journal_bytes > 0
        assert stats.pending == 1
        await bookkeeper.settled()
        await trio.sleep(JOURNAL_DELAY * 2)
        stats = bookkeeper.statistics()
        assert stats == BookkeeperStatistics(
            pending=0,
            written=1,
            failed=0,
            dropped=0,
            leases_unwritten=0,
            leases_journaled=0,
            leases_written=1,
            batches=1,
            journal_bytes=0,
        )
        nursery.cancel_scope.cancel()
    journal.close()


async def test_a_store_refusing_lease_rows_does_not_hold_the_ordered_writes_back(
    store, autojump_clock
):
    bookkeeper = Bookkeeper(LeaseBook(SqliteRecords(store)))
    attempts = []
    original = bookkeeper.leases.insert_many

    def refuse(many, **kw):
        attempts.append(trio.current_time())
        if len(attempts) <= 3:
            raise StoreError("the database is read-only")
        return original(many, **kw)

    bookkeeper.leases.insert_many = refuse
    done: list[str] = []
    async with trio.open_nursery() as nursery:
        await nursery.start(bookkeeper.run)
        bookkeeper.open_lease(
            "d1", worker="w", model_type="swamp/echo", model_name="default", method="echo"
        )
        await trio.sleep(0.06)  # due, refused once: now in its pause
        assert len(attempts) == 1
        bookkeeper.put(Stream.WORKERS, "a worker as idle", lambda: "ok", done.append)
        await bookkeeper.settled()
        assert done == ["ok"] and len(attempts) == 1  # written meanwhile, the lease still waits
        await trio.sleep(5)
        assert len(attempts) == 4 and bookkeeper.statistics().leases_unwritten == 0
        nursery.cancel_scope.cancel()
