"""Fleet tokens with real processes: one token, many machines, each a named, labelled member."""

import hashlib
import json
import signal
import sqlite3
import uuid

import pytest
import trio
import trio_websocket

from swamp.protocol.frames import PROTOCOL_VERSION
from tests.integration.conftest import logs_of, result_of, wait_until

pytestmark = pytest.mark.integration

CLASH_A, CLASH_B = "clash-machine-00022136", "clash-machine-00080544"


def _cache(cluster, name, machine_id=None):
    path = cluster.tmp / f"cache-{name}"
    if machine_id:
        path.mkdir()
        (path / "machine-id").write_text(machine_id)
    return path


def _digest(machine_id: str) -> str:
    return hashlib.sha256(machine_id.encode()).hexdigest()


def _tokens(cluster):
    return {
        t["name"]: t
        for t in cluster.cli_json("worker", "token", "list", "--repo-dir", str(cluster.repo))
    }


def _token_versions(cluster, name):
    return len(
        cluster.cli_json(
            "data",
            "query",
            f'modelType == "swamp/enrollment-token" && modelName == "{name}"',
            "--all-versions",
            "--repo-dir",
            str(cluster.repo),
        )
    )


def test_one_token_three_named_labelled_dispatchable_members(cluster):
    cluster.serve()
    made = cluster.cli_json(
        "worker",
        "token",
        "create",
        "pool",
        "--duration",
        "1h",
        "--max-enrollments",
        "3",
        "--repo-dir",
        str(cluster.repo),
    )
    assert made["maxEnrollments"] == 3
    token = made["token"]
    members = {}
    for i in range(3):
        proc = cluster.worker(token, cache_dir=_cache(cluster, f"m{i}"))
        name = proc.wait_for(lambda e: e.get("event") == "enrolled")["workerName"]
        members[name] = proc
    assert len(members) == 3
    machine_ids = [(cluster.tmp / f"cache-m{i}" / "machine-id").read_text() for i in range(3)]
    assert set(members) == {f"pool-{_digest(m)[:8]}" for m in machine_ids}

    listed = {w["name"]: w for w in cluster.workers()}
    assert set(listed) == set(members)
    assert all(w["labels"]["fleet"] == "pool" for w in listed.values())
    for name in members:
        code, lines = cluster.run(
            "command/shell", "run", "--arg", f"command=echo hi-{name}", "--target", name
        )
        assert code == 0 and result_of(lines)["worker"] == name
        assert f"hi-{name}" in logs_of(lines)
    code, lines = cluster.run(
        "command/shell", "run", "--arg", "command=true", "--label", "fleet=pool"
    )
    assert code == 0 and result_of(lines)["worker"] in members

    # a fourth machine: it waits for a place (one frees after a member is gone for the
    # retention), retrying, and never enrolls meanwhile
    fourth = cluster.worker(token, cache_dir=_cache(cluster, "m3"), wait=False)
    told = fourth.wait_for(lambda e: e.get("event") == "fleet_full")
    assert "fleet token 'pool': enrollment allowance exhausted (3 / 3)" in told["reason"]
    fourth.wait_for(lambda e: e.get("event") == "waiting_for_place")
    fourth.signal(signal.SIGTERM)
    assert fourth.wait_exit() == 0
    assert not any(e.get("event") == "enrolled" for e in fourth.events())
    text = cluster.cli("worker", "token", "list", "--repo-dir", str(cluster.repo)).stdout
    assert "3 / 3" in text
    listed_json = _tokens(cluster)["pool"]
    assert listed_json["maxEnrollments"] == 3 and len(listed_json["bindings"]) == 3
    assert {b["workerName"] for b in listed_json["bindings"]} == set(members)

    # a member restarts with the same cache dir: same name, no slot used, no token write
    versions = _token_versions(cluster, "pool")
    name, proc = next(iter(members.items()))
    index = machine_ids.index(next(m for m in machine_ids if name.endswith(_digest(m)[:8])))
    proc.signal(signal.SIGTERM)
    assert proc.wait_exit() == 0
    again = cluster.worker(token, cache_dir=cluster.tmp / f"cache-m{index}")
    assert again.wait_for(lambda e: e.get("event") == "enrolled")["workerName"] == name
    assert _token_versions(cluster, "pool") == versions
    assert "3 / 3" in cluster.cli("worker", "token", "list", "--repo-dir", str(cluster.repo)).stdout
    members[name] = again

    # revoke: every member is cut off at once — before the revoke has answered — and none may
    # come back
    result = cluster.cli("worker", "token", "revoke", "pool", "--server", cluster.url)
    assert result.returncode == 0
    log = cluster.serve_proc.log.read_text()
    for name in members:
        assert f"disconnecting {name}: token 'pool' has been revoked" in log
    for proc in members.values():
        proc.wait_for(lambda e: e.get("event") == "disconnected" and "revoked" in e["reason"])
        assert proc.wait_exit() == 1
        assert "revoked" in [e for e in proc.events() if e.get("event") == "stopped"][-1]["reason"]


def test_a_single_machine_token_is_unchanged(cluster):
    cluster.serve()
    cluster.worker(cluster.mint("solo"))
    [worker] = cluster.workers()
    assert worker["name"] == "solo" and "fleet" not in worker["labels"]
    assert _tokens(cluster)["solo"]["maxEnrollments"] == 1


def test_a_worker_keeps_its_own_fleet_label_and_the_orchestrator_warns(cluster):
    serve = cluster.serve()
    token = cluster.mint_fleet("pool", "2")
    proc = cluster.worker(token, "--label", "fleet=gpus")
    name = proc.wait_for(lambda e: e.get("event") == "enrolled")["workerName"]
    assert cluster.workers()[0]["labels"] == {"fleet": "gpus"}
    wait_until(
        lambda: f"worker {name} supplies its own fleet label 'gpus'" in serve.log.read_text(),
        what="the warning in the orchestrator's log",
    )


def test_forced_suffix_clash_gives_two_distinct_stable_names(cluster):
    cluster.serve()
    token = cluster.mint_fleet("pool", "unlimited")
    a = cluster.worker(token, cache_dir=_cache(cluster, "a", CLASH_A))
    b = cluster.worker(token, cache_dir=_cache(cluster, "b", CLASH_B))
    name_a = a.wait_for(lambda e: e.get("event") == "enrolled")["workerName"]
    name_b = b.wait_for(lambda e: e.get("event") == "enrolled")["workerName"]
    assert name_a == f"pool-{_digest(CLASH_A)[:8]}"
    assert name_b == f"pool-{_digest(CLASH_B)[:9]}"
    # both restart (B first this time): each keeps the name stored in its binding
    for proc in (a, b):
        proc.signal(signal.SIGTERM)
        assert proc.wait_exit() == 0
    b2 = cluster.worker(token, cache_dir=cluster.tmp / "cache-b")
    a2 = cluster.worker(token, cache_dir=cluster.tmp / "cache-a")
    assert b2.wait_for(lambda e: e.get("event") == "enrolled")["workerName"] == name_b
    assert a2.wait_for(lambda e: e.get("event") == "enrolled")["workerName"] == name_a


def test_records_of_an_older_version_are_moved_to_binding_records_at_boot(cluster):
    """A repo written by an older swamp: a single-machine token in the oldest shape
    (``boundMachineId``) and a fleet token listing its bindings inline. The next boot moves the
    bindings to records of their own; the bound machines keep their names, the places left are
    counted right."""
    single = cluster.mint("old")
    fleet = cluster.mint_fleet("oldfleet", "3")
    db = sqlite3.connect(cluster.repo / ".swamp" / "swamp.db")
    for name, change in (
        (
            "old",
            {
                "state": "enrolled",
                "boundMachineId": "legacy-machine-1",
                "enrolledAt": "2026-01-01T00:00:00.000Z",
            },
        ),
        (
            "oldfleet",
            {
                "state": "enrolled",
                "bindings": [
                    {
                        "machineId": f"fleet-machine-{i}",
                        "workerName": f"oldfleet-name{i}",
                        "enrolledAt": "2026-01-01T00:00:00.000Z",
                    }
                    for i in (1, 2)
                ],
            },
        ),
    ):
        query = "SELECT attributes FROM data WHERE model_name=? AND model_type=?"
        (text,) = db.execute(query, (name, "swamp/enrollment-token")).fetchone()
        attrs = json.loads(text)
        del attrs["enrollments"]
        if name == "old":
            del attrs["maxEnrollments"], attrs["expiresAtEpoch"]
        attrs.update(change)
        db.execute("UPDATE data SET attributes=? WHERE model_name=?", (json.dumps(attrs), name))
    db.commit()
    db.close()
    cluster.serve()
    bound = cluster.worker(single, cache_dir=_cache(cluster, "legacy", "legacy-machine-1"))
    assert bound.wait_for(lambda e: e.get("event") == "enrolled")["workerName"] == "old"
    other = cluster.worker(single, cache_dir=_cache(cluster, "new"), wait=False)
    assert other.wait_exit() == 1
    assert "allowance exhausted" in other.wait_for(lambda e: e.get("event") == "stopped")["reason"]
    again = cluster.worker(fleet, cache_dir=_cache(cluster, "f1", "fleet-machine-1"))
    assert again.wait_for(lambda e: e.get("event") == "enrolled")["workerName"] == "oldfleet-name1"
    third = cluster.worker(fleet, cache_dir=_cache(cluster, "f3"))
    assert third.wait_for(lambda e: e.get("event") == "enrolled")["workerName"].startswith(
        "oldfleet-"
    )
    listed = _tokens(cluster)
    assert listed["old"]["bindings"] == [
        {
            "machineId": "legacy-machine-1",
            "workerName": "old",
            "enrolledAt": "2026-01-01T00:00:00.000Z",
        }
    ]
    assert listed["oldfleet"]["enrollments"] == 3 and len(listed["oldfleet"]["bindings"]) == 3
    assert (
        _token_versions(cluster, "old") == 2
    )  # minted, then moved once; re-enrolling wrote nothing


def test_unlimited_enrolls_twenty_machines(cluster):
    cluster.serve()
    token = cluster.mint_fleet("swarm", "unlimited")
    procs = [cluster.worker(token, wait=False) for _ in range(20)]
    names = {
        p.wait_for(lambda e: e.get("event") == "enrolled", timeout=90)["workerName"] for p in procs
    }
    assert len(names) == 20
    assert (
        "20 / unlimited"
        in cluster.cli("worker", "token", "list", "--repo-dir", str(cluster.repo)).stdout
    )


async def test_two_hundred_racing_enrollments_yield_exactly_ten_bindings(cluster):
    cluster.serve()
    token = cluster.mint_fleet("ten", "10")
    outcomes = []
    go = trio.Event()

    async def machine(i: int) -> None:
        await go.wait()  # 200 machines booting at once: connect and enroll, as a worker does
        while True:
            try:
                async with trio_websocket.open_websocket_url(cluster.url) as ws:
                    await ws.send_message(
                        json.dumps(
                            {
                                "type": "request",
                                "id": "e",
                                "method": "worker.enroll",
                                "params": {
                                    "token": token,
                                    "instanceId": str(uuid.uuid4()),
                                    "machineId": f"racer-{i}",
                                    "protocolVersion": PROTOCOL_VERSION,
                                    "version": "t",
                                    "platform": "linux",
                                    "arch": "x86_64",
                                    "labels": {},
                                    "capacity": 1,
                                },
                            }
                        )
                    )
                    while True:
                        frame = json.loads(await ws.get_message())
                        if frame.get("id") == "e":
                            outcomes.append(frame)
                            return
            except trio_websocket.ConnectionClosed:  # evicted in the burst: retry, as workers do
                await trio.sleep(0.1 + i / 1000)

    with trio.fail_after(120):
        async with trio.open_nursery() as nursery:
            for i in range(200):
                nursery.start_soon(machine, i)
            go.set()
    enrolled = [o for o in outcomes if o["type"] == "response"]
    refused = [o for o in outcomes if o["type"] == "error"]
    assert len(enrolled) == 10 and len(refused) == 190
    assert {o["error"]["code"] for o in refused} == {"fleet_full"}
    assert all("enrollment allowance exhausted (10 / 10)" in o["error"]["message"] for o in refused)
    assert len(_tokens(cluster)["ten"]["bindings"]) == 10


def test_bad_max_enrollments_values(cluster):
    for value in ("0", "-1", "lots", "2.5"):
        result = cluster.cli(
            "worker",
            "token",
            "create",
            "x",
            "--duration",
            "1h",
            "--max-enrollments",
            value,
            "--repo-dir",
            str(cluster.repo),
        )
        assert result.returncode == 2
        assert "a positive integer or unlimited" in result.stderr
    assert _tokens(cluster) == {}


def test_stale_members_are_forgotten_and_their_slots_released(cluster):
    cluster.serve("--worker-retention", "2s", "--grace-window", "1s")
    token = cluster.mint_fleet("eph", "1")
    fleet = cluster.mint_fleet("ephemeral", "2")
    single = cluster.worker(token)
    first = cluster.worker(fleet)
    cluster.worker(fleet)
    gone = first.wait_for(lambda e: e.get("event") == "enrolled")["workerName"]
    first.p.kill()
    single.p.kill()
    # the binding and the worker's record go in one pass, one after the other
    wait_until(
        lambda: (
            len(_tokens(cluster)["ephemeral"]["bindings"]) == 1
            and gone not in {w["name"] for w in cluster.workers("--all")}
        ),
        timeout=40,
        what="the stale binding to be released and the worker forgotten",
    )
    third = cluster.worker(fleet)  # the freed slot admits a new machine
    assert third.wait_for(lambda e: e.get("event") == "enrolled")["workerName"] != gone
    assert len(_tokens(cluster)["eph"]["bindings"]) == 1  # single-machine bindings are kept
