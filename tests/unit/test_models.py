import sys

import pytest

from swamp.errors import UnknownMethod, UnknownModel, UserError
from swamp.models.builtin import SHELL
from swamp.models.context import LocalContext
from swamp.models.framework import Arg
from swamp.models.runner import run_method
from swamp.plugins import ModelRegistry, plugin_manager
from swamp.store.datastore import Datastore, Key
from swamp.store.records import SqliteRecords


def test_builtins_register_through_the_hook():
    registry = ModelRegistry.from_plugins(plugin_manager(load_entry_points=False))
    assert registry.runnable("command/shell") is SHELL
    with pytest.raises(UnknownModel, match="bookkeeping"):
        registry.runnable("swamp/worker")
    with pytest.raises(UnknownModel) as info:
        registry.get("no/such")
    assert info.value.code == "unknown_model" and "command/shell" in info.value.message


def test_argument_validation():
    run = SHELL.method("run")
    assert run.validate({"command": "true", "timeout": "5m"}) == {"command": "true", "timeout": 300}
    with pytest.raises(UserError, match="needs argument 'command'"):
        run.validate({})
    with pytest.raises(UserError, match="no argument 'cmd'"):
        run.validate({"cmd": "true"})
    with pytest.raises(UserError, match="duration"):
        run.validate({"command": "true", "timeout": "soon"})
    with pytest.raises(UnknownMethod):
        SHELL.method("walk")


@pytest.mark.parametrize(
    "arg,value,expected",
    [
        (Arg("n", "integer"), "3", 3),
        (Arg("n", "integer"), 3, 3),
        (Arg("x", "number"), "0.5", 0.5),
        (Arg("b", "boolean"), "yes", True),
        (Arg("b", "boolean"), False, False),
    ],
)
def test_coercion(arg, value, expected):
    assert arg.coerce(value) == expected


@pytest.mark.parametrize(
    "arg,value",
    [
        (Arg("n", "integer"), "3.5"),
        (Arg("n", "integer"), True),
        (Arg("n", "integer"), 2.5),
        (Arg("x", "number"), "nan"),
        (Arg("b", "boolean"), "maybe"),
        (Arg("s"), 5),
    ],
)
def test_bad_coercion(arg, value):
    with pytest.raises(UserError):
        arg.coerce(value)


@pytest.fixture
def context(tmp_path):
    store = Datastore(tmp_path / "db")
    events = []

    async def emit(event):
        events.append(event)

    ctx = LocalContext(
        db=SqliteRecords(store),
        emit=emit,
        model_type=SHELL,
        model_name="t",
        method="run",
        dispatch_id=None,
        env={"GREETING": "hi", "PATH": "/usr/bin:/bin"},
    )
    return ctx, store, events


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX shell")
async def test_shell_streams_lines_and_writes_its_result(context):
    ctx, store, events = context
    outcome = await run_method(
        SHELL.method("run"), {"command": "echo $GREETING; echo oops >&2"}, ctx
    )
    assert outcome.status == "succeeded"
    assert {"kind": "log", "stream": "stdout", "line": "hi"} in events
    assert {"kind": "log", "stream": "stderr", "line": "oops"} in events
    result = store.latest(Key("command/shell", "t", "result")).attributes
    assert result["exitCode"] == 0 and result["stdoutTail"] == "hi"
    assert outcome.outputs == [{"spec": "result", "name": "result", "version": 1}]


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX shell")
async def test_shell_failure_and_timeout(context):
    ctx, store, _ = context
    failed = await run_method(SHELL.method("run"), {"command": "exit 3"}, ctx)
    assert failed.status == "failed" and "status 3" in failed.error
    slow = await run_method(SHELL.method("run"), {"command": "sleep 30", "timeout": 1}, ctx)
    assert slow.status == "failed" and "timed out" in slow.error
    assert store.latest(Key("command/shell", "t", "result")).attributes["timedOut"] is True


async def test_writes_are_limited_to_declared_specs(context):
    ctx, _, _ = context
    with pytest.raises(UserError, match="no resource spec"):
        await ctx.write_resource("secrets", "x", {})
    with pytest.raises(UserError):
        await ctx.write_resource("result", "../escape", {})
