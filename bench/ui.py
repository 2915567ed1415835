#!/usr/bin/env python3
"""The fleet's web pages at fleet scale: ``--workers`` idle workers on one orchestrator, then
what the pages cost it.

A real ``swamp serve``; ``--workers`` lightweight workers enrolled on one fleet token by this
process (``bench/fleet.py``'s, labelled ``zone=a``/``zone=b``); a session from
``swamp ui --no-browser --json``. Measures:

- the fleet page (``GET /ui/``: a summary per fleet and one page of 100 workers): its server
  time — the orchestrator's CPU per page, and the answer's time on loopback — for the first
  page, the last, and a label filter, over ``--pages`` requests each, each one rendered (a
  parameter of its own defeats the pages' render cache); its size; and the same page asked
  again while nothing changed (``shared``: the rendering its viewers share);
- one open page: what the orchestrator spends with one page open (its event stream, and the
  main part fetched again on each event, as the page's script does) beyond what it spends
  without it, while ``--churners`` more workers join and leave over and over (each a pool
  event: the page is told at most twice a second), over ``--seconds``; and on the idle fleet,
  where it must be nothing (no event, no timer);
- ``--viewers`` open fleet pages at once (64, the bound) on the churning fleet: what they cost
  together (they share one rendering per change).

Prints one JSON object.

    python3 build.py bench-ui [--workers 10000] [--pages 30] [--seconds 20]
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import re
import statistics
import sys
import time
from pathlib import Path

import httpx
import trio
from benchkit import cpu_seconds, percentile, scratch
from fleet import Member

from swamp.bookkeeping.server_tokens import ServerTokenBook
from swamp.bookkeeping.tokens import TokenBook
from swamp.domain.scopes import Scope
from swamp.processes import start_serve, stop_all, swamp_argv
from swamp.repo import Repo
from swamp.store.records import SqliteRecords
from swamp.ui.live import MAX_PER_CREDENTIAL as PAGES_PER_CREDENTIAL


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
    async with httpx.AsyncClient() as http:  # the link's page, then its button's POST
        shown = await http.get(link, follow_redirects=False)
        code = re.search(r'name="code" value="([^"]+)"', shown.text)
        assert code, shown.text
        opened = await http.post(
            f"{base}/ui/login",
            headers={"origin": base},
            data={"code": code.group(1)},
            follow_redirects=False,
        )
    [(name, value)] = opened.cookies.items()
    return base, f"{name}={value}"


async def token_login(base: str, token: str) -> str:
    """A session cookie from the pages' login form and a server token."""
    async with httpx.AsyncClient() as http:
        opened = await http.post(
            f"{base}/ui/login",
            headers={"origin": base},
            data={"token": token},
            follow_redirects=False,
        )
    [(name, value)] = opened.cookies.items()
    return f"{name}={value}"


async def page_times(
    serve, http: httpx.AsyncClient, path: str, count: int, *, fresh: bool = True
) -> dict:
    walls, size = [], 0
    cpu_before = cpu_seconds(serve.pid)
    for i in range(count):
        started = time.perf_counter()
        # a parameter of its own: a page of its own to the render cache, rendered each time
        asked = f"{path}{'&' if '?' in path else '?'}fresh={i}" if fresh else path
        response = await http.get(asked)
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


async def with_page(serve, http, seconds: float, viewers: int = 1) -> tuple[float, int]:
    """``http``: one client, or one per session (a session opens at most 8 pages)."""
    clients = http if isinstance(http, list) else [http]
    seen: list[float] = []
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        for i in range(viewers):
            nursery.start_soon(open_page, clients[i % len(clients)], seen, stop)
        await trio.sleep(1)  # the streams are open
        seen.clear()
        cpu = await share(serve, seconds)
        stop.set()
        nursery.cancel_scope.cancel()
    return cpu, len(seen)


async def measure(serve, repo: Repo, url: str, env: dict, args, nursery) -> dict:
    store = repo.open_store()
    total = args.workers + args.churners
    _, token = await TokenBook(SqliteRecords(store)).mint(
        "fleet", duration_seconds=7200, max_enrollments=total
    )
    # the many open pages: read tokens of their own (one credential opens at most 16)
    readers = [
        (await ServerTokenBook(SqliteRecords(store)).create(f"viewer-{i}", Scope.READ))[1]
        for i in range(-(-args.viewers // PAGES_PER_CREDENTIAL))
    ]
    store.close()
    stop = trio.Event()
    started = time.perf_counter()
    members = [Labelled(url, token, i) for i in range(args.workers)]
    await enroll_all(members, stop, nursery, args.parallel)
    print(f"{args.workers} enrolled in {time.perf_counter() - started:.0f}s", file=sys.stderr)
    await trio.sleep(args.settle)
    base, cookie = await login(repo.root, env)
    result: dict = {"workers": args.workers}
    limits = httpx.Limits(max_connections=args.viewers * 2 + 4)
    async with httpx.AsyncClient(
        base_url=base, headers={"cookie": cookie}, limits=limits, timeout=60
    ) as http:
        last = -(-args.workers // 100)
        result["fleet_page"] = {
            "first": await page_times(serve, http, "/ui/", args.pages),
            "last": await page_times(serve, http, f"/ui/?page={last}", args.pages),
            "label_filter": await page_times(serve, http, "/ui/?label=zone=a", args.pages),
            "queue": await page_times(serve, http, "/ui/queue", args.pages),
            "shared": await page_times(serve, http, "/ui/", args.pages, fresh=False),
        }
        print("pages measured", file=sys.stderr)
        idle_without = await share(serve, args.seconds)
        idle_with, idle_events = await with_page(serve, http, args.seconds)
        churning = trio.Event()
        async with trio.open_nursery() as churners:
            churners.start_soon(churn, url, token, args.workers, args.churners, churning)
            await trio.sleep(2)
            # without and with, alternated: the churn's own cost drifts over a minute, and a
            # baseline measured once beside one measurement with the page moved the figure
            pairs = []
            for _ in range(args.rounds):
                without = await share(serve, args.seconds)
                with_it, events = await with_page(serve, http, args.seconds)
                pairs.append((without, with_it, events))
            busy_without = statistics.median(p[0] for p in pairs)
            busy_with = statistics.median(p[1] for p in pairs)
            busy_events = statistics.median(p[2] for p in pairs)
            page_costs = sorted(round(w - o, 4) for o, w, _ in pairs)
            sessions = []
            for reader in readers:
                other = await token_login(base, reader)
                sessions.append(
                    httpx.AsyncClient(
                        base_url=base, headers={"cookie": other}, limits=limits, timeout=60
                    )
                )
            many_with, many_events = await with_page(serve, sessions, args.seconds, args.viewers)
            for client in sessions:
                await client.aclose()
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
            "page_cost_share_of_a_core": statistics.median(page_costs),
            "page_cost_each_round": page_costs,
            "events_per_second": round(busy_events / args.seconds, 2),
        },
    }
    result["open_pages"] = {
        "viewers": args.viewers,
        "cpu_share_with": round(many_with, 4),
        "pages_cost_share_of_a_core": round(many_with - busy_without, 4),
        "events_per_second_each": round(many_events / args.seconds / args.viewers, 2),
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
    parser.add_argument("--rounds", type=int, default=3, help="without/with pairs, churning")
    parser.add_argument(
        "--viewers", type=int, default=64, help="open pages at once (64: the bound)"
    )
    parser.add_argument("--settle", type=float, default=5)
    print(json.dumps(trio.run(main, parser.parse_args()), indent=2))
