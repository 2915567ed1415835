"""The shared queue's notifications and ``PgStore.transact(queue_on=...)`` where they can go
wrong, on a real PostgreSQL: a placement too large for a notification's payload, a payload
anyone on the database sent, a claim heard of and sent on while a pass runs, a queue's lock
when its caller is cancelled as the server grants it, the count of others' waiting steps."""

from __future__ import annotations

import time
from types import SimpleNamespace

import trio

from swamp.domain.labels import check_labels
from swamp.domain.peers import SharedStep
from swamp.errors import SwampError
from swamp.orchestrator.peers import CHANNEL, Peers
from swamp.store import pg
from swamp.store.pg_locks import lock_key
from swamp.store.pg_peers import PgPeers


def big_labels() -> dict[str, str]:
    """64 labels of the longest key and value check_labels accepts (a valid placement)."""
    return check_labels({f"k{i:02d}" + "x" * 60: "v" * 128 for i in range(64)})


async def test_a_step_with_a_valid_but_large_placement_is_still_shared(pg_url):
    """A placement too large for a notification's payload (8000 bytes) is published all the
    same, with a plain wake-up: the others read it from the table."""
    async with pg.Pool(pg_url) as pool:
        table = await PgPeers.open(pool)
        step = SharedStep("q-big", "origin", {"labels": big_labels()}, 0, "local", 1.0)
        try:
            await table.publish(step)
        except SwampError as exc:
            raise AssertionError(f"publish refused a valid placement: {exc}") from None
        assert [s.queue_id for s in await table.claimable("other")] == ["q-big"]


async def test_a_malformed_notification_does_not_kill_the_listener(pg_url):
    """Anyone on the database can NOTIFY the orchestrators' channel: a payload nested too
    deep to read is ignored (a pass reads the tables), never the listener's end."""
    async with pg.Pool(pg_url) as pool:
        table = await PgPeers.open(pool)
        peers = Peers(table, pg_url, reconcile=None)  # type: ignore[arg-type]
        crashed: list[BaseException] = []

        async def hear() -> None:
            try:
                await peers._hear()
            except Exception as exc:
                crashed.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hear)
            await trio.sleep(0.5)  # listening
            async with pool.connection() as conn:
                await conn.execute("SELECT pg_notify($1, repeat('[', 5000))", (CHANNEL,))
            with trio.move_on_after(2):
                while not crashed:  # noqa: ASYNC110
                    await trio.sleep(0.05)
            nursery.cancel_scope.cancel()
        assert not crashed, f"the listener died: {crashed[0]!r}"


class OneSlot:
    """A queue whose one worker takes anything (the claimer's side)."""

    def __init__(self) -> None:
        self.pool = self
        self.members = {"w": object()}
        self.released: list[str] = []
        self.published: dict = {}

    def reserve_for_peer(self, requirement):
        return SimpleNamespace(name="w"), "d1"

    def release(self, member, dispatch_id):
        self.released.append(dispatch_id)


class Origin:
    """The origin's queue: published tickets; claimed() as DispatchQueue.claimed."""

    def __init__(self) -> None:
        self.published: dict = {}

    def claimed(self, ticket, claim) -> None:
        ticket.claim = claim


async def test_a_claim_heard_by_notification_is_not_withdrawn_by_the_next_pass(pg_url):
    """A claim heard of in its notification and sent on (its ticket gone from the published)
    is not withdrawn by the origin's next pass: the claimer keeps its slot for the step on its
    way."""
    async with pg.Pool(pg_url) as pool:
        table = await PgPeers.open(pool)
        origin = Peers(table, pg_url, reconcile=None)  # type: ignore[arg-type]
        claimer = Peers(table, pg_url, reconcile=None)  # type: ignore[arg-type]
        origin.queue = o_queue = Origin()  # type: ignore[assignment]
        claimer.queue = c_queue = OneSlot()  # type: ignore[assignment]
        t1 = SimpleNamespace(claim=None, member=None)
        t2 = SimpleNamespace(claim=None, member=None)
        o_queue.published = {"q1": t1, "q2": t2}
        await table.publish(SharedStep("q1", origin.me, {}, 0, "local", 1.0))
        await table.publish(SharedStep("q2", origin.me, {"labels": {"gpu": "x"}}, 0, "", 2.0))
        step = (await table.claimable(claimer.me))[0]
        assert step.queue_id == "q1"
        await claimer._claim_one(c_queue, step)  # type: ignore[arg-type]
        assert "q1" in claimer.held
        # the origin hears the claim (the payload as PgPeers.claim sends it)
        origin._claimed_now({"step": "q1", "claimer": claimer.me, "worker": "w", "dispatch": "d1"})
        assert t1.claim is not None
        del o_queue.published["q1"]  # acquire returned Grant(claim): run_there is next
        # a pass of the origin's before the step reaches the claimer (it marks the claim
        # taken first: a pass as _passes runs it)
        await origin._take_claims()
        await origin._withdraw_pending()
        await origin._mark_taken()
        assert await table.claims_of(claimer.me) == {"q1": True}
        # ... and one of the claimer's
        await claimer._expire_holds()
        assert "q1" in claimer.held and not c_queue.released, (
            "the claim the origin is sending was withdrawn under it: the claimer let the slot "
            "go and will answer ClaimGone"
        )


async def test_a_cancelled_queue_on_never_leaves_its_lock_on_a_pooled_connection(pg_url):
    """Cancelled just as the server grants a queue's lock (its answer on the wire, not yet
    read), the connection goes back to the pool without it: else every later redemption of
    that token, on every orchestrator, would wait on it for as long as the connection lives."""
    import psycopg

    from swamp.store.pg_store import PgStore

    store = await PgStore.open(pg_url)
    key = lock_key("swamp token fleet")
    # the other holder on a blocking connection: letting the lock go runs no trio task
    other = psycopg.connect(pg_url, autocommit=True)
    try:
        async with await pg.connect(pg_url) as look:
            other.execute("SELECT pg_advisory_lock(%s)", (key,))
            ran: list[str] = []

            async def body(tx) -> None:
                ran.append("body")

            async with trio.open_nursery() as nursery:
                scope = trio.CancelScope()

                async def enroll() -> None:
                    with scope:
                        await store.transact(body, queue_on="swamp token fleet")

                nursery.start_soon(enroll)
                with trio.fail_after(10):  # the enrollment waits on the lock
                    while not (  # noqa: ASYNC110
                        await look.execute(
                            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                            "AND NOT granted"
                        )
                    ).rows[0][0]:
                        await trio.sleep(0.01)
                other.execute("SELECT pg_advisory_unlock(%s)", (key,))
                time.sleep(0.2)  # noqa: ASYNC251 (blocking) the server grants it and answers meanwhile
                scope.cancel()  # the caller goes away (a client hung up) in that instant
            assert not ran
            assert store.pool.statistics()["idle"] == 1  # the connection went back
            free = (await look.execute("SELECT pg_try_advisory_lock($1)", (key,))).rows[0][0]
            assert free, "a connection back in the pool still holds the token's queue lock"
    finally:
        other.close()
        await store.aclose()


async def test_a_step_claimed_from_its_notification_leaves_no_negative_count(pg_url):
    """A step claimed from its notification leaves the count of others' waiting steps (a
    pass's) as it was: below zero, every freed slot would wake a pass for nothing."""
    async with pg.Pool(pg_url) as pool:
        table = await PgPeers.open(pool)
        claimer = Peers(table, pg_url, reconcile=None)  # type: ignore[arg-type]
        claimer.queue = queue = OneSlot()  # type: ignore[assignment]
        await table.publish(SharedStep("q1", "origin", {}, 0, "local", 1.0))
        await claimer._claim()  # a pass: nothing else waits after it
        assert claimer.others_waiting == 0
        await table.publish(SharedStep("q2", "origin", {}, 0, "local", 2.0))
        claimer.held.clear()
        await claimer._claim_one(queue, (await table.claimable(claimer.me))[0])  # as offered
        claimer.slot_freed()
        assert claimer.others_waiting >= 0 and not claimer._wake.is_set()
