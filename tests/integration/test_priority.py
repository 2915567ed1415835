"""Priority and fair share on real processes: an urgent step passes a backlog, two submitters
(two server tokens) take turns on one slot, and aging lets a low step pass a stream of higher
ones. Orders are read from the dispatch ids, which the orchestrator makes in the order it gives
slots (they sort by creation time); nothing here waits on time."""

import httpx
import pytest
import trio
from prometheus_client.parser import text_string_to_metric_families

from swamp.client import connect
from swamp.repo import Repo
from tests.integration.conftest import Proc, wait_until

pytestmark = pytest.mark.integration

PER_SOCKET = 50  # under an admin socket's 64 calls in flight


def _echo(lane: str, **more) -> dict:
    return {
        "model": "swamp/echo",
        "method": "echo",
        "placement": {"labels": {"lane": lane}},
        **more,
    }


async def _backlog(url: str, credential: str, params: dict, count: int, nursery, done: list):
    """``count`` steps with ``params`` from ``credential``'s submitter, each queued before this
    returns (their results go to ``done``)."""
    queued = trio.Semaphore(0)

    async def on_event(event: dict) -> None:
        if event.get("kind") == "queued":
            queued.release()

    async def socket(n: int, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with connect(url, server_token=credential) as channel:
            await channel.call("server.info", {})  # an admin socket now: 64 calls in flight
            task_status.started()
            async with trio.open_nursery() as calls:
                for _ in range(n):

                    async def one() -> None:
                        done.append(
                            await channel.call(
                                "model.method.run", params, timeout=None, on_event=on_event
                            )
                        )

                    calls.start_soon(one)

    left = count
    while left:
        await nursery.start(socket, min(PER_SOCKET, left))
        left -= min(PER_SOCKET, left)
    for _ in range(count):
        await queued.acquire()


def _result(proc: Proc) -> dict:
    return proc.wait_for(lambda e: "result" in e)["result"]


async def test_an_urgent_step_submitted_last_passes_a_backlog_of_two_hundred(cluster):
    cluster.serve()
    credential = Repo(cluster.repo).admin_credential_for(cluster.url)
    backlog: list[dict] = []
    async with trio.open_nursery() as nursery:
        await _backlog(cluster.url, credential, _echo("one"), 200, nursery, backlog)
        urgent = cluster.spawn(
            "model", "method", "run", "swamp/echo", "echo", "--label", "lane=one",
            "--priority", "10", "--server", cluster.url, "--json",
        )  # fmt: skip
        urgent.wait_for(lambda e: e.get("event", {}).get("kind") == "queued")
        listed = await trio.to_thread.run_sync(
            lambda: cluster.cli_json("worker", "queue", "--server", cluster.url)
        )
        items = listed["items"]
        assert len(items) == 201 and {i["submitter"] for i in items} == {"local"}
        assert sorted(i["priority"] for i in items) == [0] * 200 + [10]
        assert items[-1]["priority"] == 10  # oldest first: it came last

        # the repo's records say the same (written behind: read once they are all there)
        def on_repo() -> list[dict] | None:
            got = cluster.cli_json("worker", "queue", "--repo-dir", str(cluster.repo))["items"]
            return got if len(got) == 201 else None

        recorded = await trio.to_thread.run_sync(lambda: wait_until(on_repo, what="records"))
        assert {(i["priority"], i["submitter"]) for i in recorded} == {(0, "local"), (10, "local")}
        async with httpx.AsyncClient() as http:
            metrics = await http.get(
                cluster.url.replace("ws://", "http://") + "/metrics",
                headers={"Authorization": f"Bearer {credential}"},
            )
        by_priority = {
            s.labels["priority"]: s.value
            for family in text_string_to_metric_families(metrics.text)
            for s in family.samples
            if s.name == "swamp_queue_waiting_by_priority"
        }
        assert by_priority == {"0": 200, "10": 1}
        cluster.worker(cluster.mint("two-slots"), "--label", "lane=one", "--concurrency", "2")
        first = await trio.to_thread.run_sync(lambda: _result(urgent))
    assert first["status"] == "succeeded" and len(backlog) == 200
    assert all(r["status"] == "succeeded" for r in backlog)
    # it went first: before any of the 200 steps that waited longer
    assert first["dispatchId"] < min(r["dispatchId"] for r in backlog)


async def test_two_submitters_with_a_hundred_steps_each_take_turns_on_one_slot(cluster):
    tokens = {
        name: cluster.cli_json("server", "token", "create", name, "--repo-dir", str(cluster.repo))[
            "token"
        ]
        for name in ("alpha", "beta")
    }
    # a 1 ms aging tick: nearly every step arrives in a tick of its own, and beta's all
    # arrive in later ticks than alpha's — the order must not depend on where ticks fall
    cluster.serve("--queue-aging", "1ms")
    done: dict[str, list[dict]] = {"alpha": [], "beta": []}
    async with trio.open_nursery() as nursery:
        for name in ("alpha", "beta"):  # alpha's hundred all wait before beta's first
            await _backlog(cluster.url, tokens[name], _echo("two"), 100, nursery, done[name])
        listed = await trio.to_thread.run_sync(
            lambda: cluster.cli_json("worker", "queue", "--server", cluster.url)
        )
        submitters = [i["submitter"] for i in listed["items"]]
        assert submitters == ["token:alpha"] * 100 + ["token:beta"] * 100
        cluster.worker(cluster.mint("one-slot"), "--label", "lane=two", "--concurrency", "1")
    order = sorted(
        (r["dispatchId"], name) for name, results in done.items() for r in results
    )  # every step has ended here: the nursery waited for all 200 results
    assert [name for _, name in order] == ["alpha", "beta"] * 100


async def test_a_low_step_behind_a_stream_of_higher_ones_still_runs(cluster):
    """Aging, with a short tick (--queue-aging 100ms): the stream keeps a priority-10 step
    waiting at every freed slot, so without aging the priority-0 step would never run."""
    cluster.serve("--queue-aging", "100ms")
    cluster.worker(cluster.mint("one-slot"), "--label", "lane=three", "--concurrency", "1")
    credential = Repo(cluster.repo).admin_credential_for(cluster.url)
    files = cluster.tmp / "holds"
    files.mkdir()
    state: dict[str, str] = {}  # step → queued | dispatched | done, as its client last heard
    changed = trio.Condition()
    passed: list[str] = []  # stream steps waiting when the low one got the slot

    async def now(name: str, what: str) -> None:
        if what == "dispatched" and name == "low":
            passed.extend(n for n, s in state.items() if s == "queued" and n != "low")
        state[name] = what
        async with changed:
            changed.notify_all()

    async def until(check) -> None:
        async with changed:
            while not check():
                await changed.wait()

    async with connect(cluster.url, server_token=credential) as channel:
        await channel.call("server.info", {})

        async def step(name: str, priority: int, hold: bool) -> None:
            params = _echo("three", priority=priority)
            if hold:
                params = dict(params, model="test/steps", method="hold")
                params["args"] = {"until": str(files / name)}

            async def on_event(event: dict) -> None:
                if event.get("kind") in ("queued", "dispatched"):  # (again, if it was bounced)
                    await now(name, event["kind"])

            result = await channel.call("model.method.run", params, timeout=None, on_event=on_event)
            assert result["status"] == "succeeded", result
            await now(name, "done")

        def running() -> list[str]:
            return [n for n, s in state.items() if s == "dispatched"]

        async with trio.open_nursery() as nursery:

            async def ask(name: str, priority: int, hold: bool) -> None:
                nursery.start_soon(step, name, priority, hold)
                await until(lambda: name in state)  # it waits, or has the slot

            await ask("p10-0", 10, True)  # takes the slot
            await ask("low", 0, False)  # waits behind it
            asked = 1
            while asked < 5000:
                await until(lambda: len(running()) == 1 or state["low"] != "queued")
                if state["low"] != "queued":
                    break
                [holding] = running()
                await ask(f"p10-{asked}", 10, True)  # waits: the stream goes on
                asked += 1
                (files / holding).touch()  # the running step ends: its slot is free
                await until(lambda h=holding: state[h] == "done")
            await until(lambda: state["low"] == "done")
            for k in range(asked):  # let every held step end
                (files / f"p10-{k}").touch()
    # when it got the slot, priority-10 steps queued before it was free were still waiting
    assert state["low"] == "done" and passed, state


WORKFLOW = """\
name = "urgent"
priority = 2
labels = { lane = "four" }
[[jobs]]
name = "j"
[[jobs.steps]]
name = "s"
task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }
"""


def test_a_workflow_runs_at_the_priority_it_was_given_on_either_route(cluster):
    (cluster.repo / "workflows" / "urgent.toml").write_text(WORKFLOW)
    (cluster.repo / "workflows" / "here.toml").write_text(
        WORKFLOW.replace("urgent", "here").replace('labels = { lane = "four" }\n', "")
    )
    # straight on the repo there is no queue: the priority is checked, then has nothing to do
    code = cluster.cli("workflow", "run", "here", "--priority", "5", "--json").returncode
    assert code == 0
    for bad in ("101", "high"):
        for args in (
            ("workflow", "run", "here", "--priority", bad),
            ("model", "method", "run", "swamp/echo", "echo", "--priority", bad),
        ):
            refused = cluster.cli(*args)
            assert refused.returncode == 2 and refused.stderr.strip().splitlines() == [
                f"error: invalid --priority {bad!r}: expected a whole number from -100 to 100 "
                "(higher goes first; default 0)"
            ], refused.stderr
    cluster.serve()
    run = cluster.spawn("workflow", "run", "urgent", "--priority", "7", "--server", cluster.url,
                        "--json")  # fmt: skip
    run.wait_for(lambda e: e.get("event", {}).get("what") == "queued")
    [item] = cluster.cli_json("worker", "queue", "--server", cluster.url)["items"]
    assert (item["priority"], item["submitter"], item["workflowName"]) == (7, "local", "urgent")
    cluster.worker(cluster.mint("four"), "--label", "lane=four")
    assert run.wait_exit() == 0
