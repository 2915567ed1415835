"""swamp.store.pg against a real PostgreSQL server (tests.postgres): values, errors,
transactions, a compare-and-swap race, cancellation, a killed backend, LISTEN/NOTIFY, and an
event loop that keeps running. Every wait is on an event, bounded by ``fail_after``."""

from __future__ import annotations

import math
import os
import random
from decimal import Decimal

import pytest
import trio
import trio.testing

from swamp.errors import (
    ConnectionLost,
    DatabaseUnavailable,
    PoolTimeout,
    SqlError,
    UserError,
)
from swamp.store import pg

BOUND = 10  # seconds: a test that waits longer has hung


async def test_every_parameter_type_round_trips(pg_url):
    values = [
        None,
        True,
        False,
        0,
        -1,
        2**15,
        2**31,
        2**63 - 1,
        -(2**63),
        1.5,
        -0.1,
        math.inf,
        -math.inf,
        "",
        "héllo wörld ✓ 🐍 日本",
        "a 'quoted' \"one\" \\ and\nnewline",
        b"",
        bytes(range(256)),
        Decimal("1234567890.000000000001"),
    ]
    async with await pg.connect(pg_url) as conn:
        for value in values:
            result = await conn.execute("SELECT $1", [value])
            assert result.rows == [(value,)], value
            assert type(result.rows[0][0]) is type(value)
        nan = (await conn.execute("SELECT $1", [math.nan])).rows[0][0]
        assert math.isnan(nan)
        several = await conn.execute("SELECT $1::int8, $2::text, $3::bytea", [7, "x", b"y"])
        assert several.rows == [(7, "x", b"y")]


async def test_every_result_type_converts_by_its_oid(pg_url):
    async with await pg.connect(pg_url) as conn:
        result = await conn.execute(
            "SELECT 1::int2, 2::int4, 3::int8, 1.5::float4, 2.25::float8, 3.10::numeric, "
            "'t'::text, 'v'::varchar, 'n'::name, '\\x00ff'::bytea, true, false, "
            """'{"a": [1, 2]}'::json, '{"b": null}'::jsonb, NULL::int, NULL::text, """
            "'2024-01-02'::date, '5f0c0b7e-33f5-4e5b-9d0e-6b4a3c1a2b3c'::uuid, ''::text"
        )
        assert result.rows == [
            (
                *(1, 2, 3, 1.5, 2.25, Decimal("3.10")),
                *("t", "v", "n", b"\x00\xff", True, False),
                *('{"a": [1, 2]}', '{"b": null}', None, None),
                *("2024-01-02", "5f0c0b7e-33f5-4e5b-9d0e-6b4a3c1a2b3c", ""),
            )
        ]
        special = await conn.execute("SELECT 'NaN'::numeric, 'Infinity'::float8")
        assert special.rows[0][0].is_nan() and special.rows[0][1] == math.inf
        await conn.execute("SET bytea_output = 'escape'")
        escaped = await conn.execute("SELECT $1::bytea", [b"a\\b\x00\xffz"])
        assert escaped.rows == [(b"a\\b\x00\xffz",)]


async def test_values_postgresql_cannot_take_are_refused_before_anything_is_sent(pg_url):
    async with await pg.connect(pg_url) as conn:
        with pytest.raises(UserError, match="64 bits"):
            await conn.execute("SELECT $1", [2**63])
        with pytest.raises(UserError, match="NUL"):
            await conn.execute("SELECT $1", ["a\x00b"])
        with pytest.raises(UserError, match="cannot be sent"):
            await conn.execute("SELECT $1", [object()])
        assert (await conn.execute("SELECT 1")).rows == [(1,)]


async def test_a_few_megabytes_of_bytea_round_trip(pg_url):
    blob = os.urandom(4 * 1024 * 1024)
    async with await pg.connect(pg_url) as conn:
        await conn.execute("CREATE TABLE blobs (id int PRIMARY KEY, data bytea NOT NULL)")
        await conn.execute("INSERT INTO blobs VALUES ($1, $2)", [1, blob])
        back = await conn.execute("SELECT data, length(data) FROM blobs WHERE id = $1", [1])
        assert back.rows == [(blob, len(blob))]


async def test_several_rows_the_count_and_the_command_tag(pg_url):
    async with await pg.connect(pg_url) as conn:
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY, name text)")
        inserted = await conn.execute(
            "INSERT INTO t SELECT i, 'n' || i FROM generate_series(1, $1) AS i", [5]
        )
        assert (inserted.rowcount, inserted.status) == (5, "INSERT 0 5")
        updated = await conn.execute("UPDATE t SET name = NULL WHERE id > $1", [2])
        assert (updated.rowcount, updated.status) == (3, "UPDATE 3")
        selected = await conn.execute("SELECT id, name FROM t ORDER BY id")
        assert selected.rows == [(1, "n1"), (2, "n2"), (3, None), (4, None), (5, None)]
        assert (selected.rowcount, selected.status) == (5, "SELECT 5")
        none = await conn.execute("SELECT id FROM t WHERE false")
        assert (none.rows, none.rowcount) == ([], 0)


async def test_a_server_error_carries_its_sqlstate_and_the_connection_goes_on(pg_url):
    async with await pg.connect(pg_url) as conn:
        with pytest.raises(SqlError) as missing:
            await conn.execute("SELECT * FROM nowhere")
        assert missing.value.sqlstate == pg.UNDEFINED_TABLE
        assert 'relation "nowhere" does not exist' in missing.value.message
        with pytest.raises(SqlError) as syntax:
            await conn.execute("SELEC 1")
        assert syntax.value.sqlstate == "42601"
        assert (await conn.execute("SELECT 2")).rows == [(2,)]
        assert not conn.closed


async def test_a_duplicate_primary_key_is_a_unique_violation(pg_url):
    async with await pg.connect(pg_url) as conn:
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        await conn.execute("INSERT INTO t VALUES ($1)", [1])
        with pytest.raises(SqlError) as info:
            await conn.execute("INSERT INTO t VALUES ($1)", [1])
        assert info.value.sqlstate == pg.UNIQUE_VIOLATION
        assert "Key (id)=(1) already exists" in info.value.detail


async def test_a_transaction_commits_and_rolls_back(pg_url):
    async with await pg.connect(pg_url) as conn:
        await conn.execute("CREATE TABLE t (id int PRIMARY KEY)")
        async with conn.transaction():
            await conn.execute("INSERT INTO t VALUES (1)")
            assert conn.in_transaction
        assert not conn.in_transaction
        with pytest.raises(RuntimeError):
            async with conn.transaction():
                await conn.execute("INSERT INTO t VALUES (2)")
                raise RuntimeError("the block failed")
        with pytest.raises(SqlError) as failed:  # a refused statement the block swallowed
            async with conn.transaction():
                await conn.execute("INSERT INTO t VALUES (3)")
                with pytest.raises(SqlError):
                    await conn.execute("INSERT INTO t VALUES (1)")
        assert failed.value.sqlstate == pg.IN_FAILED_TRANSACTION
        with pytest.raises(UserError, match="nest"):
            async with conn.transaction(), conn.transaction():
                pass
        assert not conn.in_transaction
        assert (await conn.execute("SELECT id FROM t")).rows == [(1,)]


TASKS, MOVES = 6, 15  # writers racing on a pool of 4, wins each


async def _race(pool: pg.Pool, attempt) -> list[list[int]]:
    """Each writer reads the current version, lets the others run, and attempts n -> n+1
    until it has won MOVES times; the versions each one won."""
    won: list[list[int]] = [[] for _ in range(TASKS)]

    async def writer(me: int) -> None:
        while len(won[me]) < MOVES:
            async with pool.connection() as conn:
                if (version := await attempt(conn, me)) is not None:
                    won[me].append(version)

    with trio.fail_after(BOUND * 3):
        async with trio.open_nursery() as nursery:
            for me in range(TASKS):
                nursery.start_soon(writer, me)
    return won


async def test_compare_and_swap_updates_on_a_pool_lose_and_double_nothing(pg_url):
    async with pg.Pool(pg_url, size=4) as pool:
        async with pool.connection() as conn:
            await conn.execute("CREATE TABLE rec (id int PRIMARY KEY, version int8, moves int8)")
            await conn.execute("INSERT INTO rec VALUES (1, 0, 0)")

        async def attempt(conn: pg.Connection, me: int) -> int | None:
            (version,) = (await conn.execute("SELECT version FROM rec WHERE id = 1")).rows[0]
            await trio.lowlevel.checkpoint()  # let the others read the same version
            moved = await conn.execute(
                "UPDATE rec SET version = $1 + 1, moves = moves + 1 "
                "WHERE id = 1 AND version = $1 RETURNING version",
                [version],
            )
            return moved.rows[0][0] if moved.rows else None  # no row: another won

        won = await _race(pool, attempt)
        async with pool.connection() as conn:
            final = await conn.execute("SELECT version, moves FROM rec")
    assert final.rows == [(TASKS * MOVES, TASKS * MOVES)]
    assert sorted(v for mine in won for v in mine) == list(range(1, TASKS * MOVES + 1))


async def test_compare_and_swap_inserts_on_a_pool_lose_and_double_nothing(pg_url):
    """The next version is a new row; two racers for it meet on the primary key."""
    async with pg.Pool(pg_url, size=4) as pool:
        async with pool.connection() as conn:
            await conn.execute("CREATE TABLE versions (version int8 PRIMARY KEY, writer int)")

        async def attempt(conn: pg.Connection, me: int) -> int | None:
            (latest,) = (await conn.execute("SELECT max(version) FROM versions")).rows[0]
            await trio.lowlevel.checkpoint()
            added = await conn.execute(
                "INSERT INTO versions SELECT $1 + 1, $2 "
                "WHERE (SELECT COALESCE(max(version), 0) FROM versions) = $1 "
                "ON CONFLICT DO NOTHING RETURNING version",
                [latest or 0, me],
            )
            return added.rows[0][0] if added.rows else None

        won = await _race(pool, attempt)
        async with pool.connection() as conn:
            rows = (await conn.execute("SELECT version, writer FROM versions")).rows
    assert sorted(v for v, _ in rows) == list(range(1, TASKS * MOVES + 1))
    assert sorted(rows) == sorted((v, me) for me, mine in enumerate(won) for v in mine)


async def _active(conn: pg.Connection, pid: int) -> list[tuple]:
    found = await conn.execute(
        "SELECT state, query FROM pg_stat_activity WHERE pid = $1 AND state = 'active'", [pid]
    )
    return found.rows


async def test_a_query_cancelled_in_flight_is_stopped_and_its_connection_not_reused_broken(
    pg_url,
):
    async with await pg.connect(pg_url) as conn, await pg.connect(pg_url) as watcher:
        started = trio.current_time()
        with trio.move_on_after(0.2) as scope:
            await conn.execute("SELECT pg_sleep(10)")
        assert scope.cancelled_caught
        assert trio.current_time() - started < 5  # not the statement's 10 s
        assert await _active(watcher, conn.pid) == []  # the server stopped it, too
        if not conn.closed:  # brought back to idle: usable as it is
            assert not conn.in_transaction
            assert (await conn.execute("SELECT 1")).rows == [(1,)]


async def test_a_cancelled_statement_inside_a_transaction_rolls_it_back(pg_url):
    async with await pg.connect(pg_url) as conn:
        await conn.execute("CREATE TABLE t (id int)")
        with trio.move_on_after(0.2):
            async with conn.transaction():
                await conn.execute("INSERT INTO t VALUES (1)")
                await conn.execute("SELECT pg_sleep(10)")
        assert conn.closed or not conn.in_transaction
        async with await pg.connect(pg_url) as other:
            assert (await other.execute("SELECT count(*) FROM t")).rows == [(0,)]


async def test_after_a_cancel_the_pool_hands_out_a_working_connection(pg_url):
    async with pg.Pool(pg_url, size=1) as pool:
        with trio.move_on_after(0.2):
            async with pool.connection() as conn:
                await conn.execute("SELECT pg_sleep(10)")
        with trio.fail_after(BOUND):
            async with pool.connection() as again:
                assert (await again.execute("SELECT 1")).rows == [(1,)]
                assert not again.closed


async def test_a_closed_connection_is_not_handed_out_again(pg_url):
    async with pg.Pool(pg_url, size=1) as pool:
        async with pool.connection() as conn:
            first = conn
            conn.close()
        async with pool.connection() as conn:
            assert conn is not first
            assert (await conn.execute("SELECT 1")).rows == [(1,)]


async def _terminate(pg_url: str, pid: int) -> None:
    """End a backend from another connection, waiting (server side) until it is gone."""
    async with await pg.connect(pg_url) as admin:
        done = await admin.execute("SELECT pg_terminate_backend($1, 5000)", [pid])
        assert done.rows == [(True,)]


async def test_a_backend_terminated_while_idle_raises_connection_lost(pg_url):
    conn = await pg.connect(pg_url)
    await _terminate(pg_url, conn.pid)
    with trio.fail_after(BOUND), pytest.raises(ConnectionLost, match="administrator command"):
        await conn.execute("SELECT 1")
    assert conn.closed
    with pytest.raises(ConnectionLost):
        await conn.execute("SELECT 1")


async def test_a_backend_terminated_mid_query_raises_connection_lost_not_a_hang(pg_url):
    async with await pg.connect(pg_url) as conn:
        outcome: list[BaseException] = []

        async def sleeper(task_status=trio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            try:
                await conn.execute("SELECT pg_sleep(30)")
            except ConnectionLost as exc:
                outcome.append(exc)

        with trio.fail_after(BOUND):
            async with trio.open_nursery() as nursery:
                await nursery.start(sleeper)
                await trio.testing.wait_all_tasks_blocked()  # sent, waiting for the answer
                await _terminate(pg_url, conn.pid)
        assert len(outcome) == 1 and conn.closed


async def test_the_pool_replaces_a_connection_the_server_ended(pg_url):
    async with pg.Pool(pg_url, size=1) as pool:
        async with pool.connection() as conn:
            first = conn.pid
        await _terminate(pg_url, first)
        async with pool.connection() as conn:
            assert conn.pid != first
            assert (await conn.execute("SELECT 1")).rows == [(1,)]


async def test_waiting_for_a_pool_is_bounded_and_first_come_first_served(pg_url):
    order: list[int] = []
    async with pg.Pool(pg_url, size=1) as pool:

        async def waiter(me: int) -> None:
            async with pool.connection() as conn:
                order.append(me)
                await conn.execute("SELECT 1")

        with trio.fail_after(BOUND):
            async with trio.open_nursery() as nursery, pool.connection():
                with pytest.raises(PoolTimeout, match="came free"):
                    async with pool.connection(wait=0.05):
                        pass
                for me in range(4):
                    nursery.start_soon(waiter, me)
                    await trio.testing.wait_all_tasks_blocked()  # queued in this order
                assert pool.statistics()["waiting"] == 4
    assert order == [0, 1, 2, 3]


async def test_a_closed_pool_refuses(pg_url):
    pool = pg.Pool(pg_url, size=2)
    async with pool.connection() as conn:
        await conn.execute("SELECT 1")
    await pool.aclose()
    with pytest.raises(ConnectionLost, match="pool is closed"):
        async with pool.connection():
            pass


async def test_listen_and_notify_between_two_connections(pg_url):
    async with await pg.connect(pg_url) as listener, await pg.connect(pg_url) as sender:
        await listener.listen("jobs")
        got: list[pg.Notifications] = []
        arrived = trio.Event()

        async def wait() -> None:
            got.append(await listener.wait_notifications())
            arrived.set()

        with trio.fail_after(BOUND):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait)
                await trio.testing.wait_all_tasks_blocked()
                await sender.execute("SELECT pg_notify($1, $2)", ["jobs", "step 7 ✓"])
                await arrived.wait()
        (batch,) = got
        assert batch.received == (pg.Notification("jobs", "step 7 ✓", sender.pid),)
        assert not batch.missed


async def test_a_statement_on_the_listening_connection_does_not_lose_notifications(pg_url):
    """The listener is waiting for notifications when it runs a statement (the wait yields
    the socket); a notification sent meanwhile comes in with the statement's answer."""
    async with await pg.connect(pg_url) as listener, await pg.connect(pg_url) as sender:
        await listener.listen("wake")
        await sender.execute("SELECT pg_advisory_lock(1)")
        got: list[pg.Notifications] = []

        async def wait() -> None:
            got.append(await listener.wait_notifications())

        async def query(task_status=trio.TASK_STATUS_IGNORED) -> None:
            task_status.started()
            # blocks on the server until the sender lets go of the lock
            await listener.execute("SELECT pg_advisory_lock(1)")

        with trio.fail_after(BOUND):
            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait)
                await trio.testing.wait_all_tasks_blocked()
                await nursery.start(query)
                await trio.testing.wait_all_tasks_blocked()  # sent, waiting for the lock
                await sender.execute("SELECT pg_notify('wake', 'during')")
                await sender.execute("SELECT pg_advisory_unlock(1)")
        assert [n.payload for n in got[0].received] == ["during"]


async def test_past_the_bound_notifications_are_dropped_and_missed_is_set(pg_url):
    async with await pg.connect(pg_url, max_pending=3) as listener:
        await listener.listen("c")
        async with await pg.connect(pg_url) as sender:
            async with sender.transaction():
                for n in range(5):
                    await sender.execute("SELECT pg_notify('c', $1)", [str(n)])
            # the server sends a listener its notifications before answering its next statement
            await listener.execute("SELECT 1")
            with trio.fail_after(BOUND):
                batch = await listener.wait_notifications()
            assert [n.payload for n in batch.received] == ["0", "1", "2"] and batch.missed
            await sender.execute("SELECT pg_notify('c', 'after')")
            with trio.fail_after(BOUND):
                batch = await listener.wait_notifications()
            assert [n.payload for n in batch.received] == ["after"] and not batch.missed


async def test_the_event_loop_runs_while_a_query_is_in_flight(pg_url):
    ticks_in_flight = 0
    in_flight = True

    async def ticker() -> None:
        nonlocal ticks_in_flight
        while in_flight:
            await trio.sleep(0.005)
            if in_flight:
                ticks_in_flight += 1

    async with await pg.connect(pg_url) as conn, trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await conn.execute("SELECT pg_sleep(0.5)")
        in_flight = False
    assert ticks_in_flight > 0


async def test_connecting_resolves_names_and_says_what_failed_without_the_password(
    postgres_cluster,
):
    url = postgres_cluster.url()
    async with await pg.connect(url.replace("127.0.0.1", "localhost")) as conn:
        assert (await conn.execute("SELECT 1")).rows == [(1,)]
    local = (
        f"host={postgres_cluster.directory} port={postgres_cluster.port} user=swamp dbname=postgres"
    )
    async with await pg.connect(local) as conn:  # a Unix socket: nothing to resolve
        assert (await conn.execute("SELECT current_user")).rows == [("swamp",)]
    secret = url.replace("swamp@", "swamp:s3cret-pw@")
    with pytest.raises(DatabaseUnavailable) as refused:
        await pg.connect(secret.replace(str(postgres_cluster.port), "1"))
    assert "127.0.0.1" in refused.value.message and "s3cret" not in refused.value.message
    with pytest.raises(DatabaseUnavailable, match="does not exist"):
        await pg.connect(secret.replace("/postgres", "/no_such_db"))
    with pytest.raises(DatabaseUnavailable, match="cannot resolve"):
        await pg.connect(secret.replace("127.0.0.1", "no-such-host.invalid"))
    with pytest.raises(UserError, match="not a PostgreSQL URL"):
        await pg.connect("host=x s3cret")


# -- what a hostile review found ----------------------------------------------------------------


async def test_a_statement_called_in_a_cancelled_scope_sends_nothing(pg_url):
    async with await pg.connect(pg_url) as conn:
        await conn.execute("CREATE TABLE t (i int)")
        with trio.CancelScope() as scope:
            scope.cancel()
            await conn.execute("INSERT INTO t VALUES (1)")
        assert (await conn.execute("SELECT count(*) FROM t")).rows == [(0,)]
        with trio.CancelScope() as scope:
            scope.cancel()
            async with conn.transaction():
                pass
        assert not conn.closed and not conn.in_transaction  # no BEGIN left open


async def test_a_value_that_cannot_be_sent_leaves_the_connection_as_it_was(pg_url):
    async with await pg.connect(pg_url) as conn:
        with pytest.raises(UserError, match="at most 65535 parameters"):
            await conn.execute("SELECT 1", [1] * 70000)
        with pytest.raises(UserError, match="lone surrogate"):
            await conn.execute("SELECT $1", ["\udc80"])
        with pytest.raises(UserError, match="lone surrogate"):
            await conn.execute("SELECT '\udc80'")
        assert not conn.closed and (await conn.execute("SELECT 1")).rows == [(1,)]


async def test_a_pool_asked_without_a_wait_gives_a_free_connection(pg_url):
    async with pg.Pool(pg_url, size=1) as pool, pool.connection(wait=0) as conn:
        assert (await conn.execute("SELECT 1")).rows == [(1,)]
        with pytest.raises(PoolTimeout):
            async with pool.connection(wait=0):
                pass


async def test_a_cancel_never_reaches_the_next_statement(pg_url):
    """Statements cancelled at random points of their course, each followed at once by
    another on the same connection: that one is never the one cancelled, and the pool's
    count of connections in use comes back to nothing."""
    chance = random.Random(7)
    async with pg.Pool(pg_url, size=3) as pool:
        for _ in range(120):
            async with pool.connection() as conn:
                with trio.move_on_after(chance.uniform(0, 0.004)):
                    await conn.execute("SELECT pg_sleep(0.002)")
                if not conn.closed:
                    assert (await conn.execute("SELECT 1")).rows == [(1,)]
            assert pool.statistics()["in_use"] == 0


async def test_a_host_from_the_environment_is_resolved_by_trio_too(pg_url, monkeypatch):
    """A URL without a host: libpq would take PGHOST and resolve it on the event loop; it is
    resolved by trio as a URL's host is. A service file's is refused, for the same reason."""
    from urllib.parse import urlsplit

    parts = urlsplit(pg_url)
    monkeypatch.setenv("PGHOST", "localhost")
    hostless = f"postgresql:///{parts.path.lstrip('/')}?user=swamp&port={parts.port}"
    async with await pg.connect(hostless) as conn:
        assert (await conn.execute("SELECT 1")).rows == [(1,)]
    with pytest.raises(UserError, match="service="):
        await pg.connect("postgresql:///x?service=elsewhere")
