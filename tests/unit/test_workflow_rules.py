"""Workflow definitions, expressions and run rules: pure, so every branch is a unit test."""

import pytest

from swamp.domain.expressions import ExpressionError, check_templates, render
from swamp.domain.workflow import Condition, Dependency, Placement, find_cycle, parse
from swamp.domain.workflow_run import combined, decide, expansion_name, job_status, run_status

TASK = {"type": "model_method", "modelIdOrName": "command/shell", "methodName": "run"}


def workflow(**over):
    raw = {"name": "w", "jobs": [{"name": "a", "steps": [{"name": "s", "task": TASK}]}]}
    raw.update(over)
    return parse(raw, name="w")


def test_a_good_workflow_parses_without_problems():
    wf, problems = workflow(labels={"pool": "x"}, queueTimeout=30)
    assert problems == []
    assert wf.placement.queue_timeout == "30s" and wf.placed_steps()


def test_every_problem_is_reported_with_its_place():
    _, problems = parse(
        {
            "name": "w",
            "jobz": [],
            "jobs": [{"name": "a", "steps": [{"name": "s", "task": {"type": "shell"}}]}],
        },
        name="w",
    )
    lines = [p.line() for p in problems]
    assert any(line.startswith("jobz: unknown key; did you mean 'jobs'?") for line in lines)
    assert "jobs[0].steps[0].task.type: expected model_method or workflow" in lines


def test_the_child_wins_and_an_explicit_empty_label_table_clears():
    parent = Placement(labels={"gpu": "true"}, queue_timeout="5m", target=None)
    assert Placement(labels={}).under(parent).labels == {}
    assert not Placement(labels={}).under(parent).is_remote()
    assert Placement().under(parent).labels == {"gpu": "true"}
    assert Placement(queue_timeout="0").under(parent).queue_timeout == "0"


@pytest.mark.parametrize(
    ("condition", "status", "holds"),
    [
        (Condition("succeeded"), "succeeded", True),
        (Condition("succeeded"), "skipped", False),
        (Condition("completed"), "failed", True),
        (Condition("completed"), "skipped", False),
        (Condition("always"), None, True),
        (Condition("not", (Condition("failed"),)), "succeeded", True),
        (Condition("or", (Condition("failed"), Condition("skipped"))), "skipped", True),
        (Condition("and", (Condition("completed"), Condition("failed"))), "succeeded", False),
    ],
)
def test_conditions(condition, status, holds):
    assert condition.holds(status) is holds


def test_a_node_waits_runs_or_is_skipped_with_the_reason():
    deps = [Dependency("build"), Dependency("lint", Condition("always"))]
    assert decide(deps, {"build": "succeeded", "lint": None}) is None  # lint still running
    assert decide(deps, {"build": "succeeded", "lint": "failed"}) == "run"
    assert decide(deps, {"build": "failed", "lint": "succeeded"}) == (
        "build failed (needed: succeeded)"
    )


def test_statuses_add_up():
    assert combined(["succeeded", "running"]) is None
    assert combined(["succeeded", "failed"]) == "failed"
    assert combined(["skipped", "skipped"]) == combined([]) == "skipped"
    assert job_status([("failed", True), ("succeeded", False)]) == "succeeded"
    assert job_status([("failed", False)]) == "failed"
    assert run_status(["succeeded", "skipped"]) == "succeeded"
    assert expansion_name("up", "eu-1", 0) == "up-eu-1"
    assert expansion_name("up", {"name": "pool-1"}, 3) == "up-pool-1"
    assert expansion_name("up", {"x": 1}, 3) == "up-3"


def test_cycles_are_found_and_shown():
    assert find_cycle({"a": ["b"], "b": ["c"], "c": ["a"]}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": ["b"], "b": ["ghost"]}) is None


def test_expressions_keep_types_whole_and_turn_into_text_inside_text():
    ctx = {"inputs": {"n": 2, "env": "eu"}, "self": {"w": {"name": "pool-1"}}}
    assert render("${{ inputs.n + 1 }}", ctx) == 3
    assert render("host-${{ self.w.name }}-${{ inputs.n }}", ctx) == "host-pool-1-2"
    assert render({"a": ["${{ inputs.env == 'eu' ? 'near' : 'far' }}"]}, ctx) == {"a": ["near"]}
    assert render("${{ size([1, 2]) }} ${{ has(self.w.zone) }}", ctx) == "2 false"
    with pytest.raises(ExpressionError, match="no field 'zone'"):
        render("${{ self.w.zone }}", ctx)
    with pytest.raises(ExpressionError, match="unknown name 'nope'"):
        render("${{ nope }}", ctx)
    with pytest.raises(ExpressionError, match="unterminated"):
        check_templates("echo ${{ inputs.n")


def test_a_nested_workflow_missing_a_required_input_is_found_by_validation():
    from swamp.domain.workflow import MethodInfo, check_against

    child, _ = parse(
        {
            "name": "child",
            "inputs": {"required": ["who"], "properties": {"who": {"type": "string"}}},
            "jobs": [{"name": "a", "steps": [{"name": "s", "task": TASK}]}],
        },
        name="child",
    )
    parent, _ = parse(
        {
            "name": "parent",
            "jobs": [
                {
                    "name": "a",
                    "steps": [
                        {"name": "s", "task": {"type": "workflow", "workflowIdOrName": "child"}}
                    ],
                }
            ],
        },
        name="parent",
    )
    problems = check_against(
        parent,
        method_of=lambda *a: MethodInfo(required=(), known=("command",)),
        workflow_of=lambda name: child if name == "child" else None,
    )
    assert [p.line() for p in problems] == [
        "jobs[0].steps[0].task.inputs: workflow 'child' needs input 'who'"
    ]


def test_what_a_for_each_may_give():
    from swamp.domain.workflow_run import MAX_EXPANSIONS, expansion_items
    from swamp.errors import UserError

    assert expansion_items([1, 2], step="s") == [1, 2]
    assert expansion_items({"a": 1}, step="s") == [{"key": "a", "value": 1}]
    for bad, needle in (("abc", "gave str"), (None, "gave null")):
        with pytest.raises(UserError, match=needle):
            expansion_items(bad, step="s")
    assert len(expansion_items(list(range(MAX_EXPANSIONS)), step="s")) == MAX_EXPANSIONS
    with pytest.raises(UserError, match=f"at most {MAX_EXPANSIONS} times .*--max-fan-out"):
        expansion_items(list(range(MAX_EXPANSIONS + 1)), step="s")
    assert MAX_EXPANSIONS == 10_000  # the fleet's size the issue asks for
    assert len(expansion_items([1, 2, 3], step="s", cap=3)) == 3
    with pytest.raises(UserError, match="gave 4 items; a step runs at most 3 times"):
        expansion_items([1, 2, 3, 4], step="s", cap=3)


def test_a_rendered_value_has_a_size_cap():
    from swamp.domain.expressions import MAX_RENDERED

    big = {"blob": "x" * (MAX_RENDERED + 1)}
    with pytest.raises(ExpressionError, match="at most"):
        render("${{ inputs.blob }}", {"inputs": big})
    with pytest.raises(ExpressionError, match="at most"):
        render("prefix ${{ inputs.blob }}", {"inputs": big})
    with pytest.raises(ExpressionError, match="longer than"):
        render(
            "${{ inputs.half + inputs.half + inputs.half }}",
            {"inputs": {"half": "y" * (MAX_RENDERED // 2)}},
        )
    # the control: just under the cap renders
    fits = "x" * (MAX_RENDERED - 10)
    assert render("${{ inputs.fits }}", {"inputs": {"fits": fits}}) == fits


def test_workflow_expressions_never_read_infrastructure(tmp_path):
    from swamp.domain.query import parse
    from swamp.domain.read_scope import ALL_DATA, INFRASTRUCTURE_TYPES
    from swamp.store.datastore import Datastore, Key, SpecPolicy

    store = Datastore(tmp_path / "swamp.db")
    try:
        for model_type in (*INFRASTRUCTURE_TYPES, "command/shell", "test/steps"):
            store.write(Key(model_type, "x", "item"), {"secret": 1}, policy=SpecPolicy("item"))
        everything = {r.model_type for r in store.query(parse("attributes.secret == 1"))}
        assert everything >= INFRASTRUCTURE_TYPES  # the control: unscoped, they are there
        scoped = {
            r.model_type for r in store.query(parse("attributes.secret == 1"), scope=ALL_DATA)
        }
        assert scoped == {"command/shell", "test/steps"}
    finally:
        store.close()


def test_a_workflow_name_is_checked_before_any_file_is_looked_at():
    from swamp.domain.workflow import check_workflow_name
    from swamp.errors import UserError

    assert check_workflow_name("ci-1_x") == "ci-1_x"
    assert check_workflow_name("a" * 64) == "a" * 64
    for bad in ("a" * 65, "a" * 3_000_000, "x\udcff", "../etc", "", "A", None, "x\x00"):
        with pytest.raises(UserError, match="invalid workflow name") as info:
            check_workflow_name(bad)
        assert "\n" not in info.value.message and len(info.value.message) < 200
    with pytest.raises(UserError, match=r"\(3000000 characters\)"):
        check_workflow_name("a" * 3_000_000)


def test_an_array_or_object_input_is_read_as_json_and_a_string_stays_text():
    from swamp.domain.workflow_run import input_value
    from swamp.errors import UserError

    assert input_value('["a", "b"]', "array", "hosts") == ["a", "b"]
    assert input_value('{"k": [1, 2]}', "object", "opts") == {"k": [1, 2]}
    assert input_value('["a", "b"]', "string", "s") == '["a", "b"]'  # text stays text
    assert input_value("[1]", None, "s") == "[1]"  # no type: as given
    assert input_value(["a"], "array", "hosts") == ["a"]  # already a list (a nested run)
    assert input_value("3", "integer", "n") == 3 and input_value("true", "boolean", "b") is True
    for text, kind, needle in (
        ("a,b", "array", """input 'hosts': expected JSON for its type array (e.g. ["a", "b"]), """),
        ("{k: 1}", "object", "expected JSON for its type object"),
        ("[" * 100_000, "array", "nested more than 32 levels deep"),  # never the parser's stack
        ("[" * 40 + "]" * 40, "array", "nested more than 32 levels deep"),
    ):
        with pytest.raises(UserError) as info:
            input_value(text, kind, "hosts")
        assert needle in info.value.message and "\n" not in info.value.message
        assert len(info.value.message) < 200


def test_show_writes_out_dependencies_caps_and_allowed_failures():
    from swamp.domain.workflow import explicit

    raw = {
        "name": "w",
        "jobs": [
            {
                "name": "a",
                "steps": [{"name": "s", "task": {}}, "not a table"],
            },
            {
                "name": "b",
                "concurrency": 2,
                "dependsOn": [{"job": "a"}, "wrong"],
                "steps": [{"name": "t", "dependsOn": [{"step": "u"}], "allowFailure": True}],
            },
        ],
    }
    out = explicit(raw)
    assert out["concurrency"] == 0
    a, b = out["jobs"]
    assert a["dependsOn"] == [] and a["concurrency"] == 0
    assert a["steps"][0] == {
        "name": "s",
        "task": {},
        "dependsOn": [],
        "concurrency": 0,
        "allowFailure": False,
    }
    assert a["steps"][1] == "not a table"  # as written: its problem is reported beside it
    assert b["concurrency"] == 2
    assert b["dependsOn"] == [{"job": "a", "condition": {"type": "succeeded"}}, "wrong"]
    assert b["steps"][0]["dependsOn"] == [{"step": "u", "condition": {"type": "succeeded"}}]
    assert b["steps"][0]["allowFailure"] is True
    assert raw["jobs"][0] == {"name": "a", "steps": [{"name": "s", "task": {}}, "not a table"]}
    assert explicit({"jobs": "oops"}) == {"jobs": "oops", "concurrency": 0}
