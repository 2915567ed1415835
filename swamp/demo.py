"""The demo: real ``swamp serve`` and ``swamp worker connect`` processes, driven as a user would.

It walks through the fleet design in short numbered sections, each ending with what it showed:

1. an orchestrator in a temporary repo, and one fleet token;
2. the elastic queue: a step submitted before any worker exists waits, and is dispatched to the
   first member the moment it enrolls;
3. the rest of the fleet enrolls with the same token;
4. placement by name and by label (least loaded);
5. the pool and a verification of every seam;
6. a workflow fan-out: one step per connected member (``forEach`` over ``workers.connected``);
7. a drain on SIGTERM: the member running a step takes no new work, finishes it, exits 0;
8. shutdown.

Every wait is on an event — a streamed run event, a worker's JSON line, a process's exit — or
on a listing that must change, each bounded by :data:`WAIT`; nothing sleeps hoping something
happened. Each section checks what it claims from causes, never from how fast this machine is:
a failed check stops the demo with one line and exit 1. ``--json`` prints, at the end, the facts
each check was made on (the queue episode's record, each member's own event lines, the
workflow run, exit statuses), so a test can check them again.

Whatever happens — a failed check, Ctrl-C — the processes are stopped and the temporary
directory (repo, workers' cache dirs) is removed, unless ``--keep``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import sys
import tempfile
from pathlib import Path

import trio

from swamp import client
from swamp.concurrency import open_unwrapping_nursery
from swamp.demo_driver import WAIT, Demo, Member, Step, gap_ms, start_members
from swamp.errors import SwampError
from swamp.processes import start_serve, stop_all
from swamp.repo import Repo

FLEET = "demo"  # the fleet token's name, hence every member's ``fleet`` label
FIRST_SLOTS = 3  # the first member's slots: more than any other, so least-loaded picks it

# The fan-out of section 6, as examples/workflows/fleet-uptime.toml writes it.
FAN_OUT = """\
# One step per connected member of a fleet: forEach over the live pool, each step placed on
# the member it was made for.   swamp workflow run fleet-uptime --input fleet=demo
name = "fleet-uptime"
description = "uptime on every member of a fleet"

[inputs.properties.fleet]
type = "string"
default = "demo"

[[jobs]]
name = "survey"

[[jobs.steps]]
name = "uptime-${{ self.w.name }}"
forEach = { item = "w", in = "${{ workers.connected({'fleet': inputs.fleet}) }}" }
target = "${{ self.w.name }}"
queueTimeout = "1m"

[jobs.steps.task]
type = "model_method"
modelType = "command/shell"
modelName = "uptime-${{ self.w.name }}"
methodName = "run"
inputs = { command = "uptime 2>/dev/null || echo up" }
"""


async def run_demo(count: int, keep: bool, as_json: bool) -> int:
    say = (lambda *a, **k: None) if as_json else _print
    root = Path(tempfile.mkdtemp(prefix="swamp-demo-"))
    report: dict = {"runs": []}
    processes: list[trio.Process] = []
    demo = Demo(root=root, say=say, report=report, env=dict(os.environ), processes=processes)
    say(f"swamp demo: an orchestrator and {count} worker processes, real, on this machine")
    status = 1
    try:
        async with open_unwrapping_nursery() as nursery:  # Ctrl-C surfaces as itself
            await _sections(demo, nursery, count)
            nursery.cancel_scope.cancel()  # the children's output readers
        status = 0
    except SwampError as exc:
        report["error"] = {"code": exc.code, "message": exc.message}
        say(f"\nthe demo stopped in section {demo.number}: {exc.message}", file=sys.stderr)
    finally:
        demo.release()  # a step held in section 7 ends, so its worker can stop at once
        await stop_all(processes)
        report["exitCodes"] = {
            "serve" if i == 0 else demo.names.get(p.pid, f"worker pid {p.pid}"): p.returncode
            for i, p in enumerate(processes)
        }
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    demo.section("Shut down")
    codes = ", ".join(f"{name} {code}" for name, code in report["exitCodes"].items())
    say(f"   SIGTERM to every process still running; exit statuses: {codes}")
    say(f"   kept {root} (the repo, each worker's cache dir)" if keep else f"   removed {root}")
    if as_json:
        print(json.dumps(report, indent=2))
    return status


def _print(*args, **kwargs) -> None:
    print(*args, **kwargs, flush=True)  # a pipe shows each line as it happens too


def _slots(n: int) -> str:
    return f"{n} slot" if n == 1 else f"{n} slots"


async def _sections(demo: Demo, nursery: trio.Nursery, count: int) -> None:
    admin, credential = await _orchestrator(demo, nursery, count)
    async with client.connect(demo.url, server_token=admin) as channel:
        demo.channel = channel
        first = await _elastic_queue(demo, nursery, credential)
        members = await _rest_of_fleet(demo, nursery, credential, first, count)
        await _placement(demo, members)
        await _pool(demo, count)
        await _fan_out(demo, members)
        await _drain(demo, nursery, first)


async def _orchestrator(demo: Demo, nursery: trio.Nursery, count: int) -> tuple[str, str]:
    """The orchestrator's admin credential and the fleet token."""
    demo.section("An orchestrator and one fleet token")
    repo, _ = Repo.init(demo.root / "repo")
    (repo.root / "workflows" / "fleet-uptime.toml").write_text(FAN_OUT)
    server, lines, url = await start_serve(repo.root, env=demo.env)
    demo.processes.append(server)
    nursery.start_soon(lines.drain)
    demo.url = url
    demo.report.update(repo=str(repo.root), url=url)
    demo.say(f"   swamp serve, in a temporary repo {repo.root}: listening on {url}")

    from swamp.bookkeeping.tokens import TokenBook
    from swamp.store.records import SqliteRecords

    db = SqliteRecords(repo.open_store())  # as the CLI on the repo writes it
    try:
        _, credential = await TokenBook(db).mint(
            FLEET, duration_seconds=3600, max_enrollments=count
        )
    finally:
        await db.aclose()
    demo.say(
        f"   a fleet token '{FLEET}' for {count} machines (its secret is shown once; only a hash"
    )
    demo.say(f"   is stored): swamp worker token create {FLEET} --max-enrollments {count}")
    # the local admin credential, as the CLI run in the repo presents it
    admin = repo.admin_credential_for(url)
    if admin is None:
        raise SwampError(f"the orchestrator at {url} announced no local admin credential")
    return admin, credential


async def _elastic_queue(demo: Demo, nursery: trio.Nursery, credential: str) -> Member:
    demo.section("A step waits in the elastic queue until a worker enrolls")
    step = Step(demo, {"labels": {"fleet": FLEET}}, 'echo "picked up from the queue"')
    nursery.start_soon(step.run)
    demo.say(f"   swamp model method run command/shell run --label fleet={FLEET}  (no worker yet)")
    queued = await step.reached("queued")
    demo.say(f"   … queued, waiting for a worker matching {queued.requirement}")
    listing = await demo.call("worker.queue.list")
    [demand] = listing["summary"]
    demo.say(
        f"   swamp worker queue: {demand['requirement']}: {demand['waiting']} waiting, "
        f"{demand['connected']} matching workers connected"
    )
    demo.check(
        demand["waiting"] == 1 and demand["connected"] == 0,
        f"the queue should hold the step and no matching worker: {demand}",
    )
    demo.say(f"   starting the first worker process ({FIRST_SLOTS} slots) ...")
    [first] = await start_members(demo, nursery, credential, [FIRST_SLOTS])
    dispatched = await step.reached("dispatched")
    started = await first.line("dispatch_started", dispatchId=dispatched.dispatch_id)
    demo.say(
        f"   {first.name} enrolled → the step was dispatched to it "
        f"{gap_ms(first.enrolled['time'], started['time'])} ms later (the worker's clock)"
    )
    await step.reached("result")
    demo.check(dispatched.worker == first.name, f"dispatched to {dispatched.worker}")
    demo.check(step.succeeded, f"the queued step {step.outcome}")

    def ended(records: list[dict]) -> dict | None:
        found = [r["attributes"] for r in records if r["attributes"].get("queueId")]
        return found[0] if found and found[0]["state"] != "waiting" else None

    # the orchestrator's records (its clock): the wait's episode, written behind, and the
    # worker's enrollment, written before the worker was answered
    episode = await demo.until(
        lambda: demo.call("data.query", {"predicate": 'modelType == "swamp/pending-dispatch"'}),
        lambda reply: ended(reply["records"]),
        what="the queue episode's record to end",
    )
    pool = await demo.call("worker.list")
    enrolled_at = next(w["enrolledAt"] for w in pool["workers"] if w["name"] == first.name)
    demo.say("   the orchestrator's records, on its clock:")
    demo.say(f"     {episode['queuedAt'][11:23]}  the step queued (swamp/pending-dispatch)")
    demo.say(f"     {enrolled_at[11:23]}  {first.name} enrolled (swamp/worker)")
    demo.say(f"     {episode['endedAt'][11:23]}  the wait ended: {episode['state']}")
    demo.check(
        episode["state"] == "dispatched" and episode.get("dispatchId") == dispatched.dispatch_id,
        f"the queue episode ended {episode['state']}",
    )
    demo.check(
        episode["queuedAt"] <= enrolled_at <= episode["endedAt"],
        "queued before the worker enrolled, dispatched after",
    )
    demo.report["queue"] = {
        "listing": listing,
        "episode": episode,
        "enrolledAt": enrolled_at,
        "worker": first.name,
        "dispatchId": dispatched.dispatch_id,
        "workerEvents": list(first.log.events),
        "step": step.summary(),
    }
    demo.proves(
        "demand waits for supply: the step was listed with no worker to match, and the",
        "enrollment itself dispatched it (nothing polls)",
    )
    return first


async def _rest_of_fleet(
    demo: Demo, nursery: trio.Nursery, credential: str, first: Member, count: int
) -> list[Member]:
    demo.section("The rest of the fleet enrolls with the same token")
    rest = await start_members(demo, nursery, credential, [1] * (count - 1))
    members = [first, *rest]
    more = "1 more worker process" if count == 2 else f"{count - 1} more worker processes"
    demo.say(f"   {more} with the same token; the fleet:")
    demo.say(f"   {', '.join(f'{m.name} ({_slots(m.slots)})' for m in members)}")
    demo.proves(
        f"one token, {count} machines: each its own stable name demo-<hash of its machine id>"
    )
    return members


async def _placement(demo: Demo, members: list[Member]) -> None:
    demo.section("Placement: by name, and by label (the least-loaded member)")
    for member in members:
        step = Step(demo, {"target": member.name}, 'echo "hello from pid $PPID on $(uname -sm)"')
        await step.run()
        demo.check(step.succeeded and step.worker == member.name, f"by target: {step.outcome}")
        demo.say(f"   --target {member.name}: ran there, {step.outcome}")
    step = Step(demo, {"labels": {"fleet": FLEET}}, "echo picked by label")
    await step.run()
    demo.check(step.succeeded, f"by label: {step.outcome}")
    demo.check(step.worker == members[0].name, f"by label: ran on {step.worker}")
    demo.say(
        f"   --label fleet={FLEET}: ran on {step.worker}, the member with the most free slots "
        f"({FIRST_SLOTS})"
    )
    demo.proves("a target picks the member; a label picks the least loaded of those matching")


async def _pool(demo: Demo, count: int) -> None:
    demo.section("The pool and a fleet verification")
    pool = await demo.call("worker.list")
    demo.report["workers"] = pool["workers"]
    demo.say("   swamp worker list:")
    demo.say(f"     {'NAME':<16} {'STATUS':<6} {'BUSY':<4} {'PLATFORM':<13} LABELS")
    for w in pool["workers"]:
        labels = ",".join(f"{k}={v}" for k, v in sorted(w["labels"].items()))
        slots = f"{len(w.get('activeDispatchIds', []))}/{w['capacity']}"
        where = f"{w['platform']}/{w['arch']}"
        demo.say(f"     {w['name']:<16} {w['status']:<6} {slots:<4} {where:<13} {labels}")
    verified = await demo.call("worker.verify", timeout=WAIT * 2)
    demo.report["verify"] = verified
    demo.say("   swamp worker verify (the fleet probe, through every seam):")
    for verdict in verified["workers"]:
        seams = ", ".join(
            f"{name} {'ok' if r['ok'] else 'FAILED'}" for name, r in verdict["seams"].items()
        )
        demo.say(f"     {verdict['name']:<16} {verdict['status']:<5} {seams}")
    demo.check(verified["passed"] == count, f"{verified['passed']} of {count} workers passed")
    demo.proves("every member answers end to end: its environment, a capability, the data plane")


async def _fan_out(demo: Demo, members: list[Member]) -> None:
    demo.section("A workflow fan-out over the fleet (forEach over workers.connected)")
    demo.say("   workflows/fleet-uptime.toml: one step per connected member of fleet=demo,")
    demo.say(
        f"   each placed on its member:  swamp workflow run fleet-uptime --input fleet={FLEET}"
    )

    async def shown(payload: dict) -> None:
        from swamp.protocol.messages import StepEvent, decode_event

        event = decode_event(payload)
        if isinstance(event, StepEvent) and event.what == "dispatched":
            demo.say(f"     {event.job}.{event.step} → dispatched to {event.worker}")
        elif isinstance(event, StepEvent) and event.what == "log":
            demo.say(f"       [{event.worker}] {(event.line or '').strip()}")

    reply = await demo.call(
        "workflow.run", {"name": "fleet-uptime", "inputs": {"fleet": FLEET}}, on_event=shown
    )
    run = reply["run"]
    steps = [
        {"name": s["name"], "status": s["status"], "worker": s.get("worker")}
        for job in run["jobs"]
        for s in job["steps"]
    ]
    demo.report["fanOut"] = {"runId": run["runId"], "status": run["status"], "steps": steps}
    on = sorted(s["worker"] for s in steps)
    demo.say(
        f"   run {run['runId'][:8]} {run['status']}: {len(steps)} steps on {len(set(on))} members"
    )
    demo.check(run["status"] == "succeeded", f"the fan-out run {run['status']}")
    demo.check(on == sorted(m.name for m in members), f"the steps ran on {on}")
    demo.proves("the step list is made from the live pool when the run starts: one per member")


async def _drain(demo: Demo, nursery: trio.Nursery, member: Member) -> None:
    demo.section("Drain on SIGTERM: finish the running step, take no new work, exit 0")
    release = demo.root / "release"
    demo.release = release.touch
    held = Step(
        demo,
        {"target": member.name},
        f"while [ ! -e {shlex.quote(str(release))} ]; do sleep 0.1; done; echo finished",
    )
    nursery.start_soon(held.run)
    dispatched = await held.reached("dispatched")
    await member.line("dispatch_started", dispatchId=dispatched.dispatch_id)
    demo.say(f"   a step that runs until the demo releases it: running on {member.name}")
    mark = len(member.log.events)
    member.process.send_signal(signal.SIGTERM)
    draining = await member.line("draining", start=mark)
    demo.say(f"   SIGTERM → {member.name}: draining, {draining['running']} step still running")
    demo.check(draining["running"] == 1, f"draining with {draining['running']} running")

    def free(w: dict) -> int:
        return w["capacity"] - len(w.get("activeDispatchIds", []))

    def draining_listed(reply: dict) -> dict | None:
        found = [w for w in reply["workers"] if w["name"] == member.name]
        return reply if found and found[0]["status"] == "draining" else None

    pool = await demo.until(
        lambda: demo.call("worker.list"),
        draining_listed,
        what=f"the pool to list {member.name} as draining",
    )
    [listed] = [w for w in pool["workers"] if w["name"] == member.name]
    most = max(free(w) for w in pool["workers"] if w["name"] != member.name)
    demo.check(free(listed) > most, f"{member.name} has {free(listed)} free slots, another {most}")
    demo.say(
        f"   swamp worker list: {member.name} draining with {free(listed)} free slots of "
        f"{listed['capacity']}; no other member has more than {most}"
    )
    other = Step(demo, {"labels": {"fleet": FLEET}}, 'echo "taken by a member not draining"')
    await other.run()
    demo.check(other.succeeded and other.worker != member.name, f"the new step {other.outcome}")
    demo.say(
        f"   a new step for fleet={FLEET} (the least-loaded member gets it) ran on "
        f"{other.worker}, not on {member.name}"
    )
    release.touch()
    await held.reached("result")
    demo.check(held.succeeded and "finished" in held.lines, f"the held step {held.outcome}")
    demo.say(f"   released: the step finished on {member.name} ({held.outcome})")
    code = await member.exited()
    await member.line("stopped", start=mark)
    after = member.log.events[mark:]
    demo.say(f"   {member.name}: {' → '.join(e['event'] for e in after)}; exit status {code}")
    demo.check(code == 0, f"{member.name} exited {code}")
    demo.check(
        not any(e["event"] == "dispatch_started" for e in after),
        f"{member.name} started a dispatch after SIGTERM",
    )

    def gone(reply: dict) -> dict | None:
        found = [w for w in reply["workers"] if w["name"] == member.name]
        return found[0] if found and found[0]["status"] == "disconnected" else None

    left = await demo.until(
        lambda: demo.call("worker.list", {"all": True}),
        gone,
        what=f"{member.name} to leave the pool",
    )
    demo.say(f"   swamp worker list --all: {member.name} disconnected: {left['disconnectReason']}")
    demo.report["drain"] = {
        "worker": member.name,
        "exitCode": code,
        "signalledAt": mark,  # the index in ``events`` of the first line after SIGTERM
        "events": list(member.log.events),
        "listedDraining": pool["workers"],
        "heldStep": held.summary(),
        "duringDrain": other.summary(),
        "left": left,
    }
    demo.proves(
        "SIGTERM is a drain: the orchestrator heard of it at once and sent the new step",
        "elsewhere; the running step finished and reached its client; the worker exited 0",
    )
