"""A running step carried across its worker's move: the rules (``swamp.domain.carrying``), the
lease's compare-and-swaps on a real store, and the worker's side of a carried run
(``swamp.worker.runs``) on trio's clock."""

from __future__ import annotations

import pytest
import trio
import trio.testing

from swamp.bookkeeping.leases import LeaseBook
from swamp.domain import carrying
from swamp.domain.leases import LeaseState
from swamp.domain.peers import dead_fence, rerun_fence
from swamp.domain.workers import FENCE_MARGIN, fence_seconds
from swamp.errors import WorkerStopped
from swamp.orchestrator.peers import DEATH_GRACE
from swamp.store.datastore import Datastore
from swamp.store.records import SqliteRecords
from swamp.worker.runs import CARRY_ENDED, MAX_KEPT_EVENTS, Link, Run, Runs

DEAD, CARRIER, THIRD = "a" * 32, "b" * 32, "c" * 32
STEP = "d" * 32


def _lease(**changes) -> dict:
    return {
        "leaseId": "1" * 32,
        "dispatchId": "1" * 32,
        "workerName": "edge-1",
        "modelType": "command/shell",
        "modelName": "x",
        "methodName": "run",
        "state": "active",
        "hasWrites": False,
        "createdAt": "2026-12-03T00:00:00.000Z",
        "orchestrator": DEAD,
        "stepId": STEP,
        **changes,
    }


# -- the rules ----------------------------------------------------------------------------------


def test_only_a_dead_holders_own_step_of_this_worker_may_be_carried():
    ok = {"worker": "edge-1", "carrier": CARRIER, "owner": DEAD}
    assert carrying.carriable(_lease(), **ok)
    assert carrying.carriable(_lease(carriedBy=CARRIER), **ok)  # (marked again: the same)
    assert not carrying.carriable(None, **ok)
    assert not carrying.carriable(_lease(state="expired"), **ok)
    assert not carrying.carriable(_lease(workerName="edge-2"), **ok)  # another worker's
    assert not carrying.carriable(_lease(orchestrator=CARRIER), **ok)  # ours already
    assert not carrying.carriable(_lease(orchestrator=""), **ok)  # a database of its own
    assert not carrying.carriable(_lease(carriedBy=THIRD), **ok)  # a third carries it
    assert not carrying.carriable(_lease(stepId=None), **ok)  # a workflow's: no record
    assert not carrying.carriable(_lease(), **(ok | {"owner": THIRD}))  # sent by another


def test_the_burial_moves_a_carried_lease_to_a_serving_carrier_and_expires_the_rest():
    marked = carrying.mark(_lease(), CARRIER)
    assert marked is not None and carrying.mark(marked, CARRIER) is None
    assert carrying.bury(marked, DEAD, {CARRIER}) == CARRIER
    assert carrying.bury(marked, DEAD, {THIRD}) is None  # the carrier is gone too
    assert carrying.bury(_lease(), DEAD, {CARRIER}) is None  # nobody carries it
    assert carrying.bury(dict(marked, state="completed"), DEAD, {CARRIER}) is None
    moved = carrying.moved(marked, CARRIER)
    assert moved["orchestrator"] == CARRIER and moved["carriedFrom"] == DEAD
    assert "carriedBy" not in moved
    assert carrying.adopted(moved, carrier=CARRIER, worker="edge-1")
    assert not carrying.adopted(marked, carrier=CARRIER, worker="edge-1")
    assert not carrying.adopted(moved, carrier=CARRIER, worker="edge-2")
    assert carrying.unmark(marked, CARRIER) == _lease()
    assert carrying.unmark(moved, CARRIER) is None  # moved: it is ours, not a mark


def test_a_worker_carries_only_a_socket_lost_to_an_orchestrator_that_adopts():
    assert carrying.may_carry(offered=True, draining=False, closed_by_peer=False)
    assert not carrying.may_carry(offered=False, draining=False, closed_by_peer=False)
    assert not carrying.may_carry(offered=True, draining=True, closed_by_peer=False)
    assert not carrying.may_carry(offered=True, draining=False, closed_by_peer=True)


@pytest.mark.parametrize("heartbeat", [0.5, 1, 2, 3, 4, 5, 10, 30, 50])
def test_every_copy_carried_ends_before_another_may_start(heartbeat):
    """The worker stops a carried copy ``carry_seconds`` after it last heard from its
    orchestrator (at the latest, its death or its loss of the worker). The earliest another
    copy may start: a dead holder's step, the grace and the rerun fence after its death; a
    lost worker's, the lost-worker fence after the holder noticed (no sooner than the worker
    last heard from it)."""
    carry = carrying.carry_seconds(heartbeat)
    assert carry >= heartbeat * 3  # never shorter than it ran before carrying existed
    assert carry >= carrying.CARRY_AT_LEAST > DEATH_GRACE
    peer_fence = max(
        rerun_fence(fence_seconds(heartbeat), death_grace=DEATH_GRACE),
        carrying.lost_worker_fence(heartbeat, carrying=True),
    )
    for told in (heartbeat, heartbeat * 2, heartbeat * 10):  # a pool that grew
        dead = DEATH_GRACE + dead_fence(peer_fence, told, death_grace=DEATH_GRACE)
        assert carrying.carry_seconds(told) + FENCE_MARGIN <= dead, told
        assert carrying.carry_seconds(told) + FENCE_MARGIN <= carrying.lost_worker_fence(
            told, carrying=True
        )
    # where nothing is carried (one orchestrator), the fence is what it was
    assert carrying.lost_worker_fence(heartbeat, carrying=False) == fence_seconds(heartbeat)


# -- the lease, on a real store ---------------------------------------------------------------


@pytest.fixture
def book(tmp_path):
    store = Datastore(tmp_path / "swamp.db")
    yield store
    store.close()


async def test_the_carrier_marks_the_lease_and_the_burial_moves_it(book):
    dead = LeaseBook(SqliteRecords(book), owner=DEAD)
    carrier = LeaseBook(SqliteRecords(book), owner=CARRIER)
    await dead.insert(_lease())
    await dead.insert(_lease(leaseId="2" * 32, dispatchId="2" * 32))
    args = {"carrier": CARRIER, "worker": "edge-1", "owner": DEAD}
    assert await carrier.mark_carried("1" * 32, **args) is not None
    assert await carrier.mark_carried("1" * 32, **args) is not None  # (again: the same)
    assert await carrier.mark_carried("1" * 32, **(args | {"worker": "edge-2"})) is None
    assert await carrier.mark_carried("9" * 32, **args) is None  # no such lease
    moved: list[str] = []
    expired = await LeaseBook(SqliteRecords(book)).reconcile(
        lambda attrs: attrs.get("orchestrator") == DEAD,
        why="it died",
        dead=DEAD,
        serving=frozenset({CARRIER}),
        moved=moved,
    )
    assert (expired, moved) == (1, ["1" * 32])
    [one, two] = sorted(
        [r.attributes for r in await SqliteRecords(book).latest_of_type("swamp/step-lease")],
        key=lambda a: a["leaseId"],
    )
    assert (one["state"], one["orchestrator"], one["carriedFrom"]) == ("active", CARRIER, DEAD)
    assert (two["state"], two["error"]) == ("expired", "it died")
    # the dead one, back for a moment, cannot end what is the carrier's now
    assert await dead.end("1" * 32, LeaseState.EXPIRED) is None
    [still] = [r for r in await SqliteRecords(book).latest_of_type("swamp/step-lease")
               if r.attributes["leaseId"] == "1" * 32]  # fmt: skip
    assert still.attributes["state"] == "active"
    ended = await carrier.end("1" * 32, LeaseState.COMPLETED)
    assert ended is not None and ended.attributes["state"] == "completed"


async def test_a_mark_taken_off_leaves_the_lease_to_its_holder(book):
    holder = LeaseBook(SqliteRecords(book), owner=DEAD)
    carrier = LeaseBook(SqliteRecords(book), owner=CARRIER)
    await holder.insert(_lease())
    await carrier.mark_carried("1" * 32, carrier=CARRIER, worker="edge-1", owner=DEAD)
    after = await carrier.unmark_carried("1" * 32, carrier=CARRIER)
    assert after is not None and "carriedBy" not in after.attributes
    # the holder, alive, expires it as it always did (a mark never stops its own rules)
    await carrier.mark_carried("1" * 32, carrier=CARRIER, worker="edge-1", owner=DEAD)
    ended = await holder.end("1" * 32, LeaseState.EXPIRED, error="lost")
    assert ended is not None and ended.attributes["state"] == "expired"
    assert (
        await carrier.mark_carried("1" * 32, carrier=CARRIER, worker="edge-1", owner=DEAD) is None
    )


# -- the worker's side ------------------------------------------------------------------------


async def test_a_carried_run_nobody_adopts_stops_at_its_deadline(autojump_clock):
    runs = Runs()
    stopped_at = []
    async with trio.open_nursery() as nursery:
        await nursery.start(runs.serve)
        run = Run("1" * 32)

        async def body() -> None:
            try:
                await trio.sleep_forever()
            finally:
                stopped_at.append(trio.current_time())

        runs.begin(run)
        runs.start(run, body)
        await trio.testing.wait_all_tasks_blocked()
        start = trio.current_time()
        runs.carry(run, start + 12)
        assert run.carried and runs.carried() == [run]
        await run.done.wait()
        nursery.cancel_scope.cancel()
    assert stopped_at == [pytest.approx(start + 12)]
    assert isinstance(run.stopped, WorkerStopped) and run.stopped.message == CARRY_ENDED
    assert runs.active == 0 and runs.idle.is_set()


async def test_what_a_carried_run_says_waits_for_its_next_link(autojump_clock):
    run = Run("1" * 32)
    run.detach(trio.current_time() + 10)
    await run.emit({"kind": "log", "line": "one", "stream": "log"})
    await run.emit({"kind": "effects"})
    for n in range(MAX_KEPT_EVENTS + 5):
        await run.emit({"kind": "log", "line": f"{n}", "stream": "log"})
    linked = []

    async def call_home() -> None:  # (a call home waits while the run is carried)
        linked.append(await run.linked())

    class _Call:
        async def emit(self, event):
            raise AssertionError("nothing is sent before the run is linked")

    async with trio.open_nursery() as nursery:
        nursery.start_soon(call_home)
        await trio.testing.wait_all_tasks_blocked()
        assert linked == []
        link = Link(_Call(), None, "https://o", "secret")  # type: ignore[arg-type]
        kept = run.attach(link)
    assert linked == [link] and not run.carried
    assert kept[0] == {"kind": "effects"}  # the effect first: the step must not run again
    assert kept[1]["line"] == "one" and len(kept) == MAX_KEPT_EVENTS + 2
    assert "6 line(s) printed while the worker moved were not kept" in kept[-1]["line"]


async def test_a_run_that_had_an_effect_marks_its_lease_as_it_is_carried(book):
    holder = LeaseBook(SqliteRecords(book), owner=DEAD)
    carrier = LeaseBook(SqliteRecords(book), owner=CARRIER)
    await holder.insert(_lease())
    marked = await carrier.mark_carried(
        "1" * 32, carrier=CARRIER, worker="edge-1", owner=DEAD, effects=True
    )
    assert marked is not None and marked["hasWrites"] is True  # not adopted: never again


async def test_whoever_took_the_step_over_waits_for_the_carried_runs_answer(autojump_clock):
    from swamp.orchestrator.outliving import Outliving

    async def never_kept(*args) -> bool:
        raise AssertionError("a carried run's answer is not written anywhere")

    outliving = Outliving(keep=never_kept)
    go = trio.Event()
    heard = []

    async def adopted() -> dict:
        await go.wait()
        return {"dispatchId": "1" * 32, "how": "succeeded"}

    async def not_adopted() -> None:
        await go.wait()
        return None

    async with trio.open_nursery() as nursery:
        nursery.start_soon(outliving.answer_later, DEAD, "carried:1", STEP, adopted)
        nursery.start_soon(outliving.answer_later, DEAD, "carried:2", "e" * 32, not_adopted)
        await trio.testing.wait_all_tasks_blocked()

        async def ask(step: str) -> None:
            heard.append((step, await outliving.wait_step(step)))

        nursery.start_soon(ask, STEP)
        nursery.start_soon(ask, "e" * 32)
        await trio.testing.wait_all_tasks_blocked()
        assert heard == []  # each waits for its run, known as running since it was marked
        go.set()
    assert dict(heard) == {
        STEP: {"state": "ended", "answer": {"reply": {"dispatchId": "1" * 32, "how": "succeeded"}}},
        "e" * 32: {"state": "unknown"},  # not adopted: the lease rules decide
    }
