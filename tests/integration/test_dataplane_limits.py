"""What a worker-token holder can make the data plane do: write without end, query without end.

The attack found by the second hostile pass: one dispatch wrote 600 MB to its own model, then
kept queries in flight over it; admin calls stalled 15 s and an innocent worker was dropped for
missed heartbeats. Each part is repeated here against a real ``swamp serve``.
"""

import json
import sqlite3
import time

import pytest
import trio

from swamp import client
from swamp.repo import Repo
from tests.integration.conftest import logs_of, result_of
from tests.integration.hostile import rss_bytes

pytestmark = pytest.mark.integration

SEEDED = 120_000


def test_a_dispatch_cannot_write_past_its_quota(cluster):
    cluster.serve("--write-quota-bytes", "1MiB", "--write-quota-records", "20")
    cluster.worker(cluster.mint("w1"))

    def hoard(count: int, size: int) -> dict:
        code, lines = cluster.run(
            "test/steps", "hoard", "--arg", f"count={count}", "--arg", f"size={size}",
            "--target", "w1",
        )  # fmt: skip
        assert code == 0, lines
        result = result_of(lines)
        kept = cluster.query(f'modelName == "{result["model"]}" && name != ""', "--all-versions")
        assert len(kept) == result["result"]["kept"]  # what was refused was not kept
        return result["result"]

    # the control: under both quotas every write is kept
    assert hoard(10, 1000) == {"kept": 10}
    # 64 KiB each: the seventeenth would pass 1 MiB
    assert hoard(100, 64 * 1024) == {"kept": 16, "refused": "quota_exceeded"}
    # small ones: the twenty-first record is refused
    assert hoard(100, 10) == {"kept": 20, "refused": "quota_exceeded"}


def test_a_dispatch_cannot_make_the_orchestrator_hold_its_writes(cluster):
    """The quota held, but the bodies did not: 64 writes of 16 MiB at once from one dispatch were
    each read whole before the quota refused them (43 MB → 1.48 GB, 1.09 GB kept). A write
    is refused by its declared length before it is kept, a dispatch has at most two under way
    (held until they are written), and all the bodies being taken in at once are bounded."""
    serve = cluster.serve("--write-quota-bytes", "64MiB")
    cluster.worker(cluster.mint("w1"))
    before = rss_bytes(serve.p.pid)
    code, lines = cluster.run(
        "test/steps", "parallel_put", "--arg", "count=16", "--arg", f"size={16 * 2**20 - 1}",
        "--target", "w1",
    )  # fmt: skip
    assert code == 0, lines
    outcomes = result_of(lines)["result"]["outcomes"]
    after = rss_bytes(serve.p.pid)
    print(f"outcomes {outcomes}; rss before {before >> 20} MiB, after {after >> 20} MiB")
    # two at a time (the others were told busy, and the worker asked again), until the quota
    # was spent; then each was refused by its declared length, none of it kept
    assert outcomes == {"ok": 4, "quota_exceeded": 12}, outcomes
    assert after - before < 200 * 2**20, (before, after)
    # the control: the same writes one after another are each taken, up to the quota
    code, lines = cluster.run(
        "test/steps", "hoard", "--arg", "count=8", "--arg", f"size={16 * 2**20 - 1}",
        "--target", "w1",
    )  # fmt: skip
    assert result_of(lines)["result"] == {"kept": 4, "refused": "quota_exceeded"}


def _seed(repo, count: int) -> None:
    """``count`` records of the instance ``flood`` (type test/steps), straight into the file
    before the orchestrator starts: what a dispatch could have written over hours."""
    db = sqlite3.connect(Repo(repo).db_path)
    with db:
        db.executemany(
            "INSERT INTO data (model_type, model_name, name, version, spec, attributes, "
            "created_at, created_epoch, expires_epoch, size, content) "
            "VALUES ('test/steps', 'flood', ?, 1, 'progress', ?, '2026-12-01T00:00:00.000Z', "
            "0, NULL, 0, NULL)",
            ((f"item-{i:06d}", json.dumps({"i": i, "pad": "p" * 200})) for i in range(count)),
        )
    db.close()


async def test_a_worker_flooding_queries_holds_up_no_one(cluster):
    """A dispatch keeps queries over a large instance of its own in flight. Queries run off the
    orchestrator's event loop, each within a time budget: admin calls are answered meanwhile,
    and an innocent worker is never dropped for silence."""
    (cluster.repo / "models" / "flood.toml").write_text('type = "test/steps"\n')
    _seed(cluster.repo, SEEDED)
    serve = cluster.serve()
    cluster.worker(cluster.mint("hostile"), "--label", "role=hostile")
    innocent = cluster.worker(cluster.mint("innocent"), "--label", "role=innocent")
    credential = Repo(cluster.repo).admin_credential_for(cluster.url)
    flood = cluster.spawn(
        "model", "method", "run", "flood", "flood", "--label", "role=hostile",
        "--arg", "predicate=attributes.i < 0", "--arg", "queries=8", "--arg", "parallel=4",
        "--server", cluster.url, "--json",
    )  # fmt: skip
    flood.wait_for(lambda e: e.get("event", {}).get("kind") == "dispatched")
    latencies = []
    async with client.connect(cluster.url, server_token=credential) as admin:
        while flood.p.poll() is None:  # admin calls and dispatches all through the flood
            started = time.monotonic()
            listed = await admin.call("worker.list")
            latencies.append(time.monotonic() - started)
            assert {w["name"] for w in listed["workers"]} == {"hostile", "innocent"}
            reply = await admin.call(
                "model.method.run",
                {"model": "swamp/echo", "method": "echo", "placement": {"target": "innocent"}},
            )
            assert reply["status"] == "succeeded", reply
            # an innocent worker's own query is answered, not queued behind the flood's
            started = time.monotonic()
            reply = await admin.call(
                "model.method.run",
                {
                    "model": "test/steps",
                    "method": "query",
                    "args": {"predicate": 'modelType == "test/steps"'},
                    "placement": {"target": "innocent"},
                },
            )
            assert reply["status"] == "succeeded" and reply["result"] == {"count": 0}, reply
            latencies.append(time.monotonic() - started)
            await trio.sleep(0.1)
    assert flood.wait_exit() == 0, flood.lines[-5:]
    report = json.loads(logs_of(flood.events())[-1])
    latencies.sort()
    print(f"flood {report}; admin calls {len(latencies)}, worst {latencies[-1]:.3f}s")
    # the flood did run: each query scanned the whole instance (or was stopped at its budget)
    assert sum(report["outcomes"].values()) == 8, report
    # each answered, stopped at its budget, or (waiting behind its own others) told to ask again
    assert set(report["outcomes"]) <= {"ok", "query_timeout", "busy"}, report
    # no one was held up for long enough to be dropped
    assert "no heartbeat from worker innocent" not in serve.log.read_text()
    assert not [e for e in innocent.events() if e.get("event") == "disconnected"]
    assert [w["status"] for w in cluster.workers() if w["name"] == "innocent"] == ["idle"]
