"""A dispatch must be acknowledged, and may run only so long.

The attack of the second hostile pass: a worker on a plain token claimed a label and 1024 slots,
received every matching step, and never answered while it kept pinging; the steps waited
forever (a queue timeout no longer applies once a step is dispatched). Now a worker that says
nothing of a dispatch within a few heartbeats has it taken back, is marked and gets no more
work, and the step runs elsewhere; and a run or a step may say how long it may run at all.
"""

import uuid

import pytest
import trio

from tests.integration.conftest import result_of, wait_until
from tests.integration.hostile import RawSocket, enroll_params

pytestmark = pytest.mark.integration


class BlackHole:
    """A hand-made worker that takes every dispatch and never answers, while it pings."""

    def __init__(self, ws: RawSocket) -> None:
        self.ws = ws
        self.dispatches: list[dict] = []
        self.cancels: list[str] = []

    async def serve(self) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._ping)
            while (frame := await self.ws.next_frame()) is not None:
                if frame.get("method") == "worker.dispatch":
                    self.dispatches.append(frame["params"])
                elif frame.get("type") == "cancel":
                    self.cancels.append(frame.get("id"))
            nursery.cancel_scope.cancel()

    async def _ping(self) -> None:
        while True:  # looks alive: never dropped for silence
            await self.ws.send({"type": "ping"})
            await trio.sleep(0.3)


async def test_a_worker_that_never_answers_cannot_hold_steps(cluster):
    cluster.serve()
    honest = cluster.worker(cluster.mint("honest"), "--label", "gpu=true")
    token = cluster.mint("hole")  # first: a socket has only seconds to enroll
    ws = await RawSocket.open(cluster.url)
    hole_params = enroll_params(token, labels={"gpu": "true"}, capacity=1024)
    reply = await ws.request("worker.enroll", hole_params)
    assert reply["type"] == "response" and reply["result"]["capacity"] == 64, reply
    hole = BlackHole(ws)

    def attack() -> None:  # the CLI side, in a thread: the black hole keeps serving meanwhile
        # the honest worker is busy for a moment, so the next steps go to the most free slots
        busy = cluster.spawn(
            "model", "method", "run", "test/steps", "wait", "--arg", "seconds=4",
            "--target", "honest", "--server", cluster.url, "--json",
        )  # fmt: skip
        busy.wait_for(lambda e: e.get("event", {}).get("kind") == "dispatched")
        runs = [
            cluster.spawn(
                "model",
                "method",
                "run",
                "swamp/echo",
                "echo",
                "--label",
                "gpu=true",
                "--server",
                cluster.url,
                "--json",
            )  # fmt: skip
            for _ in range(3)
        ]
        for run in runs:  # each went to the black hole first (the attack happened)...
            run.wait_for(lambda e: e.get("event", {}).get("worker") == "hole")
        # ...was taken back, and ran on the honest worker
        for run in runs:
            run.wait_for(lambda e: e.get("event", {}).get("kind") == "redispatch")
            done = run.wait_for(lambda e: "result" in e, timeout=60)
            assert run.wait_exit() == 0
            assert done["result"]["status"] == "succeeded" and done["result"]["worker"] == "honest"
        assert busy.wait_exit() == 0  # dispatched longer than the deadline, acknowledged: kept

    async with trio.open_nursery() as nursery:
        nursery.start_soon(hole.serve)
        await trio.to_thread.run_sync(attack)
        # read while it still pings: silent, it would be dropped (and listed disconnected)
        listed = {w["name"]: w for w in await trio.to_thread.run_sync(cluster.workers)}
        nursery.cancel_scope.cancel()
    assert len(hole.dispatches) >= 1 and hole.cancels  # it was told to let go
    assert listed["hole"]["status"] == "unresponsive"
    assert "said nothing of dispatch" in listed["hole"]["unresponsiveReason"]
    assert listed["honest"]["status"] == "idle"
    assert not [e for e in honest.events() if e.get("event") == "disconnected"]
    await ws.aclose()
    # reconnecting does not clear the mark: the machine is held back for a while, so it does
    # not attract the steps it let down again by being fresh and least loaded
    again = await RawSocket.open(cluster.url)
    reply = await again.request("worker.enroll", dict(hole_params, instanceId=str(uuid.uuid4())))
    assert reply["type"] == "response", reply
    async with trio.open_nursery() as nursery:  # answering pings meanwhile, as above
        nursery.start_soon(again.wait_closed)
        listed = {w["name"]: w for w in await trio.to_thread.run_sync(cluster.workers)}
        nursery.cancel_scope.cancel()
    assert listed["hole"]["status"] == "unresponsive", listed["hole"]
    assert "held back" in listed["hole"]["unresponsiveReason"]
    code, lines = await trio.to_thread.run_sync(
        lambda: cluster.run("swamp/echo", "echo", "--label", "gpu=true")
    )
    assert code == 0 and result_of(lines)["worker"] == "honest"
    await again.aclose()


def test_a_run_or_a_step_may_say_how_long_it_may_run(cluster):
    cluster.serve()
    cluster.worker(cluster.mint("w1"))
    # the control: within its timeout a run succeeds (and a long one is acknowledged)
    code, lines = cluster.run(
        "test/steps", "wait", "--arg", "seconds=4", "--timeout", "60s", "--target", "w1"
    )
    assert code == 0, lines
    # past it, the method is stopped on the worker and the run fails with its own code
    code, lines = cluster.run(
        "test/steps", "wait", "--arg", "seconds=600", "--timeout", "2s", "--target", "w1"
    )
    error = lines[-1]["error"]
    assert code == 1 and error["code"] == "execution_timeout", lines
    assert "w1" in error["message"] and "timeout" in error["message"]
    # the model's own default, and the worker's slot is free again at once
    (cluster.repo / "models" / "slow.toml").write_text('type = "test/steps"\ntimeout = "2s"\n')
    code, lines = cluster.run("slow", "wait", "--arg", "seconds=600", "--target", "w1")
    assert code == 1 and lines[-1]["error"]["code"] == "execution_timeout", lines
    code, lines = cluster.run("swamp/echo", "echo", "--target", "w1")
    assert code == 0 and result_of(lines)["worker"] == "w1"
    # a run's own --timeout beats the model's
    code, lines = cluster.run(
        "slow", "wait", "--arg", "seconds=3", "--timeout", "1m", "--target", "w1"
    )
    assert code == 0, lines
    # bad input is one line, exit 2, before anything runs
    bad = cluster.cli(
        "model", "method", "run", "swamp/echo", "echo", "--timeout", "soon", "--server", cluster.url
    )
    assert bad.returncode == 2 and "--timeout" in bad.stderr and "Traceback" not in bad.stderr
    # a workflow step's timeout
    (cluster.repo / "workflows" / "slow.toml").write_text(
        'name = "slow"\n[[jobs]]\nname = "j"\n[[jobs.steps]]\nname = "s"\ntarget = "w1"\n'
        'timeout = "2s"\n[jobs.steps.task]\ntype = "model_method"\nmodelType = "test/steps"\n'
        'modelName = "slow-step"\nmethodName = "wait"\ninputs = { seconds = 600 }\n'
    )
    ran = cluster.cli("workflow", "run", "slow", "--server", cluster.url, "--json")
    assert ran.returncode == 1, ran.stderr
    assert "execution_timeout" in ran.stdout or "ran longer than its timeout" in ran.stdout
    wait_until(
        lambda: [w for w in cluster.workers() if w["name"] == "w1" and w["status"] == "idle"],
        what="w1 idle again",
    )
