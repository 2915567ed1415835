"""The demo: real ``swamp serve`` and ``swamp worker connect`` processes, driven as a user would."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

import trio

from swamp import client
from swamp.bookkeeping.tokens import TokenBook
from swamp.processes import start_serve, start_worker, stop_all, wait_enrolled
from swamp.repo import Repo


async def run_demo(count: int, keep: bool, as_json: bool) -> int:
    say = (lambda *a, **k: None) if as_json else print
    root = Path(tempfile.mkdtemp(prefix="swamp-demo-"))
    repo, _ = Repo.init(root / "repo")
    say(f"1. repo {repo.root}")
    processes: list[trio.Process] = []
    report: dict = {"repo": str(repo.root), "runs": []}
    env = dict(os.environ)
    try:
        async with trio.open_nursery() as drains:
            await _demo_body(repo, env, count, processes, report, say, drains)
            drains.cancel_scope.cancel()
    finally:
        await stop_all(processes)
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    say("9. everything shut down cleanly" + (f"; repo kept at {repo.root}" if keep else ""))
    if as_json:
        print(json.dumps(report, indent=2))
    passed = report.get("verify", {}).get("passed")
    return 0 if report.get("succeeded") == count + 1 and passed == count else 1


async def _demo_body(repo, env, count, processes, report, say, drains) -> None:
    """Start the processes and drive them; ``processes`` collects them for the caller's cleanup."""
    server, server_lines, url = await start_serve(repo.root, env=env)
    processes.append(server)
    drains.start_soon(server_lines.drain)
    say(f"2. orchestrator listening on {url}")
    report["url"] = url
    admin = repo.admin_credential_for(url)  # the local credential, as the CLI in the repo uses

    store = repo.open_store()
    _, credential = TokenBook(store).mint("demo", duration_seconds=3600, max_enrollments=count)
    store.close()
    say(f"3. minted one fleet token 'demo' for {count} machines (only its hash is stored)")

    readers = []
    for i in range(count):
        worker, reader = await start_worker(url, credential, "--label", f"slot={i}", env=env)
        processes.append(worker)
        readers.append(reader)
    names = [event["workerName"] for event in await wait_enrolled(readers)]
    for reader in readers:
        drains.start_soon(reader.drain)
    say(f"4. {count} worker processes enrolled with it: {', '.join(names)}")

    async def run(placement: dict, command: str) -> dict:
        lines: list[str] = []

        async def on_event(event: dict) -> None:
            if event.get("kind") == "log":
                lines.append(event["line"])
                say(f"     [{event.get('worker')}] {event['line']}")

        result = await client.call(
            url,
            "model.method.run",
            {
                "model": "command/shell",
                "method": "run",
                "args": {"command": command},
                "placement": placement,
            },
            timeout=60,
            on_event=on_event,
            server_token=admin,
        )
        report["runs"].append(
            {
                "placement": placement,
                "worker": result["worker"],
                "status": result["status"],
                "output": lines,
            }
        )
        return result

    say("5. command/shell run on each worker by target:")
    for name in names:
        result = await run({"target": name}, 'echo "hello from pid $PPID on $(uname -sm)"')
        say(f"   ran on {result['worker']}: {result['status']} in {result['durationMs']}ms")
    say("6. and once by the fleet label fleet=demo (the least-loaded member):")
    result = await run({"labels": {"fleet": "demo"}}, "echo picked by label")
    say(f"   ran on {result['worker']}: {result['status']}")

    pool = await client.call(url, "worker.list", {}, server_token=admin)
    report["workers"] = pool["workers"]
    say("7. the pool (swamp worker list):")
    for w in pool["workers"]:
        labels = ",".join(f"{k}={v}" for k, v in sorted(w["labels"].items()))
        say(f"   {w['name']:<16} {w['status']:<6} {w['platform']}/{w['arch']}  {labels}")
    verified = await client.call(url, "worker.verify", {}, timeout=120, server_token=admin)
    report["verify"] = verified
    say("8. swamp worker verify (the fleet probe, every seam):")
    for verdict in verified["workers"]:
        seams = ", ".join(
            f"{name} {'ok' if r['ok'] else 'FAILED'}" for name, r in verdict["seams"].items()
        )
        say(f"   {verdict['name']:<16} {verdict['status']:<5} {seams}")
    records = len([1 for r in report["runs"] if r["status"] == "succeeded"])
    report["succeeded"] = records
