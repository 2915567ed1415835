"""Identity is the orchestrator's: impostor workers, pinned claims, and text from peers.

The impostor is a hostile client enrolling by hand (a real worker cannot choose its instance
id); every victim and every run is a real ``swamp worker connect`` / CLI process.
"""

import httpx
import pytest
import trio

from swamp.domain.claims import DEFAULT_MAX_CONCURRENCY
from swamp.repo import Repo
from swamp.store.datastore import Datastore, Key, SpecPolicy
from tests.integration.conftest import logs_of, result_of, wait_until
from tests.integration.hostile import RawSocket, enroll_params

pytestmark = pytest.mark.integration


class Impostor:
    """A hand-made worker that would fake success for anything it is sent."""

    def __init__(self, ws: RawSocket, name: str, instance_id: str) -> None:
        self.ws, self.name, self.instance_id, self.dispatches = ws, name, instance_id, []

    @classmethod
    async def enroll(cls, url: str, token: str, **params) -> tuple["Impostor | None", dict]:
        ws = await RawSocket.open(url)
        params = enroll_params(token, **params)
        reply = await ws.request("worker.enroll", params)
        if "error" in reply:
            await ws.aclose()
            return None, reply
        return cls(ws, reply["result"]["workerName"], params["instanceId"]), reply["result"]

    async def serve(self) -> None:
        while (frame := await self.ws.next_frame()) is not None:
            if frame.get("type") == "request" and frame.get("method") == "worker.dispatch":
                self.dispatches.append(frame["params"])
                await self.ws.send(
                    {
                        "type": "response",
                        "id": frame["id"],
                        "result": {
                            "status": "succeeded",
                            "outputs": [],
                            "durationMs": 0,
                            "result": {"faked": True},
                        },
                    }
                )


async def test_an_impostor_gets_none_of_its_victims_targeted_work(cluster):
    cluster.serve()
    victim = cluster.mint("victim")
    cluster.worker(victim)
    victim_id = cluster.workers()[0]["instanceId"]
    pool = cluster.mint_fleet("pool", "5")

    # the victim's name as instance id: not an instance id at all
    _, refused = await Impostor.enroll(cluster.url, pool, instanceId="victim")
    assert (
        refused["error"]["code"] == "invalid_input" and "instanceId" in refused["error"]["message"]
    )
    # the victim's own instance id, copied: refused while the victim is in the pool
    _, refused = await Impostor.enroll(cluster.url, pool, instanceId=victim_id)
    assert refused["error"]["code"] == "conflict"
    # a well-formed impostor claiming the victim's fleet label and 1024 slots is admitted,
    # with at most the default cap of slots...
    impostor, granted = await Impostor.enroll(
        cluster.url, pool, capacity=1024, labels={"fleet": "victim"}
    )
    assert impostor is not None and granted["capacity"] == DEFAULT_MAX_CONCURRENCY
    # ...counted in its token's fleet, whatever fleet label it claims: an autoscaler reading
    # /metrics does not see the victim's fleet grow
    credential = Repo(cluster.repo).admin_credential_for(cluster.url)
    async with httpx.AsyncClient() as http:
        answer = await http.get(
            cluster.url.replace("ws://", "http://") + "/metrics",
            headers={"Authorization": f"Bearer {credential}"},
        )
    metrics = answer.text
    assert f'swamp_slots{{fleet="pool"}} {DEFAULT_MAX_CONCURRENCY}.0' in metrics, metrics
    assert 'swamp_slots{fleet="victim"} 1.0' in metrics  # the victim's own slot, no more
    async with trio.open_nursery() as nursery:
        nursery.start_soon(impostor.serve)
        # ...but work for the victim, by its name or its instance id, goes to the victim
        for target in ("victim", victim_id):
            code, lines = await trio.to_thread.run_sync(
                lambda t=target: cluster.run(
                    "command/shell", "run", "--arg", "command=echo for-the-victim", "--target", t
                )
            )
            assert code == 0 and result_of(lines)["worker"] == "victim", lines
            assert "for-the-victim" in logs_of(lines)
        assert impostor.dispatches == []
        # (the control: its own unique instance id does reach it)
        code, lines = await trio.to_thread.run_sync(
            lambda: cluster.run("swamp/echo", "echo", "--target", impostor.instance_id)
        )
        assert code == 0 and result_of(lines)["worker"] == impostor.name
        assert len(impostor.dispatches) == 1
        nursery.cancel_scope.cancel()
    await impostor.ws.aclose()
    # the refused attempts bound nothing: only the admitted impostor holds a slot of 'pool'
    pool_token = {t["name"]: t for t in cluster.cli_json("worker", "token", "list")}["pool"]
    assert pool_token["enrollments"] == 1


async def test_a_token_pins_and_limits_what_its_workers_claim(cluster):
    cluster.serve()
    cluster.worker(cluster.mint("gpu"), "--label", "gpu=true")
    limited = cluster.cli_json(
        "worker",
        "token",
        "create",
        "pool",
        "--duration",
        "1h",
        "--max-enrollments",
        "5",
        "--label",
        "fleet=pool",
        "--label",
        "zone=eu",
        "--allow-labels",
        "disk",
        "--max-concurrency",
        "2",
    )
    assert limited["pinnedLabels"] == {"fleet": "pool", "zone": "eu"}
    assert limited["allowedLabelKeys"] == ["disk"] and limited["maxConcurrency"] == 2
    token = limited["token"]
    # real worker processes that claim what the token does not allow stop at once, exit 1
    for label, code in (
        ("fleet=gpu", "label_pinned"),
        ("zone=us", "label_pinned"),
        ("gpu=true", "label_not_allowed"),
    ):
        worker = cluster.worker(token, "--label", label, wait=False)
        assert worker.wait_exit() == 1
        stopped = [e for e in worker.events() if e.get("event") == "stopped"][0]
        assert stopped["code"] == code and label.split("=")[0] in stopped["reason"]
    # one within the rules is admitted with the pinned labels and at most 2 slots
    member = cluster.worker(token, "--label", "disk=ssd", "--concurrency", "64")
    enrolled = member.wait_for(lambda e: e.get("event") == "enrolled")
    assert enrolled["capacity"] == 2 and enrolled["requestedCapacity"] == 64
    listed = {w["name"]: w for w in cluster.workers()}[enrolled["workerName"]]
    assert listed["labels"] == {"disk": "ssd", "fleet": "pool", "zone": "eu"}
    assert listed["capacity"] == 2
    # a hand-made impostor fares no better than the real processes
    _, refused = await Impostor.enroll(cluster.url, token, labels={"gpu": "true"})
    assert refused["error"]["code"] == "label_not_allowed"
    impostor, granted = await Impostor.enroll(cluster.url, token, capacity=1024)
    assert granted["capacity"] == 2 and granted["labels"]["fleet"] == "pool"
    await impostor.ws.aclose()
    # four refused enrollments used no slot: the member and the impostor hold the only two
    tokens = {t["name"]: t for t in cluster.cli_json("worker", "token", "list")}
    assert tokens["pool"]["enrollments"] == 2
    # gpu work never reaches the limited fleet
    code, lines = cluster.run(
        "command/shell", "run", "--arg", "command=true", "--label", "gpu=true"
    )
    assert code == 0 and result_of(lines)["worker"] == "gpu"


async def test_control_characters_and_newlines_from_peers_are_refused(cluster):
    serve = cluster.serve()
    token = cluster.mint("w1")
    ws = await RawSocket.open(cluster.url)
    for field, value in (
        ("platform", "\x1b[2J\x1b[Hlinux"),
        ("arch", "x86_64\n"),
        ("version", "1.0\r\nINFO forged log line"),
        ("machineId", "m\x07"),
        ("instanceId", "victim\n"),
        ("labels", {"k": "v\n"}),
        ("labels", {"k\x1b[31m": "v"}),
        ("token", "w1\x1b[2J.secret"),
    ):
        reply = await ws.request("worker.enroll", {**enroll_params(token), field: value})
        assert reply["error"]["code"] in ("invalid_input", "frame_too_large"), (field, reply)
    # 10,000 labels: past the message limit before trust, which closes the socket (1009, or a
    # reset if it is still sending; test_bounded has the limit itself)
    big = await RawSocket.open(cluster.url)
    labels = {f"k{i}": "v" * 128 for i in range(10_000)}
    try:
        reply = await big.request("worker.enroll", {**enroll_params(token), "labels": labels})
    except (ConnectionError, trio.BrokenResourceError):
        reply = None
    await big.aclose()
    assert reply is None or reply["error"]["code"] == "frame_too_large", reply
    assert cluster.workers("--all") == []
    assert cluster.query('modelType == "swamp/worker"') == []
    await ws.aclose()
    log = serve.log.read_text()
    assert "\x1b" not in log and "\x07" not in log and "\nINFO forged" not in log


def test_what_peers_wrote_is_escaped_when_shown(cluster):
    """Records written before validation existed (or by anything else) and a command's own
    output reach the terminal escaped, never interpreted."""
    store = Datastore(cluster.repo / ".swamp" / "swamp.db")
    store.write(
        Key("swamp/worker", "old", "state"),
        {
            "name": "old",
            "status": "idle",
            "labels": {"k": "v"},
            "platform": "\x1b[2J\x1b[H",
            "arch": "x86_64\nfake row",
            "capacity": 1,
            "activeDispatchIds": [],
            "lastSeenAt": "t",
            "tokenName": "old",
        },
        policy=SpecPolicy("state"),
    )
    store.close()
    listed = cluster.cli("worker", "list", "--all")
    assert listed.returncode == 0
    assert "\x1b" not in listed.stdout and "\\x1b[2J" in listed.stdout
    assert "x86_64\\x0afake row" in listed.stdout
    cluster.serve()
    cluster.worker(cluster.mint("w1"))
    ran = cluster.cli(
        "model",
        "method",
        "run",
        "command/shell",
        "run",
        "--arg",
        "command=printf '\\033]0;owned\\007\\033[2Jvisible\\n'",
        "--target",
        "w1",
    )
    assert ran.returncode == 0, ran.stderr
    assert "\x1b" not in ran.stdout and "\x07" not in ran.stdout
    assert "\\x1b]0;owned\\x07\\x1b[2Jvisible" in ran.stdout
    wait_until(lambda: cluster.workers()[0]["status"] == "idle", what="the worker idle")


def test_metrics_count_a_worker_in_the_fleet_its_token_pins(cluster):
    """Two tokens that pin one fleet label (a token being rotated) are one fleet to an
    autoscaler; a token that pins none is a fleet of its own name."""
    cluster.serve()
    for name in ("gpu-old", "gpu-new"):
        token = cluster.mint_fleet(name, "2", "--label", "fleet=gpu")
        cluster.worker(token, cache_dir=cluster.tmp / name)
    cluster.worker(cluster.mint("solo"))
    credential = Repo(cluster.repo).admin_credential_for(cluster.url)
    metrics = httpx.get(
        cluster.url.replace("ws://", "http://") + "/metrics",
        headers={"Authorization": f"Bearer {credential}"},
    ).text
    assert 'swamp_slots{fleet="gpu"} 2.0' in metrics, metrics
    assert 'swamp_slots{fleet="solo"} 1.0' in metrics
    assert "gpu-old" not in metrics and "gpu-new" not in metrics
