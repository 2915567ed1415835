#!/usr/bin/env python3
"""Workflow fan-outs over a fleet, beside the raw dispatch rate on the same workers.

A real ``swamp serve`` and real ``swamp worker connect`` processes (4 × 32 slots by default).
After a warm-up, each round the same workers take ``--raw`` direct dispatches of
``swamp/echo`` (every slot kept busy, as ``bench/dispatch.py`` measures throughput), then one
workflow run per size — a ``forEach`` of ``swamp/echo`` over 2,500 and 10,000 items — through
``workflow.run``, reading its events as the CLI does; the next round takes the sizes in the
other order. Meanwhile a process of its own asks ``server.info`` every 50 ms (its longest
answer during a run is the orchestrator's longest stall, give or take a round of its loop),
and serve's memory and the store's size are sampled. Prints one JSON object: per size the
medians — steps/s, the ratio to the raw rate, serve's and the workers' CPU a step, serve's
memory half-way through (half the items made and waiting their turn) — the largest size's
time over the smallest's (linear: at most 4.5 for 10,000/2,500), and the growth of the
database and its WAL over a round.

    python3 build.py bench-workflows [--sizes 2500,10000] [--workers 4] [--slots 32]
        [--raw 10000] [--rounds 2]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import trio
from benchkit import cpu_seconds, rss_kib, scratch

from swamp.bookkeeping.tokens import TokenBook
from swamp.client import connect
from swamp.domain.run_record import merge_page
from swamp.processes import (
    LineReader,
    start_serve,
    start_worker,
    stop_all,
    wait_enrolled_text,
)
from swamp.repo import Repo
from swamp.store.records import SqliteRecords

FAN = """\
    name = "fan"
    [inputs.properties.items]
    type = "array"
    [[jobs]]
    name = "fan"
    [[jobs.steps]]
    name = "echo"
    forEach = { item = "i", in = "${{ inputs.items }}" }
    labels = { role = "bench" }
    task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }
"""
ECHO = {
    "model": "swamp/echo",
    "method": "echo",
    "args": {},
    "placement": {"labels": {"role": "bench"}},
}
TARGETS = {"steps_per_second": 500, "time_ratio": 4.5, "store_growth_mb": 100}


def store_bytes(db: Path) -> int:
    return sum(p.stat().st_size for p in (db, Path(f"{db}-wal")) if p.exists())


async def ping(url: str) -> None:
    """``--ping URL``: ask ``server.info`` every 50 ms; print each second's longest answer (a
    process of its own: the benchmark's own loop, busy with a run's events, would count its
    own stalls as serve's)."""
    async with connect(url, server_token=os.environ.get("SWAMP_BENCH_ADMIN")) as channel:
        while True:
            second, longest = int(time.time()), 0.0
            while int(time.time()) == second:
                started = time.perf_counter()
                await channel.call("server.info", {}, timeout=None)
                longest = max(longest, time.perf_counter() - started)
                await trio.sleep(0.05)
            print(json.dumps({"t": second, "ms": round(longest * 1000, 1)}), flush=True)


class Watch:
    """Serve's longest stall (from the pinging process), its peak resident memory and the
    store's peak size (the database and its WAL)."""

    def __init__(self, pid: int, db: Path, pings: LineReader) -> None:
        self.pid, self.db, self.pings = pid, db, pings
        self.stalls: list[tuple[int, float]] = []
        self.peak_kib = 0
        self.peak_store = 0

    def reset(self) -> None:
        self.peak_kib = rss_kib(self.pid)

    def longest(self, start: float, end: float) -> float:
        return max((ms for t, ms in self.stalls if start - 1 <= t <= end), default=0.0)

    async def run(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.read_pings)
            while True:
                self.peak_kib = max(self.peak_kib, rss_kib(self.pid))
                self.peak_store = max(self.peak_store, store_bytes(self.db))
                await trio.sleep(0.05)

    async def read_pings(self) -> None:
        while (line := await self.pings.readline()) is not None:
            with contextlib.suppress(ValueError, KeyError):
                entry = json.loads(line)
                self.stalls.append((entry["t"], entry["ms"]))


async def raw_rate(url: str, admin: str | None, total: int, in_flight: int) -> float:
    """Direct dispatches per second, ``in_flight`` clients (one connection each) at once."""
    done = 0

    async def one_client(calls: int) -> None:
        nonlocal done
        async with connect(url, server_token=admin) as channel:
            for _ in range(calls):
                result = await channel.call("model.method.run", ECHO, timeout=None)
                assert result["status"] == "succeeded", result
                done += 1

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for _ in range(in_flight):
            nursery.start_soon(one_client, total // in_flight)
    return done / (time.perf_counter() - started)


async def fan_out(url: str, admin: str | None, size: int, serve_pid: int) -> dict:
    """One workflow run of ``size`` expansions; its time, what it said, and serve's resident
    memory when half of them had ended (the other half made and waiting their turn)."""
    events = ended = half_kib = 0
    ends: list[float] = []  # when each step ended (as its event arrived)

    async def on_event(event: dict) -> None:
        nonlocal events, ended, half_kib
        events += 1
        if event.get("kind") == "step" and event.get("what") == "succeeded":
            ended += 1
            ends.append(time.perf_counter())
            if ended == size // 2:
                half_kib = rss_kib(serve_pid)

    async with connect(url, server_token=admin) as channel:
        started = time.perf_counter()
        reply = await channel.call(
            "workflow.run",
            {"name": "fan", "inputs": {"items": list(range(size))}},
            timeout=None,
            on_event=on_event,
        )
        elapsed = time.perf_counter() - started
        run, offset = reply["run"], reply.get("nextOffset")
        pages = 1
        while offset is not None:  # a run larger than one frame holds comes in pages
            more = await channel.call(
                "workflow.history.get", {"run": run["runId"], "offset": offset}, timeout=None
            )
            merge_page(run, more["run"])
            offset, pages = more.get("nextOffset"), pages + 1
    steps = [s for j in run["jobs"] for s in j["steps"]]
    ok = sum(1 for s in steps if s["status"] == "succeeded")
    assert run["status"] == "succeeded" and ok == size, (run["status"], ok, run.get("error"))
    return {
        "seconds": round(elapsed, 2),
        "steps_per_second": round(size / elapsed, 1),
        "events": events,
        "reply_pages": pages,
        "half_kib": half_kib,
        # steps/s over each tenth of the run: flat when a step costs the same throughout
        "tenths_per_second": [
            round(len(part) / max(part[-1] - part[0], 1e-6))
            for part in (ends[i : i + size // 10] for i in range(0, size, size // 10))
            if len(part) > 1
        ],
        "first_step_s": round(ends[0] - started, 2) if ends else None,
    }


async def main(args) -> dict:
    sizes = [int(n) for n in args.sizes.split(",")]
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWAMP_")}
    with scratch("swamp-bench-workflows-") as root:
        repo, _ = Repo.init(root / "repo")
        (repo.root / "workflows" / "fan.toml").write_text(textwrap.dedent(FAN))
        procs: list = []
        logs = contextlib.ExitStack()  # every process's stderr, kept in the temp dir

        def log_file(name: str):
            return logs.enter_context(open(root / name, "wb"))

        try:
            serve, serve_lines, url = await start_serve(
                repo.root, env=env, stderr=log_file("serve.log")
            )
            procs.append(serve)
            readers = [serve_lines]
            store = repo.open_store()
            for i in range(args.workers):
                _, credential = await TokenBook(SqliteRecords(store)).mint(
                    f"bench-{i}", duration_seconds=3600
                )
                worker, reader = await start_worker(
                    url,
                    credential,
                    *("--label", "role=bench", "--concurrency", str(args.slots)),
                    env=env,
                    stderr=log_file(f"worker-{i}.log"),
                    json=False,
                )
                procs.append(worker)
                readers.append(reader)
            store.close()
            await wait_enrolled_text(readers[1:])
            admin = repo.admin_credential_for(url)
            slots = args.workers * args.slots
            pids = [p.pid for p in procs]
            pinger = await trio.lowlevel.open_process(
                [sys.executable, __file__, "--ping", url],
                stdout=subprocess.PIPE,
                env=dict(env, SWAMP_BENCH_ADMIN=admin or ""),
            )
            procs.append(pinger)
            watch = Watch(serve.pid, repo.db_path, LineReader(pinger.stdout))

            def cpu() -> list[float]:
                return [cpu_seconds(pid) for pid in pids]

            def per_step(spent: list[float], count: int) -> dict:
                return {
                    "serve_cpu_us": round(spent[0] / count * 1e6, 1),
                    "workers_cpu_us": round(sum(spent[1:]) / count * 1e6, 1),
                }

            result: dict = {
                "workers": args.workers,
                "slots": args.slots,
                "sizes": sizes,
                "rounds": args.rounds,
            }
            raws: list[float] = []
            runs: dict[str, list[dict]] = {str(size): [] for size in sizes}
            growth: list[tuple[float, float]] = []  # per round: at its end, at its peak
            async with trio.open_nursery() as nursery:
                for reader in readers:
                    nursery.start_soon(reader.drain)
                await raw_rate(url, admin, slots * 8, slots)  # warm up every slot
                nursery.start_soon(watch.run)
                for round_no in range(args.rounds):
                    spent = cpu()
                    raw = await raw_rate(url, admin, args.raw, slots)
                    spent = [b - a for a, b in zip(spent, cpu(), strict=True)]
                    raws.append(raw)
                    result.setdefault("raw_per_dispatch", []).append(per_step(spent, args.raw))
                    print(f"round {round_no + 1} raw: {raw:.0f}/s", file=sys.stderr, flush=True)
                    before = watch.peak_store = store_bytes(repo.db_path)
                    # the sizes one way, then the other: a machine that slows down or speeds
                    # up meanwhile favours neither
                    for size in sizes if round_no % 2 == 0 else sizes[::-1]:
                        watch.reset()
                        base_kib = watch.peak_kib
                        spent = cpu()
                        began = time.time()
                        figures = await fan_out(url, admin, size, serve.pid)
                        spent = [b - a for a, b in zip(spent, cpu(), strict=True)]
                        figures.update(per_step(spent, size))
                        figures["ratio_to_raw"] = round(figures["steps_per_second"] / raw, 2)
                        figures["longest_stall_ms"] = watch.longest(began, time.time())
                        grown = max(0, watch.peak_kib - base_kib) * 1024
                        # the peak comes at the end, with the run's reply built (the tree as
                        # JSON); half-way, half the items are made and waiting their turn
                        figures["serve_peak_growth_mib"] = round(grown / 2**20, 1)
                        halfway = max(0, figures.pop("half_kib") - base_kib) * 1024
                        figures["serve_halfway_growth_mib"] = round(halfway / 2**20, 1)
                        figures["bytes_per_expansion_halfway"] = round(halfway / size)
                        runs[str(size)].append(figures)
                        print(f"  {size}: {json.dumps(figures)}", file=sys.stderr, flush=True)
                    growth.append(
                        (
                            (store_bytes(repo.db_path) - before) / 1e6,
                            (watch.peak_store - before) / 1e6,
                        )
                    )
                nursery.cancel_scope.cancel()
            raw = statistics.median(raws)
            result["raw_dispatches_per_second"] = round(raw, 1)
            medians = {
                size: {
                    k: statistics.median(r[k] for r in found)
                    for k, v in found[0].items()
                    if isinstance(v, (int, float))
                }
                for size, found in runs.items()
            }
            for figures in medians.values():
                figures["ratio_to_raw"] = round(figures["steps_per_second"] / raw, 2)
            result["median"] = medians
            result["runs"] = runs
            small, large = medians[str(min(sizes))], medians[str(max(sizes))]
            result["time_ratio"] = round(large["seconds"] / small["seconds"], 2)
            result["size_ratio"] = round(max(sizes) / min(sizes), 2)
            # the database and its WAL over one round (both sizes): at its end (checkpoints
            # shrink the WAL) and the most it grew meanwhile; the largest round's
            result["store_growth_mb"] = round(max(g[0] for g in growth), 1)
            result["store_peak_growth_mb"] = round(max(g[1] for g in growth), 1)
            slowest = min(m["steps_per_second"] for m in medians.values())
            result["targets"] = {
                "steps_per_second": [slowest, slowest >= TARGETS["steps_per_second"]],
                "time_ratio": [result["time_ratio"], result["time_ratio"] <= TARGETS["time_ratio"]],
                "store_growth_mb": [
                    result["store_peak_growth_mb"],
                    result["store_peak_growth_mb"] <= TARGETS["store_growth_mb"],
                ],
            }
            return result
        finally:
            await stop_all(procs)
            logs.close()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2500,10000", help="forEach sizes, comma-separated")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--slots", type=int, default=32)
    parser.add_argument("--raw", type=int, default=10_000, help="direct dispatches measured")
    parser.add_argument("--rounds", type=int, default=2, help="each size once a round")
    parser.add_argument("--ping", metavar="URL", help=argparse.SUPPRESS)
    arguments = parser.parse_args()
    if arguments.ping:
        with contextlib.suppress(KeyboardInterrupt):
            trio.run(ping, arguments.ping)
    else:
        print(json.dumps(trio.run(main, arguments), indent=2))
