"""The step-log store's contract on both backends: SQLite's tables behind the seam
(``SqliteLogs``) and PostgreSQL's (``PgLogStore``). Lines come back in order, a log is cut to
its cap with the gap said, reads by run, step, prefix and id, pages with their cursor, and
collection. On PostgreSQL, writers racing never let a following reader step past a chunk."""

from __future__ import annotations

import pytest
import trio
import trio.lowlevel

from swamp.domain.step_logs import LogOwner
from swamp.store.datastore import Datastore, iso
from swamp.store.step_logs import (
    Chunk,
    LogEnd,
    LogStart,
    LogStore,
    SqliteLogs,
    SqliteLogStore,
)

RUN = "ab" * 16
IN_RUN = LogOwner("swamp/echo", "e", "echo", run_id=RUN, workflow="wf", job="j", step="s")
ADHOC = LogOwner("command/shell", "printer", "run")
BIG = 1 << 25


@pytest.fixture(
    params=[
        "sqlite",
        pytest.param("postgres", marks=[pytest.mark.postgres, pytest.mark.integration]),
    ]
)
async def logs(request, tmp_path):
    if request.param == "sqlite":
        store = Datastore(tmp_path / "swamp.db", orchestrator=True)
        try:
            yield SqliteLogs(SqliteLogStore(store))
        finally:
            store.close()
    else:
        from swamp.store import pg
        from swamp.store.pg_step_logs import PgLogStore

        async with pg.Pool(request.getfixturevalue("pg_url"), size=4) as pool:
            yield await PgLogStore.open(pool)


def start(log_id: str, owner: LogOwner = ADHOC, at: float = 1_800_000_000.0) -> LogStart:
    return LogStart(log_id, owner, "w1", 1, at)


def chunk(log_id: str, first: int, lines: list[str], streams: str | None = None) -> Chunk:
    size = sum(len(line.encode()) + 1 for line in lines)
    return Chunk(log_id, first, first * 10, lines, streams or "o" * len(lines), size)


async def read_all(logs: LogStore, log_id: str) -> list[str]:
    out, after = [], 0
    while True:
        chunks, more = await logs.chunks([log_id], after=after, limit_bytes=1 << 20)
        out += [line for c in chunks for line in c.lines]
        if chunks:
            after = chunks[-1].id
        if not more:
            return out


async def test_lines_come_back_in_order_with_their_streams_and_counts(logs):
    await logs.write([start("aa01")], [chunk("aa01", 0, ["one", "two"], "oe")], [], cap=BIG)
    await logs.write([], [chunk("aa01", 2, ["three"])], [LogEnd("aa01", 1.8e9 + 5, 3, 14)], cap=BIG)
    assert await read_all(logs, "aa01") == ["one", "two", "three"]
    chunks, more = await logs.chunks(["aa01"], after=0, limit_bytes=1)
    assert len(chunks) == 1 and more and chunks[0].streams == "oe"  # at least one chunk a page
    [info] = await logs.logs_with_prefix("aa0")
    assert (info.lines, info.bytes, info.worker, info.attempt) == (3, 26, "w1", 1)  # 20 + 6
    assert info.ended_at is not None and info.owner == ADHOC


async def test_a_chunk_of_no_log_is_never_written(logs):
    await logs.write([], [chunk("ff01", 0, ["lost"])], [], cap=BIG)
    assert await read_all(logs, "ff01") == []
    assert await logs.forget_orphans() == 0


async def test_past_the_cap_the_oldest_chunks_go_and_the_gap_is_known(logs):
    await logs.write([start("cc01")], [], [], cap=100)
    for n in range(10):
        await logs.write([], [chunk("cc01", n * 2, [f"{n}a" * 10, f"{n}b" * 10])], [], cap=100)
    kept = await read_all(logs, "cc01")
    [info] = await logs.logs_by_id(["cc01"])
    assert kept[-1] == "9b" * 10 and len(kept) < 20
    assert info.dropped_lines == 20 - len(kept) and info.dropped_bytes == info.dropped_lines * 10
    first, _ = await logs.chunks(["cc01"], after=0, limit_bytes=1)
    assert first[0].first_line == info.dropped_lines


async def test_logs_are_read_by_run_step_prefix_and_id_in_the_order_opened(logs):
    other = LogOwner("swamp/echo", "e", "echo", run_id=RUN, workflow="wf", job="j", step="t")
    await logs.write(
        [start("bb02", IN_RUN), start("bb01", other), start("bc03", ADHOC)],
        [chunk("bb02", 0, ["x"]), chunk("bb01", 0, ["y"]), chunk("bc03", 0, ["z"])],
        [LogEnd("bb01", 1.8e9 + 1, 1, 2)],
        cap=BIG,
    )
    assert [i.log_id for i in await logs.logs_of_run(RUN)] == ["bb02", "bb01"]
    assert [i.log_id for i in await logs.logs_of_step(RUN, "s")] == ["bb02"]
    assert [i.log_id for i in await logs.logs_of_step(RUN, "j.t")] == ["bb01"]
    assert [i.log_id for i in await logs.logs_with_prefix("bb")] == ["bb02", "bb01"]
    assert [i.log_id for i in await logs.logs_by_id(["bc03", "bb01"])] == ["bb01", "bc03"]
    assert await logs.run_workflow(RUN) == "wf" and await logs.run_workflow("cd" * 16) is None
    assert await logs.run_counts(RUN) == (2, 1)
    chunks, more = await logs.chunks_of_run(RUN, after=0, limit_bytes=1 << 20)
    assert [c.lines for c in chunks] == [["x"], ["y"]] and not more
    after, _ = await logs.chunks_of_run(RUN, after=chunks[0].id, limit_bytes=1 << 20)
    assert [c.lines for c in after] == [["y"]]


async def test_logs_are_forgotten_with_their_run_their_instance_or_by_id(logs):
    await logs.write(
        [start("dd01", IN_RUN), start("dd02", ADHOC), start("dd03", ADHOC)],
        [chunk("dd01", 0, ["a"]), chunk("dd02", 0, ["b"]), chunk("dd03", 0, ["c"])],
        [LogEnd("dd02", 1.8e9 + 1, 1, 2), LogEnd("dd03", 1.8e9 + 2, 1, 2)],
        cap=BIG,
    )
    assert await logs.runs() == [(RUN, "wf")]
    assert sorted(o[2] for o in await logs.others()) == ["dd02", "dd03"]
    assert await logs.forget_runs([RUN]) == 1
    assert await logs.forget_logs(["dd02"]) == 1
    assert await logs.forget_instances([("command/shell", "printer")]) == 1
    assert await logs.logs_with_prefix("dd") == [] and await read_all(logs, "dd03") == []


async def test_the_logs_left_open_end_at_boot(logs):
    await logs.write([start("ee01"), start("ee02")], [], [LogEnd("ee02", 1.8e9, 0, 0)], cap=BIG)
    assert await logs.end_open(1.8e9 + 60) == 1
    [info] = await logs.logs_by_id(["ee01"])
    assert info.ended_at is not None


async def test_the_logs_a_dead_orchestrator_left_open_end_and_no_others(pg_url):
    """On a shared database each orchestrator's logs name it: whoever reconciles a dead one
    ends the logs it left open, and leaves the living's (and ended ones) as they were."""
    from swamp.store import pg
    from swamp.store.pg_step_logs import PgLogStore

    async with pg.Pool(pg_url, size=2) as pool:
        dead = await PgLogStore.open(pool, orchestrator="aa")
        living = PgLogStore(pool, orchestrator="bb")
        earlier = PgLogStore(pool)  # an earlier version's: it named none
        await dead.write([start("ff01"), start("ff02")], [], [LogEnd("ff02", 1.8e9, 0, 0)], cap=BIG)
        await living.write([start("ff03")], [], [], cap=BIG)
        await earlier.write([start("ff04")], [], [], cap=BIG)
        assert await living.end_left(1.8e9 + 60, "aa") == 1
        assert await living.end_left(1.8e9 + 60, None) == 1
        infos = {i.log_id: i for i in await living.logs_by_id(["ff01", "ff02", "ff03", "ff04"])}
        ends = {log_id: info.ended_at for log_id, info in infos.items()}
        assert ends == {
            "ff01": iso(1.8e9 + 60),  # left open by the dead one: ended now
            "ff02": iso(1.8e9),  # ended by it: as it was
            "ff03": None,  # the living's: still open
            "ff04": iso(1.8e9 + 60),
        }


async def test_unnamed_logs_end_only_once_no_other_orchestrator_serves(pg_url):
    """An earlier version's orchestrator names none of its logs, and may be alive beside this
    one: they are ended only once nobody but this one (and one being buried) is registered."""
    from swamp.domain.peers import PeerRow
    from swamp.orchestrator.server import end_unnamed_logs
    from swamp.store import pg
    from swamp.store.pg_peers import PgPeers
    from swamp.store.pg_step_logs import PgLogStore

    async with pg.Pool(pg_url, size=2) as pool:
        logs, table = await PgLogStore.open(pool), await PgPeers.open(pool)
        await logs.write([start("ab01")], [], [], cap=BIG)  # named by none
        for me in ("me", "dead", "earlier"):
            await table.register(PeerRow(me, f"ws://{me}.invalid", "", None, 1.0))
        assert await end_unnamed_logs(logs, table, gone=("me",)) == 0
        assert await end_unnamed_logs(logs, table, gone=("me", "dead")) == 0  # "earlier" lives
        await table.forget("earlier")
        assert await end_unnamed_logs(logs, table, gone=("me", "dead")) == 1
        [info] = await logs.logs_by_id(["ab01"])
        assert info.ended_at is not None


async def test_a_table_of_an_earlier_version_is_given_the_writer_column_and_no_start_waits(
    pg_url,
):
    """A ``step_log`` made without the column gets it (its rows name no writer); once it has
    it, a start takes no lock on the table: it never waits behind a reader (nor holds up
    every writer while it waits)."""
    from swamp.store import pg
    from swamp.store.pg_step_logs import _SCHEMA, PgLogStore

    async with pg.Pool(pg_url, size=3) as pool:
        await pg.make_schema(pool, _SCHEMA)  # the table as an earlier version made it
        async with pool.connection() as conn:
            await conn.execute(
                "INSERT INTO step_log (log_id, model_type, model_name, method, attempt, "
                "started_epoch) VALUES ('cd01', 't', 'n', 'm', 1, 1.0)"
            )
        logs = await PgLogStore.open(pool, orchestrator="me")
        await logs.write([start("cd02")], [], [], cap=BIG)
        async with pool.connection() as conn:
            rows = await conn.execute("SELECT log_id, orchestrator FROM step_log ORDER BY log_id")
            assert rows.rows == [("cd01", None), ("cd02", "me")]
        async with pool.connection() as reader, reader.transaction():
            await reader.execute("SELECT count(*) FROM step_log")  # holds its share lock
            with trio.fail_after(10):  # (an ALTER would wait for the reader's end)
                await PgLogStore.open(pool, orchestrator="other")


@pytest.mark.postgres
@pytest.mark.integration
async def test_racing_writers_never_let_a_follower_step_past_a_chunk(pg_url):
    """Two orchestrators' writers, each batch a transaction, and a reader following the
    cursor as ``swamp logs --follow`` does: every chunk is read, once, whatever the order the
    batches commit in."""
    from swamp.store import pg
    from swamp.store.pg_step_logs import PgLogStore

    async with pg.Pool(pg_url, size=6) as pool:
        logs = await PgLogStore.open(pool)
        owners = {f"ab{w}0": IN_RUN for w in range(2)}
        await logs.write(
            [start(log_id, owner) for log_id, owner in owners.items()], [], [], cap=BIG
        )
        batches = 40
        seen: list[str] = []
        done = trio.Event()

        async def writer(log_id: str) -> None:
            for n in range(batches):
                lines = [f"{log_id}-{n}-{i}" for i in range(3)]
                await logs.write([], [chunk(log_id, n * 3, lines)], [], cap=BIG)

        async def follower() -> None:
            after = 0
            while True:
                finished = done.is_set()  # (read once more after the writers end)
                chunks, _ = await logs.chunks_of_run(RUN, after=after, limit_bytes=1 << 20)
                seen.extend(line for c in chunks for line in c.lines)
                if chunks:
                    after = chunks[-1].id
                elif finished:
                    return
                await trio.lowlevel.checkpoint()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(follower)
            async with trio.open_nursery() as writers:
                for log_id in owners:
                    writers.start_soon(writer, log_id)
            done.set()
        assert len(seen) == len(set(seen)) == 2 * batches * 3
