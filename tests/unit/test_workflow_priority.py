"""Priority in workflow files: a whole number in range on the workflow, a job or a step, the
nearest winning; the run's --priority stands in for the workflow's; every placed step's request
carries it and the run's submitter (a nested run's steps too)."""

import pytest

from swamp.domain.workflow import Placement, parse
from tests.unit.engine_harness import Worker, open_rig

TASK = {"type": "model_method", "modelIdOrName": "swamp/echo", "methodName": "echo"}


def test_priority_is_inherited_downward_and_the_nearest_wins():
    wf, problems = parse(
        {
            "name": "w",
            "priority": 5,
            "jobs": [
                {"name": "a", "priority": -2, "steps": [{"name": "s", "task": TASK}]},
                {"name": "b", "steps": [{"name": "t", "task": TASK, "priority": 100}]},
            ],
        },
        name="w",
    )
    assert problems == []
    [a, b] = wf.jobs
    top = wf.placement
    assert a.steps[0].placement.under(a.placement.under(top)).priority == -2
    assert b.steps[0].placement.under(b.placement.under(top)).priority == 100
    assert Placement().under(Placement()).priority is None


@pytest.mark.parametrize("bad", [101, -101, "5", 1.5, True, "${{ inputs.p }}"])
def test_a_bad_priority_is_a_problem_line_with_its_place(bad):
    _, problems = parse(
        {
            "name": "w",
            "jobs": [{"name": "a", "steps": [{"name": "s", "task": TASK, "priority": bad}]}],
        },
        name="w",
    )
    [problem] = problems
    assert problem.line() == (
        "jobs[0].steps[0].priority: expected a whole number from -100 to 100 (higher goes "
        f"first; default 0), got {bad!r}"
    )


async def test_each_step_asks_with_its_nearest_priority_and_the_runs_submitter(tmp_path):
    async with open_rig(tmp_path, Worker("w", {"pool": "x"})) as rig:
        rig.workflow(
            "inner",
            """\
            name = "inner"
            priority = 1
            [[jobs]]
            name = "j"
            labels = { pool = "x" }
            [[jobs.steps]]
            name = "deep"
            task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }
            """,
        )
        rig.workflow(
            "outer",
            """\
            name = "outer"
            priority = 3
            labels = { pool = "x" }
            [[jobs]]
            name = "plain"
            [[jobs.steps]]
            name = "inherits"
            task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }
            [[jobs.steps]]
            name = "own"
            priority = -7
            task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }
            [[jobs]]
            name = "urgent"
            priority = 9
            [[jobs.steps]]
            name = "nested"
            task = { type = "workflow", workflowIdOrName = "inner" }
            """,
        )
        seen = {}
        run_step = rig.fleet.run_step

        async def capture(request, emit):
            seen[request.step] = (request.priority, request.submitter)
            return await run_step(request, emit)

        rig.engine.host.run_step = capture
        for given, expected in (
            (None, {"inherits": 3, "own": -7, "deep": 9}),
            (-4, {"inherits": -4, "own": -7, "deep": 9}),
        ):
            seen.clear()
            workflow = rig.engine.workflows.checked("outer")
            record = await rig.engine.run(
                workflow, {}, rig.emit, priority=given, submitter="token:ci"
            )
            assert record.status.value == "succeeded"
            assert seen == {name: (p, "token:ci") for name, p in expected.items()}
