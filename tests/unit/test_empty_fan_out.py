"""A fan-out over zero items, in-process (the engine on a repo, no server): it says so in the
run's events and record, and what depends on it goes on by the usual rules."""

import textwrap

from swamp.admin.local import RepoAdmin
from swamp.protocol.messages import WorkflowRunRequest
from swamp.repo import Repo

EMPTY = """\
    name = "empty"
    [inputs.properties.items]
    type = "array"
    default = []
    [[jobs]]
    name = "fan"
    [[jobs.steps]]
    name = "each"
    forEach = { item = "x", in = "${{ inputs.items }}" }
    task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }
    [[jobs.steps]]
    name = "after"
    dependsOn = [{ step = "each", condition = { type = "succeeded" } }]
    task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }
    [[jobs.steps]]
    name = "anyway"
    dependsOn = [{ step = "each", condition = { type = "always" } }]
    task = { type = "model_method", modelIdOrName = "swamp/echo", methodName = "echo" }
"""


async def _run(tmp_path, inputs: dict) -> tuple[dict, list[dict]]:
    repo, _ = Repo.init(tmp_path / "repo")
    (repo.root / "workflows" / "empty.toml").write_text(textwrap.dedent(EMPTY))
    store = repo.open_store()
    events: list[dict] = []

    async def on_event(event: dict) -> None:
        events.append(event)

    try:
        reply = await RepoAdmin(repo, store).workflow_run(
            WorkflowRunRequest(name="empty", inputs=inputs), on_event
        )
    finally:
        store.close()
    return reply.run, events


async def test_a_fan_out_over_zero_items_says_so(tmp_path):
    run, events = await _run(tmp_path, {})
    assert run["status"] == "succeeded"
    steps = {s["name"]: s for s in run["jobs"][0]["steps"]}
    said = "forEach over zero items: ${{ inputs.items }} gave none, so nothing ran"
    assert steps["each"] == {
        "name": "each",
        "status": "skipped",
        "template": "each",
        "reason": said,
    }
    skipped = [e for e in events if e.get("kind") == "step" and e["what"] == "skipped"]
    assert {"step": "each", "detail": said}.items() <= skipped[0].items()
    # a dependency on it: skipped (no expansion succeeded), and 'always' still runs
    assert steps["after"]["status"] == "skipped"
    assert steps["after"]["reason"] == "each skipped (needed: succeeded)"
    assert steps["anyway"]["status"] == "succeeded"


async def test_a_fan_out_with_items_is_unchanged(tmp_path):
    run, _ = await _run(tmp_path, {"items": ["a", "b"]})
    steps = [(s["name"], s["status"]) for s in run["jobs"][0]["steps"]]
    assert steps == [
        ("each-a", "succeeded"),
        ("each-b", "succeeded"),
        ("after", "succeeded"),
        ("anyway", "succeeded"),
    ]
