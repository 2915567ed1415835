#!/usr/bin/env python3
"""``/metrics`` at fleet scale, in-process: what one scrape costs the orchestrator.

A real pool of ``--workers`` members (sockets are stand-ins: nothing but the pool, the queue
service and the collector runs), a real queue service holding steps that wait for
``--requirements`` distinct requirements and steps running on the fleet; then the collector
renders the whole exposition ``--scrapes`` times. Two shapes of fleet:

- ``fleets``: 4 fleets, the members of each labelled alike (a few *offers*: what real fleets
  look like);
- ``unique``: every member has a label of its own too (``host=h<n>``: 10,000 offers, the worst
  case for the idle-slots count).

Prints one JSON object: per shape and number of requirements, the median and the slowest
scrape (milliseconds), the median of the per-requirement numbers alone (steps waiting and
running, idle matching slots: computed, not formatted) and the exposition's size.
``bench/fleet.py`` measures the same scrape over HTTP against a real ``swamp serve`` with
10,000 connected workers.

    python3 build.py bench-metrics [--workers 10000] [--requirements 1,100,1000] [--scrapes 20]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path

import trio
import trio.testing
from benchkit import scratch

from swamp.bookkeeping.leases import LeaseBook
from swamp.domain.placement import Placement
from swamp.orchestrator.bookkeeper import Bookkeeper
from swamp.orchestrator.metrics import Metrics
from swamp.orchestrator.pool import Member, Pool
from swamp.orchestrator.queue import DispatchQueue, StepInfo
from swamp.store.datastore import Datastore
from swamp.store.records import SqliteRecords

INFO = StepInfo("command/shell", "default", "run")
RUNNING = 2_000  # steps holding a slot on the fleet while the scrapes run


class Socket:
    """What the pool asks of a member's channel: is it open?"""

    closed = False
    heartbeat = 5.0


async def ignore(event: dict) -> None:
    return None


def member(n: int, shape: str) -> Member:
    labels = {"pool": f"p{n % 4}"}
    if shape == "unique":
        labels["host"] = f"h{n}"
    return Member(
        name=f"w{n}",
        instance_id=str(uuid.UUID(int=n)),
        machine_id=f"m{n}",
        token_name=f"p{n % 4}",
        labels=labels,
        platform="linux",
        arch="x86_64",
        capacity=4,
        version="1",
        channel=Socket(),  # type: ignore[arg-type]
        fleet=f"p{n % 4}",
    )


async def one(root: Path, workers: int, shape: str, requirements: int, scrapes: int) -> dict:
    store = Datastore(root / f"{shape}-{requirements}.db", orchestrator=True)
    bookkeeper = Bookkeeper(LeaseBook(SqliteRecords(store)))
    queue = DispatchQueue(
        Pool(), bookkeeper.leases.db, bookkeeper, tokens=lambda name: None, clock=time.time
    )
    metrics = Metrics()
    metrics.watch(queue.pool, queue)
    for n in range(workers):
        queue.pool.put(member(n, shape))
    async with trio.open_nursery() as nursery:
        await nursery.start(bookkeeper.run)
        for n in range(min(RUNNING, workers)):  # on the fleet, by pool: slots taken at once
            await queue.acquire(
                Placement(labels={"pool": f"p{n % 4}"}), INFO, deadline=None, emit=ignore
            )
        for r in range(requirements):  # nobody matches: two steps wait for each
            for _ in range(2):
                nursery.start_soon(
                    lambda r=r: queue.acquire(
                        Placement(labels={"gpu": f"g{r}"}), INFO, deadline=None, emit=ignore
                    )
                )
        await trio.testing.wait_all_tasks_blocked()
        assert len(queue.waiting) == 2 * requirements
        times, computed = [], []
        size = 0
        for _ in range(scrapes):
            started = time.perf_counter()
            size = len(metrics.render())
            times.append(time.perf_counter() - started)
            started = time.perf_counter()  # the per-requirement numbers alone, unformatted
            queue.pool.index.idle_slots(list(queue.demand()))
            computed.append(time.perf_counter() - started)
        nursery.cancel_scope.cancel()
    store.close()
    return {
        "shape": shape,
        "requirements": requirements,
        "scrape_ms_median": round(statistics.median(times) * 1000, 1),
        "scrape_ms_max": round(max(times) * 1000, 1),
        "demand_ms_median": round(statistics.median(computed) * 1000, 1),
        "exposition_kib": round(size / 1024, 1),
    }


async def main(args: argparse.Namespace) -> dict:
    results = []
    with scratch("swamp-metrics-") as root:
        for shape in ("fleets", "unique"):
            for requirements in args.requirements:
                results.append(await one(root, args.workers, shape, requirements, args.scrapes))
                print(json.dumps(results[-1]), file=sys.stderr, flush=True)
    return {"workers": args.workers, "running": min(RUNNING, args.workers), "results": results}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=10_000)
    parser.add_argument(
        "--requirements",
        type=lambda text: [int(n) for n in text.split(",")],
        default=[1, 100, 1000],
        help="numbers of requirements with steps waiting, comma-separated",
    )
    parser.add_argument("--scrapes", type=int, default=20)
    print(json.dumps(trio.run(main, parser.parse_args()), indent=2))
