"""Workers' holdings and fenced writes (``swamp.bookkeeping.holdings``) on both backends of the
record store (the contract tests' ``records`` fixture): epochs that never repeat however
orchestrators race to take a worker, and a write for a connection that was replaced refused,
nothing of it written."""

from __future__ import annotations

import pytest
import trio
import trio.lowlevel
import trio.testing

from swamp.bookkeeping.holdings import HoldingBook
from swamp.domain.holding import Holding, fence, taken
from swamp.errors import Fenced
from swamp.store.datastore import Key, SpecPolicy
from tests.unit.test_store_contract import records  # noqa: F401 - the fixture

LEASE = Key("swamp/step-lease", "w1", "d-1")
ONE = SpecPolicy("lease", garbage_collection=1)


def test_the_rules():
    first = taken(None, "w1", "orch-a", "t0")
    assert (first.epoch, first.orchestrator) == (1, "orch-a")
    again = taken(first, "w1", "orch-a", "t1")  # a reconnection to the same one: a new epoch
    moved = taken(again, "w1", "orch-b", "t2")
    assert (again.epoch, moved.epoch) == (2, 3)
    assert fence(moved, moved) is None
    assert "connected to orch-b since (epoch 3)" in (fence(moved, again) or "")
    assert "no holding" in (fence(None, first) or "")
    assert Holding.from_json(moved.to_json()) == moved
    with pytest.raises(ValueError):
        Holding.from_json({**moved.to_json(), "epoch": True})


async def test_a_write_for_a_replaced_connection_is_refused_and_nothing_lands(records):  # noqa: F811
    book = HoldingBook(records)
    held_by_a = await book.take("w1", "orch-a")
    await book.write_fenced(held_by_a, LEASE, {"by": "a"}, policy=ONE, expected_version=0)
    held_by_b = await book.take("w1", "orch-b")  # the worker moved: a's connection is gone
    assert held_by_b.epoch == held_by_a.epoch + 1
    with pytest.raises(Fenced, match="connected to orch-b"):
        await book.write_fenced(held_by_a, LEASE, {"by": "a, late"}, policy=ONE, expected_version=1)
    latest = await records.latest(LEASE)
    assert latest is not None and latest.attributes == {"by": "a"}
    written = await book.write_fenced(held_by_b, LEASE, {"by": "b"}, policy=ONE, expected_version=1)
    assert written.version == 2 and (await book.current("w1")) == held_by_b


async def test_orchestrators_racing_to_take_a_worker_never_share_an_epoch(records):  # noqa: F811
    book = HoldingBook(records)
    got: list[Holding] = []

    async def take(orchestrator: str) -> None:
        got.append(await book.take("w1", orchestrator))

    async with trio.open_nursery() as nursery:
        for i in range(12):
            nursery.start_soon(take, f"orch-{i % 3}")
    assert sorted(h.epoch for h in got) == list(range(1, 13))
    last = max(got, key=lambda h: h.epoch)
    assert await book.current("w1") == last


async def test_writes_racing_a_take_land_only_for_the_holding_they_were_made_for(records):  # noqa: F811
    """The old holder writes over and over while another orchestrator takes the worker: the
    writes land until the take, and from then on every one is refused, writing nothing."""
    book = HoldingBook(records)
    old = await book.take("w1", "orch-a")
    moved = trio.Event()
    outcomes: list[str] = []

    async def old_holder() -> None:
        for i in range(10_000):  # until refused three times after the take
            if moved.is_set() and outcomes.count("fenced") >= 3:
                return
            try:
                await book.write_fenced(old, Key("t/out", "w1", f"r{i}"), {"i": i}, policy=ONE)
                outcomes.append("landed")
            except Fenced:
                outcomes.append("fenced")
            await trio.lowlevel.checkpoint()

    async def new_holder() -> None:
        await trio.lowlevel.checkpoint()
        await book.take("w1", "orch-b")
        moved.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(old_holder)
        nursery.start_soon(new_holder)
    assert moved.is_set() and "fenced" in outcomes
    first_fenced = outcomes.index("fenced")
    assert all(o == "fenced" for o in outcomes[first_fenced:])  # once refused, always
    landed = await records.latest_of_type("t/out")
    assert len(landed) == first_fenced  # what was refused wrote nothing


async def test_a_take_waits_for_a_fenced_write_in_flight(records, monkeypatch):  # noqa: F811
    """The old holder's transaction has read the holding and stalls (a pause, a slow network)
    while another orchestrator takes the worker. The take waits for it — the holding is held
    as read (PostgreSQL: FOR SHARE; a serializable check alone does not see a take, which is
    no transaction) — so the write lands before the take returns, and the new holder sees it:
    never a write landing behind the new holder's back."""
    book = HoldingBook(records)
    old = await book.take("w1", "orch-a")
    holding_read, finish = trio.Event(), trio.Event()
    real = records.transact

    async def stalled(body):
        async def slowed(tx):
            class Stalling:  # its write waits until told
                def __getattr__(self, name):
                    return getattr(tx, name)

                async def write(self, *args, **kw):
                    holding_read.set()
                    await finish.wait()
                    return await tx.write(*args, **kw)

            return await body(Stalling())

        return await real(slowed)

    monkeypatch.setattr(records, "transact", stalled)
    outcome: list[str] = []
    after_take: list = []

    async def old_holder() -> None:
        try:
            await book.write_fenced(old, LEASE, {"by": "a"}, policy=ONE, expected_version=0)
            outcome.append("landed")
        except Fenced:
            outcome.append("fenced")

    async def new_holder() -> None:
        after_take.append(await book.take("w1", "orch-b"))
        after_take.append(await records.latest(LEASE))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(old_holder)
        await holding_read.wait()
        nursery.start_soon(new_holder)
        await _take_waits_or_returns(records, after_take)
        assert after_take == []  # the take waits on the write in flight
        finish.set()
    assert outcome == ["landed"] and after_take[0].epoch == old.epoch + 1
    assert after_take[1] is not None and after_take[1].attributes == {"by": "a"}


async def _take_waits_or_returns(records, after_take: list) -> None:  # noqa: F811
    """Until the take either returned or waits on the write in flight: SQLite's waits on the
    store's lock in this process; PostgreSQL's on a row lock in the server, which tells no
    one — it is asked until it says so (or the take returned, which the caller then sees)."""
    if type(records).__name__ != "PgStore":
        await trio.testing.wait_all_tasks_blocked()
        return
    with trio.fail_after(30):
        while not after_take:
            async with records.pool.connection() as conn:
                waiting = await conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'"
                )
            if waiting.rows[0][0]:
                return
            await trio.sleep(0.01)
