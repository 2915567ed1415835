"""``swamp workflow``: create, check, list, show, run, history and cancel workflows."""

from __future__ import annotations

import json
import sys
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from swamp.cli.common import (
    JSON,
    REPO_DIR,
    ROUTE,
    Route,
    command,
    emit_json,
    repo_path,
    table,
    with_admin,
)

if TYPE_CHECKING:
    from rich.live import Live
    from rich.tree import Tree

app = typer.Typer(
    help="Workflows: jobs and steps in workflows/NAME.toml, run by the orchestrator.",
    no_args_is_help=True,
    rich_markup_mode=None,
)

TEMPLATE_HEADER = """\
# A workflow: jobs of steps. Run it with 'swamp workflow run {name}'.
# A job starts when the jobs it depends on have ended (dependsOn, with a condition: succeeded,
# failed, completed, skipped, always, and/or/not); a step likewise within its job.
# A step runs a model method (modelIdOrName = an instance in models/ or a type such as
# command/shell; or modelType + modelName) or another workflow (type = "workflow").
# Placement - target, labels, platform, queueTimeout (seconds, or 5m; 0 waits forever) - may be
# set on the workflow, a job or a step; the closest wins. ${{{{ ... }}}} in a string is an
# expression: inputs.x, self.<item> (forEach), run.id, data.latest(model, name),
# data.query(predicate), workers.connected({{'fleet': 'pool'}}).
#
# Fan a step out over every worker of a fleet:
#   forEach = {{ item = "w", in = "${{{{ workers.connected({{'fleet': 'pool'}}) }}}}" }}
#   target = "${{{{ self.w.name }}}}"

"""


def _template(name: str) -> dict:
    return {
        "name": name,
        "description": "Say hello, then report where it ran.",
        "inputs": {
            "properties": {"greeting": {"type": "string", "default": "hello"}},
        },
        "jobs": [
            {
                "name": "main",
                "steps": [
                    {
                        "name": "greet",
                        "task": {
                            "type": "model_method",
                            "modelIdOrName": "command/shell",
                            "methodName": "run",
                            "inputs": {"command": "echo ${{ inputs.greeting }}"},
                        },
                    },
                    {
                        "name": "where",
                        "dependsOn": [{"step": "greet", "condition": {"type": "succeeded"}}],
                        "task": {
                            "type": "model_method",
                            "modelIdOrName": "command/shell",
                            "methodName": "run",
                            "inputs": {"command": "uname -n"},
                        },
                    },
                ],
            }
        ],
    }


@app.command("create", short_help="Write a commented, runnable workflows/NAME.toml.")
@command
def create(
    name: str = typer.Argument(..., help="Lowercase letters, digits, - and _."),
    repo_dir: Path = REPO_DIR,
    json_output: bool = JSON,
) -> None:
    """Write workflows/NAME.toml: a two-step workflow that runs as it is, with comments that
    say what every field does. Refuses to overwrite a workflow that exists."""
    import tomli_w

    from swamp.domain.workflow import check_workflow_name
    from swamp.errors import AlreadyExists
    from swamp.repo import Repo

    check_workflow_name(name)
    repo = Repo.find(repo_path(repo_dir))
    path = repo.root / "workflows" / f"{name}.toml"
    if path.exists():
        raise AlreadyExists(f"workflow {name!r} exists already: {path}")
    path.parent.mkdir(exist_ok=True)
    path.write_text(TEMPLATE_HEADER.format(name=name) + tomli_w.dumps(_template(name)))
    if json_output:
        emit_json({"name": name, "path": str(path)})
    else:
        print(f"wrote {path}; run it with 'swamp workflow run {name}'")


@app.command("validate", short_help="Check workflows: one line per problem, with its place.")
@command
def validate(
    name: str = typer.Argument(None, show_default=False, help="One workflow (default: all)."),
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """Check each workflow: keys (with a did-you-mean), names, dependencies and cycles, models,
    methods and required arguments, labels, durations and expressions. Each problem is one line
    naming its place in the file, e.g. jobs[1].steps[0].task.methodName. Warnings (a
    queueTimeout without placement) do not fail. Exit 2 if any workflow has a problem."""
    from swamp.domain.workflow import check_workflow_name
    from swamp.protocol.messages import WorkflowRequest

    if name is not None:
        check_workflow_name(name)  # refused here, the same on either route

    reply = with_admin(
        lambda api: api.workflow_validate(WorkflowRequest(name=name)),
        route,
    )
    if json_output:
        emit_json(reply.to_json())
    else:
        _print_problems(reply.workflows)
    if not reply.passed:
        raise typer.Exit(2)


def _print_problems(workflows: list[dict]) -> None:
    from swamp.domain.text import printable

    for item in workflows:
        errors = [p for p in item["problems"] if not p["warning"]]
        mark = "✗" if errors else "✓"
        print(f"{mark} {item['name']}", file=sys.stderr if errors else sys.stdout)
        for problem in item["problems"]:
            kind = "warning" if problem["warning"] else "error"
            place = f"{problem['place']}: " if problem["place"] else ""
            print(printable(f"  {kind}: {place}{problem['message']}"), file=sys.stderr)


@app.command("list", short_help="The workflows of the repo.")
@command
def list_workflows(
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """Every workflows/*.toml: its jobs, steps, whether it places steps on workers, problems."""
    reply = with_admin(
        lambda api: api.workflow_list(),
        route,
    )
    if json_output:
        emit_json(reply.to_json())
        return
    if not reply.workflows:
        print("No workflows yet: 'swamp workflow create NAME' writes one.")
        return
    rows = [
        [
            w["name"],
            str(w["jobs"]),
            str(w["steps"]),
            "yes" if w["placed"] else "no",
            str(w["problems"]) if w["problems"] else "-",
            w["description"],
        ]
        for w in reply.workflows
    ]
    print(table(["NAME", "JOBS", "STEPS", "PLACED", "PROBLEMS", "DESCRIPTION"], rows))


@app.command("show", short_help="A workflow as its file says, and its problems.")
@command
def show(
    name: str = typer.Argument(...),
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """The workflow's jobs and steps: what each runs, what it depends on (and on which
    condition), its concurrency cap, whether a step may fail without failing its job, and its
    fan-out, guard and placement. --json gives the file with those defaults written out."""
    from swamp.domain.text import printable
    from swamp.domain.workflow import check_workflow_name
    from swamp.protocol.messages import WorkflowRequest

    check_workflow_name(name)  # refused here, the same on either route

    reply = with_admin(
        lambda api: api.workflow_show(WorkflowRequest(name=name)),
        route,
    )
    if json_output:
        emit_json(reply.to_json())
        return
    wf = reply.workflow
    print(printable(f"{name}: {wf.get('description', '')}".rstrip(": ")))
    print(f"jobs at once: {_cap(wf.get('concurrency'))}")
    print()
    print(
        table(
            ["JOB", "STEP", "RUNS", "DEPENDS ON", "CONCURRENCY", "ALLOW FAILURE", "MORE"], _rows(wf)
        )
    )
    _print_problems([{"name": name, "problems": reply.problems}] if reply.problems else [])


def _cap(value, none: str = "no cap") -> str:
    """A concurrency as written: 0 (or nothing) is no cap."""
    return none if value in (0, None) else str(value)


def _condition(condition) -> str:
    if not isinstance(condition, dict):
        return str(condition)
    kind = condition.get("type", "succeeded")
    if kind in ("and", "or"):
        parts = condition.get("conditions")
        if isinstance(parts, list):
            return "(" + f" {kind} ".join(_condition(c) for c in parts) + ")"
    if kind == "not":
        return f"not {_condition(condition.get('condition'))}"
    return str(kind)


def _depends(node: dict, noun: str) -> str:
    deps = node.get("dependsOn") or []
    if not isinstance(deps, list):
        return str(deps)
    return (
        ", ".join(
            f"{d.get(noun)} {_condition(d.get('condition'))}" if isinstance(d, dict) else str(d)
            for d in deps
        )
        or "-"
    )


def _rows(wf: dict) -> list[list[str]]:
    """A row per job (its own settings), then a row per step of it."""
    rows = []
    jobs = wf.get("jobs")
    for job in jobs if isinstance(jobs, list) else []:
        if not isinstance(job, dict):
            continue
        # a job's cap is on its steps at once; without one, the workflow's applies to them too
        cap = _cap(job.get("concurrency"), "-")
        if cap == "-" and _cap(wf.get("concurrency"), "-") != "-":
            cap = f"{wf['concurrency']} (the workflow's)"
        rows.append([str(job.get("name")), "", "", _depends(job, "job"), cap, "", _more(job)])
        steps = job.get("steps")
        for step in steps if isinstance(steps, list) else []:
            if not isinstance(step, dict):
                continue
            task = step.get("task")
            if not isinstance(task, dict):
                task = {}
            runs = task.get("workflowIdOrName") or (
                f"{task.get('modelIdOrName') or task.get('modelType')}.{task.get('methodName')}"
            )
            extra = (
                [f"for each {step['forEach'].get('item')}"]
                if isinstance(step.get("forEach"), dict)
                else []
            )
            if step.get("guard"):
                extra.append(f"guard {step['guard']}")
            rows.append(
                [
                    "",
                    str(step.get("name")),
                    str(runs),
                    _depends(step, "step"),
                    _cap(step.get("concurrency"), "-"),  # its forEach expansions at once
                    "yes" if step.get("allowFailure") is True else "no",
                    "; ".join([*extra, _more(step)]).strip("; "),
                ]
            )
    return rows


def _more(node: dict) -> str:
    return "; ".join(
        f"{key}={node[key]}"
        for key in ("target", "labels", "platform", "queueTimeout", "timeout", "affinity")
        if key in node
    )


# -- running ------------------------------------------------------------------------------------

TREE_STEPS = 20  # a job with more steps is drawn as counts, and its running or failed ones
_ICONS = {
    "pending": "○",
    "running": "◐",
    "queued": "…",
    "succeeded": "✓",
    "failed": "✗",
    "skipped": "⊘",
    "cancelled": "✖",
}


async def whole_run(api, reply) -> dict:
    """The run a reply began, every step: a run larger than one reply holds comes in pages,
    asked for one after the other (the same on both routes)."""
    from swamp.domain.run_record import merge_page
    from swamp.protocol.messages import RunRef

    run, offset = reply.run, reply.next_offset
    while offset is not None:
        more = await api.workflow_history_get(RunRef(run=run["runId"], offset=offset))
        merge_page(run, more.run)
        offset = more.next_offset
    return run


class RunView:
    """What a terminal shows of a running workflow: a tree of jobs and steps (rich), redrawn as
    events arrive and every second; elsewhere, one line per event."""

    def __init__(self, *, live: bool, json_output: bool, out) -> None:
        self.live = live
        self.json = json_output
        self.out = out
        self.name = ""
        self.jobs: dict[str, dict] = {}
        self.steps: dict[tuple[str, str], dict] = {}
        self._live: Live | None = None
        self._drawn = 0.0  # when the tree was last drawn (monotonic)

    def start(self) -> None:
        if self.live:
            from rich.console import Console
            from rich.live import Live

            self._live = Live(
                self.render(), console=Console(stderr=True), refresh_per_second=4, transient=False
            )
            self._live.start()

    def stop(self) -> None:
        if self._live is not None:
            self._live.update(self.render())
            self._live.stop()
            self._live = None

    def event(self, payload: dict) -> None:
        from swamp.domain.text import printable
        from swamp.errors import MalformedFrame
        from swamp.protocol.messages import RunEvent, StepEvent, decode_event

        try:
            event = decode_event(payload)
        except MalformedFrame:
            return
        if self.json:
            self.out.line(json.dumps({"event": event.to_json()}))
            return
        if isinstance(event, RunEvent):
            if event.what == "started" and not self.name:
                self.name = event.workflow
                for job in event.jobs:
                    self.jobs[job["name"]] = {"status": "pending", "since": None}
            elif event.what == "job_started" and event.job in self.jobs:
                self.jobs[event.job].update(status="running", since=time.monotonic())
            elif event.what == "job_finished" and event.job in self.jobs:
                self.jobs[event.job]["status"] = event.status
            line = (
                f"{event.job or event.workflow} │ {event.what.replace('_', ' ')}"
                + (f" {event.status}" if event.status else "")
                + (f": {event.detail}" if event.detail else "")
            )
        elif isinstance(event, StepEvent):
            key = (event.job, event.step)
            step = self.steps.setdefault(key, {"status": "pending", "since": None})
            if event.what == "started":
                step.update(status="running", since=time.monotonic())
            elif event.what == "queued":
                step.update(status="queued", detail=event.detail)
            elif event.what == "dispatched":
                step.update(status="running", worker=event.worker)
            elif event.what in ("succeeded", "failed", "skipped", "cancelled"):
                step.update(status=event.what, detail=event.detail, ended=time.monotonic())
            if event.what == "log":
                where = f"[{event.worker}] " if event.worker else ""
                line = f"{event.job}.{event.step} │ {where}{event.line}"
            else:
                line = (
                    f"{event.job}.{event.step} │ {event.what}"
                    + (f" on {event.worker}" if event.worker else "")
                    + (f": {event.detail}" if event.detail else "")
                )
        else:
            return
        if self._live is not None:
            # drawn four times a second at most, not at each event (30,000 in a fan-out)
            if (now := time.monotonic()) - self._drawn >= 0.25:
                self._live.update(self.render())
                self._drawn = now
        elif not self.live:
            self.out.line(printable(line, keep_tab=True), sys.stderr)

    def render(self) -> Tree:
        from rich.text import Text
        from rich.tree import Tree

        from swamp.domain.text import printable

        root = Tree(Text(f"workflow {self.name or '…'}", style="bold"))
        now = time.monotonic()
        by_job: dict[str, list[tuple[str, dict]]] = {}
        for (j, step), s in self.steps.items():
            by_job.setdefault(j, []).append((step, s))
        for job, state in self.jobs.items():
            branch = root.add(f"{_ICONS.get(state['status'], '?')} {printable(job)}")
            steps = by_job.get(job, [])
            if len(steps) > TREE_STEPS:  # a fan-out: how many in each status, and a few
                counts = Counter(s["status"] for _, s in steps)
                branch.add(", ".join(f"{n:,} {status}" for status, n in sorted(counts.items())))
                busy = [(n, s) for n, s in steps if s["status"] in ("running", "queued", "failed")]
                steps = busy[:TREE_STEPS]
            for step, s in steps:
                since = s.get("since")
                elapsed = f" {int((s.get('ended') or now) - since)}s" if since else ""
                worker = f" on {s['worker']}" if s.get("worker") else ""
                detail = f" — {s['detail']}" if s.get("detail") else ""
                branch.add(
                    Text(
                        printable(f"{_ICONS.get(s['status'], '?')} {step}{worker}{elapsed}{detail}")
                    )
                )
        return root

    async def tick(self) -> None:
        import trio

        while True:
            await trio.sleep(1)
            if self._live is not None:
                self._live.update(self.render())


@app.command("run", short_help="Run a workflow; streams its jobs and steps.")
@command
def run(
    name: str = typer.Argument(...),
    input: list[str] = typer.Option(
        None,
        "--input",
        metavar="K=V",
        help="A workflow input; repeatable. V takes the input's declared type: JSON for an "
        """array or object (--input 'hosts=["a", "b"]'), text for a string.""",
    ),
    timeout: str = typer.Option(
        None, "--timeout", help="Cancel the run after this long, e.g. 30m."
    ),
    priority: str = typer.Option(
        None,
        "--priority",
        metavar="N",
        show_default=False,
        help="The run's priority, -100 to 100: its placed steps go before waiting steps of "
        "lower priority. As if the workflow said priority = N: a job's or step's own priority "
        "in the file still wins. Default: the file's, else 0. A run here, without a queue, "
        "ignores it.",
    ),
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """Run a workflow in the orchestrator (the repo's running 'swamp serve', --server or
    SWAMP_SERVE_URL); one with no placed step may also run here, without a server.

    Jobs and steps start as soon as their own dependencies have ended. On a terminal a live
    tree shows each step's status, worker and time; --json prints one event per line and then
    the run. Ctrl-C cancels the run (its running steps are cancelled on their workers, queued
    ones leave the queue) and exits 130. Exit 0 when the run succeeded, 1 when it failed or was
    cancelled, 2 when the workflow or its inputs are invalid.
    """
    from swamp.cli.model_cmd import parse_args
    from swamp.cli.output import LinePump
    from swamp.concurrency import open_unwrapping_nursery
    from swamp.domain.durations import parse_duration
    from swamp.domain.priority import check_priority
    from swamp.domain.workflow import check_workflow_name
    from swamp.protocol.messages import WorkflowRunRequest

    check_workflow_name(name)  # refused here, the same on either route
    if timeout is not None:
        parse_duration(timeout, what="--timeout")
    request = WorkflowRunRequest(
        name=name,
        inputs=parse_args(input or []),
        timeout=timeout,
        priority=None if priority is None else check_priority(priority),
    )
    out = LinePump()
    view = RunView(live=not json_output and sys.stderr.isatty(), json_output=json_output, out=out)

    async def on_event(event: dict) -> None:
        view.event(event)

    async def go(api):
        view.start()
        try:
            async with open_unwrapping_nursery() as nursery:
                nursery.start_soon(view.tick)
                reply = await api.workflow_run(request, on_event)
                nursery.cancel_scope.cancel()
        finally:
            view.stop()
        return await whole_run(api, reply)  # outside the cancelled scope: its pages, if any

    try:
        record = with_admin(
            go,
            route,
            prefer_server=True,
        )
    finally:
        out.close()
    if json_output:
        print(json.dumps({"run": record}), flush=True)
    else:
        _print_summary(record)
    raise typer.Exit(0 if record["status"] == "succeeded" else 1)


def _print_summary(run: dict) -> None:
    from swamp.domain.text import printable

    mark = _ICONS.get(run["status"], "?")
    print(printable(f"{mark} workflow {run['workflow']} {run['status']} (run {run['runId'][:12]})"))
    for job in run.get("jobs", []):
        print(printable(f"  {_ICONS.get(job['status'], '?')} {job['name']}"))
        for step in job.get("steps", []):
            where = f" on {step['worker']}" if step.get("worker") else ""
            why = step.get("error") or step.get("reason")
            allowed = " (allowed to fail)" if step.get("allowedFailure") else ""
            print(
                printable(
                    f"    {_ICONS.get(step['status'], '?')} {step['name']}{where}{allowed}"
                    + (f": {why}" if why else "")
                )
            )
    if run.get("error") and run["status"] != "succeeded":
        print(printable(f"error: {run['error']}"), file=sys.stderr)


@app.command("history", short_help="Past and running runs; 'history get RUN' shows one.")
@command
def history(
    name: str = typer.Argument(
        None, show_default=False, help="Only this workflow's runs; or 'get' followed by a run."
    ),
    run_id: str = typer.Argument(
        None, metavar="[RUN]", show_default=False, help="With get: a run id or unique prefix."
    ),
    logs: bool = typer.Option(
        False, "--logs", help="With get: then everything each step printed (see 'swamp logs')."
    ),
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """'swamp workflow history [NAME]': runs, newest first — id, workflow, status, steps that
    succeeded, start, error. 'swamp workflow history get RUN [--logs]': one run as recorded,
    job by job and step by step, with each step's worker, queue wait, error and times; with
    --logs then every line its steps printed, step by step, each line after its step's name
    (as 'swamp logs RUN'; with --json: the run as one line, then one object per line)."""
    from swamp.domain.workflow import check_workflow_name
    from swamp.errors import UserError
    from swamp.protocol.messages import RunRef, WorkflowRequest

    if name == "get":
        if not run_id:
            raise UserError("history get needs a run id: see 'swamp workflow history'")
        if logs:
            _history_get_with_logs(run_id, route, json_output)
            return

        async def get(api) -> dict:
            return await whole_run(api, await api.workflow_history_get(RunRef(run=run_id)))

        whole = with_admin(get, route)
        if json_output:
            emit_json({"run": whole})
            return
        _print_summary(whole)
        return
    if run_id:
        raise UserError(f"unexpected {run_id!r}: 'history NAME' or 'history get RUN'")
    if name is not None:
        check_workflow_name(name)  # refused here, the same on either route
    reply = with_admin(lambda api: api.workflow_history(WorkflowRequest(name=name)), route)
    if json_output:
        emit_json(reply.to_json())
        return
    if not reply.runs:
        print("No workflow runs yet.")
        return
    rows = [
        [
            r["runId"][:12],
            r["workflow"],
            r["status"],
            f"{r['succeeded']}/{r['steps']}",
            r["startedAt"],
            (r.get("error") or "")[:60],
        ]
        for r in reply.runs
    ]
    print(table(["RUN", "WORKFLOW", "STATUS", "STEPS OK", "STARTED", "ERROR"], rows))


def _history_get_with_logs(run_id: str, route: Route, json_output: bool) -> None:
    """The run's tree, then all its steps' output (one route for both)."""
    from swamp.cli.logs_cmd import say_how_it_ended, show
    from swamp.protocol.messages import RunRef

    async def go(api) -> dict:
        run = await whole_run(api, await api.workflow_history_get(RunRef(run=run_id)))
        if json_output:
            print(json.dumps({"run": run}), flush=True)
        else:
            _print_summary(run)
            sys.stdout.flush()
        return await show(api, run["runId"], follow=False, json_output=json_output)

    say_how_it_ended(with_admin(go, route, prefer_server=True), follow=False)  # as swamp logs


@app.command("cancel", short_help="Cancel a running workflow run.")
@command
def cancel(
    run_id: str = typer.Argument(..., metavar="RUN", help="A run id, or a unique prefix."),
    reason: str = typer.Option(None, "--reason", help="Recorded with the run."),
    step: str = typer.Option(
        None,
        "--step",
        metavar="JOB.STEP",
        help="Cancel only this running step (as 'workflow history get' names it).",
    ),
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """Cancel a run in the orchestrator that runs it (asked through any other serving the same
    database): its running steps are cancelled on their workers, its queued steps leave the
    queue, the run is recorded cancelled.

    With --step JOB.STEP only that step is cancelled (on its worker, or out of the queue): it
    ends failed with the reason, its dependants follow their conditions as after any failure
    (a step that runs when another fails runs), and the run goes on.

    Exit status: 0 cancelled; 1 no such run or step running in this orchestrator."""
    from swamp.protocol.messages import RunRef

    async def cancel_run(api) -> dict:
        request = RunRef(run=run_id, reason=reason, step=step)
        return await whole_run(api, await api.workflow_cancel(request))

    run = with_admin(cancel_run, route, prefer_server=True)
    if json_output:
        emit_json({"run": run})
    elif step is not None:
        ended = _step_of(run, step)
        print(f"run {run['runId'][:12]} step {step}: {ended or 'cancelled'} ({run['status']})")
    else:
        print(f"run {run['runId'][:12]}: {run['status']}")


def _step_of(run: dict, ref: str) -> str | None:
    """The status ``run`` records for its step ``JOB.STEP``."""
    for job in run.get("jobs") or []:
        for entry in job.get("steps") or []:
            if f"{job.get('name')}.{entry.get('name')}" == ref:
                return str(entry.get("status"))
    return None
