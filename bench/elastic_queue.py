#!/usr/bin/env python3
"""Queue benchmark: the scheduling decision, wake on enrollment, and a backlog drained.

- **decision**: one step placed by the pure assignment (``assign`` over the pool index, slot
  taken, then released) in pools of 100, 1,000 and 10,000 workers (4 slots each, labels
  ``fleet``, ``zone`` and, on 1 %, ``gpu``), for a fleet-wide and a rare requirement;
- **decision at scale**: 10,000 workers, all busy, and 10,000 waiting steps of 20 submitters,
  priorities -2 to 10 started in 100 aging ticks, for six requirements: the pick when a worker
  frees a slot (the requirements it matches, then ``assign``: priority, fair share, age) and
  the admission of one more step that has to wait; the queue kept at its size;
- **wake on enroll**: a step waits for a label nobody has; a worker with that label enrolls;
  the time from the enrollment reply reaching the worker to the dispatch frame reaching it
  (a real ``swamp serve``; the worker is spoken by this process, so both ends are timed on one
  clock);
- **backlog**: 10,000 waiting ``swamp/echo`` steps, then 8 ``swamp worker connect`` × 4 slots
  start and drain it: dispatches per second, and the orchestrator's RSS with the backlog queued.

Prints one JSON object.

    python3 build.py bench-queue [--rounds 50] [--backlog 10000] [--workers 8] [--concurrency 4]
        [--decisions-only]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
import uuid
from pathlib import Path

import trio
from benchkit import enroll_params, percentile, rss_kib, scratch

from swamp.bookkeeping.tokens import TokenBook
from swamp.client import connect
from swamp.domain.placement import Placement
from swamp.domain.queue import WaitingQueue, WaitingStep
from swamp.domain.scheduler import (
    PoolIndex,
    Requirement,
    Slots,
    Wait,
    admit,
    assign,
    requirements_of,
)
from swamp.processes import start_serve, start_worker, stop_all
from swamp.protocol.frames import MAX_FRAME_BYTES
from swamp.protocol.messages import DispatchResult
from swamp.protocol.rpc import IncomingCall, RpcChannel
from swamp.protocol.transport import open_websocket
from swamp.repo import Repo
from swamp.store.records import SqliteRecords

# -- the decision ---------------------------------------------------------------------------------


def decisions(sizes=(100, 1_000, 10_000), rounds: int = 20_000) -> dict:
    rng = random.Random(1)
    out = {}
    for size in sizes:
        index = PoolIndex()
        for i in range(size):
            labels = {"fleet": "pool", "zone": f"z{i % 4}"}
            if i % 100 == 0:
                labels["gpu"] = "true"
            index.put(
                Slots(
                    f"w{i:05d}", str(uuid.uuid4()), labels, "linux", "x86_64", 4, rng.randint(0, 3)
                )
            )
        out[size] = {}
        for what, placement in (
            ("fleet", Placement(labels={"fleet": "pool"})),
            ("gpu_in_zone", Placement(labels={"gpu": "true", "zone": "z0"})),
        ):
            queue = WaitingQueue()
            timings = []
            for _ in range(rounds):
                step = WaitingStep(Requirement.of(placement))
                started = time.perf_counter()
                queue.add(step)
                [assignment] = assign(queue, index, [step.requirement])
                timings.append((time.perf_counter() - started) * 1e6)
                index.release(assignment.worker)  # keep the pool as it was
            out[size][what] = {
                "p50_us": round(percentile(timings, 50), 2),
                "p99_us": round(percentile(timings, 99), 2),
            }
    return out


def decisions_at_scale(workers: int = 10_000, waiting: int = 10_000, rounds: int = 20_000) -> dict:
    """The pick and the admission with a full pool and a deep, mixed queue (see the top)."""
    rng = random.Random(2)
    index = PoolIndex()
    names = []
    for i in range(workers):
        labels = {"fleet": "pool", "zone": f"z{i % 4}"}
        if i % 100 == 0:
            labels["gpu"] = "true"
        names.append(f"w{i:05d}")
        index.put(Slots(names[-1], str(uuid.uuid4()), labels, "linux", "x86_64", 4, 4))
    requirements = [
        Requirement.of(p)
        for p in (
            Placement(labels={"fleet": "pool"}),
            Placement(labels={"zone": "z0"}),
            Placement(labels={"zone": "z1"}),
            Placement(labels={"gpu": "true"}),
            Placement(labels={"gpu": "true", "zone": "z0"}),
            Placement(labels={"fleet": "pool"}, platform="linux"),
        )
    ]
    submitters = [f"token:team-{i}" for i in range(20)]
    queue = WaitingQueue()
    for submitter in submitters:  # each has some running already
        for _ in range(rng.randint(0, 50)):
            queue.started(submitter)

    def one_step(requirement: Requirement | None = None) -> WaitingStep:
        priority = rng.choice((0, 0, 0, 0, 1, 2, 5, 10, -2))
        return WaitingStep(
            requirement or rng.choice(requirements),
            priority=priority,
            submitter=rng.choice(submitters),
            epoch=rng.randint(0, 100),  # waiting for up to 100 aging ticks
        )

    for _ in range(waiting):
        queue.add(one_step())
    picks, admissions = [], []
    for _ in range(rounds):
        name = rng.choice(names)
        started = time.perf_counter()
        index.release(name)
        slots = index.get(name)
        [assignment] = assign(queue, index, requirements_of(slots, queue), epoch=100)
        picks.append((time.perf_counter() - started) * 1e6)
        queue.finished(assignment.step.submitter)  # (another of its steps ends, later)
        step = one_step(assignment.step.requirement)  # the mix stays as it was
        started = time.perf_counter()
        decision = admit(
            step.requirement,
            queue,
            index,
            max_waiting=100_000,
            priority=step.priority,
            submitter=step.submitter,
            epoch=rng.randint(0, 100),
        )
        admissions.append((time.perf_counter() - started) * 1e6)
        assert isinstance(decision, Wait) and len(queue) == waiting
    return {
        "workers": workers,
        "waiting": waiting,
        "submitters": len(submitters),
        "requirements": len(requirements),
        "pick_on_freed_slot": {
            "p50_us": round(percentile(picks, 50), 2),
            "p99_us": round(percentile(picks, 99), 2),
        },
        "admit_to_wait": {
            "p50_us": round(percentile(admissions, 50), 2),
            "p99_us": round(percentile(admissions, 99), 2),
        },
    }


# -- wake on enroll -------------------------------------------------------------------------------


async def wake_on_enroll(url: str, admin: str, token: str, rounds: int) -> dict:
    latencies = []
    async with connect(url, server_token=admin) as channel:
        for i in range(rounds):
            latencies.append(await _wake_once(channel, url, token, f"r{i}"))
    return {
        "rounds": rounds,
        "p50_ms": round(percentile(latencies, 50), 3),
        "p99_ms": round(percentile(latencies, 99), 3),
        "max_ms": round(max(latencies), 3),
    }


async def _wake_once(channel: RpcChannel, url: str, token: str, label: str) -> float:
    """One step waits for ``wake=label``; a worker with it enrolls: ms from its enrollment
    reply to the dispatch frame."""
    queued, got, finished = trio.Event(), trio.Event(), trio.Event()
    times: dict[str, float] = {}

    async def on_event(event: dict) -> None:
        if event.get("kind") == "queued":
            queued.set()

    async def place() -> None:
        params = {"model": "swamp/echo", "method": "echo", "placement": {"labels": {"wake": label}}}
        result = await channel.call("model.method.run", params, timeout=60, on_event=on_event)
        assert result["status"] == "succeeded", result
        finished.set()

    async def handle(call: IncomingCall):
        times["dispatch"] = time.perf_counter()
        got.set()
        return DispatchResult(status="succeeded").to_json()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(place)
        await queued.wait()
        async with open_websocket(
            url, ssl_context=None, max_message_size=MAX_FRAME_BYTES * 2
        ) as ws:
            worker = RpcChannel(ws, handle, name="bench worker")
            await nursery.start(worker.serve)
            enroll = enroll_params(token, f"bench-{label}", {"wake": label})
            await worker.call("worker.enroll", enroll, timeout=30)
            times["enrolled"] = time.perf_counter()
            await got.wait()
            await finished.wait()  # the result got home before this worker leaves
            await worker.close()
    return (times["dispatch"] - times["enrolled"]) * 1000


# -- a backlog ------------------------------------------------------------------------------------


async def backlog(url, admin, token, serve_pid, args, env, procs, root) -> dict:
    params = {"model": "swamp/echo", "method": "echo", "placement": {"labels": {"drain": "yes"}}}
    done = 0
    first: float | None = None
    last = 0.0

    async def client(count: int, task_status=trio.TASK_STATUS_IGNORED) -> None:
        nonlocal done, first, last
        async with connect(url, server_token=admin) as channel:
            await channel.call("server.info", {})  # an admin socket now: 64 calls in flight
            task_status.started()  # one socket at a time: fewer than 128 are ever pending

            async def one() -> None:
                nonlocal done, first, last
                result = await channel.call("model.method.run", params, timeout=None)
                assert result["status"] == "succeeded", result
                now = time.perf_counter()
                first = now if first is None else first
                last, done = now, done + 1

            async with trio.open_nursery() as nursery:
                for _ in range(count):
                    nursery.start_soon(one)

    rss_before = rss_kib(serve_pid)
    per_socket = 60  # under an admin socket's 64 requests in flight
    async with trio.open_nursery() as outer:
        async with trio.open_nursery() as clients:
            left = args.backlog
            while left:
                await clients.start(client, min(per_socket, left))
                left -= min(per_socket, left)
            async with connect(url, server_token=admin) as channel:

                async def waiting() -> int:
                    return (await channel.call("server.info", {}))["waitingSteps"]

                with trio.fail_after(300):
                    # the orchestrator's count, asked again: no event crosses the socket for it
                    while await waiting() < args.backlog:  # noqa: ASYNC110
                        await trio.sleep(0.2)
            queued_at = time.perf_counter()
            rss_queued = rss_kib(serve_pid)
            for i in range(args.workers):
                worker, reader = await start_worker(
                    url, token, "--label", "drain=yes", "--concurrency", str(args.concurrency),
                    "--cache-dir", str(root / f"drain-{i}"), env=env,
                )  # fmt: skip
                procs.append(worker)
                outer.start_soon(reader.drain)
        outer.cancel_scope.cancel()  # every step is back: stop reading the workers
    return {
        "steps": done,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "orchestrator_rss_mib_before": round(rss_before / 1024, 1),
        "orchestrator_rss_mib_with_backlog": round(rss_queued / 1024, 1),
        "seconds_from_first_to_last": round(last - first, 2),
        "dispatches_per_second": round((done - 1) / (last - first), 1),
        "seconds_from_workers_started": round(last - queued_at, 2),
    }


async def main(args) -> dict:
    result: dict = {"decision": decisions(), "decision_at_scale": decisions_at_scale()}
    if args.decisions_only:
        return result
    with scratch("swamp-bench-queue-") as root:
        async with await trio.Path(root / "serve.log").open("wb") as log:
            return await _measure(root, result, args, log.wrapped)


async def _measure(root: Path, result: dict, args, log) -> dict:
    repo, _ = Repo.init(root / "repo")
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWAMP_")}
    procs: list = []
    try:
        serve, lines, url = await start_serve(
            repo.root,
            env=env,
            stderr=log,
        )
        procs.append(serve)
        store = repo.open_store()
        _, token = await TokenBook(SqliteRecords(store)).mint(
            "bench", duration_seconds=3600, max_enrollments="unlimited"
        )
        store.close()
        admin = repo.admin_credential_for(url)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lines.drain)
            result["wake_on_enroll"] = await wake_on_enroll(url, admin, token, args.rounds)
            result["backlog"] = await backlog(url, admin, token, serve.pid, args, env, procs, root)
            nursery.cancel_scope.cancel()
        return result
    finally:
        await stop_all(procs)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--backlog", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--decisions-only", action="store_true", help="no processes: the decisions")
    print(json.dumps(trio.run(main, parser.parse_args()), indent=2))
