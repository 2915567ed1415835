"""The queue service in-process: a real datastore and pool, members whose sockets are stand-ins.
A waiting step is woken by the pool event itself; timeouts, cancellation and a dead target end
its episode as the records say."""

import uuid

import pytest
import trio
import trio.testing

from swamp.bookkeeping.leases import LeaseBook
from swamp.bookkeeping.tokens import TokenBook
from swamp.domain.placement import Placement
from swamp.errors import NoMatchingWorker, QueueTimeout
from swamp.orchestrator.bookkeeper import Bookkeeper
from swamp.orchestrator.live_tokens import LiveTokens
from swamp.orchestrator.pool import Member, Pool
from swamp.orchestrator.queue import DispatchQueue, StepInfo
from swamp.store.datastore import Datastore
from swamp.store.records import SqliteRecords


class Socket:
    """What the pool asks of a member's channel: is it open?"""

    closed = False


def member(name, *, labels=None, capacity=1, token="t"):
    return Member(
        name=name,
        instance_id=str(uuid.uuid5(uuid.NAMESPACE_DNS, name)),
        machine_id=name,
        token_name=token,
        labels=labels or {},
        platform="linux",
        arch="x86_64",
        capacity=capacity,
        version="1",
        channel=Socket(),
    )


INFO = StepInfo("command/shell", "default", "run")


async def ignore(event):
    return None


@pytest.fixture
def store(tmp_path):
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    yield store
    store.close()


@pytest.fixture
def live_tokens(store):
    """What the queue knows of tokens (told of a write by the test, as by the admin)."""
    return LiveTokens(store, Pool(), TokenBook(SqliteRecords(store)))


@pytest.fixture
async def queue(store, live_tokens):
    bookkeeper = Bookkeeper(LeaseBook(live_tokens.tokens.db))
    service = DispatchQueue(
        live_tokens.pool, bookkeeper.leases.db, bookkeeper, tokens=live_tokens.token
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(bookkeeper.run)
        yield service
        nursery.cancel_scope.cancel()


async def episodes(queue):
    await queue.bookkeeper.settled()
    return {
        a["queueId"]: a
        for a in (
            r.attributes for r in queue.pending.db.store.latest_of_type("swamp/pending-dispatch")
        )
    }


async def test_a_free_worker_takes_the_step_at_once_and_leaves_no_record(queue):
    w = member("w", labels={"gpu": "true"})
    queue.pool.put(w)
    ticket = await queue.acquire(
        Placement(labels={"gpu": "true"}), INFO, deadline=None, emit=ignore
    )
    assert ticket.member is w and ticket.queue_id is None and w.active == {ticket.dispatch_id}
    assert await episodes(queue) == {}


async def test_an_enrollment_wakes_the_waiting_step_in_the_same_event(queue):
    got = []

    async def wait() -> None:
        got.append(
            await queue.acquire(Placement(labels={"gpu": "true"}), INFO, deadline=None, emit=ignore)
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        assert len(queue.waiting) == 1 and [i.requirement for i in queue.items()] == ["gpu=true"]
        queue.pool.put(member("plain"))  # matches nothing: still waiting
        assert len(queue.waiting) == 1
        gpu = member("gpu", labels={"gpu": "true"})
        queue.pool.put(gpu)
        assert len(queue.waiting) == 0 and len(gpu.active) == 1  # decided in the event itself
    [ticket] = got
    assert ticket.member is gpu
    [episode] = (await episodes(queue)).values()
    assert episode["state"] == "dispatched" and episode["dispatchId"] == ticket.dispatch_id


async def test_a_freed_slot_goes_to_the_oldest_waiting_step(queue):
    w = member("w", capacity=1)
    queue.pool.put(w)
    first = await queue.acquire(Placement(target="w"), INFO, deadline=None, emit=ignore)
    order = []

    async def wait(n) -> None:
        ticket = await queue.acquire(Placement(target="w"), INFO, deadline=None, emit=ignore)
        order.append(n)
        queue.release(w, ticket.dispatch_id)

    async with trio.open_nursery() as nursery:
        for n in range(3):
            nursery.start_soon(wait, n)
            await trio.testing.wait_all_tasks_blocked()
        queue.release(w, first.dispatch_id)
    assert order == [0, 1, 2] and w.active == set()


async def test_the_deadline_fails_the_step_and_ends_its_episode(queue):
    with pytest.raises(QueueTimeout, match="matching labels zone=mars to become available"):
        await queue.acquire(
            Placement(labels={"zone": "mars"}),
            INFO,
            deadline=trio.current_time() + 0.05,
            emit=ignore,
        )
    assert len(queue.waiting) == 0
    assert [e["state"] for e in (await episodes(queue)).values()] == ["timed_out"]


async def test_a_cancelled_wait_leaves_the_queue_and_takes_no_slot(queue):
    with trio.move_on_after(0.05):
        await queue.acquire(Placement(labels={"gpu": "true"}), INFO, deadline=None, emit=ignore)
    assert len(queue.waiting) == 0
    gpu = member("gpu", labels={"gpu": "true"})
    queue.pool.put(gpu)
    assert gpu.active == set()  # nothing was dispatched later
    assert [e["state"] for e in (await episodes(queue)).values()] == ["cancelled"]


async def test_a_target_whose_token_dies_fails_its_waiting_step_at_once(queue, live_tokens):
    await live_tokens.tokens.mint("t", duration_seconds=3600)
    await live_tokens.reread("t")
    w = member("w", token="t")
    queue.pool.put(w)
    busy = await queue.acquire(Placement(target="w"), INFO, deadline=None, emit=ignore)
    failures = []

    async def wait() -> None:
        try:
            await queue.acquire(Placement(target="w"), INFO, deadline=None, emit=ignore)
        except NoMatchingWorker as exc:
            failures.append(exc.message)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        await live_tokens.tokens.revoke("t")
        await live_tokens.reread("t")  # as the admin's revoke does, before disconnecting
        w.channel = None  # its socket is cut off
        queue.pool.refresh(w)
    assert failures and "can never return" in failures[0] and "revoked" in failures[0]
    queue.release(w, busy.dispatch_id)


async def test_ended_episodes_are_collected_and_waiting_ones_orphaned_at_boot(tmp_path):
    from swamp.bookkeeping.pending import PendingBook
    from swamp.domain.queue import PendingState

    store = Datastore(tmp_path / "swamp.db")
    now = [1_000_000.0]
    book = PendingBook(SqliteRecords(store), clock=lambda: now[0])
    for queue_id in ("old", "new", "still"):
        await book.enqueue({"queueId": queue_id, "queuedAt": "2026-01-01T00:00:00.000Z"})
    await book.end("old", PendingState.DISPATCHED, dispatch_id="d1")
    now[0] += 7200
    await book.end("new", PendingState.TIMED_OUT)
    assert await book.collect(older_than_seconds=3600) > 0  # "old" ended two hours ago
    assert await book.reconcile() == 1  # "still" was waiting when the orchestrator died
    states = {
        a["queueId"]: a["state"]
        for a in (r.attributes for r in store.latest_of_type("swamp/pending-dispatch"))
    }
    assert states == {"new": "timed_out", "still": "orphaned"}
    store.close()


async def test_a_freed_slot_goes_to_the_highest_priority_then_submitters_take_turns(queue):
    w = member("w", capacity=1)
    queue.pool.put(w)
    first = await queue.acquire(Placement(target="w"), INFO, deadline=None, emit=ignore)
    order = []

    async def wait(name: str, priority: int, submitter: str) -> None:
        info = StepInfo("swamp/echo", "e", "echo", priority=priority, submitter=submitter)
        ticket = await queue.acquire(Placement(target="w"), info, deadline=None, emit=ignore)
        order.append(name)
        queue.release(w, ticket.dispatch_id)

    async with trio.open_nursery() as nursery:
        for name, priority, submitter in (
            ("a1", 0, "local"),
            ("a2", 0, "local"),
            ("b1", 0, "token:b"),
            ("b2", 0, "token:b"),
            ("urgent", 10, "local"),
        ):
            nursery.start_soon(wait, name, priority, submitter)
            await trio.testing.wait_all_tasks_blocked()
        [*items] = queue.items()
        assert [(i.priority, i.submitter) for i in items][-1] == (10, "local")
        assert queue.waiting.by_priority == {0: 4, 10: 1}
        queue.release(w, first.dispatch_id)
    # the urgent one first; then b (local just ran one), then turns
    assert order == ["urgent", "b1", "a1", "b2", "a2"]
    assert queue.waiting.running == {} and queue.holders == {}


async def test_a_waiting_step_records_its_priority_and_submitter(queue):
    info = StepInfo("swamp/echo", "e", "echo", priority=-3, submitter="token:ci")
    with pytest.raises(QueueTimeout):
        await queue.acquire(
            Placement(labels={"zone": "mars"}),
            info,
            deadline=trio.current_time() + 0.05,
            emit=ignore,
        )
    [episode] = (await episodes(queue)).values()
    assert episode["priority"] == -3 and episode["submitter"] == "token:ci"
    assert queue.waiting.by_priority == {}


def test_a_submitter_is_named_by_its_credential_never_its_secret():
    from swamp.orchestrator.admin_auth import Principal

    assert Principal("local", "local").submitter() == "local"
    assert Principal("server-token", "ci", minted="f00d").submitter() == "token:ci"
    assert Principal("anyone", "anyone").submitter() == "anyone"
