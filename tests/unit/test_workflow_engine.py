"""The workflow engine in-process (``engine_harness``): a real store, workers behind the
engine's seam. A fan-out runs its items at once, each where its expression placed it; conditions
and guards decide what runs; a failure fails what needs it and nothing else."""

import pytest
import trio
import trio.testing

from tests.unit.engine_harness import Worker, open_rig

ECHO = 'task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo"'


@pytest.fixture
async def rig(tmp_path):
    workers = (
        Worker("edge-1", {"fleet": "edge"}),
        Worker("edge-2", {"fleet": "edge"}),
        Worker("core", {"fleet": "core"}),
    )
    async with open_rig(tmp_path, *workers) as rig:
        yield rig


async def test_a_fan_out_runs_every_item_at_once_each_where_it_was_placed(rig):
    count = "${{ size(self.w.labels) }}"
    rig.workflow(
        "fan",
        f"""\
        name = "fan"
        [inputs.properties.fleet]
        type = "string"
        [[jobs]]
        name = "j"
        [[jobs.steps]]
        name = "ping"
        forEach = {{ item = "w", in = "${{{{ workers.connected({{'fleet': inputs.fleet}}) }}}}" }}
        target = "${{{{ self.w.name }}}}"
        {ECHO}, inputs = {{ message = "hi ${{{{ self.w.name }}}} of {count}" }} }}
        [[jobs.steps]]
        name = "after"
        dependsOn = [{{ step = "ping", condition = {{ type = "succeeded" }} }}]
        {ECHO} }}
        """,
    )
    gates = [rig.fleet.hold("ping-edge-1"), rig.fleet.hold("ping-edge-2")]
    async with trio.open_nursery() as nursery:
        ran: list[dict] = []

        async def run() -> None:
            ran.append(await rig.run("fan", {"fleet": "edge"}))

        nursery.start_soon(run)
        one = await rig.fleet.started("ping-edge-1")
        two = await rig.fleet.started("ping-edge-2")
        await trio.testing.wait_all_tasks_blocked()
        # both items run at once, each on the worker its expression named; nothing follows yet
        assert rig.fleet.running() == {"edge-1": {"ping-edge-1"}, "edge-2": {"ping-edge-2"}}
        assert (one.worker, one.args) == ("edge-1", {"message": "hi edge-1 of 1"})
        assert (two.worker, two.args) == ("edge-2", {"message": "hi edge-2 of 1"})
        assert sorted(d.step for d in rig.fleet.dispatches) == ["ping-edge-1", "ping-edge-2"]
        for gate in gates:
            gate.set()
    [record] = ran
    assert record["status"] == "succeeded"
    steps = rig.steps(record)
    assert list(steps) == ["ping-edge-1", "ping-edge-2", "after"]
    assert {n: (s["status"], s["worker"]) for n, s in steps.items() if n != "after"} == {
        "ping-edge-1": ("succeeded", "edge-1"),
        "ping-edge-2": ("succeeded", "edge-2"),
    }
    assert steps["after"]["status"] == "succeeded"
    assert [s for _, s in rig.said("dispatched")][-1] == "after"  # only after both ended
    assert [s for _, s in rig.said("succeeded")][-1] == "after"


async def test_conditions_and_guards_decide_what_runs(rig):
    rig.workflow(
        "cond",
        f"""\
        name = "cond"
        [inputs.properties.dry]
        type = "boolean"
        default = false
        [[jobs]]
        name = "j"
        [[jobs.steps]]
        name = "first"
        {ECHO} }}
        [[jobs.steps]]
        name = "on-success"
        dependsOn = [{{ step = "first", condition = {{ type = "succeeded" }} }}]
        {ECHO} }}
        [[jobs.steps]]
        name = "on-failure"
        dependsOn = [{{ step = "first", condition = {{ type = "failed" }} }}]
        {ECHO} }}
        [[jobs.steps]]
        name = "guarded"
        guard = "${{{{ inputs.dry || run.id == '' }}}}"
        {ECHO} }}
        [[jobs.steps]]
        name = "bad-guard"
        guard = "${{{{ inputs.nope }}}}"
        allowFailure = true
        {ECHO} }}
        """,
    )
    record = await rig.run("cond", {"dry": True})
    steps = rig.steps(record)
    assert {n: s["status"] for n, s in steps.items()} == {
        "first": "succeeded",
        "on-success": "succeeded",
        "on-failure": "skipped",
        "guarded": "skipped",
        "bad-guard": "failed",
    }
    assert steps["on-failure"]["reason"] == "first succeeded (needed: failed)"
    assert steps["guarded"]["reason"] == "guard ${{ inputs.dry || run.id == '' }}"
    assert steps["bad-guard"]["error"] == "guard: in ${{ inputs.nope }}: no field 'nope'"
    assert record["status"] == "succeeded"  # the one failure was allowed
    assert {d.step for d in rig.fleet.dispatches} == {"first", "on-success"}

    record = await rig.run("cond", {"dry": False})
    assert rig.steps(record)["guarded"]["status"] == "succeeded"


async def test_a_failure_fails_what_needs_it_and_nothing_else(rig):
    rig.workflow(
        "fails",
        f"""\
        name = "fails"
        [[jobs]]
        name = "build"
        [[jobs.steps]]
        name = "compile"
        labels = {{ fleet = "core" }}
        {ECHO} }}
        [[jobs.steps]]
        name = "lint"
        {ECHO} }}
        [[jobs]]
        name = "ship"
        dependsOn = [{{ job = "build", condition = {{ type = "succeeded" }} }}]
        [[jobs.steps]]
        name = "upload"
        {ECHO} }}
        [[jobs]]
        name = "report"
        dependsOn = [{{ job = "build", condition = {{ type = "completed" }} }}]
        [[jobs.steps]]
        name = "mail"
        {ECHO}, inputs = {{ message = "${{{{ run.id != '' ? 'done' : 'odd' }}}}" }} }}
        """,
    )
    rig.fleet.fail("compile", "exit 2: no such header")
    record = await rig.run("fails")
    jobs = {j["name"]: j["status"] for j in record["jobs"]}
    assert jobs == {"build": "failed", "ship": "skipped", "report": "succeeded"}
    steps = rig.steps(record)
    assert (steps["compile"]["status"], steps["compile"]["worker"]) == ("failed", "core")
    assert steps["lint"]["status"] == "succeeded"  # a sibling runs on
    assert steps["upload"]["status"] == "skipped"
    assert steps["mail"]["status"] == "succeeded"
    assert record["status"] == "failed"
    assert record["error"] == "build.compile: exit 2: no such header"
    assert [d.args for d in rig.fleet.dispatches if d.step == "mail"] == [{"message": "done"}]
    finished = [e for e in rig.events if e.get("kind") == "run" and e["what"] == "finished"]
    assert [(e["status"], e["detail"]) for e in finished] == [
        ("failed", "build.compile: exit 2: no such header")
    ]
