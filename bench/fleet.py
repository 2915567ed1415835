#!/usr/bin/env python3
"""Fleet benchmark: many idle workers on one orchestrator.

A real ``swamp serve``; one fleet token; then ``--workers`` lightweight workers spoken at the
protocol level by this one process (one websocket each: enroll, then the heartbeat the
orchestrator asks for — at enrollment, and longer later as the pool grows — nothing else),
``--parallel`` enrolling at a time. Measures:

- enrollments per second over the first and the last thousand (their ratio: flat or not);
- the store's size (database + WAL) every thousand members (linear or not);
- with all of them enrolled and idle: the orchestrator's CPU over ``--idle-seconds`` (share of
  one core) and its resident memory per worker: the RSS growth from the first thousand (idle,
  after ``--settle`` seconds) to all of them, per worker added — what one more worker costs.
  The growth from the empty orchestrator is reported too; it also holds what the first
  connections load once (code, caches, buffers), which no single worker costs.
- then, with ``--requirements`` steps waiting (one per requirement, that no worker matches:
  placed by an admin client): ``GET /metrics`` ``--scrapes`` times over HTTP, one at a time —
  the wall time of a scrape, and the orchestrator's CPU per scrape (its idle rate taken off).

With ``--orchestrators N`` (N > 1): N orchestrators on one PostgreSQL (a throwaway server, as
the tests start theirs), the workers spread over them (worker ``i`` on orchestrator ``i % N``,
all on one fleet token); the enrollment rates, and each orchestrator's idle CPU and memory
per worker (no store sizes, no scrapes: the records are the database's).

Prints one JSON object.

    python3 build.py bench-fleet [--workers 10000] [--parallel 32] [--idle-seconds 30]
        [--requirements 100] [--scrapes 20] [--orchestrators 2]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
from pathlib import Path

import httpx
import trio
from benchkit import cpu_seconds, enroll_params, percentile, rss_kib, scratch
from trio_websocket import ConnectionClosed, open_websocket_url

from swamp import client
from swamp.bookkeeping.tokens import TokenBook
from swamp.processes import start_serve, stop_all
from swamp.repo import Repo
from swamp.store.records import SqliteRecords

ROOT = Path(__file__).resolve().parent.parent  # the checkout: tests.postgres starts a server


def store_bytes(repo: Path) -> dict:
    """The database file and its WAL (the WAL's size follows checkpoint timing, not growth)."""
    files = {p.name: p.stat().st_size for p in (repo / ".swamp").glob("swamp.db*")}
    return {"db": files.get("swamp.db", 0), "wal": files.get("swamp.db-wal", 0)}


class Member:
    """One lightweight worker: its socket, and the heartbeat the orchestrator asked for."""

    prefix = "fleet-bench"  # its machine id: PREFIX-INDEX

    def __init__(self, url: str, token: str, index: int) -> None:
        self.url = url
        self.token = token
        self.index = index
        self.enrolled = trio.Event()
        self.heartbeat = 5.0
        self.error: str | None = None

    def labels(self) -> dict[str, str]:
        return {}

    async def run(self, stop: trio.Event) -> None:
        enroll = enroll_params(self.token, f"{self.prefix}-{self.index}", self.labels())
        try:
            async with open_websocket_url(self.url, message_queue_size=4) as ws:
                frame = {"type": "request", "id": "1", "method": "worker.enroll"}
                await ws.send_message(json.dumps({**frame, "params": enroll}))
                reply = json.loads(await ws.get_message())
                if reply.get("type") != "response":
                    self.error = json.dumps(reply)[:300]
                    self.enrolled.set()
                    return
                self.heartbeat = float(reply["result"].get("heartbeatSeconds") or 5.0)
                self.enrolled.set()
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(self._discard, ws)
                    nursery.start_soon(self._beat, ws)
                    await stop.wait()
                    nursery.cancel_scope.cancel()
        except (ConnectionClosed, OSError) as exc:
            self.error = self.error or f"{type(exc).__name__}: {exc}"
            self.enrolled.set()

    async def _discard(self, ws) -> None:
        """Read what comes; a pong may carry a longer interval (the pool grew): take it, as a
        real worker does."""
        while True:
            message = await ws.get_message()
            if '"heartbeat"' in message:
                self.heartbeat = max(self.heartbeat, float(json.loads(message)["heartbeat"]))

    async def _beat(self, ws) -> None:
        await trio.sleep(self.heartbeat * (self.index % 97) / 97)  # spread over the interval
        while True:
            await ws.send_message('{"type":"ping"}')
            await trio.sleep(self.heartbeat)


async def main(args) -> dict:
    with scratch("swamp-fleet-") as root:
        if args.orchestrators > 1:
            return await _fleet_shared(root, args)
        return await _fleet(root, args)


async def _fleet_shared(root: Path, args) -> dict:
    """Idle workers spread over several orchestrators on one PostgreSQL."""
    sys.path.insert(0, str(ROOT))
    from swamp.store.pg_store import PgStore
    from tests import postgres

    with postgres.cluster() as cluster:
        database = cluster.new_database()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWAMP_")}
        env["SWAMP_DATABASE_URL"] = database
        procs: list = []
        try:
            async with trio.open_nursery() as nursery:
                urls = []
                for n in range(args.orchestrators):
                    repo, _ = Repo.init(root / f"repo-{n}")
                    log = await trio.Path(root / f"serve-{n}.log").open("wb")
                    serve, lines, url = await start_serve(repo.root, env=env, stderr=log.wrapped)
                    procs.append(serve)
                    urls.append(url)
                    nursery.start_soon(lines.drain)
                db = await PgStore.open(database, size=1)
                _, token = await TokenBook(db).mint(
                    "fleet", duration_seconds=3600, max_enrollments=args.workers
                )
                await db.aclose()
                result = await measure_shared(procs, urls, token, args, nursery)
                nursery.cancel_scope.cancel()
            return result
        finally:
            await stop_all(procs)


async def enroll_all(
    members: list[Member],
    stop: trio.Event,
    parallel: int,
    done_at: list[float],
    started: float,
    nursery,
    every_thousand=lambda: {},
) -> list[dict]:
    """Enroll ``members``, ``parallel`` at a time (each then idles in ``nursery`` until
    ``stop``); the time each enrolled goes in ``done_at``; ``every_thousand`` says what to
    note at each thousand (it is printed)."""
    limiter = trio.CapacityLimiter(parallel)
    noted: list[dict] = []

    async def enroll(member: Member) -> None:
        async with limiter:
            nursery.start_soon(member.run, stop)
            await member.enrolled.wait()
        if member.error:
            raise RuntimeError(f"worker {member.index} did not enroll: {member.error}")
        done_at.append(time.perf_counter())
        if len(done_at) % 1000 == 0:
            noted.append(every_thousand())
            print(
                f"{len(done_at)} enrolled, {time.perf_counter() - started:.1f}s",
                file=sys.stderr,
                flush=True,
            )

    async with trio.open_nursery() as enrolling:
        for member in members:
            enrolling.start_soon(enroll, member)
    return noted


async def measure_shared(serves: list, urls: list[str], token: str, args, nursery) -> dict:
    stop = trio.Event()
    members = [Member(urls[i % len(urls)], token, i) for i in range(args.workers)]
    rss_empty = [rss_kib(serve.pid) for serve in serves]
    done_at: list[float] = []
    started = time.perf_counter()
    await enroll_all(members, stop, args.parallel, done_at, started, nursery)
    enroll_seconds = time.perf_counter() - started
    cpu_enrolled = [cpu_seconds(serve.pid) for serve in serves]

    def rate(window: list[float]) -> float:
        return round((len(window) - 1) / (window[-1] - window[0]), 1)

    await trio.sleep(args.settle)
    before = [cpu_seconds(serve.pid) for serve in serves]
    wall_before = time.perf_counter()
    await trio.sleep(args.idle_seconds)
    wall = time.perf_counter() - wall_before
    idle = [(cpu_seconds(s.pid) - b) / wall for s, b in zip(serves, before, strict=True)]
    rss_full = [rss_kib(serve.pid) for serve in serves]
    stop.set()
    each = args.workers / len(serves)
    first, last = rate(done_at[:1000]), rate(done_at[-1000:])
    return {
        "workers": args.workers,
        "orchestrators": len(serves),
        "enroll_seconds": round(enroll_seconds, 1),
        "enrollments_per_second": {
            "first_thousand": first,
            "last_thousand": last,
            "last_over_first": round(last / first, 2),
        },
        "orchestrator_cpu_ms_per_enrollment": [round(1000 * c / each, 2) for c in cpu_enrolled],
        "idle_cpu_share_of_a_core": [round(c, 3) for c in idle],
        "rss_kib": {"empty": rss_empty, "full": rss_full},
        "kib_per_worker_from_empty": [
            round((full - empty) / each, 1) for full, empty in zip(rss_full, rss_empty, strict=True)
        ],
    }


async def _fleet(root: Path, args) -> dict:
    repo, _ = Repo.init(root / "repo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWAMP_")}
    procs = []
    try:
        async with await trio.Path(root / "serve.log").open("wb") as log:
            serve, lines, url = await start_serve(repo.root, env=env, stderr=log.wrapped)
            procs.append(serve)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lines.drain)
                result = await measure(serve, repo, url, args, nursery)
                nursery.cancel_scope.cancel()
        return result
    finally:
        await stop_all(procs)


async def measure(serve, repo: Repo, url: str, args, nursery) -> dict:
    store = repo.open_store()
    _, token = await TokenBook(SqliteRecords(store)).mint(
        "fleet", duration_seconds=3600, max_enrollments=args.workers
    )
    store.close()
    await trio.sleep(1)
    rss_empty = rss_kib(serve.pid)
    stop = trio.Event()
    members = [Member(url, token, i) for i in range(args.workers)]
    done_at: list[float] = []
    started = time.perf_counter()

    def size() -> dict:
        return {
            "members": len(done_at),
            "orchestrator_cpu_s": round(cpu_seconds(serve.pid), 2),
            "bench_cpu_s": round(cpu_seconds(os.getpid()), 2),
            **store_bytes(repo.root),
        }

    baseline = min(1000, args.workers // 2)
    sizes = await enroll_all(
        members[:baseline], stop, args.parallel, done_at, started, nursery, size
    )
    paused = time.perf_counter()
    await trio.sleep(args.settle)  # the first thousand idle: memory's baseline
    rss_baseline = rss_kib(serve.pid)
    pause = time.perf_counter() - paused
    sizes += await enroll_all(
        members[baseline:], stop, args.parallel, done_at, started, nursery, size
    )
    enroll_seconds = time.perf_counter() - started - pause

    def rate(window: list[float]) -> float:
        return round((len(window) - 1) / (window[-1] - window[0]), 1)

    first = rate(done_at[:1000])
    last = rate(done_at[-1000:])
    cpu_enrolled = cpu_seconds(serve.pid)
    await trio.sleep(args.settle)
    cpu_before, wall_before = cpu_seconds(serve.pid), time.perf_counter()
    await trio.sleep(args.idle_seconds)
    idle_cpu = (cpu_seconds(serve.pid) - cpu_before) / (time.perf_counter() - wall_before)
    rss_full = rss_kib(serve.pid)
    scrape = await measure_scrape(serve, repo, url, args, idle_cpu)
    stop.set()
    beats = sorted(m.heartbeat for m in members)
    return {
        "workers": args.workers,
        "heartbeat_seconds": {"first": beats[0], "last": beats[-1]},
        "orchestrator_cpu_ms_per_enrollment": round(1000 * cpu_enrolled / args.workers, 2),
        "enroll_seconds": round(enroll_seconds, 1),
        "enrollments_per_second": {
            "first_thousand": first,
            "last_thousand": last,
            "last_over_first": round(last / first, 2),
        },
        "idle_cpu_share_of_a_core": round(idle_cpu, 3),
        "rss_kib": {"empty": rss_empty, f"at_{baseline}": rss_baseline, "full": rss_full},
        "kib_per_worker": round((rss_full - rss_baseline) / (args.workers - baseline), 1),
        "kib_per_worker_from_empty": round((rss_full - rss_empty) / args.workers, 1),
        "store": sizes,
        "metrics_scrape": scrape,
    }


async def measure_scrape(serve, repo: Repo, url: str, args, idle_cpu: float) -> dict:
    """``GET /metrics`` with ``args.requirements`` requirements waiting, one scrape at a time."""
    credential = repo.admin_credential_for(url)
    assert credential is not None
    endpoint = url.replace("ws://", "http://") + "/metrics"
    headers = {"Authorization": f"Bearer {credential}"}

    async def place(numbers: range) -> None:
        async with client.connect(url, server_token=credential) as admin, trio.open_nursery() as n:
            await admin.call("server.info")  # trusted first: then more than one call in flight
            for i in numbers:  # no worker has the label: each waits, for as long as it takes
                params = {
                    "model": "command/shell",
                    "method": "run",
                    "args": {"command": "true"},
                    "placement": {"labels": {"bench-requirement": f"r{i}"}},
                    "queueTimeout": "0",
                }
                n.start_soon(lambda p=params: admin.call("model.method.run", p, timeout=None))

    async with trio.open_nursery() as nursery, httpx.AsyncClient(timeout=60) as http:
        for first in range(0, args.requirements, 50):  # within a socket's in-flight limit
            nursery.start_soon(place, range(first, min(first + 50, args.requirements)))
        while True:  # until every one waits (the scrapes below are what is measured)
            text = (await http.get(endpoint, headers=headers)).text
            if (
                text.count('swamp_queue_waiting{requirement="bench-requirement=')
                >= args.requirements
            ):
                break
            await trio.sleep(0.2)
        times = []
        size = 0
        cpu_before, wall_before = cpu_seconds(serve.pid), time.perf_counter()
        for _ in range(args.scrapes):
            started = time.perf_counter()
            answer = await http.get(endpoint, headers=headers)
            times.append(time.perf_counter() - started)
            size = len(answer.content)
        wall = time.perf_counter() - wall_before
        cpu = cpu_seconds(serve.pid) - cpu_before - idle_cpu * wall
        nursery.cancel_scope.cancel()
    return {
        "requirements_waiting": args.requirements,
        "scrapes": args.scrapes,
        "wall_ms_p50": round(percentile(times, 50) * 1000, 1),
        "wall_ms_max": round(max(times) * 1000, 1),
        "orchestrator_cpu_ms_per_scrape": round(1000 * max(0.0, cpu) / args.scrapes, 1),
        "exposition_kib": round(size / 1024, 1),
    }


if __name__ == "__main__":
    # this one process holds every fake worker: its own collector must not be what slows the
    # last thousand down (the orchestrator's is what is measured)
    gc.disable()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=10_000)
    parser.add_argument("--parallel", type=int, default=32)
    parser.add_argument("--idle-seconds", type=float, default=30)
    parser.add_argument("--settle", type=float, default=5)
    parser.add_argument("--requirements", type=int, default=100)
    parser.add_argument("--scrapes", type=int, default=20)
    parser.add_argument(
        "--orchestrators",
        type=int,
        default=1,
        help="more than one: that many on one PostgreSQL (a throwaway server), workers spread",
    )
    print(json.dumps(trio.run(main, parser.parse_args()), indent=2))
