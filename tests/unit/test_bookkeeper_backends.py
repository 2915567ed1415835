"""The bookkeeper, its books and a workflow run's writer on both backends of the record store
(the contract tests' ``records`` fixture). On PostgreSQL a batch of lease rows is a
transaction in flight while dispatches go on: one that ends, writes or has an effect meanwhile
must change the row the batch wrote — never insert it twice, never lose its end."""

from __future__ import annotations

import trio
import trio.lowlevel
import trio.testing

from swamp.bookkeeping.leases import LeaseBook
from swamp.bookkeeping.leases import key as lease_key
from swamp.bookkeeping.pending import PendingBook
from swamp.bookkeeping.workers import WorkerBook
from swamp.bookkeeping.workflow_runs import RunBook, RunWriter
from swamp.domain.leases import LeaseState
from swamp.domain.queue import PendingState
from swamp.domain.run_record import JobRecord, RunRecord, Status, StepRecord, step_counts
from swamp.orchestrator.bookkeeper import LEASE_WRITE_DELAY, Bookkeeper
from tests.unit.test_store_contract import records  # noqa: F401 - the fixture

COUNT = 24


def opened(bookkeeper: Bookkeeper, n: int):
    return bookkeeper.open_lease(
        f"d{n:03}", worker="w", model_type="swamp/echo", model_name="default", method="echo"
    )


async def test_dispatches_that_end_while_their_rows_are_in_flight_end_them(records):  # noqa: F811
    bookkeeper = Bookkeeper(LeaseBook(records))
    async with trio.open_nursery() as nursery:
        await nursery.start(bookkeeper.run)
        leases = [opened(bookkeeper, n) for n in range(COUNT)]
        await trio.sleep(LEASE_WRITE_DELAY)  # due: the task takes them in one batch
        await trio.lowlevel.checkpoint()  # (PostgreSQL: the batch is in flight now)
        async with trio.open_nursery() as ending:
            for n, lease in enumerate(leases):
                if n % 3 == 0:
                    bookkeeper.mark_effects(lease)
                ending.start_soon(bookkeeper.end_lease, lease, LeaseState.COMPLETED, None)
        nursery.cancel_scope.cancel()
    for n in range(COUNT):
        row = await records.latest(lease_key(f"d{n:03}"))
        assert row is not None and row.attributes["state"] == "completed", n
        assert row.attributes["hasWrites"] is (n % 3 == 0), n
        # inserted once (maybe already ended), marked once (maybe in the insert), ended once
        assert row.version <= (3 if n % 3 == 0 else 2), n
    assert bookkeeper.statistics().leases_unwritten == 0


async def test_an_effect_on_a_written_row_is_marked_by_the_task(records):  # noqa: F811
    bookkeeper = Bookkeeper(LeaseBook(records))
    async with trio.open_nursery() as nursery:
        await nursery.start(bookkeeper.run)
        lease = opened(bookkeeper, 1)
        await trio.sleep(LEASE_WRITE_DELAY)
        await bookkeeper.flush()  # its row goes in, active
        assert lease.record is not None
        bookkeeper.mark_effects(lease)  # never waits: the task writes it
        with trio.fail_after(30):
            await bookkeeper.effects_settled()
        row = await records.latest(lease_key("d001"))  # said in the stored row, before its end
        assert row is not None and row.attributes["hasWrites"] is True
        assert row.attributes["state"] == "active" and lease.writes_stored
        await bookkeeper.end_lease(lease, LeaseState.COMPLETED, None)
        nursery.cancel_scope.cancel()


async def test_rows_still_unwritten_go_in_active_at_shutdown_and_boot_expires_them(records):  # noqa: F811
    bookkeeper = Bookkeeper(LeaseBook(records))
    for n in range(3):
        opened(bookkeeper, n)  # the task never ran: nothing is written
    await bookkeeper.flush()
    assert [
        (await records.latest(lease_key(f"d{n:03}"))).attributes["state"] for n in range(3)
    ] == ["active"] * 3
    assert await LeaseBook(records).reconcile() == 3  # the next boot
    row = await records.latest(lease_key("d000"))
    assert row is not None and row.attributes["state"] == "expired"


async def test_worker_versions_and_queue_episodes(records):  # noqa: F811
    workers = WorkerBook(records)
    await workers.enrolled(
        name="w1", instance_id="i", machine_id="m", token="t", labels={}, platform="linux",
        arch="x86_64", capacity=2, version="1",
    )  # fmt: skip
    await workers.set_status("w1", "busy", active=["d1"])
    assert await workers.set_status("w1", "busy", active=["d1"]) is not None  # no new version
    assert [a["status"] for a in await workers.all()] == ["busy"]
    assert await workers.reconcile() == 1
    [gone] = await workers.stale(older_than_seconds=-60, live=())
    assert gone["status"] == "disconnected" and gone["disconnectReason"] == "orchestrator restart"
    assert await workers.forget(["w1"]) == 3  # its versions
    assert await workers.all() == []

    pending = PendingBook(records)
    for queue_id in ("a", "b"):
        await pending.enqueue({"queueId": queue_id, "queuedAt": f"2026-01-01T00:00:0{queue_id}"})
    await pending.end("a", PendingState.DISPATCHED, dispatch_id="d1")
    assert [a["queueId"] for a in await pending.waiting()] == ["b"]
    assert await pending.reconcile() == 1
    assert await pending.collect(older_than_seconds=-60) == 4  # both, two versions each
    assert await pending.waiting() == []


async def test_a_run_changed_while_its_flush_is_in_flight_is_stored_as_it_ended(records):  # noqa: F811
    """On PostgreSQL the engine goes on while a flush waits on the server: a step changed,
    the header changed and a step dropped meanwhile are written by the next flush, and two
    flushes never run at once."""
    run = RunRecord(
        "ab" * 16,
        "wf",
        "2026-01-01T00:00:00.000Z",
        status=Status.RUNNING,
        jobs=[JobRecord("j", Status.RUNNING, steps=[StepRecord(f"s{i}") for i in range(40)])],
    )
    writer = RunWriter(records, run)
    for step in run.jobs[0].steps:
        writer.add("j", step)
    steps = run.jobs[0].steps
    async with trio.open_nursery() as nursery:
        nursery.start_soon(writer.flush)
        nursery.start_soon(writer.flush)  # a second save at once: it waits for the first
        await trio.testing.wait_all_tasks_blocked()  # the first waits on the server
        for step in steps[:10]:  # (on SQLite the first flush has committed by now)
            step.status = Status.SUCCEEDED
            writer.changed(step)
        writer.drop(steps[39])
        run.status = Status.SUCCEEDED
        writer.header_changed()
    while writer.pending:
        await writer.flush()
    stored = await RunBook(records).get(run.run_id)
    assert stored.status == Status.SUCCEEDED
    by_name = {s.name: s.status for s in stored.jobs[0].steps}
    assert [by_name[f"s{i}"] for i in range(10)] == [Status.SUCCEEDED] * 10
    assert by_name["s10"] == Status.PENDING and "s39" not in by_name
    header = await RunBook(records).header(run.run_id)
    assert step_counts(header) == {"succeeded": 10, "pending": 29}


async def test_writes_and_the_end_of_a_dispatch_at_once_find_its_row_written(records):  # noqa: F811
    """Two writes of one dispatch at once (the data plane lets them), then its end while the
    first insert of its row may still be on the server: each write returns with the row
    stored and write-bearing, and the end ends that row (a review found, on PostgreSQL, the
    second write returning with no row, and the end lost)."""

    class SlowServer(LeaseBook):  # the store's own, a row's insert taking a while
        async def insert(self, attrs: dict):
            await trio.sleep(0.05)
            return await super().insert(attrs)

    bookkeeper = Bookkeeper(SlowServer(records))  # its task not running: nothing is due
    lease = opened(bookkeeper, 1)
    seen: list[bool] = []

    async def write() -> None:
        await bookkeeper.mark_writes(lease)
        row = await records.latest(lease_key("d001"))
        seen.append(row is not None and row.attributes["hasWrites"] is True)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(write)
        nursery.start_soon(write)
    assert seen == [True, True]
    other = opened(bookkeeper, 2)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(bookkeeper.mark_writes, other)
        await trio.testing.wait_all_tasks_blocked()  # its insert under way
        nursery.start_soon(bookkeeper.end_lease, other, LeaseState.COMPLETED, None)
    row = await records.latest(lease_key("d002"))
    assert row is not None and row.attributes["state"] == "completed"
    assert row.attributes["hasWrites"] is True
