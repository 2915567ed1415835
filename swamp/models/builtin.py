"""The built-in model types, registered through the same hook as any third-party plugin."""

from __future__ import annotations

import time
from typing import Any

from swamp.hooks import hookimpl
from swamp.models.fleet_probe import FLEET_PROBE
from swamp.models.framework import Arg, Method, MethodFailed, ModelType, ResourceSpec

# -- command/shell ------------------------------------------------------------------------------


async def _shell_run(ctx, args: dict[str, Any]) -> dict:
    started = time.monotonic()
    result = await ctx.run_process(
        args["command"], cwd=args.get("cwd"), timeout=args.get("timeout")
    )
    summary = {
        "exitCode": result.exit_code,
        "stdoutTail": "\n".join(result.stdout_tail),
        "stderrTail": "\n".join(result.stderr_tail),
        "durationMs": round((time.monotonic() - started) * 1000),
    }
    if result.timed_out:
        summary["timedOut"] = True
    await ctx.write_resource("result", "result", summary)
    if result.timed_out:
        raise MethodFailed(f"command timed out after {args['timeout']}s and was killed")
    if result.exit_code != 0:
        raise MethodFailed(f"command exited with status {result.exit_code}")
    return summary


SHELL = ModelType(
    "command/shell",
    description="Run a shell command; its output lines stream as logs.",
    methods=(
        Method(
            "run",
            _shell_run,
            args=(
                Arg("command", required=True, help="the command line, run by /bin/sh -c"),
                Arg("cwd", help="working directory (default: the process's own)"),
                Arg("timeout", type="duration", help="kill the command after this long, e.g. 5m"),
            ),
            help="Run the command; a non-zero exit fails the dispatch.",
        ),
    ),
    resources=(
        ResourceSpec(
            "result", garbage_collection=20, help="{exitCode, stdoutTail, stderrTail, durationMs}"
        ),
    ),
)

# -- swamp/echo: the smallest possible method (benchmarks, smoke tests of placement) ------------


async def _echo(ctx, args: dict[str, Any]) -> dict:
    if args.get("message"):
        await ctx.log(args["message"])
    return {"message": args.get("message", "")}


ECHO = ModelType(
    "swamp/echo",
    description="Do nothing but echo a message: for smoke tests and benchmarks.",
    methods=(
        Method(
            "echo",
            _echo,
            args=(Arg("message", help="a line to log"),),
            help="Log the message (if any) and succeed.",
        ),
    ),
)

# -- the orchestrator's own bookkeeping: data, but never runnable --------------------------------

ENROLLMENT_TOKEN = ModelType(
    "swamp/enrollment-token",
    methods=(),
    internal=True,
    resources=(ResourceSpec("token", garbage_collection=10),),
)
SERVER_TOKEN = ModelType(
    "swamp/server-token",
    methods=(),
    internal=True,
    resources=(ResourceSpec("token", garbage_collection=10),),
)
TOKEN_BINDING = ModelType(
    "swamp/token-binding",
    methods=(),
    internal=True,
    # one item per machine a token admitted (instance: the token's name)
    resources=(ResourceSpec("binding", garbage_collection=1),),
)
WORKER = ModelType(
    "swamp/worker",
    methods=(),
    internal=True,
    resources=(ResourceSpec("state", garbage_collection=20),),
)
# which orchestrator holds a worker's socket, since which connection (swamp.domain.holding):
# one item per worker, replaced in place by compare-and-swap
WORKER_HOLDING = ModelType(
    "swamp/worker-holding",
    methods=(),
    internal=True,
    resources=(ResourceSpec("holding", garbage_collection=1),),
)
STEP_LEASE = ModelType(
    "swamp/step-lease",
    methods=(),
    internal=True,
    # one row per dispatch: inserted when it ends or 50 ms into it, then replaced in place
    resources=(ResourceSpec("lease", garbage_collection=1),),
)

PENDING_DISPATCH = ModelType(
    "swamp/pending-dispatch",
    methods=(),
    internal=True,
    resources=(ResourceSpec("dispatch", garbage_collection=10),),
)

WORKFLOW_RUN = ModelType(
    "swamp/workflow-run",
    methods=(),
    internal=True,
    resources=(ResourceSpec("run", garbage_collection=5),),
)
# one item per step of a run (its header is the workflow-run): replaced in place, a batch at once
WORKFLOW_STEP = ModelType(
    "swamp/workflow-step",
    methods=(),
    internal=True,
    resources=(ResourceSpec("step", garbage_collection=1),),
)

BUILTIN_TYPES = (
    SHELL,
    ECHO,
    FLEET_PROBE,
    ENROLLMENT_TOKEN,
    TOKEN_BINDING,
    SERVER_TOKEN,
    WORKER,
    WORKER_HOLDING,
    STEP_LEASE,
    PENDING_DISPATCH,
    WORKFLOW_RUN,
    WORKFLOW_STEP,
)

# the orchestrator's bookkeeping: their instance names are tokens', workers' and workflows'
INTERNAL_TYPES = frozenset(t.type for t in BUILTIN_TYPES if t.internal)


@hookimpl
def swamp_model_types() -> list[ModelType]:
    return list(BUILTIN_TYPES)
