"""The shared queue and the registry of orchestrators (``swamp.store.pg_peers``) on a real
PostgreSQL, and a step as one orchestrator sends it to another (``swamp.orchestrator.peers``):
claims are compare-and-swap (racing claimers, one wins), a withdrawal races a claim and one of
the two stands, an orchestrator's death frees what it claimed and drops what it waited for;
a malformed step is refused, never half taken."""

from __future__ import annotations

import json

import pytest
import trio

from swamp.domain.episodes import Ending, EpisodeEnd
from swamp.domain.peers import PeerRow, SharedStep, credential_hash
from swamp.domain.read_scope import ReadScope
from swamp.domain.step_logs import LogOwner
from swamp.errors import MalformedFrame
from swamp.orchestrator.peers import decode_ending, decode_step, encode_ending, encode_step
from swamp.store import pg
from swamp.store.pg_peers import PgPeers


@pytest.fixture
async def table(pg_url):
    async with pg.Pool(pg_url, size=6) as pool:
        yield await PgPeers.open(pool)


def waiting(queue_id: str, origin: str = "b", **placement) -> SharedStep:
    return SharedStep(queue_id, origin, placement or {"labels": {"fleet": "edge"}}, 0, "local", 1.0)


async def test_racing_claimers_one_wins_and_the_origin_takes_it(table):
    await table.publish(waiting("q1"))
    assert [s.queue_id for s in await table.claimable("a")] == ["q1"]
    assert await table.claimable("b") == []  # never its own origin's
    won: list[str] = []

    async def claim(me: str) -> None:
        if await table.claim("q1", me, f"{me}-worker", f"{me}-dispatch"):
            won.append(me)

    async with trio.open_nursery() as nursery:
        for me in ("a", "c", "d", "e"):
            nursery.start_soon(claim, me)
    assert len(won) == 1
    [claimed] = await table.claimed_for("b")
    assert claimed.claimed_by == won[0] and claimed.worker == f"{won[0]}-worker"
    assert await table.claimable("a") == []
    assert not await table.take("q1", "someone-else")  # only the claim that stands
    [taken] = await table.take_claims("b")  # the origin takes what was claimed, once
    assert taken.queue_id == "q1" and taken.dispatch_id == f"{won[0]}-dispatch"
    assert await table.take_claims("b") == [] and await table.claimed_for("b") == []
    assert await table.claims_of(won[0]) == {"q1": True}
    await table.done("q1", won[0])
    assert await table.claims_of(won[0]) == {}


async def test_a_withdrawal_and_a_claim_race_and_one_stands(table):
    for n in range(20):
        queue_id = f"q{n}"
        await table.publish(waiting(queue_id))
        results: dict[str, bool] = {}

        async def withdraw(queue_id=queue_id, results=results) -> None:
            results["withdrawn"] = await table.withdraw_unclaimed(queue_id)

        async def claim(queue_id=queue_id, results=results) -> None:
            results["claimed"] = await table.claim(queue_id, "a", "w", "d")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(withdraw)
            nursery.start_soon(claim)
        assert results["withdrawn"] != results["claimed"], results
        left = await table.claimed_for("b")
        assert [s.queue_id for s in left] == ([queue_id] if results["claimed"] else [])
        await table.withdraw(queue_id)


async def test_a_dead_orchestrator_is_forgotten_with_what_it_waited_for_and_claimed(table):
    for me in ("a", "b"):
        await table.register(PeerRow(me, f"ws://{me}", credential_hash(me), None, 1.0))
    await table.publish(waiting("from-a", origin="a"))
    await table.publish(waiting("claimed-by-a"))
    await table.publish(waiting("taken-by-a"))
    assert await table.claim("claimed-by-a", "a", "w1", "d1")
    assert await table.claim("taken-by-a", "a", "w2", "d2")
    assert await table.take("taken-by-a", "a")
    await table.forget("a")
    assert [row.id for row in await table.orchestrators()] == ["b"]
    assert await table.get("a") is None
    # its own waits are gone; what it claimed and never took is offered again; what its
    # origin took went with it (the origin learns it from the broken link)
    assert [s.queue_id for s in await table.claimable("c")] == ["claimed-by-a"]
    assert await table.claims_of("a") == {}


def test_a_step_travels_whole_and_a_malformed_one_is_refused():
    scope = ReadScope.of("command/shell", "adhoc-1", type_patterns=("@test/*",))
    owner = LogOwner("command/shell", "adhoc-1", "run", run_id="r1", workflow="w", job="j")
    sent = encode_step(
        model_type="command/shell",
        model_name="adhoc-1",
        method="run",
        args={"command": "echo hi"},
        environment={"TOKEN": "s3cret"},
        read_scope=scope,
        timeout=30.0,
        owner=owner,
        step_id="s1",
        attempt=2,
    )
    got = decode_step(sent)
    assert (got.model_type, got.model_name, got.method, got.args) == (
        "command/shell",
        "adhoc-1",
        "run",
        {"command": "echo hi"},
    )
    assert got.environment == {"TOKEN": "s3cret"} and got.timeout == 30.0
    assert got.read_scope.items == scope.items and got.read_scope.type_patterns == ("@test/*",)
    assert got.read_scope.excluded_types == scope.excluded_types  # infrastructure stays out
    assert got.owner == owner and (got.step_id, got.attempt) == ("s1", 2)
    for broken in (
        {**sent, "modelType": ""},
        {**sent, "args": []},
        {**sent, "environment": {"A": 1}},
        {**sent, "reads": [["only-one"]]},
        {**sent, "timeout": float("inf")},
        {**sent, "timeout": True},
        {**sent, "attempt": 0},
        {**sent, "owner": {"runId": 5}},
    ):
        with pytest.raises(MalformedFrame):
            decode_step(broken)
    end = EpisodeEnd(Ending.LOST, "w1", "gone", has_writes=True)
    assert decode_ending(encode_ending(end, None)) == (end, None)
    for broken_reply in ([], {"how": "exploded", "worker": "w", "reason": ""}, {"how": "lost"}):
        with pytest.raises(MalformedFrame):
            decode_ending(broken_reply)


async def test_a_step_for_a_named_worker_wakes_only_the_orchestrator_holding_it(pg_url):
    """Its notification goes to the holder's own channel, as the worker's record names it;
    none at all when the origin holds it; every orchestrator when nobody does (no record, or
    one that says disconnected: it may enroll anywhere)."""
    from swamp.bookkeeping.workers import WorkerBook
    from swamp.bookkeeping.workers import key as worker_key
    from swamp.domain.peers import CLAIMS_PREFIX, claims_channel
    from swamp.store.pg_store import PgStore

    store = await PgStore.open(pg_url)
    try:
        table = await PgPeers.open(store.pool)
        for name, holder in (("w-a", "a"), ("w-b", "b"), ("w-gone", "a")):
            await WorkerBook(store, owner=holder).enrolled(
                name=name, instance_id="i", machine_id="m", token="t", labels={},
                platform="linux", arch="x86_64", capacity=1, version="1",
            )  # fmt: skip
        await WorkerBook(store, owner="a").set_status("w-gone", "disconnected")
        heard: dict[str, list[str]] = {}
        async with (
            await pg.connect(pg_url) as conn,
            trio.open_nursery() as nursery,
        ):
            channels = {"all": "swamp_orchestrators", "a": claims_channel("a")}
            channels["b"] = claims_channel("b")
            for channel in channels.values():
                await conn.listen(channel)
            by_channel = {channel: who for who, channel in channels.items()}

            last = trio.Event()  # notifications come in the order of their commits

            async def hear() -> None:
                while True:
                    batch = await conn.wait_notifications()
                    for note in batch.received:
                        heard.setdefault(by_channel[note.channel], []).append(note.payload)
                        if '"q4"' in note.payload:
                            last.set()

            nursery.start_soon(hear)
            for queue_id, target in (
                ("q1", "w-a"),
                ("q2", "w-b"),
                ("q3", "w-none"),
                ("q5", "w-gone"),
            ):
                record = worker_key(target)
                await table.publish(
                    waiting(queue_id, "b", target=target),
                    holder=(record.model_type, record.model_name, record.name),
                    holder_prefix=CLAIMS_PREFIX,
                )
            await table.publish(waiting("q4", "b"))  # no worker named: every one
            with trio.fail_after(10):
                await last.wait()  # q4, sent last (q2's holder is its origin: none for it)
            nursery.cancel_scope.cancel()
        steps = {who: [json.loads(s)["step"] for s in said] for who, said in heard.items()}
        assert steps == {"a": ["q1"], "all": ["q3", "q5", "q4"]}, steps
        # each is in the table for every pass to see (should the worker move)
        assert sorted(s.queue_id for s in await table.claimable("c")) == [
            "q1", "q2", "q3", "q4", "q5"
        ]  # fmt: skip
    finally:
        await store.aclose()


async def test_a_registry_of_an_earlier_version_is_given_the_features_column(pg_url):
    """Its rows say nothing of what their orchestrators can do (an earlier version's: not
    waited for after a broken link); this version's say so."""
    from swamp.domain.peers import FEATURES
    from swamp.store.pg_peers import _SCHEMA

    async with pg.Pool(pg_url, size=2) as pool:
        await pg.make_schema(pool, _SCHEMA)  # as an earlier version made it
        async with pool.connection() as conn:
            await conn.execute(
                "INSERT INTO swamp_orchestrator (id, url, credential_hash, ca_pem, "
                "started_epoch) VALUES ('old', 'ws://old', 'h', NULL, 1.0)"
            )
        table = await PgPeers.open(pool)
        await table.register(PeerRow("new", "ws://new", "h", None, 2.0, FEATURES))
        features = {row.id: row.features for row in await table.orchestrators()}
        assert features == {"old": frozenset(), "new": FEATURES} and "outliving" in FEATURES


async def test_the_registry_keeps_the_longest_heartbeat_each_orchestrator_told(table, pg_url):
    """A pool that grows tells its workers a longer heartbeat: written before the worker hears
    it (rounded up to whole intervals, so a growing pool writes it now and then), never
    shortened; a peer that takes it for dead waits as long as its workers would."""
    from swamp.domain.peers import dead_fence, rerun_fence
    from swamp.domain.workers import fence_seconds
    from swamp.orchestrator.peers import DEATH_GRACE, Peers

    peers = Peers(table, pg_url, reconcile=None, me="grown", heartbeat=5.0)  # type: ignore[arg-type]
    await table.register(PeerRow("grown", "ws://grown", credential_hash("x"), None, 1.0,
                                 frozenset(), 5.0))  # fmt: skip
    assert (await table.get("grown")).heartbeat == 5.0
    await peers.telling(5.0)  # the base: nothing to write
    await peers.telling(20.5)  # 4,100 workers
    assert (await table.get("grown")).heartbeat == 25.0
    await peers.telling(21.0)  # within what is written: no write needed
    await table.told("grown", 10.0)  # (an older write landing late) never shortens it
    assert (await table.get("grown")).heartbeat == 25.0
    # taken for dead: its steps wait until its workers, cut off too, have killed their copies
    ours = fence_seconds(5.0)
    assert dead_fence(ours, 25.0, death_grace=DEATH_GRACE) == fence_seconds(25.0)
    assert dead_fence(ours, 0.0, death_grace=DEATH_GRACE) == rerun_fence(
        ours, death_grace=DEATH_GRACE
    )
    # a registry an earlier version wrote (no heartbeat): read as not said
    await table.register(PeerRow("old", "ws://old", credential_hash("y"), None, 2.0))
    assert (await table.get("old")).heartbeat == 0.0
