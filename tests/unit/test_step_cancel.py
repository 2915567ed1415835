"""Cancelling one step of a running workflow (``workflow cancel --step``) in the engine:
steps are told apart by job and name (names may hold dots), a ref that names two running
steps is refused, and a step running a nested workflow cancels its child with the reason."""

from contextlib import asynccontextmanager

import pytest
import trio
import trio.testing

from swamp.errors import UserError
from tests.unit.engine_harness import Worker, open_rig

ECHO = 'task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }'

WF = f"""\
name = "dots"
[[jobs]]
name = "a.b"
[[jobs.steps]]
name = "c"
{ECHO}
[[jobs]]
name = "a"
[[jobs.steps]]
name = "b.c"
{ECHO}
"""


@asynccontextmanager
async def both_running(tmp_path):
    """Job "a.b" step "c" and job "a" step "b.c" running at once (both JOB.STEP "a.b.c"):
    the rig, the run's id, the events that end each step, and where the run's record goes."""
    async with open_rig(tmp_path, Worker("w1")) as rig:
        rig.workflow("dots", WF)
        first, second = rig.fleet.hold("c"), rig.fleet.hold("b.c")
        out: list[dict] = []
        async with trio.open_nursery() as nursery:

            async def run():
                out.append(await rig.run("dots"))

            nursery.start_soon(run)
            await rig.fleet.started("c")
            await rig.fleet.started("b.c")
            await trio.testing.wait_all_tasks_blocked()
            [run_id] = list(rig.engine.running)
            yield rig, run_id, first, second, out


async def test_colliding_places_do_not_crash_the_run(tmp_path):
    async with both_running(tmp_path) as (_, _, first, second, out):
        first.set()  # "a.b"/"c" ends first: its place must not be the other one's
        await trio.testing.wait_all_tasks_blocked()
        second.set()
    [record] = out
    assert record["status"] == "succeeded"


async def test_a_ref_naming_two_running_steps_is_refused_then_reaches_the_one(tmp_path):
    async with both_running(tmp_path) as (rig, run_id, first, second, out):
        # job "a.b" step "c", or job "a" step "b.c": the engine does not guess
        with pytest.raises(UserError, match="more than one running step"):
            rig.engine.cancel_step(run_id, "a.b.c", "stop")
        first.set()  # one of them ends: the ref names one running step now
        await trio.testing.wait_all_tasks_blocked()
        assert rig.engine.cancel_step(run_id, "a.b.c", "stop") is not None
        await trio.testing.wait_all_tasks_blocked()
        second.set()
    [record] = out
    jobs = {j["name"]: j["steps"][0] for j in record["jobs"]}
    assert jobs["a.b"]["status"] == "succeeded"
    assert (jobs["a"]["status"], jobs["a"]["error"]) == ("failed", "stop")


async def test_cancelling_a_nested_workflow_step_cancels_its_child_with_the_reason(tmp_path):
    async with open_rig(tmp_path, Worker("w1")) as rig:
        rig.workflow(
            "child",
            f"""\
name = "child"
[[jobs]]
name = "cj"
[[jobs.steps]]
name = "inner"
{ECHO}
""",
        )
        rig.workflow(
            "parent",
            """\
name = "parent"
[[jobs]]
name = "pj"
[[jobs.steps]]
name = "sub"
task = { type = "workflow", workflowIdOrName = "child" }
""",
        )
        rig.fleet.hold("inner")
        out = []
        async with trio.open_nursery() as nursery:

            async def run():
                out.append(await rig.run("parent"))

            nursery.start_soon(run)
            await rig.fleet.started("inner")
            await trio.testing.wait_all_tasks_blocked()
            parent_id = next(
                i for i, r in rig.engine.running.items() if r.workflow.name == "parent"
            )
            child_id = next(i for i, r in rig.engine.running.items() if r.workflow.name == "child")
            saved = rig.engine.cancel_step(parent_id, "pj.sub", "operator: stuck")
            assert saved is not None
            with trio.fail_after(5):
                await saved.wait()
        [record] = out
        sub = rig.steps(record)["sub"]
        child = (await rig.engine.runs.get(child_id)).to_json()
        assert (sub["status"], sub["error"]) == ("failed", "operator: stuck")
        assert (child["status"], child.get("error")) == ("cancelled", "operator: stuck")
        assert sub.get("childRunId") == child_id
