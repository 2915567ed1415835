#!/usr/bin/env python3
"""Dispatch benchmark, as ratios to the floor.

Each round runs, for each shape (1 worker × 32 slots, 8 workers × 4 slots), the floor
(``bench/floor.py``: the same hop with nothing else) and swamp — a real ``swamp serve``, real
``swamp worker connect`` processes, ``swamp/echo`` dispatched by label through the client —
one after the other, alternating which goes first. Each first warms every worker up (eight
calls per slot, all slots busy), then measures sequential latency on one client (p50, p99) and
throughput with every slot kept busy (32 clients, one call in flight each). Prints one JSON
object: every run, the median of each figure over the rounds, and swamp's figures as ratios to
the floor's (latency: lower is better; throughput: higher is).

    python3 build.py bench [--rounds 3] [--sequential 400] [--total 2000] [--shapes 1x32,8x4]
        [--swamp-only] [--floors]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import asynccontextmanager
from pathlib import Path

import floor
import trio
from benchkit import cpu_seconds, percentile, scratch

from swamp.bookkeeping.tokens import TokenBook
from swamp.client import connect
from swamp.processes import (
    LineReader,
    start_serve,
    start_worker,
    stop_all,
    wait_enrolled,
    wait_enrolled_text,
)
from swamp.repo import Repo
from swamp.store.records import Records, SqliteRecords

HERE = Path(__file__).resolve().parent


# -- the two systems: each yields a factory of clients ------------------------------------------


@asynccontextmanager
async def swamp_system(
    root: Path,
    workers: int,
    slots: int,
    env: dict,
    *,
    database: Callable[[], str] | None = None,
    through_other: bool = False,
):
    """``database``: a fresh PostgreSQL database's URL for each run (serve --database);
    ``through_other``: a second orchestrator on it, which the clients call — it holds no
    worker, so every step goes through the shared queue to the first, and back."""
    repo, _ = Repo.init(root / "repo")
    url_db = database() if database is not None else None
    procs: list = []
    logs = contextlib.ExitStack()  # every process's stderr, kept in the temp dir

    def log_file(name: str):
        return logs.enter_context(open(root / name, "wb"))

    try:
        serve_env = env if url_db is None else {**env, "SWAMP_DATABASE_URL": url_db}
        serve, serve_lines, url = await start_serve(
            repo.root, env=serve_env, stderr=log_file("serve.log")
        )
        procs.append(serve)
        client_url, client_repo = url, repo
        if through_other:
            other, _ = Repo.init(root / "other")
            second, second_lines, client_url = await start_serve(
                other.root, env=serve_env, stderr=log_file("serve-other.log")
            )
            procs.append(second)
            client_repo = other
        if url_db is None:
            db: Records = SqliteRecords(repo.open_store())
        else:
            from swamp.store.pg_store import PgStore

            db = await PgStore.open(url_db, size=1)
        readers = [serve_lines] + ([second_lines] if through_other else [])
        for i in range(workers):
            _, credential = await TokenBook(db).mint(f"bench-{i}", duration_seconds=3600)
            worker, reader = await start_worker(
                url,
                credential,
                *("--label", "role=bench", "--concurrency", str(slots)),
                env=env,
                stderr=log_file(f"worker-{i}.log"),
                json=False,  # as an operator runs it: no line per dispatch
            )
            procs.append(worker)
            readers.append(reader)
        await db.aclose()
        await wait_enrolled_text(readers[2 if through_other else 1 :])
        admin = client_repo.admin_credential_for(client_url)
        params = {
            "model": "swamp/echo",
            "method": "echo",
            "args": {},
            "placement": {"labels": {"role": "bench"}},
        }

        @asynccontextmanager
        async def client():
            async with connect(client_url, server_token=admin) as channel:

                async def call() -> dict:
                    # as the CLI's client runs a method: no deadline on the call
                    result = await channel.call("model.method.run", params, timeout=None)
                    assert result["status"] == "succeeded", result
                    return result

                yield call

        async with trio.open_nursery() as drains:
            for reader in readers:
                drains.start_soon(reader.drain)
            yield client, [p.pid for p in procs], 2 if through_other else 1
            drains.cancel_scope.cancel()
    finally:
        await stop_all(procs)
        logs.close()


@asynccontextmanager
async def floor_system(root: Path, workers: int, slots: int, env: dict, *, serve="serve"):
    procs: list = []
    argv = [sys.executable, str(HERE / "floor.py")]
    try:
        server = await trio.lowlevel.open_process(
            [*argv, serve, str(root / "floor.db")], stdout=subprocess.PIPE, env=env
        )
        procs.append(server)
        server_lines = LineReader(server.stdout)
        with trio.fail_after(30):
            url = (await server_lines.until(lambda e: "url" in e))["url"]
        readers = [server_lines]
        for _ in range(workers):
            worker = await trio.lowlevel.open_process(
                [*argv, "worker", url, str(slots)], stdout=subprocess.PIPE, env=env
            )
            procs.append(worker)
            readers.append(LineReader(worker.stdout))
        await wait_enrolled(readers[1:])
        async with trio.open_nursery() as drains:
            for reader in readers:
                drains.start_soon(reader.drain)
            yield (lambda: floor.client(url)), [p.pid for p in procs], 1
            drains.cancel_scope.cancel()
    finally:
        await stop_all(procs)


# -- the measurement, the same for both ---------------------------------------------------------


async def measure(
    client, pids: list[int], *, sequential: int, total: int, in_flight: int, servers: int = 1
) -> dict:
    """Sequential latency on one client, then throughput with ``in_flight`` clients, and the
    CPU each side spent per dispatch meanwhile (µs: the server — the first ``servers`` of
    ``pids`` together —, its workers together, the benchmark's own clients) — steadier than a
    rate on a shared machine."""

    async def many(count: int) -> int:
        """``count`` calls, ``in_flight`` at a time, each client its own connection."""
        done = 0

        async def one_client(calls: int) -> None:
            nonlocal done
            async with client() as call:
                for _ in range(calls):
                    await call()
                    done += 1

        async with trio.open_nursery() as nursery:
            for _ in range(in_flight):
                nursery.start_soon(one_client, count // in_flight)
        return done

    # warm up every worker (one by one, the least-loaded pick is always the same one), then
    # the one client measured one by one
    await many(in_flight * 8)
    async with client() as call:
        for _ in range(50):
            await call()
        latencies = []
        one_by_one = [cpu_seconds(pid) for pid in pids], time.process_time()
        for _ in range(sequential):
            started = time.perf_counter()
            await call()
            latencies.append((time.perf_counter() - started) * 1000)
        one_by_one = (
            [cpu_seconds(pid) - cpu for pid, cpu in zip(pids, one_by_one[0], strict=True)],
            time.process_time() - one_by_one[1],
        )
    before = [cpu_seconds(pid) for pid in pids], time.process_time()
    started = time.perf_counter()
    done = await many(total)
    elapsed = time.perf_counter() - started
    after = [cpu_seconds(pid) for pid in pids], time.process_time()
    spent = [b - a for a, b in zip(before[0], after[0], strict=True)]

    def per_dispatch(seconds: float) -> float:
        return round(seconds / max(done, 1) * 1e6, 1)

    return {
        "p50_ms": round(percentile(latencies, 50), 3),
        "p99_ms": round(percentile(latencies, 99), 3),
        # CPU per sequential dispatch, all processes together: how much of the latency is work
        "sequential_cpu_us": round((sum(one_by_one[0]) + one_by_one[1]) / sequential * 1e6, 1),
        # ... and per process: where the latency of one dispatch goes
        "sequential_server_cpu_us": round(sum(one_by_one[0][:servers]) / sequential * 1e6, 1),
        "sequential_workers_cpu_us": round(sum(one_by_one[0][servers:]) / sequential * 1e6, 1),
        "sequential_client_cpu_us": round(one_by_one[1] / sequential * 1e6, 1),
        "per_second": round(done / elapsed, 1),
        "server_cpu_us": per_dispatch(sum(spent[:servers])),
        "workers_cpu_us": per_dispatch(sum(spent[servers:])),
        "client_cpu_us": per_dispatch(after[1] - before[1]),
        "total_cpu_us": per_dispatch(sum(spent) + after[1] - before[1]),
    }


async def run_once(system, workers: int, slots: int, args) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWAMP_")}
    with scratch("swamp-bench-") as root:
        async with system(root, workers, slots, env) as (client, pids, servers):
            return await measure(
                client,
                pids,
                sequential=args.sequential,
                total=args.total,
                in_flight=workers * slots,
                servers=servers,
            )


def median_of(runs: list[dict]) -> dict:
    return {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}


async def main(args) -> dict:
    shapes = [tuple(int(n) for n in s.split("x")) for s in args.shapes.split(",")]
    systems = {"swamp": swamp_system} if args.swamp_only else {"floor": floor_system}
    if args.floors:  # the same floor behind Hypercorn: what the HTTP server costs the hop
        systems["floor_hypercorn"] = functools.partial(floor_system, serve="serve-hypercorn")
    systems.setdefault("swamp", swamp_system)
    if args.postgres is not None:  # the same, its records in PostgreSQL (serve --database)
        systems["swamp_postgres"] = functools.partial(swamp_system, database=args.postgres)
        # …and through a second orchestrator that holds no worker (the shared queue)
        systems["swamp_postgres_other"] = functools.partial(
            swamp_system, database=args.postgres, through_other=True
        )
    runs: dict = {f"{w}x{s}": {name: [] for name in systems} for w, s in shapes}
    for round_no in range(args.rounds):
        order = list(systems) if round_no % 2 == 0 else list(reversed(systems))
        for workers, slots in shapes:
            for name in order:
                figures = await run_once(systems[name], workers, slots, args)
                runs[f"{workers}x{slots}"][name].append(figures)
                print(
                    f"round {round_no + 1} {workers}x{slots} {name}: {json.dumps(figures)}",
                    file=sys.stderr,
                    flush=True,
                )
    result: dict = {"rounds": args.rounds, "sequential": args.sequential, "total": args.total}
    for shape, by_system in runs.items():
        medians = {name: median_of(r) for name, r in by_system.items()}
        entry = {"median": medians, "runs": by_system}
        if "swamp_postgres" in medians:  # PostgreSQL beside SQLite, in the same rounds
            pg, lite = medians["swamp_postgres"], medians["swamp"]
            entry["postgres_to_sqlite"] = {
                "throughput": round(pg["per_second"] / lite["per_second"], 2),
                "p50_ms_more": round(pg["p50_ms"] - lite["p50_ms"], 3),
                "server_cpu": round(pg["server_cpu_us"] / lite["server_cpu_us"], 2),
            }
            other = medians["swamp_postgres_other"]
            entry["through_other"] = {  # against the holder itself, in the same rounds
                "throughput": round(other["per_second"] / pg["per_second"], 2),
                "p50_ms_more": round(other["p50_ms"] - pg["p50_ms"], 3),
                "servers_cpu": round(other["server_cpu_us"] / pg["server_cpu_us"], 2),
            }
        if "floor" in medians:
            base = medians["floor"]
            for name in ("swamp", "floor_hypercorn"):
                if name not in medians:
                    continue
                key = "ratio_to_floor" if name == "swamp" else f"{name}_ratio_to_floor"
                entry[key] = {
                    "p50": round(medians[name]["p50_ms"] / base["p50_ms"], 2),
                    "p99": round(medians[name]["p99_ms"] / base["p99_ms"], 2),
                    "throughput": round(medians[name]["per_second"] / base["per_second"], 2),
                    "server_cpu": round(medians[name]["server_cpu_us"] / base["server_cpu_us"], 2),
                    "total_cpu": round(medians[name]["total_cpu_us"] / base["total_cpu_us"], 2),
                    "sequential_server_cpu": round(
                        medians[name]["sequential_server_cpu_us"]
                        / base["sequential_server_cpu_us"],
                        2,
                    ),
                }
        result[shape] = entry
    return result


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sequential", type=int, default=400)
    parser.add_argument("--total", type=int, default=2000)
    parser.add_argument("--shapes", default="1x32,8x4", help="WORKERSxSLOTS, comma-separated")
    parser.add_argument("--swamp-only", action="store_true", help="no floor, no ratios")
    parser.add_argument(
        "--floors", action="store_true", help="also the floor behind Hypercorn (swamp's server)"
    )
    parser.add_argument(
        "--postgres",
        action="store_true",
        help="also swamp with its records in PostgreSQL (serve --database; a throwaway "
        "server as the tests start theirs, a fresh database a run)",
    )
    parsed = parser.parse_args()
    with contextlib.ExitStack() as stack:
        if parsed.postgres:
            sys.path.insert(0, str(HERE.parent))
            from tests import postgres

            parsed.postgres = stack.enter_context(postgres.cluster()).new_database
        else:
            parsed.postgres = None
        print(json.dumps(trio.run(main, parsed), indent=2))
