#!/usr/bin/env python3
"""What a hostile peer costs the orchestrator: the two measurements of issue 23.

1. **Flood before trust.** Waves of sockets that never enroll nor authenticate, each sending
   one text message of 4 MB minus a byte; the orchestrator's resident memory before, at its
   peak, and 5 s after the last wave. Goal: peak ≤ 150 MB above the baseline, back within
   40 MB after 5 s.
2. **Queries over a large instance.** A worker-token holder's dispatch keeps queries in flight
   over its own model, which holds ``--data-mb`` of content and ``--records`` records, while
   an admin client calls ``worker.list`` every 20 ms and an innocent worker idles. Goal: admin
   p99 ≤ 100 ms, no worker dropped.

A real ``swamp serve`` and real ``swamp worker connect`` processes; the hostile sockets are
spoken by hand (wsproto). Prints one JSON object.

    python3 build.py bench-hostile [--waves 4] [--sockets 128] [--data-mb 600]
"""

from __future__ import annotations

import argparse
import json
import os
import sqlite3
import sys
import time
from pathlib import Path
from urllib.parse import urlsplit

import trio
from benchkit import percentile, rss_kib, scratch
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Message, Request

from swamp import client
from swamp.bookkeeping.tokens import TokenBook
from swamp.processes import start_serve, start_worker, stop_all, wait_enrolled
from swamp.repo import Repo
from swamp.store.records import SqliteRecords

ROOT = Path(__file__).resolve().parents[1]
MESSAGE = 4 * 1024 * 1024 - 1


def environment() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWAMP_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT / "tests" / "plugins"), str(ROOT)])
    env["SWAMP_PLUGINS"] = "swamp_testkit"  # test/steps flood: queries in a loop
    return env


async def flood_socket(url: str) -> str:
    """One untrusted socket sending one 4 MB message; how it ended."""
    parts = urlsplit(url)
    try:
        stream = await trio.open_tcp_stream(parts.hostname, parts.port)
    except OSError as exc:
        return f"refused: {exc}"
    ws = WSConnection(ConnectionType.CLIENT)
    try:
        await stream.send_all(ws.send(Request(host=parts.netloc, target="/")))
        while True:
            data = await stream.receive_some(65536)
            if not data:
                return "closed before the upgrade"
            ws.receive_data(data)
            if any(isinstance(e, AcceptConnection) for e in ws.events()):
                break
        frame = ws.send(Message(data="x" * MESSAGE))
        try:
            for at in range(0, len(frame), 65536):
                await stream.send_all(frame[at : at + 65536])
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        while True:
            try:
                data = await stream.receive_some(65536)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                return "reset"
            if not data:
                return "closed"
            ws.receive_data(data)
            for event in ws.events():
                if isinstance(event, CloseConnection):
                    return f"close {event.code}"
    finally:
        await stream.aclose()


async def measure_flood(repo: Path, env: dict, waves: int, sockets: int) -> dict:
    serve, reader, url = await start_serve(repo, env=env)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader.drain)
            await trio.sleep(1)
            before = rss_kib(serve.pid)
            peak = before
            done = trio.Event()

            async def watch() -> None:
                nonlocal peak
                while not done.is_set():
                    peak = max(peak, rss_kib(serve.pid))
                    with trio.move_on_after(0.02):
                        await done.wait()

            outcomes: dict[str, int] = {}

            async def one() -> None:
                ended = await flood_socket(url)
                outcomes[ended] = outcomes.get(ended, 0) + 1

            nursery.start_soon(watch)
            started = time.monotonic()
            for _ in range(waves):
                async with trio.open_nursery() as wave:
                    for _ in range(sockets):
                        wave.start_soon(one)
            flooded = time.monotonic() - started
            done.set()
            await trio.sleep(5)
            after = rss_kib(serve.pid)
            nursery.cancel_scope.cancel()
    finally:
        await stop_all([serve])
    return {
        "waves": waves,
        "sockets_per_wave": sockets,
        "message_bytes": MESSAGE,
        "seconds": round(flooded, 2),
        "outcomes": outcomes,
        "rss_before_mib": round(before / 1024, 1),
        "rss_peak_mib": round(peak / 1024, 1),
        "rss_after_5s_mib": round(after / 1024, 1),
        "peak_above_baseline_mib": round((peak - before) / 1024, 1),
        "after_above_baseline_mib": round((after - before) / 1024, 1),
    }


def seed(repo: Path, data_mb: int, records: int) -> None:
    """The hostile model's data, straight into the file: ``data_mb`` of 1 MiB blobs and
    ``records`` small records (what queries scan), as a dispatch could have written them."""
    db = sqlite3.connect(Repo(repo).db_path)
    blob = os.urandom(1024 * 1024)
    columns = (
        "model_type, model_name, name, version, spec, attributes, created_at, created_epoch, "
        "expires_epoch, size, content"
    )
    with db:
        db.executemany(
            f"INSERT INTO data ({columns}) VALUES ('test/steps', 'hoard', ?, 1, 'progress', "
            "'{}', '2026-12-01T00:00:00.000Z', 0, NULL, ?, ?)",
            ((f"blob-{i:05d}", len(blob), blob) for i in range(data_mb)),
        )
        db.executemany(
            f"INSERT INTO data ({columns}) VALUES ('test/steps', 'hoard', ?, 1, 'progress', ?, "
            "'2026-12-01T00:00:00.000Z', 0, NULL, 0, NULL)",
            ((f"item-{i:06d}", json.dumps({"i": i})) for i in range(records)),
        )
    db.close()


async def measure_queries(
    repo: Path, env: dict, data_mb: int, records: int, queries: int, parallel: int
) -> dict:
    (repo / "models" / "hoard.toml").write_text('type = "test/steps"\n')
    seed(repo, data_mb, records)
    serve, reader, url = await start_serve(repo, env=env)
    processes = [serve]
    try:
        tokens = {}
        store = Repo(repo).open_store()
        try:
            for name in ("hostile", "innocent"):
                _, tokens[name] = await TokenBook(SqliteRecords(store)).mint(
                    name, duration_seconds=3600
                )
        finally:
            store.close()
        readers = []
        for name in ("hostile", "innocent"):
            process, worker_reader = await start_worker(
                url, tokens[name], "--label", f"role={name}", env=env
            )
            processes.append(process)
            readers.append(worker_reader)
        await wait_enrolled(readers)
        credential = Repo(repo).admin_credential_for(url)
        latencies: list[float] = []
        report: dict = {}
        async with trio.open_nursery() as nursery:
            nursery.start_soon(reader.drain)
            for worker_reader in readers:
                nursery.start_soon(worker_reader.drain)
            async with client.connect(url, server_token=credential) as admin:
                flooding = trio.Event()

                async def flood() -> None:
                    params = {
                        "model": "hoard",
                        "method": "flood",
                        "args": {
                            "predicate": "attributes.i < 0",
                            "queries": queries,
                            "parallel": parallel,
                        },
                        "placement": {"labels": {"role": "hostile"}},
                    }
                    async with client.connect(url, server_token=credential) as runner:
                        started = time.monotonic()
                        reply = await runner.call("model.method.run", params, timeout=None)
                        report.update(reply.get("result") or {}, seconds=time.monotonic() - started)
                    flooding.set()

                nursery.start_soon(flood)
                while not flooding.is_set():
                    started = time.monotonic()
                    await admin.call("worker.list")
                    latencies.append(time.monotonic() - started)
                    with trio.move_on_after(0.02):
                        await flooding.wait()
                listed = await admin.call("worker.list")
            nursery.cancel_scope.cancel()
    finally:
        await stop_all(processes)
    statuses = {w["name"]: w["status"] for w in listed["workers"]}
    return {
        "data_mb": data_mb,
        "records": records,
        "flood": {
            "queries": queries,
            "parallel": parallel,
            "outcomes": report.get("outcomes"),
            "longest_query_s": round(report.get("longest", 0), 2),
            "seconds": round(report.get("seconds", 0), 1),
        },
        "admin_calls": len(latencies),
        "admin_p50_ms": round(percentile(latencies, 50) * 1000, 1),
        "admin_p99_ms": round(percentile(latencies, 99) * 1000, 1),
        "admin_max_ms": round(max(latencies) * 1000, 1),
        "workers_after": statuses,
        "dropped": sorted(n for n, s in statuses.items() if s == "disconnected"),
    }


async def main(args: argparse.Namespace) -> dict:
    env = environment()
    out = {}
    with scratch("swamp-bench-hostile-") as tmp:
        repo = tmp / "flood"
        Repo.init(repo)
        out["flood_before_trust"] = await measure_flood(repo, env, args.waves, args.sockets)
        repo = tmp / "queries"
        Repo.init(repo)
        out["queries_over_large_instance"] = await measure_queries(
            repo, env, args.data_mb, args.records, args.queries, args.parallel
        )
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--waves", type=int, default=4)
    parser.add_argument("--sockets", type=int, default=128)
    parser.add_argument("--data-mb", type=int, default=600)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--queries", type=int, default=40)
    parser.add_argument("--parallel", type=int, default=8)
    result = trio.run(main, parser.parse_args())
    json.dump(result, sys.stdout, indent=2)
    print()
