"""A dispatch's lease row, written behind by the bookkeeper, in-process: a real datastore,
bookkeeper and episodes; the
worker's socket is a stand-in that answers when the test says so. Time is trio's (autojump):
the write-behind delay passes only when every task is blocked."""

import os
import uuid

import pytest
import trio
import trio.testing

from swamp.bookkeeping.leases import LeaseBook
from swamp.domain.query import parse as parse_predicate
from swamp.domain.read_scope import ReadScope
from swamp.errors import StoreError
from swamp.models.builtin import ECHO
from swamp.orchestrator.bookkeeper import (
    JOURNAL_BATCH,
    JOURNAL_DELAY,
    LEASE_WRITE_DELAY,
    Bookkeeper,
)
from swamp.orchestrator.credentials import Credentials
from swamp.orchestrator.episode import Episodes, Step, Work
from swamp.orchestrator.pool import Member
from swamp.protocol.messages import DispatchResult
from swamp.store.datastore import Datastore
from swamp.store.journal import Journal
from swamp.store.records import SqliteRecords


class Worker:
    """The one call a dispatch makes on a worker's channel, answered when ``answer`` is set."""

    closed = False

    def __init__(self) -> None:
        self.answer = trio.Event()
        self.received = trio.Event()
        self.on_receipt = None  # called with the dispatch id as the frame arrives

    async def call(self, method, params, **kwargs):
        assert method == "worker.dispatch"
        if self.on_receipt is not None:
            await self.on_receipt(params["dispatchId"])
        self.received.set()
        await self.answer.wait()
        return DispatchResult(status="succeeded").to_json()


def member(channel) -> Member:
    return Member(
        name="w",
        instance_id=str(uuid.uuid4()),
        machine_id="m",
        token_name="t",
        labels={},
        platform="linux",
        arch="x86_64",
        capacity=4,
        version="1",
        channel=channel,
    )


WORK = Work(ECHO, "default", "echo", {}, {}, ReadScope.of(ECHO.type, "default"))


async def ignore(event):
    return None


@pytest.fixture
async def episodes(tmp_path):
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    bookkeeper = Bookkeeper(LeaseBook(SqliteRecords(store)))
    service = Episodes(bookkeeper, Credentials())
    async with trio.open_nursery() as nursery:
        await nursery.start(bookkeeper.run)
        yield service
        nursery.cancel_scope.cancel()
    store.close()


def rows(episodes) -> list:
    """(version, state, hasWrites) of every version of every lease row."""
    leases = parse_predicate('modelType == "swamp/step-lease"')
    return [
        (r.version, r.attributes["state"], r.attributes["hasWrites"])
        for r in episodes.bookkeeper.leases.db.store.query(leases, all_versions=True)
    ]


async def test_a_dispatch_shorter_than_the_delay_writes_its_row_once_already_ended(episodes):
    worker = Worker()
    worker.answer.set()
    episode = await episodes.run(member(worker), "d1", WORK, Step("s"), ignore)
    assert episode.result.status == "succeeded"
    assert rows(episodes) == [(1, "completed", False)]  # in the store before run() returned


async def test_a_longer_dispatch_is_in_the_store_while_it_runs_then_ended_in_place(
    episodes, autojump_clock
):
    worker = Worker()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(episodes.run, member(worker), "d1", WORK, Step("s"), ignore)
        await worker.received.wait()
        assert rows(episodes) == []  # not yet: it may end before the delay
        await trio.sleep(LEASE_WRITE_DELAY * 2)
        assert rows(episodes) == [(1, "active", False)]
        worker.answer.set()
    assert rows(episodes) == [(2, "completed", False)]


async def test_leases_due_together_are_written_in_one_transaction(episodes, autojump_clock):
    worker = Worker()
    commits = []
    original = episodes.bookkeeper.leases.insert_many
    episodes.bookkeeper.leases.insert_many = lambda many, **kw: (
        commits.append(len(many)) or original(many, **kw)
    )
    async with trio.open_nursery() as nursery:
        for n in range(5):
            nursery.start_soon(episodes.run, member(worker), f"d{n}", WORK, Step(f"s{n}"), ignore)
        await trio.testing.wait_all_tasks_blocked()
        await trio.sleep(LEASE_WRITE_DELAY * 2)
        assert commits == [5] and {r[1] for r in rows(episodes)} == {"active"}
        worker.answer.set()
    assert sorted(rows(episodes)) == [(2, "completed", False)] * 5


async def test_a_dispatch_that_writes_data_first_makes_its_row_write_bearing(episodes):
    worker = Worker()
    seen = []

    async def write_data(dispatch_id):  # what the data plane does before persisting a write
        await episodes.record_write(episodes.active[dispatch_id])
        seen.extend(rows(episodes))

    worker.on_receipt = write_data
    worker.answer.set()
    await episodes.run(member(worker), "d1", WORK, Step("s"), ignore)
    assert seen == [(1, "active", True)]  # durable before the write it announces
    assert rows(episodes) == [(2, "completed", True)]


async def test_a_cancelled_dispatch_still_leaves_its_row(episodes):
    worker = Worker()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(episodes.run, member(worker), "d1", WORK, Step("s"), ignore)
        await worker.received.wait()
        nursery.cancel_scope.cancel()
    assert rows(episodes) == [(1, "cancelled", False)]
    assert episodes.active == {}


async def test_rows_not_yet_written_go_in_at_shutdown_as_active(episodes):
    """A dispatch still running when the orchestrator stops leaves its row, active, for the
    next boot's reconciliation to expire (as before rows were written behind)."""
    worker = Worker()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(episodes.run, member(worker), "d1", WORK, Step("s"), ignore)
        await worker.received.wait()
        assert rows(episodes) == []
        await episodes.bookkeeper.flush()
        assert rows(episodes) == [(1, "active", False)]
        worker.answer.set()
    assert rows(episodes) == [(2, "completed", False)]  # ended in place if it still ends


async def test_a_store_that_refuses_writes_is_retried_ever_more_slowly_and_said_once(
    episodes, autojump_clock, caplog
):
    worker = Worker()
    attempts = []
    original = episodes.bookkeeper.leases.insert_many

    def refuse(many, **kw):
        attempts.append(trio.current_time())
        if len(attempts) <= 8:
            raise StoreError("the database file was deleted")
        return original(many, **kw)

    episodes.bookkeeper.leases.insert_many = refuse
    async with trio.open_nursery() as nursery:
        nursery.start_soon(episodes.run, member(worker), "d1", WORK, Step("s"), ignore)
        await worker.received.wait()
        await trio.sleep(30)
        assert len(attempts) == 9  # waits of 0.05, 0.1, 0.2 … 3.2, then 5 s: not every 50 ms
        assert attempts[-1] - attempts[0] > 10
        assert rows(episodes) == [(1, "active", False)]  # written once the store took it
        worker.answer.set()
    warnings = [r for r in caplog.records if "could not write the leases" in r.getMessage()]
    assert len(warnings) == 1


@pytest.fixture
async def journaled(tmp_path):
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    journal = Journal(tmp_path / "swamp.journal")
    bookkeeper = Bookkeeper(LeaseBook(SqliteRecords(store)), journal)
    service = Episodes(bookkeeper, Credentials())
    async with trio.open_nursery() as nursery:
        await nursery.start(bookkeeper.run)
        yield service
        nursery.cancel_scope.cancel()
    store.close()


async def test_a_short_dispatch_ends_in_the_journal_and_its_row_follows(journaled, autojump_clock):
    worker = Worker()
    worker.answer.set()
    await journaled.run(member(worker), "d1", WORK, Step("s"), ignore)
    # durable before run() returned: in the journal, already ended
    assert [e.attributes["state"] for e in journaled.bookkeeper.journal.entries()] == ["completed"]
    assert rows(journaled) == []
    await trio.sleep(JOURNAL_DELAY * 2)
    assert rows(journaled) == [(1, "completed", False)]
    assert journaled.bookkeeper.journal.entries() == []


async def test_a_batch_of_journaled_rows_goes_in_without_waiting_for_the_delay(journaled):
    worker = Worker()
    worker.answer.set()
    for n in range(JOURNAL_BATCH):
        await journaled.run(member(worker), f"d{n}", WORK, Step(f"s{n}"), ignore)
    await trio.testing.wait_all_tasks_blocked()  # real clock: the delay has not passed
    assert sorted(rows(journaled)) == [(1, "completed", False)] * JOURNAL_BATCH
    assert journaled.bookkeeper.journal.entries() == []


async def test_a_journal_that_fails_sends_rows_straight_to_the_store_and_says_so_once(
    journaled, caplog
):
    os.close(journaled.bookkeeper.journal._fd)  # the file can no longer be written
    journaled.bookkeeper.journal._fd = os.open(os.devnull, os.O_RDONLY)
    worker = Worker()
    worker.answer.set()
    for n in range(2):
        await journaled.run(member(worker), f"d{n}", WORK, Step(f"s{n}"), ignore)
        assert len(rows(journaled)) == n + 1  # in the store before run() returned
    warnings = [r for r in caplog.records if "could not append to the journal" in r.getMessage()]
    assert len(warnings) == 1


async def test_journaled_rows_go_in_at_shutdown(journaled):
    worker = Worker()
    worker.answer.set()
    await journaled.run(member(worker), "d1", WORK, Step("s"), ignore)
    assert rows(journaled) == []
    await journaled.bookkeeper.flush()
    assert rows(journaled) == [(1, "completed", False)]
    assert journaled.bookkeeper.journal.entries() == []
