"""The elastic queue on real processes: steps wait for a free matching worker and are dispatched
on the event that frees one; waits are records; the demand view and /metrics show them."""

import json
import signal
import time

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from swamp.client import connect
from swamp.repo import Repo
from tests.integration.conftest import Proc, wait_until
from tests.integration.hostile import RawSocket

pytestmark = pytest.mark.integration


def _run_in_background(cluster, *args: str) -> Proc:
    return cluster.spawn("model", "method", "run", *args, "--server", cluster.url, "--json")


def _queued(proc: Proc) -> dict:
    return proc.wait_for(lambda e: e.get("event", {}).get("kind") == "queued")["event"]


def _pending(cluster) -> dict[str, dict]:
    return {
        r["attributes"]["queueId"]: r["attributes"]
        for r in cluster.query('modelType == "swamp/pending-dispatch"')
    }


def _error(proc: Proc) -> dict:
    return next(e["error"] for e in proc.events() if "error" in e)


def _epoch(text: str) -> float:
    from datetime import datetime

    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


async def test_twelve_steps_on_three_workers_of_two_slots_wait_for_a_free_slot(cluster):
    cluster.serve()
    token = cluster.mint_fleet("pool", "3")
    for i in range(3):
        cluster.worker(token, "--concurrency", "2", cache_dir=cluster.tmp / f"cache-{i}")
    credential = Repo(cluster.repo).admin_credential_for(cluster.url)
    release = cluster.tmp / "release"  # every step runs until the test creates it
    params = {
        "model": "test/steps",
        "method": "hold",
        "args": {"until": str(release)},
        "placement": {"labels": {"fleet": "pool"}},
    }
    results: list[dict] = []

    async def one() -> None:
        async with connect(cluster.url, server_token=credential) as channel:
            results.append(await channel.call("model.method.run", params, timeout=120))

    def six_waiting() -> dict | None:
        listed = cluster.cli_json("worker", "queue", "--server", cluster.url)
        return listed if len(listed["items"]) == 6 else None

    async with trio.open_nursery() as runs:
        for _ in range(12):  # at once: twelve clients, one step each
            runs.start_soon(one)
        # the demand view, read through the CLI while six of them wait for a slot
        listed = await trio.to_thread.run_sync(
            lambda: wait_until(six_waiting, timeout=60, what="six steps to wait")
        )
        [summary] = listed["summary"]
        assert summary["requirement"] == "fleet=pool"
        assert summary["connected"] == 3 and summary["freeSlots"] == 0
        assert summary["waiting"] == 6
        seen_waiting = {item["queueId"] for item in listed["items"]}
        release.touch()

    assert [r["status"] for r in results] == ["succeeded"] * 12

    def all_completed() -> list[dict] | None:
        # the last six end at once: their rows may reach the store just after their results
        leases = [r["attributes"] for r in cluster.query('modelType == "swamp/step-lease"')]
        done = len(leases) == 12 and all(lease["state"] == "completed" for lease in leases)
        return leases if done else None

    leases = wait_until(all_completed, what="twelve completed leases")
    by_worker: dict[str, list[tuple[float, float]]] = {}
    for lease in leases:
        by_worker.setdefault(lease["workerName"], []).append(
            (_epoch(lease["createdAt"]), _epoch(lease["endedAt"]))
        )
    assert len(by_worker) == 3
    for spans in by_worker.values():
        for start, _ in spans:  # never more than two running at once on one worker
            assert sum(1 for s, e in spans if s <= start < e) <= 2
    # the six that waited are records, each dispatched as a slot of its worker freed
    episodes = list(_pending(cluster).values())
    assert len(episodes) == 6 and all(e["state"] == "dispatched" for e in episodes)
    assert seen_waiting == {e["queueId"] for e in episodes}
    lease_of = {lease["dispatchId"]: lease for lease in leases}
    for episode in episodes:
        lease = lease_of[episode["dispatchId"]]
        started = _epoch(lease["createdAt"])
        freed = [e for s, e in by_worker[lease["workerName"]] if e <= started]
        # dispatched when a slot of its worker freed (how soon is the queue benchmark's
        # measure; here a loaded machine's margin)
        assert freed and started - max(freed) < 5.0


def test_a_step_waits_for_its_label_then_times_out_or_waits_forever(cluster):
    cluster.serve("--queue-timeout", "1s")
    cluster.worker(cluster.mint("plain"))
    base = ("command/shell", "run", "--arg", "command=echo on-gpu", "--label", "gpu=true")

    # waits (beating the server's 1s), listed on both routes and queryable, until a match enrolls
    run = _run_in_background(cluster, *base, "--queue-timeout", "1m")
    queued = _queued(run)
    assert queued["requirement"] == "labels gpu=true"
    wait_until(
        lambda: cluster.cli_json("worker", "queue", "--repo-dir", str(cluster.repo))["items"],
        what="the waiting record",
    )
    on_repo = cluster.cli_json("worker", "queue", "--repo-dir", str(cluster.repo))
    live = cluster.cli_json("worker", "queue", "--server", cluster.url)
    for listed in (on_repo, live):
        [item] = listed["items"]
        assert item["queueId"] == queued["queueId"] and item["requirement"] == "gpu=true"
        assert item["modelType"] == "command/shell" and item["methodName"] == "run"
        assert item["priority"] == 0 and item["submitter"] == "local"
        assert listed["summary"][0]["connected"] == 0
    text = cluster.cli("worker", "queue").stdout
    assert "REQUIREMENT" in text and "gpu=true: 1 waiting" in text
    row = text.splitlines()[1].split()  # a run of its own: no workflow, job or step
    assert row[:4] == ["gpu=true", "-", "-", "-"] and row[5] == "run"
    assert row[-2:] == ["0", "local"]  # its priority, and who asked
    assert _pending(cluster)[queued["queueId"]]["state"] == "waiting"

    cluster.worker(cluster.mint("gpu"), "--label", "gpu=true")
    assert run.wait_exit() == 0
    assert any(e.get("event", {}).get("line") == "on-gpu" for e in run.events())
    wait_until(
        lambda: _pending(cluster)[queued["queueId"]]["state"] == "dispatched",
        what="the record to end dispatched",
    )
    assert _pending(cluster)[queued["queueId"]]["dispatchId"]

    # a timeout fails the step with one clear message; the record ends timed_out
    zone = ("command/shell", "run", "--arg", "command=true", "--label", "zone=mars")
    code, lines = cluster.run(*zone, "--queue-timeout", "2s")
    assert code == 1
    assert lines[-1]["error"]["message"] == (
        "timed out waiting for a worker matching labels zone=mars to become available"
    )
    wait_until(
        lambda: _pending(cluster)[lines[0]["event"]["queueId"]]["state"] == "timed_out",
        what="the record to end timed_out",
    )
    assert _pending(cluster)[lines[0]["event"]["queueId"]]["requirement"] == "zone=mars"

    # 0 waits forever, whatever the server's timeout says: a step queued after it under the
    # server's 1s times out, and it is still waiting (its 1s, had it one, would have been up
    # first)
    forever = _run_in_background(cluster, *zone, "--queue-timeout", "0")
    waiting = _queued(forever)
    code, lines = cluster.run(*zone)
    assert code == 1 and lines[-1]["error"]["code"] == "queue_timeout"
    live = cluster.cli_json("worker", "queue", "--server", cluster.url)["items"]
    assert [item["queueId"] for item in live] == [waiting["queueId"]]
    assert forever.p.poll() is None
    assert _pending(cluster)[waiting["queueId"]]["state"] == "waiting"
    cluster.worker(cluster.mint("mars"), "--label", "zone=mars")
    assert forever.wait_exit() == 0


def test_a_bad_queue_timeout_is_an_input_error_on_both_commands(cluster):
    result = cluster.cli(
        "model", "method", "run", "command/shell", "run", "--label", "a=b", "--queue-timeout", "5x"
    )
    assert result.returncode == 2 and "invalid --queue-timeout '5x'" in result.stderr
    result = cluster.cli(
        "serve", "--port", "0", "--repo-dir", str(cluster.repo), env={"SWAMP_QUEUE_TIMEOUT": "-1m"}
    )
    assert result.returncode == 2 and "SWAMP_QUEUE_TIMEOUT" in result.stderr


def test_a_waiting_step_is_orphaned_by_an_orchestrator_crash(cluster):
    serve = cluster.serve()
    run = cluster.spawn(
        "model",
        "method",
        "run",
        "command/shell",
        "run",
        "--arg",
        "command=true",
        "--label",
        "gpu=true",
        "--server",
        cluster.url,
    )
    wait_until(
        lambda: cluster.cli_json("worker", "queue", "--repo-dir", str(cluster.repo))["items"],
        what="the waiting record",
    )
    serve.p.kill()
    serve.wait_exit()
    assert run.wait_exit() == 1
    said = [line for line in run.log.read_text().splitlines() if line.strip()]
    assert said[0] == "… queued, waiting for a worker matching labels gpu=true"
    assert len(said) == 2 and said[1].startswith("error: "), said  # one line: what happened
    restarted = cluster.serve()  # a port of its own: nothing needs the old one
    booted = restarted.wait_for(lambda e: e.get("event") == "listening")
    assert booted["reconciled"]["queued"] == 1
    [episode] = _pending(cluster).values()
    assert episode["state"] == "orphaned" and episode["reason"] == "orchestrator restart"
    assert cluster.cli_json("worker", "queue")["items"] == []


def test_metrics_show_supply_and_demand_and_need_a_credential(cluster):
    cluster.serve()
    token = cluster.mint_fleet("pool", "2")
    cluster.worker(token, "--concurrency", "3", cache_dir=cluster.tmp / "c1")
    run = _run_in_background(
        cluster, "command/shell", "run", "--arg", "command=true", "--label", "gpu=true"
    )
    _queued(run)
    http = cluster.url.replace("ws://", "http://") + "/metrics"
    refused = httpx.get(http)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
    scraper = cluster.cli_json("server", "token", "create", "scraper")["token"]
    answer = httpx.get(http, headers={"Authorization": f"Bearer {scraper}"})
    assert answer.status_code == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(answer.text)
        for s in family.samples
    }
    assert samples[("swamp_workers", (("fleet", "pool"), ("status", "idle")))] == 1
    assert samples[("swamp_slots", (("fleet", "pool"),))] == 3
    assert samples[("swamp_slots_busy", (("fleet", "pool"),))] == 0
    assert samples[("swamp_queue_waiting", (("requirement", "gpu=true"),))] == 1
    assert samples[("swamp_queue_oldest_wait_seconds", (("requirement", "gpu=true"),))] >= 0
    run.signal(signal.SIGINT)  # Ctrl-C while queued: the episode ends cancelled
    assert run.wait_exit() != 0
    wait_until(
        lambda: [e["state"] for e in _pending(cluster).values()] == ["cancelled"],
        what="the episode to end cancelled",
    )


async def test_a_stalled_admin_client_with_a_thousand_waiting_steps_stalls_nothing(cluster):
    cluster.serve()
    cluster.worker(cluster.mint("w1"))
    credential = Repo(cluster.repo).admin_credential_for(cluster.url)
    sockets = []
    for s in range(16):  # 16 sockets × 63 requests: each socket's in-flight budget, nearly
        client = await RawSocket.open(
            cluster.url, headers=[("authorization", f"Bearer {credential}")]
        )
        sockets.append(client)
        assert (await client.request("server.info"))["type"] == "response"  # an admin now
        for i in range(63 if s < 15 else 55):
            await client.send(
                {
                    "type": "request",
                    "id": f"r{i}",
                    "method": "model.method.run",
                    "params": {
                        "model": "command/shell",
                        "method": "run",
                        "args": {"command": "true"},
                        "placement": {"labels": {"gpu": "true"}},
                        "queueTimeout": "0",
                    },
                }
            )
        # ...and never reads a single frame

    def waiting() -> int:
        return len(cluster.cli_json("worker", "queue", "--server", cluster.url)["items"])

    await trio.to_thread.run_sync(
        lambda: wait_until(lambda: waiting() == 1000, what="1,000 waiting steps", timeout=60)
    )
    health = cluster.url.replace("ws://", "http://") + "/health"
    for _ in range(5):  # a stall would be for good: the bound is only a loaded machine's margin
        started = time.monotonic()
        listed = await trio.to_thread.run_sync(
            lambda: cluster.cli_json("worker", "list", "--server", cluster.url)
        )
        assert [w["name"] for w in listed["workers"]] == ["w1"]
        async with httpx.AsyncClient() as http:
            assert (await http.get(health, timeout=30)).json()["status"] == "ok"
        assert time.monotonic() - started < 30
    # the worker still runs work meanwhile
    code, lines = await trio.to_thread.run_sync(
        lambda: cluster.run("command/shell", "run", "--arg", "command=echo ok", "--target", "w1")
    )
    assert code == 0, lines
    for client in sockets:
        await client.aclose()
    await trio.to_thread.run_sync(
        lambda: wait_until(lambda: waiting() == 0, what="the queue to empty", timeout=60)
    )
    states = {e["state"] for e in _pending(cluster).values()}
    assert states == {"cancelled"}, json.dumps(sorted(states))
