#!/usr/bin/env python3
"""The fleet's web pages at fleet scale: ``--workers`` idle workers on one orchestrator, then
what the pages cost it.

A real ``swamp serve``; ``--workers`` lightweight workers enrolled on one fleet token by this
process (``bench/fleet.py``'s, labelled ``zone=a``/``zone=b``); a session from
``swamp ui --no-browser --json``. Measures:

- the fleet page (``GET /ui/``: a summary per fleet and one page of 100 workers): its server
  time — the orchestrator's CPU per page, and the answer's time on loopback — for the first
  page, the last, and a label filter, over ``--pages`` requests each; its size;
- one open page: what the orchestrator spends with one page open (its event stream, and the
  main part fetched again on each event, as the page's script does) beyond what it spends
  without it, while ``--churners`` more workers join and leave over and over (each a pool
  event: the page is told at most twice a second), over ``--seconds``; and on the idle fleet,
  where it must be nothing (no event, no timer).

Prints one JSON object.

    python3 build.py bench-ui [--workers 10000] [--pages 30] [--seconds 20]
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
from benchkit import cpu_seconds, percentile, scratch
from fleet import Member

from swamp.bookkeeping.tokens import TokenBook
from swamp.processes import start_serve, stop_all, swamp_argv
from swamp.repo import Repo


class Labelled(Member):
    """A bench worker with a zone label (the filter has something to select): enrolls,
    beats and reads as ``bench/fleet.py``'s does."""

    prefix = "ui-bench"

    def labels(self) -> dict[str, str]:
        return {"zone": "a" if self.index % 2 else "b"}


async def main(args) -> dict:
    with scratch("swamp-ui-") as root:
        return await _run(root, args)


async def _run(root: Path, args) -> dict:
    repo, _ = Repo.init(root / "repo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWAMP_")}
    procs = []
    try:
        async with await trio.Path(root / "serve.log").open("wb") as log:
            serve, lines, url = await start_serve(repo.root, env=env, stderr=log.wrapped)
            procs.append(serve)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lines.drain)
                result = await measure(serve, repo, url, env, args, nursery)
                nursery.cancel_scope.cancel()
        return result
    finally:
        await stop_all(procs)


async def enroll_all(members: list[Member], stop: trio.Event, nursery, parallel: int) -> None:
    limiter = trio.CapacityLimiter(parallel)

    async def one(member: Member) -> None:
        async with limiter:
            nursery.start_soon(member.run, stop)
            await member.enrolled.wait()
        if member.error:
            raise RuntimeError(f"worker {member.index} did not enroll: {member.error}")

    async with trio.open_nursery() as enrolling:
        for member in members:
            enrolling.start_soon(one, member)


async def login(repo: Path, env: dict) -> tuple[str, str]:
    """(the pages' base URL, a session cookie) from ``swamp ui``'s link."""
    done = await trio.run_process(
        swamp_argv("ui", "--no-browser", "--json", "--repo-dir", str(repo)),
        capture_stdout=True,
        env=env,
    )
    link = json.loads(done.stdout)["url"]
    base = link.split("/ui/", 1)[0]
    async with httpx.AsyncClient() as http:
        opened = await http.get(link, follow_redirects=False)
    return base, opened.cookies["swamp_ui"]


async def page_times(serve, http: httpx.AsyncClient, path: str, count: int) -> dict:
    walls, size = [], 0
    cpu_before = cpu_seconds(serve.pid)
    for _ in range(count):
        started = time.perf_counter()
        response = await http.get(path)
        walls.append(time.perf_counter() - started)
        response.raise_for_status()
        size = len(response.content)
    cpu = (cpu_seconds(serve.pid) - cpu_before) / count
    return {
        "server_cpu_ms": round(cpu * 1000, 1),
        "answer_ms_p50": round(percentile(walls, 50) * 1000, 1),
        "answer_ms_max": round(max(walls) * 1000, 1),
        "bytes": size,
    }


async def churn(url: str, token: str, first: int, count: int, stop: trio.Event) -> None:
    """``count`` workers joining and leaving over and over until ``stop``."""

    async def one(index: int) -> None:
        while not stop.is_set():
            leave = trio.Event()
            member = Member(url, token, index)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(member.run, leave)
                await member.enrolled.wait()
                await trio.sleep(0.2)
                leave.set()

    async with trio.open_nursery() as nursery:
        for i in range(count):
            nursery.start_soon(one, first + i)


async def open_page(http: httpx.AsyncClient, seen: list[float], stop: trio.Event) -> None:
    """What one open fleet page does: its event stream, the main part again on each event."""
    async with http.stream("GET", "/ui/events?topics=fleet", timeout=None) as stream:
        async for line in stream.aiter_lines():
            if stop.is_set():
                return
            if line.startswith("event: changed"):
                seen.append(time.perf_counter())
                (await http.get("/ui/?part=main")).raise_for_status()


async def share(serve, seconds: float) -> float:
    before, wall = cpu_seconds(serve.pid), time.perf_counter()
    await trio.sleep(seconds)
    return (cpu_seconds(serve.pid) - before) / (time.perf_counter() - wall)


async def with_page(serve, http, seconds: float) -> tuple[float, int]:
    seen: list[float] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(open_page, http, seen, stop)
        await trio.sleep(1)  # the stream is open
        seen.clear()
        cpu = await share(serve, seconds)
        stop.set()
        nursery.cancel_scope.cancel()
    return cpu, len(seen)


async def measure(serve, repo: Repo, url: str, env: dict, args, nursery) -> dict:
    store = repo.open_store()
    total = args.workers + args.churners
    _, token = TokenBook(store).mint("fleet", duration_seconds=7200, max_enrollments=total)
    store.close()
    stop = trio.Event()
    started = time.perf_counter()
    members = [Labelled(url, token, i) for i in range(args.workers)]
    await enroll_all(members, stop, nursery, args.parallel)
    print(f"{args.workers} enrolled in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    await trio.sleep(args.settle)
    base, cookie = await login(repo.root, env)
    result: dict = {"workers": args.workers}
    async with httpx.AsyncClient(base_url=base, cookies={"swamp_ui": cookie}) as http:
        last = -(-args.workers // 100)
        result["fleet_page"] = {
            "first": await page_times(serve, http, "/ui/", args.pages),
            "last": await page_times(serve, http, f"/ui/?page={last}", args.pages),
            "label_filter": await page_times(serve, http, "/ui/?label=zone=a", args.pages),
            "queue": await page_times(serve, http, "/ui/queue", args.pages),
        }
        print("pages measured", file=sys.stderr)
        idle_without = await share(serve, args.seconds)
        idle_with, idle_events = await with_page(serve, http, args.seconds)
        churning = trio.Event()
        async with trio.open_nursery() as churners:
            churners.start_soon(churn, url, token, args.workers, args.churners, churning)
            await trio.sleep(2)
            busy_without = await share(serve, args.seconds)
            busy_with, busy_events = await with_page(serve, http, args.seconds)
            churning.set()
            churners.cancel_scope.cancel()
    stop.set()
    result["one_open_page"] = {
        "idle_fleet": {
            "cpu_share_without": round(idle_without, 4),
            "cpu_share_with": round(idle_with, 4),
            "events": idle_events,
        },
        "churning_fleet": {
            "churners": args.churners,
            "cpu_share_without": round(busy_without, 4),
            "cpu_share_with": round(busy_with, 4),
            "page_cost_share_of_a_core": round(busy_with - busy_without, 4),
            "events_per_second": round(busy_events / args.seconds, 2),
        },
    }
    return result


if __name__ == "__main__":
    gc.disable()  # this process holds every fake worker (the orchestrator's CPU is measured)
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=10_000)
    parser.add_argument("--parallel", type=int, default=32)
    parser.add_argument("--pages", type=int, default=30)
    parser.add_argument("--seconds", type=float, default=20)
    parser.add_argument("--churners", type=int, default=8)
    parser.add_argument("--settle", type=float, default=5)
    print(json.dumps(trio.run(main, parser.parse_args()), indent=2))
