#!/usr/bin/env python3
"""swamp.store.pg (libpq driven by trio) against psycopg's sync API in ``trio.to_thread``.

A throwaway server started as the tests start theirs (``tests.postgres.cluster()``: loopback,
``fsync=off``, ``synchronous_commit=off``), a table of ``--records`` records. Two operations:

- ``cas``: one compare-and-swap write of the next version of a record whose version the
  writer knows (``UPDATE … SET version = $2 + 1 … WHERE id = $1 AND version = $2
  RETURNING version``); each task writes records of its own, so every write wins;
- ``read``: one point read by primary key.

For each route and operation: p50/p99 latency over ``--ops`` operations on one connection,
then operations per second of 4 tasks sharing a pool of 4 connections (``--ops`` in all);
``--repetitions`` rounds, the routes alternated, the median of each figure. psycopg runs as
its users run it: autocommit, its defaults (it prepares a statement the server has seen 5
times); swamp.store.pg sends every statement unprepared. Prints one JSON object.

    python3 build.py bench-pg [--ops 1000] [--repetitions 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
import trio  # noqa: E402
from benchkit import percentile  # noqa: E402

from swamp.store import pg  # noqa: E402
from tests import postgres  # noqa: E402

POOL = 4  # connections of the pool, and tasks sharing it
WARM_UP = 100  # operations before each measured run (psycopg prepares after 5)
CAS = (
    "UPDATE rec SET version = {v} + 1, body = {b} WHERE id = {i} AND version = {v} "
    "RETURNING version"
)
READ = "SELECT version, body FROM rec WHERE id = {i}"
CAS_PG = CAS.format(i="$1", v="$2", b="$3")
READ_PG = READ.format(i="$1")
CAS_PSYCOPG = CAS.format(i="%(i)s", v="%(v)s", b="%(b)s")
READ_PSYCOPG = READ.format(i="%(i)s")

Op = Callable[[int], Awaitable[None]]  # one operation on record n


class Records:
    """The versions the writers know, per record."""

    def __init__(self, count: int) -> None:
        self.count = count
        self.version = [0] * count


async def trio_route(url: str, records: Records) -> tuple[Callable, Callable, Callable]:
    """(one connection's ops, a pool's ops, close) for swamp.store.pg."""
    conn = await pg.connect(url)
    pool = pg.Pool(url, size=POOL)

    def ops(run: Callable) -> dict[str, Op]:
        async def cas(n: int) -> None:
            v = records.version[n]
            result = await run(CAS_PG, [n, v, f"body {v + 1}"])
            assert result.rows == [(v + 1,)]
            records.version[n] = v + 1

        async def read(n: int) -> None:
            result = await run(READ_PG, [n])
            assert len(result.rows) == 1

        return {"cas": cas, "read": read}

    async def pooled(sql: str, params: list) -> pg.Result:
        async with pool.connection() as c:
            return await c.execute(sql, params)

    async def close() -> None:
        await conn.aclose()
        await pool.aclose()

    return ops(conn.execute), ops(pooled), close


async def thread_route(url: str, records: Records) -> tuple[Callable, Callable, Callable]:
    """The same for psycopg's sync connections, each call in ``trio.to_thread.run_sync``."""
    conn = await trio.to_thread.run_sync(lambda: psycopg.connect(url, autocommit=True))
    free_send, free_receive = trio.open_memory_channel[psycopg.Connection](POOL)
    for _ in range(POOL):
        free_send.send_nowait(
            await trio.to_thread.run_sync(lambda: psycopg.connect(url, autocommit=True))
        )

    def fetch(c: psycopg.Connection, sql: str, params: dict) -> list:
        return c.execute(sql, params).fetchall()

    def ops(run: Callable) -> dict[str, Op]:
        async def cas(n: int) -> None:
            v = records.version[n]
            rows = await run(CAS_PSYCOPG, {"i": n, "v": v, "b": f"body {v + 1}"})
            assert rows == [(v + 1,)]
            records.version[n] = v + 1

        async def read(n: int) -> None:
            rows = await run(READ_PSYCOPG, {"i": n})
            assert len(rows) == 1

        return {"cas": cas, "read": read}

    async def single(sql: str, params: dict) -> list:
        return await trio.to_thread.run_sync(fetch, conn, sql, params)

    async def pooled(sql: str, params: dict) -> list:
        c = await free_receive.receive()  # first come, first served, as pg.Pool
        try:
            return await trio.to_thread.run_sync(fetch, c, sql, params)
        finally:
            free_send.send_nowait(c)

    async def close() -> None:
        conn.close()
        for _ in range(POOL):
            free_receive.receive_nowait().close()

    return ops(single), ops(pooled), close


async def latency(op: Op, records: Records, count: int) -> dict[str, float]:
    """p50/p99 in ms of ``count`` operations one after another."""
    for n in range(WARM_UP):
        await op(n % records.count)
    times = []
    for n in range(count):
        started = time.perf_counter()
        await op(n % records.count)
        times.append(time.perf_counter() - started)
    return {"p50_ms": percentile(times, 50) * 1000, "p99_ms": percentile(times, 99) * 1000}


async def throughput(op: Op, records: Records, count: int) -> float:
    """Operations per second of POOL tasks doing ``count`` operations in all, each on
    records of its own (task t takes records t, t + POOL, …)."""

    async def task(t: int, how_many: int) -> None:
        mine = range(t, records.count, POOL)
        for n in range(how_many):
            await op(mine[n % len(mine)])

    async with trio.open_nursery() as nursery:
        for t in range(POOL):
            nursery.start_soon(task, t, WARM_UP // POOL)
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for t in range(POOL):
            nursery.start_soon(task, t, count // POOL)
    return count // POOL * POOL / (time.perf_counter() - started)


ROUTES = {"trio_libpq": trio_route, "psycopg_to_thread": thread_route}


async def measure(urls: dict[str, str], ops: int, repetitions: int, records_count: int) -> dict:
    """Both routes, each on a database of its own, in alternated rounds (a drift of the
    machine falls on both alike); the median of each figure."""
    routes = {}
    for name, route in ROUTES.items():
        async with await pg.connect(urls[name]) as admin:
            await admin.execute("CREATE TABLE rec (id int PRIMARY KEY, version int8, body text)")
            await admin.execute(
                "INSERT INTO rec SELECT i, 0, 'body 0' FROM generate_series(0, $1 - 1) AS i",
                [records_count],
            )
            await admin.execute("VACUUM ANALYZE rec")
        records = Records(records_count)
        routes[name] = (records, *await route(urls[name], records))
    runs: dict[tuple[str, str], list[dict]] = {}
    for _ in range(repetitions):
        for op in ("cas", "read"):
            for name, (records, single, pooled, _close) in routes.items():
                one = await latency(single[op], records, ops)
                one["pool4_ops_per_s"] = await throughput(pooled[op], records, ops)
                runs.setdefault((name, op), []).append(one)
    for _records, _single, _pooled, close in routes.values():
        await close()
    out: dict = {}
    for (name, op), done in runs.items():
        out.setdefault(name, {})[op] = {
            key: round(statistics.median(run[key] for run in done), 3) for key in done[0]
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--records", type=int, default=1000)
    args = parser.parse_args()
    with postgres.cluster() as server:
        urls = {name: server.new_database() for name in ROUTES}
        figures = trio.run(measure, urls, args.ops, args.repetitions, args.records)
        with psycopg.connect(server.url()) as probe:
            version = probe.info.server_version
    print(
        json.dumps(
            {
                "server": f"PostgreSQL {version // 10000}.{version % 10000} on 127.0.0.1, "
                "fsync=off, synchronous_commit=off",
                "psycopg": psycopg.__version__,
                "libpq": psycopg.pq.version(),
                "ops": args.ops,
                "repetitions": args.repetitions,
                "pool": POOL,
                **figures,
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
