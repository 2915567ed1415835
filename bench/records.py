#!/usr/bin/env python3
"""The record store's seam (``swamp.store.records``) on SQLite and on PostgreSQL, side by side.

What several orchestrators on one PostgreSQL will pay per bookkeeping write against what one
orchestrator on SQLite pays today: ``SqliteRecords`` over a WAL database in a temp dir, and
``PgStore`` on a throwaway server started as the tests start theirs (``tests.postgres``:
loopback, ``fsync=off``, ``synchronous_commit=off`` — the durability class of SQLite's WAL
with ``synchronous=NORMAL``). Four operations, each ``--ops`` times:

- ``cas``: a compare-and-swap write of the next version of a record the writer knows (a lease
  replaced in place: ``garbage_collection = 1``);
- ``append``: a write of the next version, whatever it is (a status history);
- ``read``: the latest version of a record;
- ``transact``: a transaction of a read and two writes (a fenced write: ``HoldingBook``).

For each backend and operation: p50/p99 latency of one task, then operations per second of
``--tasks`` tasks at once (PostgreSQL: a pool of as many connections); ``--repetitions``
rounds, the backends alternated, the median of each figure. Prints one JSON object.

    python3 build.py bench-records [--ops 1000] [--tasks 4] [--repetitions 3]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import trio  # noqa: E402
from benchkit import percentile  # noqa: E402

from swamp.bookkeeping.holdings import HoldingBook  # noqa: E402
from swamp.store.datastore import Datastore, Key, SpecPolicy  # noqa: E402
from swamp.store.pg_store import PgStore  # noqa: E402
from swamp.store.records import Records, SqliteRecords  # noqa: E402
from tests import postgres  # noqa: E402

LEASE = SpecPolicy("lease", garbage_collection=1)
STATUS = SpecPolicy("state", garbage_collection=20)
ATTRIBUTES = {"state": "running", "worker": "pool-1a2b3c4d", "dispatchId": "d" * 32, "n": 0}


async def one_backend(records: Records, args) -> dict:
    book = HoldingBook(records)
    versions: dict[int, int] = {}

    async def cas(n: int) -> None:
        key = Key("bench/lease", "w", f"d-{n % 256}")
        written = await records.write(
            key, ATTRIBUTES, policy=LEASE, expected_version=versions.get(n % 256, 0)
        )
        versions[n % 256] = written.version

    async def append(n: int) -> None:
        await records.write(Key("bench/status", "w", f"w-{n % 64}"), ATTRIBUTES, policy=STATUS)

    async def read(n: int) -> None:
        await records.latest(Key("bench/status", "w", f"w-{n % 64}"))

    holdings = {}

    async def transact(n: int) -> None:
        worker = f"w-{n % 64}"
        held = holdings.get(worker) or await book.take(worker, "orch-a")
        holdings[worker] = held
        await book.write_fenced(held, Key("bench/out", worker, f"r{n}"), ATTRIBUTES, policy=LEASE)

    out = {}
    for label, op in (("cas", cas), ("append", append), ("read", read), ("transact", transact)):
        out[label] = {**await latency(op, args.ops), **await throughput(op, args.ops, args.tasks)}
    return out


async def latency(op: Callable[[int], Awaitable[None]], ops: int) -> dict:
    times = []
    for n in range(ops):
        started = time.perf_counter()
        await op(n)
        times.append(time.perf_counter() - started)
    return {
        "p50_ms": round(percentile(times, 50) * 1000, 3),
        "p99_ms": round(percentile(times, 99) * 1000, 3),
    }


async def throughput(op, ops: int, tasks: int) -> dict:
    """``tasks`` at once, task t taking the operations n ≡ t (mod tasks): for ``cas`` each
    task's records are its own (256 records, a multiple of the tasks), so each writer knows
    its versions."""
    started = time.perf_counter()

    async def worker(first: int) -> None:
        for n in range(first, ops, tasks):
            await op(n)

    async with trio.open_nursery() as nursery:
        for t in range(tasks):
            nursery.start_soon(worker, t)
    return {"ops_per_second": round(ops / (time.perf_counter() - started))}


async def main(args) -> dict:
    rounds: dict[str, list[dict]] = {"sqlite": [], "postgresql": []}
    with postgres.cluster() as server, tempfile.TemporaryDirectory() as scratch:
        for r in range(args.repetitions):
            sqlite = SqliteRecords(Datastore(Path(scratch) / f"r{r}.db", orchestrator=True))
            try:
                rounds["sqlite"].append(await one_backend(sqlite, args))
            finally:
                await sqlite.aclose()
            pg = await PgStore.open(server.new_database(), size=args.tasks)
            try:
                rounds["postgresql"].append(await one_backend(pg, args))
            finally:
                await pg.aclose()
    result: dict = {"ops": args.ops, "tasks": args.tasks, "repetitions": args.repetitions}
    for backend, runs in rounds.items():
        result[backend] = {
            op: {
                figure: statistics.median(run[op][figure] for run in runs) for figure in runs[0][op]
            }
            for op in runs[0]
        }
    result["postgresql_over_sqlite_ops_per_second"] = {
        op: round(
            result["postgresql"][op]["ops_per_second"] / result["sqlite"][op]["ops_per_second"], 3
        )
        for op in result["sqlite"]
    }
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1000)
    parser.add_argument("--tasks", type=int, default=4, help="a divisor of 256")
    parser.add_argument("--repetitions", type=int, default=3)
    print(json.dumps(trio.run(main, parser.parse_args()), indent=2))
