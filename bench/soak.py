#!/usr/bin/env python3
"""Soak: many steps over a fleet while workers are SIGKILLed and orchestrators restart.

Every step is a ``command/shell`` run placed by the fleet label; the command itself appends
``start <id>`` and ``end <id>`` to a ledger file, so the ledger — not the orchestrator — says what
really ran. Meanwhile a chaos task SIGKILLs a random worker every few seconds (and starts it
again with the same cache dir, so it re-enrolls as itself) and, once, SIGKILLs the orchestrator
and starts it again on the same port.

With ``--orchestrators N`` (N > 1) there are N orchestrators on one PostgreSQL (a throwaway
server, as the tests start theirs): each worker is given every URL (in its own order, so they
spread), each client sends its steps to one picked at random, and besides the workers an
orchestrator is SIGKILLed every ``--kill-orchestrator-every`` seconds and started again on its
port — its workers move to the others, and its steps are taken over by the one that reconciles
it: a client whose orchestrator died follows its step through another (as the CLI given every
URL does) and counts the outcome it reads there.

The verdict: every step got an answer (none lost); no two copies of a step ever ran at once; no
step's effect happened twice (the command keys it on ``SWAMP_STEP_ID``, as docs/usage.md advises);
every step reported as succeeded finished; every failure carries its reason. More steps are in
flight than the fleet has slots, so steps also wait in the queue (and are queued again after a
lost worker). Prints one JSON object; it is not part of the test suite (it takes minutes).

    python3 build.py soak [--steps 10000] [--workers 20] [--concurrency 2] [--in-flight 60]
        [--orchestrators 3 --kill-orchestrator-every 5]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import sys
import time
from pathlib import Path

import trio
from benchkit import scratch

from swamp.bookkeeping.tokens import TokenBook
from swamp.errors import SwampError
from swamp.processes import start_serve, start_worker, stop_all
from swamp.protocol.messages import MethodRunRequest, PlacementSpec
from swamp.repo import Repo
from swamp.store.records import SqliteRecords

ROOT = Path(__file__).resolve().parent.parent  # the checkout: tests.postgres starts a server
FOLLOW_FOR = 300.0  # seconds a client follows a step whose orchestrator died, at most


async def main(args) -> dict:
    with scratch("swamp-soak-") as root:
        if args.orchestrators > 1:
            return await _soak_shared(root, args)
        return await _soak(root, args)


async def _soak_shared(root: Path, args) -> dict:
    """Several orchestrators on one PostgreSQL (see the module)."""
    sys.path.insert(0, str(ROOT))
    from swamp.store.pg_store import PgStore
    from tests import postgres

    with postgres.cluster() as cluster:
        database = cluster.new_database()
        env = {k: v for k, v in os.environ.items() if not k.startswith("SWAMP_")}
        env["SWAMP_DATABASE_URL"] = database
        serve_args = ("--heartbeat", "1s", "--grace-window", "10s")
        repos = [Repo.init(root / f"repo-{n}")[0] for n in range(args.orchestrators)]
        state: dict = {"procs": [], "workers": {}, "serves": {}}
        try:
            urls = []
            async with trio.open_nursery() as nursery:
                for n, repo in enumerate(repos):
                    serve, lines, url = await start_serve(repo.root, *serve_args, env=env)
                    state["serves"][n] = serve
                    nursery.start_soon(lines.drain)
                    urls.append(url)
                db = await PgStore.open(database, size=1)
                _, token = await TokenBook(db).mint(
                    "soak", duration_seconds=6 * 3600, max_enrollments="unlimited"
                )
                await db.aclose()

                async def start(i: int) -> None:
                    order = urls[i % len(urls) :] + urls[: i % len(urls)]
                    worker, reader = await start_worker(
                        ",".join(order), token, "--label", "pool=soak",
                        "--concurrency", str(args.concurrency),
                        "--cache-dir", str(root / f"cache-{i}"), env=env,
                    )  # fmt: skip
                    state["workers"][i] = worker
                    state["procs"].append(worker)
                    nursery.start_soon(reader.drain)

                async def restart(n: int) -> None:
                    state["serves"][n].kill()
                    await state["serves"][n].wait()
                    port = int(urls[n].rsplit(":", 1)[1])
                    serve, lines, _ = await start_serve(
                        repos[n].root, *serve_args, env=env, port=port
                    )
                    state["serves"][n] = serve
                    nursery.start_soon(lines.drain)

                for i in range(args.workers):
                    await start(i)
                outcome = await _run(
                    args, repos, urls, root / "ledger", state, start, restart, nursery
                )
                nursery.cancel_scope.cancel()
            return outcome
        finally:
            await stop_all([*state["procs"], *state["serves"].values()])


async def _soak(root: Path, args) -> dict:
    repo, _ = Repo.init(root / "repo")
    ledger = root / "ledger"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SWAMP_")}
    serve_args = ("--heartbeat", "1s", "--grace-window", "10s")
    state: dict = {"procs": [], "workers": {}}
    try:
        serve, serve_lines, url = await start_serve(repo.root, *serve_args, env=env)
        state["serve"] = serve
        port = int(url.rsplit(":", 1)[1])
        store = repo.open_store()
        _, token = await TokenBook(SqliteRecords(store)).mint(
            "soak", duration_seconds=6 * 3600, max_enrollments="unlimited"
        )
        store.close()

        async def start(i: int) -> None:
            worker, reader = await start_worker(
                url, token, "--label", "pool=soak", "--concurrency", str(args.concurrency),
                "--cache-dir", str(root / f"cache-{i}"), env=env,
            )  # fmt: skip
            state["workers"][i] = worker
            state["procs"].append(worker)
            nursery.start_soon(reader.drain)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_lines.drain)
            for i in range(args.workers):
                await start(i)
            state["serves"] = {0: serve}

            async def restart(n: int) -> None:
                state["serves"][0].kill()
                await state["serves"][0].wait()
                again, lines, _ = await start_serve(repo.root, *serve_args, env=env, port=port)
                state["serves"][0] = again
                state["serve"] = again
                nursery.start_soon(lines.drain)

            outcome = await _run(args, [repo], [url], ledger, state, start, restart, nursery)
            nursery.cancel_scope.cancel()
        return outcome
    finally:
        await stop_all([*state["procs"], *(p for p in [state.get("serve")] if p)])


async def _run(args, repos, urls, ledger, state, start, restart, nursery) -> dict:
    results: dict[int, dict] = {}
    followed = {"steps": 0, "gave_up": 0}  # steps whose client followed them elsewhere
    kills = restarts = 0
    done = trio.Event()
    next_step = iter(range(args.steps))
    rng = random.Random(args.seed)
    started = time.monotonic()

    async def client() -> None:
        from swamp.admin.remote import RemoteAdmin

        recorded: list[str] = []  # the step's id, told by its orchestrator (shared only)

        async def on_event(event: dict) -> None:
            if event.get("kind") == "recorded" and isinstance(event.get("stepId"), str):
                recorded[:] = [event["stepId"]]

        step = next(next_step, None)
        while step is not None:
            command = _command(step, ledger, rng)
            request = MethodRunRequest(
                model="command/shell", method="run", args={"command": command},
                placement=PlacementSpec(labels={"pool": "soak"}), follow=True,
            )  # fmt: skip
            n = rng.randrange(len(urls))  # the orchestrator this client sends to, until it dies
            repo, url = repos[n], urls[n]
            sent = False
            try:
                credential = repo.admin_credential_for(url)
                async with RemoteAdmin.connect(url, credential=credential) as api:
                    while step is not None:
                        sent = True
                        recorded.clear()
                        result = await api.method_run(request, on_event)
                        results[step] = {"status": result.status, "error": result.error}
                        step = next(next_step, None)
                        if step is None:
                            break
                        command = _command(step, ledger, rng)
                        request = MethodRunRequest(
                            model="command/shell", method="run", args={"command": command},
                            placement=PlacementSpec(labels={"pool": "soak"}), follow=True,
                        )  # fmt: skip
            except SwampError as exc:  # the orchestrator went away mid-step: a reasoned failure
                if exc.code == "unauthorized" or not sent:
                    # a restarted orchestrator is listening but has not written its new local
                    # credential yet, or it is down: nothing was sent; again (maybe another)
                    await trio.sleep(0.2)
                    continue
                if step is not None and step not in results:
                    if exc.code == "channel_closed" and recorded:  # through another
                        results[step] = await follow(recorded[0], n)
                    else:
                        results[step] = {"status": "failed", "error": f"{exc.code}: {exc.message}"}
                    step = next(next_step, None)
                await trio.sleep(0.5)

    async def follow(step_id: str, lost: int) -> dict:
        """A step whose orchestrator died, through the others (as the CLI given every URL
        does): its outcome once it has one, whoever settles it."""
        from swamp.admin.remote import RemoteAdmin
        from swamp.protocol.messages import MethodFollowRequest

        followed["steps"] += 1
        deadline = trio.current_time() + FOLLOW_FOR
        while trio.current_time() < deadline:
            n = rng.choice([i for i in range(len(urls)) if i != lost] or [lost])
            try:
                credential = repos[n].admin_credential_for(urls[n])
                async with RemoteAdmin.connect(urls[n], credential=credential) as api:
                    result = await api.method_follow(MethodFollowRequest(step_id))
                return {"status": result.status, "error": result.error}
            except SwampError as exc:
                if exc.code in ("channel_closed", "unauthorized", "peer_error"):
                    await trio.sleep(0.2)  # that one went too, or is starting: another
                    continue
                return {"status": "failed", "error": f"{exc.code}: {exc.message}"}
        followed["gave_up"] += 1
        return {"status": "failed", "error": f"follow: no answer in {FOLLOW_FOR:g}s"}

    async def chaos() -> None:
        nonlocal kills, restarts
        restarted = False
        while not done.is_set():
            await trio.sleep(args.kill_every)
            victim = rng.choice(sorted(state["workers"]))
            state["workers"][victim].kill()
            kills += 1
            await start(victim)
            if len(urls) == 1 and not restarted and len(results) > args.steps // 2:
                await restart(0)
                restarted, restarts = True, restarts + 1

    async def orchestrator_chaos() -> None:
        nonlocal restarts
        while not done.is_set():
            await trio.sleep(args.kill_orchestrator_every)
            await restart(rng.randrange(len(urls)))
            restarts += 1

    async with trio.open_nursery() as inner:
        inner.start_soon(chaos)
        if len(urls) > 1:
            inner.start_soon(orchestrator_chaos)
        async with trio.open_nursery() as clients:
            for _ in range(args.in_flight):
                clients.start_soon(client)
        done.set()
        inner.cancel_scope.cancel()
    elapsed = time.monotonic() - started
    return {**_verdict(args, results, ledger, kills, restarts, elapsed), "followed": followed}


def _command(step: int, ledger: Path, rng: random.Random) -> str:
    """The step's command: it notes an *overlap* if an earlier copy of the same step is still
    alive as it starts (a zombie — killed, not yet reaped — is not alive), then ``start <id>
    <pid>``, a short pause, and its effect, ``end <id> <pid> <step id>``. Like any command whose
    effect must happen once, it keys the effect on ``SWAMP_STEP_ID``: a later attempt that finds
    the effect already done writes ``again`` instead (its first copy finished, and its worker
    died before the result got home)."""
    return (
        f'for p in $(sed -n "s/^start {step} //p" {ledger} 2>/dev/null); do '
        f's=$(cut -d")" -f2 /proc/$p/stat 2>/dev/null | cut -d" " -f2); '
        f'[ -n "$s" ] && [ "$s" != Z ] && echo "overlap {step} $p" >> {ledger}; done; '
        f"echo start {step} $$ >> {ledger}; sleep {rng.choice([0, 0.01, 0.05])}; "
        f'if [ "$SWAMP_ATTEMPT" -gt 1 ] && grep -q " $SWAMP_STEP_ID$" {ledger}; '
        f"then echo again {step} $$ >> {ledger}; "
        f"else echo end {step} $$ $SWAMP_STEP_ID >> {ledger}; fi"
    )


def _verdict(args, results, ledger, kills, restarts, elapsed) -> dict:
    """What the ledger says. A copy's lines are ``start`` then (unless it was killed) ``end``, or
    ``again`` where an earlier attempt had already finished; a copy that finds an earlier copy of
    its step still alive writes ``overlap``. Neither an overlap nor a second ``end`` may ever
    happen; ``again`` counts the window no runner can close (see docs/usage.md)."""
    events = collections.defaultdict(list)
    for line in ledger.read_text().splitlines() if ledger.exists() else []:
        what, step, _ = line.split(" ", 2)
        events[int(step)].append(what)
    ends = {step: lines.count("end") for step, lines in events.items()}
    overlapping = sum(1 for lines in events.values() if "overlap" in lines)
    succeeded = [s for s, r in results.items() if r["status"] == "succeeded"]
    failed = {s: r for s, r in results.items() if r["status"] != "succeeded"}
    reasons = collections.Counter((r["error"] or "no reason")[:60] for r in failed.values())
    return {
        "steps": args.steps,
        "workers": args.workers,
        "concurrency": args.concurrency,
        "seconds": round(elapsed, 1),
        "steps_per_second": round(len(results) / elapsed, 1),
        "succeeded": len(succeeded),
        "failed": len(failed),
        "failure_reasons": dict(reasons.most_common(8)),
        "worker_kills": kills,
        "orchestrators": args.orchestrators,
        "orchestrator_restarts": restarts,
        "ran_again_after_a_lost_worker": sum(
            1 for lines in events.values() if lines.count("start") > 1
        ),  # fmt: skip
        "ran_again_after_its_command_had_finished": sum(
            1 for lines in events.values() if "again" in lines
        ),  # fmt: skip
        # the verdict
        "finished_twice": sum(1 for n in ends.values() if n > 1),
        "lost": args.steps - len(results),
        "overlapping_copies": overlapping,
        "succeeded_but_never_finished": sum(1 for s in succeeded if ends.get(s, 0) == 0),
        "failed_without_reason": sum(1 for r in failed.values() if not r["error"]),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--in-flight", type=int, default=60)
    parser.add_argument("--kill-every", type=float, default=3.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--orchestrators",
        type=int,
        default=1,
        help="more than one: that many on one PostgreSQL (a throwaway server), restarted in turn",
    )
    parser.add_argument("--kill-orchestrator-every", type=float, default=5.0)
    result = trio.run(main, parser.parse_args())
    print(json.dumps(result, indent=2))
    verdict = ("lost", "overlapping_copies", "finished_twice", "succeeded_but_never_finished",
               "failed_without_reason")  # fmt: skip
    sys.exit(1 if any(result[k] for k in verdict) else 0)
