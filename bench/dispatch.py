#!/usr/bin/env python3
"""Dispatch benchmark: a real orchestrator, real worker processes, a no-op method by placement.

Measures what a client sees for ``swamp/echo`` dispatched by label through ``swamp serve`` to
``swamp worker connect`` processes (lease and status writes included): sequential latency
(p50/p99) and throughput with many dispatches in flight. Prints one JSON object.

    python3 build.py bench [--workers 8] [--concurrency 4] [--sequential 500] [--total 4000]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

from swamp.bookkeeping.tokens import TokenBook
from swamp.client import connect
from swamp.processes import start_serve, start_worker, stop_all, wait_enrolled
from swamp.repo import Repo


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(p / 100 * (len(ordered) - 1))))]


async def main(args) -> dict:
    root = Path(tempfile.mkdtemp(prefix="swamp-bench-"))
    repo, _ = Repo.init(root / "repo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWAMP_")}
    procs: list = []
    logs = contextlib.ExitStack()  # every process's stderr, kept in the temp dir

    def log_file(name: str):
        return logs.enter_context(open(root / name, "wb"))

    try:
        serve, serve_lines, url = await start_serve(
            repo.root, env=env, stderr=log_file("serve.log")
        )
        procs.append(serve)
        store = repo.open_store()
        readers = []
        for i in range(args.workers):
            _, credential = TokenBook(store).mint(f"bench-{i}", duration_seconds=3600)
            worker, reader = await start_worker(
                url,
                credential,
                "--label",
                "role=bench",
                "--concurrency",
                str(args.concurrency),
                env=env,
                stderr=log_file(f"worker-{i}.log"),
            )
            procs.append(worker)
            readers.append(reader)
        store.close()
        await wait_enrolled(readers)
        async with trio.open_nursery() as drains:
            for reader in [serve_lines, *readers]:
                drains.start_soon(reader.drain)
            result = await measure(url, repo.admin_credential_for(url), args)
            drains.cancel_scope.cancel()
        return result
    finally:
        await stop_all(procs)
        logs.close()
        if not os.environ.get("SWAMP_BENCH_KEEP"):
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"kept {root} (logs of every process)", file=sys.stderr)


async def measure(url: str, admin: str | None, args) -> dict:
    """Sequential latency on one client, then throughput with every slot kept busy."""
    params = {
        "model": "swamp/echo",
        "method": "echo",
        "args": {},
        "placement": {"labels": {"role": "bench"}},
    }
    async with connect(url, server_token=admin) as channel:
        for _ in range(50):  # warm up
            await channel.call("model.method.run", params)
        latencies = []
        for _ in range(args.sequential):
            started = time.perf_counter()
            result = await channel.call("model.method.run", params)
            latencies.append((time.perf_counter() - started) * 1000)
            assert result["status"] == "succeeded", result

    in_flight = args.workers * args.concurrency
    done = 0

    async def client(count: int) -> None:
        nonlocal done
        async with connect(url, server_token=admin) as channel:
            for _ in range(count):
                result = await channel.call("model.method.run", params, timeout=60)
                assert result["status"] == "succeeded", result
                done += 1

    per_client = args.total // in_flight
    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(in_flight):
            nursery.start_soon(client, per_client)
    elapsed = time.perf_counter() - started
    return {
        "workers": args.workers,
        "concurrency": args.concurrency,
        "sequential": {
            "count": len(latencies),
            "p50_ms": round(percentile(latencies, 50), 3),
            "p99_ms": round(percentile(latencies, 99), 3),
            "mean_ms": round(statistics.mean(latencies), 3),
        },
        "throughput": {
            "in_flight": in_flight,
            "dispatches": done,
            "seconds": round(elapsed, 2),
            "dispatches_per_second": round(done / elapsed, 1),
        },
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--sequential", type=int, default=500)
    parser.add_argument("--total", type=int, default=4000)
    print(json.dumps(trio.run(main, parser.parse_args()), indent=2))
