"""Workflows on real processes: fan-out over a fleet, a DAG with conditions and caps, data
chained between steps, placed steps through the queue, cancellation and a crash, validation."""

import json
import re
import shutil
import signal
import textwrap
from datetime import datetime
from pathlib import Path

import pytest
import tomli_w
import tomllib

from tests.integration.conftest import ROOT, wait_until

pytestmark = pytest.mark.integration
EXAMPLES = ROOT / "examples" / "workflows"


def _epoch(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _install(cluster, name: str) -> None:
    shutil.copy(EXAMPLES / f"{name}.toml", cluster.repo / "workflows" / f"{name}.toml")


def _write(cluster, name: str, text: str) -> None:
    (cluster.repo / "workflows" / f"{name}.toml").write_text(textwrap.dedent(text))


def _run(cluster, name: str, *args: str) -> tuple[int, dict, list[dict]]:
    result = cluster.cli("workflow", "run", name, *args, "--json", timeout=120)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.strip()]
    runs = [line["run"] for line in lines if "run" in line]
    assert runs, result.stderr
    return result.returncode, runs[-1], [line["event"] for line in lines if "event" in line]


def _steps(run: dict) -> dict[str, dict]:
    return {f"{j['name']}.{s['name']}": s for j in run["jobs"] for s in j["steps"]}


def test_fan_out_over_every_member_of_a_fleet(cluster):
    cluster.serve()
    token = cluster.mint_fleet("pool", "3")
    names = {
        cluster.worker(token, cache_dir=cluster.tmp / f"c{i}").wait_for(
            lambda e: e.get("event") == "enrolled"
        )["workerName"]
        for i in range(3)
    }
    _install(cluster, "fleet-uptime")
    code, run, events = _run(cluster, "fleet-uptime")
    assert code == 0 and run["status"] == "succeeded"
    [job] = run["jobs"]
    assert len(job["steps"]) == 3
    assert {s["worker"] for s in job["steps"]} == names  # each ran on its own member
    assert all(s["name"] == f"uptime-{s['worker']}" for s in job["steps"])
    assert any(e.get("what") == "dispatched" for e in events)
    stored = cluster.query('modelType == "swamp/workflow-run"')
    assert [r["attributes"]["runId"] for r in stored] == [run["runId"]]


def test_a_dag_with_caps_conditions_and_chained_data(cluster):
    cluster.serve()
    _install(cluster, "ci")
    code, run, _ = _run(cluster, "ci")
    assert code == 0 and run["status"] == "succeeded", run
    steps = _steps(run)
    a, b = steps["test.test-a"], steps["test.test-b"]
    spans = sorted((_epoch(s["startedAt"]), _epoch(s["endedAt"])) for s in (a, b))
    assert spans[1][0] >= spans[0][1]  # job concurrency = 1: one test after the other
    assert steps["on-failure.report"]["status"] == "skipped"
    # data.latest: the build step's written result went into the deploy step's arguments
    assert steps["deploy.ship"]["logTail"] == ["deploying artifact-42"]
    # the slow lint (3 s) held nothing back: the tests started before it ended (a level-wide
    # wait would have started them after it)
    assert _epoch(a["startedAt"]) < _epoch(steps["lint.slow-lint"]["endedAt"])

    code, run, _ = _run(cluster, "ci", "--input", "fail_b=true")
    assert code == 1 and run["status"] == "failed"
    steps = _steps(run)
    assert steps["test.test-b"]["status"] == "failed"
    assert steps["deploy.ship"]["status"] == "skipped"
    assert "test failed (needed: succeeded)" in steps["deploy.ship"]["reason"]
    assert steps["on-failure.report"]["status"] == "succeeded"
    assert run["error"].startswith("test.test-b: command exited with status 1")


GPU = """\
    name = "gpu"
    [[jobs]]
    name = "train"
    labels = {{ gpu = "true" }}
    queueTimeout = {timeout}
    [[jobs.steps]]
    name = "fit"
    [jobs.steps.task]
    type = "model_method"
    modelIdOrName = "command/shell"
    methodName = "run"
    inputs = {{ command = "echo trained" }}
"""


def test_a_placed_step_goes_through_the_queue(cluster):
    cluster.serve()
    _write(cluster, "gpu", GPU.format(timeout=2))
    code, run, events = _run(cluster, "gpu")
    assert code == 1
    fit = _steps(run)["train.fit"]
    assert fit["status"] == "failed"
    assert fit["error"] == (
        "timed out waiting for a worker matching labels gpu=true to become available"
    )
    assert any(e.get("what") == "queued" for e in events)

    _write(cluster, "gpu", GPU.format(timeout=0))
    running = cluster.spawn("workflow", "run", "gpu", "--json", "--server", cluster.url)
    running.wait_for(lambda e: e.get("event", {}).get("what") == "queued")
    listed = cluster.cli_json("worker", "queue")["items"]
    assert [(i["workflowName"], i["jobName"], i["stepName"]) for i in listed] == [
        ("gpu", "train", "fit")
    ]
    for route in ((), ("--server", cluster.url)):  # the table names them too, on both routes
        header, row = cluster.cli("worker", "queue", *route).stdout.splitlines()[:2]
        assert header.split()[:4] == ["REQUIREMENT", "WORKFLOW", "JOB", "STEP"]
        assert row.split()[:4] == ["gpu=true", "gpu", "train", "fit"]
    cluster.worker(cluster.mint("gpu-box"), "--label", "gpu=true")
    assert running.wait_exit() == 0
    run = next(e["run"] for e in running.events() if "run" in e)
    fit = _steps(run)["train.fit"]
    assert fit["worker"] == "gpu-box" and fit["queuedMs"] > 0


SLOW = """\
    name = "slow"
    [[jobs]]
    name = "main"
    [[jobs.steps]]
    name = "wait"
    target = "w1"
    [jobs.steps.task]
    type = "model_method"
    modelIdOrName = "test/steps"
    methodName = "wait"
    inputs = { seconds = 60 }
"""


def test_ctrl_c_cancels_the_run_and_its_step_on_the_worker(cluster):
    cluster.serve()
    worker = cluster.worker(cluster.mint("w1"))
    _write(cluster, "slow", SLOW)
    running = cluster.spawn("workflow", "run", "slow", "--json", "--server", cluster.url)
    running.wait_for(lambda e: e.get("event", {}).get("line") == "waiting")
    running.signal(signal.SIGINT)
    assert running.wait_exit() == 130
    worker.wait_for(lambda e: e.get("event") == "dispatch_finished")
    wait_until(
        lambda: (
            cluster.query('modelType == "swamp/workflow-run"')[0]["attributes"]["status"]
            == "cancelled"
        ),
        what="the run to be recorded cancelled",
    )
    # the lease ends when the orchestrator hears the worker let go, which may be after the run
    # was recorded cancelled
    wait_until(
        lambda: (
            [r["attributes"]["state"] for r in cluster.query('modelType == "swamp/step-lease"')]
            == ["cancelled"]
        ),
        what="the lease to end cancelled",
    )
    # the run's header is one record, each step another: both say so, and the run read whole
    [header] = [r["attributes"] for r in cluster.query('modelType == "swamp/workflow-run"')]
    [step] = [r["attributes"] for r in cluster.query('modelType == "swamp/workflow-step"')]
    assert (step["runId"], step["job"], step["name"]) == (header["runId"], "main", "wait")
    assert step["status"] == "cancelled" and header["jobs"][0]["stepCounts"] == {"cancelled": 1}
    run = cluster.cli_json("workflow", "history", "get", header["runId"])["run"]
    assert _steps(run)["main.wait"]["status"] == "cancelled"


def test_workflow_cancel_and_a_crash_mid_run(cluster):
    serve = cluster.serve()
    cluster.worker(cluster.mint("w1"), cache_dir=cluster.tmp / "cache")
    _write(cluster, "slow", SLOW)
    running = cluster.spawn("workflow", "run", "slow", "--json", "--server", cluster.url)
    started = running.wait_for(lambda e: e.get("event", {}).get("line") == "waiting")["event"]
    cancelled = cluster.cli_json("workflow", "cancel", started["runId"][:8])
    assert cancelled["run"]["status"] == "cancelled"
    assert running.wait_exit() == 1

    running = cluster.spawn("workflow", "run", "slow", "--json", "--server", cluster.url)
    started = running.wait_for(lambda e: e.get("event", {}).get("line") == "waiting")["event"]
    serve.p.kill()
    serve.wait_exit()
    assert running.wait_exit() == 1
    restarted = cluster.serve()  # a port of its own: nothing needs the old one
    assert restarted.wait_for(lambda e: e.get("event") == "listening")["reconciled"]["runs"] == 1
    run = cluster.cli_json("workflow", "history", "get", started["runId"])["run"]
    assert run["status"] == "failed" and run["error"] == "interrupted: orchestrator restart"
    assert _steps(run)["main.wait"]["status"] == "failed"


EMPTY_AND_SLOW = """\
    name = "empty-and-slow"
    [inputs.properties.items]
    type = "array"
    default = []
    [[jobs]]
    name = "main"
    [[jobs.steps]]
    name = "each"
    forEach = { item = "x", in = "${{ inputs.items }}" }
    task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }
    [[jobs.steps]]
    name = "after"
    dependsOn = [{ step = "each", condition = { type = "succeeded" } }]
    task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }
    [[jobs.steps]]
    name = "wait"
    target = "w1"
    [jobs.steps.task]
    type = "model_method"
    modelIdOrName = "test/steps"
    methodName = "wait"
    inputs = { seconds = 60 }
"""


def test_a_run_with_an_empty_fan_out_and_a_running_step_is_cancelled(cluster):
    """The scale-to-zero case: a fan-out over nothing ends at once (its dependant skipped)
    while another step of the run still runs; ``workflow cancel`` ends the run cancelled."""
    cluster.serve()
    cluster.worker(cluster.mint("w1"))
    _write(cluster, "empty-and-slow", EMPTY_AND_SLOW)
    running = cluster.spawn("workflow", "run", "empty-and-slow", "--json", "--server", cluster.url)
    started = running.wait_for(lambda e: e.get("event", {}).get("line") == "waiting")["event"]
    running.wait_for(
        lambda e: (
            (e.get("event", {}).get("step"), e.get("event", {}).get("what")) == ("after", "skipped")
        )
    )
    cancelled = cluster.cli_json("workflow", "cancel", started["runId"][:8])["run"]
    assert cancelled["status"] == "cancelled"
    assert running.wait_exit() == 1
    run = cluster.cli_json("workflow", "history", "get", started["runId"])["run"]
    assert run["status"] == "cancelled" and run["jobs"][0]["status"] == "cancelled"
    steps = _steps(run)
    assert steps["main.each"]["status"] == "skipped"
    assert steps["main.each"]["reason"].startswith("forEach over zero items")
    assert steps["main.after"]["status"] == "skipped"
    assert steps["main.wait"]["status"] == "cancelled"
    [summary] = cluster.cli_json("workflow", "history", "empty-and-slow")["runs"]
    assert (summary["status"], summary["steps"], summary["succeeded"]) == ("cancelled", 3, 0)


ONE_STEP_CANCELLED = """\
    name = "one-step-cancelled"
    [[jobs]]
    name = "main"
    [[jobs.steps]]
    name = "wait"
    target = "w1"
    [jobs.steps.task]
    type = "model_method"
    modelIdOrName = "test/steps"
    methodName = "wait"
    inputs = { seconds = 60 }
    [[jobs.steps]]
    name = "cleanup"
    dependsOn = [{ step = "wait", condition = { type = "failed" } }]
    task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }
"""


def test_one_running_step_is_cancelled_and_the_run_goes_on(cluster):
    """``workflow cancel --step``: the step stops on its worker and ends failed with the
    reason; the step that runs when it fails runs; the run ends as a failure ends it."""
    cluster.serve()
    cluster.worker(cluster.mint("w1"))
    _write(cluster, "one-step-cancelled", ONE_STEP_CANCELLED)
    running = cluster.spawn(
        "workflow", "run", "one-step-cancelled", "--json", "--server", cluster.url
    )
    started = running.wait_for(lambda e: e.get("event", {}).get("line") == "waiting")["event"]
    run_id = started["runId"]
    refused = cluster.cli("workflow", "cancel", run_id[:8], "--step", "main.cleanup")
    assert refused.returncode == 1 and "is not running" in refused.stderr
    bad = cluster.cli("workflow", "cancel", run_id[:8], "--step", "wait")  # no job
    assert bad.returncode == 2 and "a step is JOB.STEP" in bad.stderr
    assert len(bad.stderr.strip().splitlines()) == 1
    one = cluster.cli("workflow", "cancel", run_id[:8], "--step", "main.wait", "--reason", "stuck")
    assert one.returncode == 0, one.stderr
    assert "step main.wait: failed (running)" in one.stdout
    assert running.wait_exit() == 1
    run = cluster.cli_json("workflow", "history", "get", run_id)["run"]
    steps = _steps(run)
    assert (steps["main.wait"]["status"], steps["main.wait"]["error"]) == ("failed", "stuck")
    assert steps["main.cleanup"]["status"] == "succeeded"
    assert run["status"] == "failed"
    wait_until(
        lambda: (
            [
                r["attributes"]["state"] for r in cluster.query('modelType == "swamp/step-lease"')
            ].count("cancelled")
            == 1
        ),
        what="the step's lease to end cancelled on its worker",
    )


TASK = 'task = { type = "model_method", modelIdOrName = "command/shell", methodName = "run", inputs = { command = "true" } }'  # noqa: E501
BROKEN = {
    "cycle": (
        f'[[jobs]]\nname = "a"\ndependsOn = [{{ job = "b" }}]\n[[jobs.steps]]\nname = "s"\n'
        f'{TASK}\n[[jobs]]\nname = "b"\ndependsOn = [{{ job = "a" }}]\n[[jobs.steps]]\n'
        f'name = "s"\n{TASK}\n',
        "jobs: dependency cycle: a -> b -> a",
    ),
    "unknown-dependency": (
        f'[[jobs]]\nname = "a"\ndependsOn = [{{ job = "ghost" }}]\n[[jobs.steps]]\nname = "s"\n'
        f"{TASK}\n",
        "jobs[0].dependsOn[0].job: no job 'ghost'",
    ),
    "unknown-model": (
        '[[jobs]]\nname = "a"\n[[jobs.steps]]\nname = "s"\ntask = { type = "model_method", '
        'modelIdOrName = "nope", methodName = "run" }\n',
        "jobs[0].steps[0].task.modelIdOrName: no model named 'nope'",
    ),
    "unknown-method": (
        '[[jobs]]\nname = "a"\n[[jobs.steps]]\nname = "s"\ntask = { type = "model_method", '
        'modelIdOrName = "command/shell", methodName = "walk" }\n',
        "jobs[0].steps[0].task.methodName: model type 'command/shell' has no method 'walk'",
    ),
    "missing-argument": (
        '[[jobs]]\nname = "a"\n[[jobs.steps]]\nname = "s"\ntask = { type = "model_method", '
        'modelIdOrName = "command/shell", methodName = "run" }\n',
        "jobs[0].steps[0].task.inputs: method 'run' needs argument 'command'",
    ),
    "bad-label": (
        f'[[jobs]]\nname = "a"\nlabels = {{ "bad key" = "x" }}\n[[jobs.steps]]\nname = "s"\n'
        f"{TASK}\n",
        "jobs[0].labels:",
    ),
    "bad-duration": (
        f'[[jobs]]\nname = "a"\nqueueTimeout = "soon"\ntarget = "w1"\n[[jobs.steps]]\n'
        f'name = "s"\n{TASK}\n',
        "jobs[0].queueTimeout: invalid queueTimeout 'soon'",
    ),
    "unknown-key": (
        f'[[jobs]]\nname = "a"\n[[jobs.steps]]\nname = "s"\ndepends = []\n{TASK}\n',
        "jobs[0].steps[0].depends: unknown key; did you mean 'dependsOn'?",
    ),
    "duplicate-step": (
        f'[[jobs]]\nname = "a"\n[[jobs.steps]]\nname = "s"\n{TASK}\n[[jobs.steps]]\n'
        f'name = "s"\n{TASK}\n',
        "jobs[0].steps[1].name: duplicate step name 's'",
    ),
    "bad-expression": (
        '[[jobs]]\nname = "a"\n[[jobs.steps]]\nname = "s"\ntask = { type = "model_method", '
        'modelIdOrName = "command/shell", methodName = "run", '
        'inputs = { command = "echo ${{ inputs. }}" } }\n',
        "jobs[0].steps[0].task.inputs: in ${{ inputs. }}: expected a name after '.'",
    ),
    "foreach-not-a-list": (
        f'[[jobs]]\nname = "a"\n[[jobs.steps]]\nname = "s"\n'
        f'forEach = {{ item = "x", in = "${{{{ \'abc\' }}}}" }}\n{TASK}\n',
        "jobs[0].steps[0].forEach.in: gives str 'abc', not a list",
    ),
    "nested-cycle": (
        '[[jobs]]\nname = "a"\n[[jobs.steps]]\nname = "s"\n'
        'task = { type = "workflow", workflowIdOrName = "nested-cycle-child" }\n',
        "workflow cycle: nested-cycle -> nested-cycle-child -> nested-cycle",
    ),
}


def test_twelve_broken_workflows_each_get_one_line_naming_the_place(cluster):
    for name, (body, _) in BROKEN.items():
        _write(cluster, name, f'name = "{name}"\n{body}')
    _write(
        cluster,
        "nested-cycle-child",
        'name = "nested-cycle-child"\n[[jobs]]\nname = "a"\n[[jobs.steps]]\nname = "s"\n'
        'task = { type = "workflow", workflowIdOrName = "nested-cycle" }\n',
    )
    for name, (_, needle) in BROKEN.items():
        result = cluster.cli("workflow", "validate", name)
        assert result.returncode == 2, (name, result.stdout, result.stderr)
        errors = [line for line in result.stderr.splitlines() if line.startswith("  error: ")]
        assert len(errors) == 1, (name, result.stderr)
        assert needle in errors[0], (name, errors[0])
        assert "Traceback" not in result.stderr
        run = cluster.cli("workflow", "run", name)  # run refuses it the same way
        assert run.returncode == 2 and needle in run.stderr, (name, run.stderr)


def test_create_writes_a_runnable_workflow_and_list_shows_it(cluster):
    created = cluster.cli_json("workflow", "create", "hello")
    assert Path(created["path"]).read_text().startswith("# A workflow")
    assert cluster.cli("workflow", "validate", "hello").returncode == 0
    code, run, _ = _run(cluster, "hello", "--input", "greeting=hi")  # no server: in the CLI
    assert code == 0 and _steps(run)["main.greet"]["logTail"] == ["hi"]
    assert [w["name"] for w in cluster.cli_json("workflow", "list")["workflows"]] == ["hello"]
    again = cluster.cli("workflow", "create", "hello")
    assert again.returncode == 2 and "exists already" in again.stderr


PINNED = """\
    name = "pinned"
    [[jobs]]
    name = "together"
    affinity = true
    labels = { fleet = "pool" }
    [[jobs.steps]]
    name = "first"
    task = { type = "model_method", modelIdOrName = "command/shell", methodName = "run", inputs = { command = "sleep 0.5" } }
    [[jobs.steps]]
    name = "second"
    task = { type = "model_method", modelIdOrName = "command/shell", methodName = "run", inputs = { command = "sleep 0.5" } }
    [[jobs.steps]]
    name = "third"
    task = { type = "model_method", modelIdOrName = "command/shell", methodName = "run", inputs = { command = "sleep 0.5" } }
    [[jobs]]
    name = "nested"
    [[jobs.steps]]
    name = "child"
    task = { type = "workflow", workflowIdOrName = "hello-child", inputs = { who = "parent" } }
"""  # noqa: E501
CHILD = """\
    name = "hello-child"
    [inputs.properties.who]
    type = "string"
    [[jobs]]
    name = "main"
    [[jobs.steps]]
    name = "say"
    task = { type = "model_method", modelIdOrName = "command/shell", methodName = "run", inputs = { command = "echo hello ${{ inputs.who }}" } }
"""  # noqa: E501


def test_affinity_keeps_a_job_on_one_worker_and_a_nested_workflow_runs_inline(cluster):
    cluster.serve()
    token = cluster.mint_fleet("pool", "2")
    for i in range(2):
        cluster.worker(token, "--concurrency", "2", cache_dir=cluster.tmp / f"c{i}")
    _write(cluster, "pinned", PINNED)
    _write(cluster, "hello-child", CHILD)
    code, run, _ = _run(cluster, "pinned")
    assert code == 0, run
    steps = _steps(run)
    # three steps at once on two 2-slot workers: least-loaded would spread them; affinity does not
    assert len({steps[f"together.{s}"]["worker"] for s in ("first", "second", "third")}) == 1
    child = steps["nested.child"]
    assert child["status"] == "succeeded"
    nested = cluster.cli_json("workflow", "history", "get", child["childRunId"])["run"]
    assert nested["workflow"] == "hello-child" and nested["inputs"] == {"who": "parent"}
    assert _steps(nested)["main.say"]["logTail"] == ["hello parent"]


def test_bad_inputs_are_refused_before_a_run_exists_and_a_fan_out_is_bounded(cluster):
    _install(cluster, "ci")
    for args, needle in (
        (["--input", "fail_b=maybe"], "inputs: data.fail_b must be boolean"),
        (["--input", "fail_b"], "expected name=value"),
    ):
        result = cluster.cli("workflow", "run", "ci", *args)
        assert result.returncode == 2 and needle in result.stderr, result.stderr
    assert cluster.query('modelType == "swamp/workflow-run"') == []
    # the orchestrator's cap (10,000 by default) is a serve setting: here 1,000
    for bad in ("0", "-5"):  # a cap below one: refused, one line, nothing started
        refused = cluster.cli("serve", "--repo-dir", str(cluster.repo), "--max-fan-out", bad)
        assert refused.returncode == 2, refused.stderr
        assert refused.stderr == f"error: invalid --max-fan-out {bad}: expected 1 or more\n"
    # above a million: refused (a run's steps are numbered in seven digits)
    refused = cluster.cli("serve", "--repo-dir", str(cluster.repo), "--max-fan-out", "1000001")
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr == (
        "error: invalid --max-fan-out 1000001: at most 1,000,000 "
        "(split a longer list between steps or runs)\n"
    )
    config = cluster.repo / "swamp.toml"
    settings = tomllib.loads(config.read_text())
    settings["serve"]["max-fan-out"] = 1000
    config.write_text(tomli_w.dumps(settings))
    cluster.serve()
    items = json.dumps(list(range(1001)))
    _write(
        cluster,
        "wide",
        f"""\
        name = "wide"
        [inputs.properties.items]
        type = "array"
        default = {items}
        [[jobs]]
        name = "fan"
        [[jobs.steps]]
        name = "each"
        forEach = {{ item = "i", in = "${{{{ inputs.items }}}}" }}
        task = {{ type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }}
        """,
    )
    code, run, _ = _run(cluster, "wide", "--server", cluster.url)
    assert code == 1 and run["jobs"][0]["status"] == "failed"
    assert run["jobs"][0]["error"] == (
        "step 'each': forEach.in gave 1001 items; a step runs at most 1000 times (the "
        "orchestrator's --max-fan-out (max-fan-out in swamp.toml [serve]); or split the list)"
    )


LISTS = """\
    name = "lists"
    [inputs.properties.hosts]
    type = "array"
    [inputs.properties.opts]
    type = "object"
    default = {}
    [inputs.properties.note]
    type = "string"
    [[jobs]]
    name = "fan"
    [[jobs.steps]]
    name = "each"
    forEach = { item = "h", in = "${{ inputs.hosts }}" }
    task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }
"""


def test_array_and_object_inputs_are_json_the_same_on_both_routes(cluster):
    _write(cluster, "lists", LISTS)
    given = ["--input", 'hosts=["a", "b"]', "--input", 'opts={"k": 1}', "--input", 'note=["x"]']

    def answers(*route: str) -> list:
        result = cluster.cli("workflow", "run", "lists", *given, *route, "--json", timeout=120)
        assert result.returncode == 0, result.stderr
        run = [json.loads(line) for line in result.stdout.splitlines() if '"run"' in line][-1]
        assert run["run"]["inputs"] == {"hosts": ["a", "b"], "opts": {"k": 1}, "note": '["x"]'}
        assert [s["name"] for s in run["run"]["jobs"][0]["steps"]] == ["each-a", "each-b"]
        bad = cluster.cli("workflow", "run", "lists", "--input", "hosts=a,b", *route)
        assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
        assert "input 'hosts': expected JSON for its type array" in bad.stderr
        return [bad.stderr]

    on_the_repo = answers()  # no server: the run is in the CLI
    cluster.serve()
    assert answers("--server", cluster.url) == on_the_repo


def test_the_readme_documents_a_guard_and_its_example_runs_as_it_says(cluster):
    text = (ROOT / "docs" / "usage.md").read_text()  # the manual, moved out of README.md
    workflows = text[text.index("\n## Workflows") :]
    workflows = workflows[: workflows.index("\n## ", 1)]
    block = re.search(r"```toml\n( *# guard: .*?\n) *```", workflows, re.S)
    assert block, "the Workflows section has no guard example"
    (cluster.repo / "workflows" / "release.toml").write_text(textwrap.dedent(block.group(1)))
    code, run, _ = _run(cluster, "release")
    assert code == 0 and _steps(run)["ship.upload"]["status"] == "succeeded"
    code, run, events = _run(cluster, "release", "--input", "dry_run=true")
    upload = _steps(run)["ship.upload"]
    assert code == 0 and upload["status"] == "skipped"
    assert upload["reason"] == "guard ${{ inputs.dry_run }}"
    assert any(e.get("what") == "skipped" and e.get("step") == "upload" for e in events)


CAPS = """\
    name = "caps"
    concurrency = 2
    [[jobs]]
    name = "a"
    [[jobs.steps]]
    name = "fan"
    concurrency = 3
    allowFailure = true
    forEach = { item = "x", in = "${{ [1, 2, 3] }}" }
    task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }
    [[jobs]]
    name = "b"
    concurrency = 1
    dependsOn = [{ job = "a", condition = { type = "or", conditions = [{ type = "succeeded" }, { type = "failed" }] } }]
    [[jobs.steps]]
    name = "second"
    dependsOn = [{ step = "first" }]
    task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }
    [[jobs.steps]]
    name = "first"
    task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }
"""  # noqa: E501


def test_show_gives_each_dependency_cap_and_allowed_failure_the_same_on_both_routes(cluster):
    _write(cluster, "caps", CAPS)

    def answers(*route: str) -> tuple[str, dict]:
        text = cluster.cli("workflow", "show", "caps", *route)
        assert text.returncode == 0, text.stderr
        return text.stdout, cluster.cli_json("workflow", "show", "caps", *route)

    text, shown = answers()
    lines = text.splitlines()
    assert lines[1] == "jobs at once: 2"
    header = lines[3].split()
    assert header[:4] == ["JOB", "STEP", "RUNS", "DEPENDS"]
    assert "CONCURRENCY" in header and "ALLOW" in header
    rows = {line.split()[0]: line.split() for line in lines[4:]}
    assert rows["a"][1:4] == ["-", "2", "(the"]  # no cap of its own: the workflow's applies
    assert rows["fan"][1:5] == ["swamp/echo.echo", "-", "3", "yes"]
    assert rows["b"][1:] == ["a", "(succeeded", "or", "failed)", "1"]
    assert rows["second"][1:6] == ["swamp/echo.echo", "first", "succeeded", "-", "no"]
    assert rows["first"][1:4] == ["swamp/echo.echo", "-", "-"]
    wf = shown["workflow"]
    assert wf["concurrency"] == 2
    a, b = wf["jobs"]
    assert (a["dependsOn"], a["concurrency"]) == ([], 0)
    assert [(s["concurrency"], s["allowFailure"], s["dependsOn"]) for s in a["steps"]] == [
        (3, True, [])
    ]
    assert b["concurrency"] == 1 and b["dependsOn"][0]["condition"]["type"] == "or"
    second, first = b["steps"]
    assert second["dependsOn"] == [{"step": "first", "condition": {"type": "succeeded"}}]
    assert (first["dependsOn"], first["concurrency"], first["allowFailure"]) == ([], 0, False)
    cluster.serve()
    assert answers("--server", cluster.url) == (text, shown)


FOLLOWS = """\
    name = "follows"
    [[jobs]]
    name = "together"
    affinity = true
    labels = {{ pool = "x" }}
    [[jobs.steps]]
    name = "first"
    task = {{ type = "model_method", modelIdOrName = "command/shell", methodName = "run", inputs = {{ command = "if [ -e {marker} ]; then echo second-run; else touch {marker}; echo first-run; sleep 60; fi" }} }}
    [[jobs.steps]]
    name = "second"
    dependsOn = [{{ step = "first" }}]
    task = {{ type = "model_method", modelIdOrName = "command/shell", methodName = "run", inputs = {{ command = "echo second-step" }} }}
    [[jobs.steps]]
    name = "gpu"
    dependsOn = [{{ step = "second" }}]
    labels = {{ pool = "x", gpu = "true" }}
    task = {{ type = "model_method", modelIdOrName = "command/shell", methodName = "run", inputs = {{ command = "echo should-not-run" }} }}
"""  # noqa: E501


def test_an_affinity_group_follows_its_first_step_to_where_it_really_ran(cluster):
    """Replayed from the original's test cases: the first step of an affinity group lost its
    worker and ran again elsewhere, and the group stayed pinned to the lost worker (the next
    step failed). And a step of the group that asks for labels its worker lacks was run there
    anyway; now it is refused, saying why."""
    cluster.serve()
    workers = {
        name: cluster.worker(cluster.mint(name), "--label", "pool=x") for name in ("w1", "w2")
    }
    marker = cluster.tmp / "marker"
    _write(cluster, "follows", FOLLOWS.format(marker=marker))
    run = cluster.spawn("workflow", "run", "follows", "--json", "--server", cluster.url)
    line = run.wait_for(lambda e: e.get("event", {}).get("line") == "first-run")["event"]
    lost = line["worker"]
    workers[lost].p.kill()  # the first step's worker is lost mid-step, before any effect
    assert run.wait_exit(timeout=90) == 1  # the gpu step is refused: the run fails
    final = [e["run"] for e in run.events() if "run" in e][-1]
    steps = _steps(final)
    other = "w2" if lost == "w1" else "w1"
    assert steps["together.first"]["status"] == "succeeded"
    assert steps["together.first"]["worker"] == other  # it ran again on the other worker
    assert steps["together.second"]["status"] == "succeeded", steps["together.second"]
    assert steps["together.second"]["worker"] == other  # the group followed it there
    gpu = steps["together.gpu"]
    assert gpu["status"] == "failed" and "gpu=true" in gpu["error"], gpu
    assert "affinity group" in gpu["error"]


WIDE_ECHO = """\
    name = "wide-echo"
    [inputs.properties.items]
    type = "array"
    [[jobs]]
    name = "fan"
    [[jobs.steps]]
    name = "each"
    forEach = { item = "i", in = "${{ inputs.items }}" }
    task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }
"""


def test_a_run_larger_than_one_reply_is_printed_whole_on_both_routes(cluster):
    """6,000 steps are more than one reply carries (pages of about 1 MiB): `workflow run` and
    `history get` ask for the rest and print the whole tree, in order, on either route."""
    _write(cluster, "wide-echo", WIDE_ECHO)
    items = json.dumps(list(range(6000)))
    for route in ((), ("--server",)):
        if route:
            cluster.serve()
            route = ("--server", cluster.url)
        code, run, events = _run(cluster, "wide-echo", "--input", f"items={items}", *route)
        assert code == 0 and run["status"] == "succeeded"
        names = [s["name"] for s in run["jobs"][0]["steps"]]
        assert names == [f"each-{i}" for i in range(6000)]
        assert sum(1 for e in events if e.get("what") == "succeeded") == 6000
        got = cluster.cli_json("workflow", "history", "get", run["runId"], *route)["run"]
        assert got == run
