"""``swamp model``: list model types, run a model's method here or on a worker."""

from __future__ import annotations

import json
import re
import sys
import time
from typing import Any

import typer

from swamp.cli.common import (
    JSON,
    ROUTE,
    Route,
    command,
    emit_json,
    with_admin,
)
from swamp.cli.output import LinePump

app = typer.Typer(
    help="Models: types, instances and running their methods.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
method_app = typer.Typer(help="Run a model's method.", no_args_is_help=True, rich_markup_mode=None)
app.add_typer(method_app, name="method")

_ARG = re.compile(r"^([A-Za-z_][A-Za-z0-9_-]*)=(.*)$", re.S)


def parse_args(items: list[str]) -> dict[str, str]:
    from swamp.errors import UserError

    out: dict[str, str] = {}
    for item in items:
        match = _ARG.match(item)
        if not match:
            raise UserError(f"invalid --arg {item!r}: expected name=value")
        out[match.group(1)] = match.group(2)
    return out


@app.command("types", short_help="Model types and their methods.")
@command
def types(json_output: bool = JSON) -> None:
    """Every runnable model type (built-in and from installed plugins) with its methods."""
    from swamp.plugins import default_registry

    registry = default_registry()
    items: list[dict[str, Any]] = [
        {
            "type": t.type,
            "description": t.description,
            "methods": [
                {
                    "name": m.name,
                    "help": m.help,
                    "args": [
                        {"name": a.name, "type": a.type, "required": a.required, "help": a.help}
                        for a in m.args
                    ],
                }
                for m in t.methods
            ],
            "resources": [s.name for s in t.resources],
        }
        for t in sorted(registry.types.values(), key=lambda t: t.type)
        if not t.internal
    ]
    if json_output:
        emit_json(items)
        return
    for item in items:
        print(f"{item['type']}: {item['description']}")
        for method in item["methods"]:
            args = ", ".join(
                f"{a['name']}{'' if a['required'] else '?'}:{a['type']}" for a in method["args"]
            )
            print(f"  {method['name']}({args}) {method['help']}")


class QueueProgress:
    """The "queued" line. On a terminal it shows the time waited, second by second, until the
    step is dispatched; elsewhere it is one line."""

    def __init__(self, out: LinePump, *, live: bool) -> None:
        self.out = out
        self.live = live
        self.text: str | None = None
        self.since = 0.0

    def queued(self, text: str) -> None:
        self.text, self.since = text, time.monotonic()
        if self.live:
            self._show()
        else:
            self.out.line(text, sys.stderr)

    def _show(self) -> None:
        waited = int(time.monotonic() - self.since)
        self.out.line(f"\r{self.text} ({waited}s)", sys.stderr, end="")

    def done(self) -> None:
        """The wait ended (dispatched, or the run ended): finish the live line."""
        if self.text is not None and self.live:
            self._show()
            self.out.line("", sys.stderr)
        self.text = None

    async def tick(self) -> None:
        import trio

        while True:
            await trio.sleep(1)
            if self.text is not None and self.live:
                self._show()


def _render_event(
    payload: dict, json_output: bool, out: LinePump, progress: QueueProgress | None = None
) -> None:
    """One streamed event: a log line, where the run went. Events come from workers, through
    the orchestrator: checked, and shown without interpreting any terminal escape. Everything
    goes through ``out``, so a reader that stalls never stalls the connection."""
    from swamp.domain.text import printable
    from swamp.errors import MalformedFrame
    from swamp.protocol.messages import (
        Dispatched,
        Dropped,
        LogLine,
        Queued,
        Redispatched,
        decode_event,
    )

    try:
        event = decode_event(payload)
    except MalformedFrame as exc:
        out.line(f"warning: ignored a malformed event: {printable(exc.message)}", sys.stderr)
        return
    if json_output:
        out.line(json.dumps({"event": event.to_json()}))
        return
    if isinstance(event, Queued):
        if event.detail:
            out.line(f"note: {printable(event.detail)}", sys.stderr)
        text = f"… queued, waiting for a worker matching {printable(event.requirement)}"
        if progress is not None:
            progress.queued(text)
        else:
            out.line(text, sys.stderr)
        return
    if progress is not None:
        progress.done()
    where = printable(getattr(event, "worker", None) or "orchestrator")
    if isinstance(event, LogLine):
        stream = sys.stderr if event.stream == "stderr" else sys.stdout
        out.line(f"[{where}] {printable(event.line, keep_tab=True)}", stream)
    elif isinstance(event, Dispatched):
        out.line(f"→ dispatched to {where} (dispatch {printable(event.dispatch_id)})", sys.stderr)
    elif isinstance(event, Redispatched):
        out.line(
            f"↻ worker {where} was lost ({printable(event.reason)}); queueing the step again",
            sys.stderr,
        )
    elif isinstance(event, Dropped):
        out.line(
            f"… {event.count} line(s) dropped by the orchestrator: this client was not "
            "reading fast enough",
            sys.stderr,
        )


@method_app.command("run", short_help="Run a method here or on a worker.")
@command
def run(
    model: str = typer.Argument(
        ...,
        help="A model instance from models/*.toml, or a model type "
        "such as command/shell (an ad-hoc instance).",
    ),
    method: str = typer.Argument(..., help="The method, e.g. run."),
    arg: list[str] = typer.Option(None, "--arg", help="name=value for the method; repeatable."),
    target: str = typer.Option(None, "--target", help="Run on this worker (name or instance id)."),
    label: list[str] = typer.Option(
        None, "--label", help="Run on a worker with this k=v label; repeatable (all must match)."
    ),
    platform: str = typer.Option(
        None, "--platform", help="Run on a worker of this os or os/arch, e.g. linux/x86_64."
    ),
    queue_timeout: str = typer.Option(
        None,
        "--queue-timeout",
        show_default=False,
        help="With a placement: how long to wait for a free matching worker before failing, "
        "e.g. 30s or 5m; 0 waits forever (default: the server's --queue-timeout, 10m).",
    ),
    timeout: str = typer.Option(
        None,
        "--timeout",
        show_default=False,
        help="How long the method may run once it started, e.g. 30m; past it, it is stopped "
        'and the run fails (execution_timeout). Default: the model\'s timeout = "…" in '
        "models/*.toml, else none. Not the time spent waiting for a worker (--queue-timeout).",
    ),
    env: list[str] = typer.Option(
        None,
        "--env",
        metavar="NAME",
        show_default=False,
        help="Ship this variable of the orchestrator's environment "
        "to the worker; repeatable. Nothing is shipped unless "
        "named here, by the model (env = [...]) or by serve "
        "--ship-env.",
    ),
    priority: str = typer.Option(
        "0",
        "--priority",
        metavar="N",
        help="With a placement, when it has to wait for a worker: -100 to 100, higher goes "
        "first (among equals, submitters take turns; waiting raises it, see serve "
        "--queue-aging). A run here, without a queue, ignores it.",
    ),
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """Run a method. With --target/--label/--platform it runs on the least-loaded matching
    worker; without, in the orchestrator's own process (or here, with no --server).

    When no matching worker is free the step waits in the queue ('swamp worker queue' lists
    it) and runs the moment one enrolls or frees a slot, or fails after --queue-timeout.
    Ctrl-C while it waits takes it out of the queue. Logs stream as they happen. With
    orchestrators sharing one database, give --server all of them (comma-separated, or a
    load balancer): if the one running the step goes away, the command follows the step
    through another and ends as it would have. Exit 0 when the method succeeded, 1 when it
    failed or timed out waiting. Example:
    swamp model method run command/shell run --arg command='uname -a' --label gpu=true
    """
    from swamp.domain.durations import parse_timeout
    from swamp.domain.environment import check_names
    from swamp.domain.labels import parse_labels
    from swamp.domain.placement import Placement
    from swamp.domain.priority import check_priority
    from swamp.domain.queue import parse_queue_timeout
    from swamp.protocol.messages import MethodRunRequest, PlacementSpec

    placement = Placement(target=target, labels=parse_labels(label or []), platform=platform)
    if queue_timeout is not None:
        parse_queue_timeout(queue_timeout, what="--queue-timeout")
    if timeout is not None:
        parse_timeout(timeout, what="--timeout")
    request = MethodRunRequest(
        model=model,
        method=method,
        args=parse_args(arg or []),
        placement=PlacementSpec(target=target, labels=placement.labels, platform=platform),
        env=list(check_names(env or [], source="--env")),
        queue_timeout=queue_timeout,
        timeout=timeout,
        priority=check_priority(priority),
        follow=True,  # (told the step's id, it follows the step elsewhere if need be)
    )

    from swamp.errors import ChannelClosed

    out = LinePump()
    progress = QueueProgress(out, live=not json_output and sys.stderr.isatty())
    recorded: list[str] = []  # the step's id, when its orchestrator recorded it
    reached: list[str] = []  # the orchestrator that took it

    async def on_event(event: dict) -> None:
        step_id = event.get("stepId") if isinstance(event, dict) else None
        if event.get("kind") == "recorded" and isinstance(step_id, str) and step_id:
            recorded[:] = [step_id]
        _render_event(event, json_output, out, progress)

    async def run_with_progress(api):
        from swamp.concurrency import open_unwrapping_nursery

        reached.append(getattr(api, "url", ""))
        async with open_unwrapping_nursery() as nursery:
            nursery.start_soon(progress.tick)
            try:
                return await api.method_run(request, on_event)
            finally:
                progress.done()
                nursery.cancel_scope.cancel()

    try:
        result = with_admin(
            run_with_progress,
            route,
            prefer_server=placement.is_remote(),
        )
    except ChannelClosed as exc:
        out.close()
        if not recorded or not route.server:
            raise
        result = _follow_after(recorded[0], route, reached[-1] if reached else "", exc.message)
    finally:
        out.close()
    if out.dropped:
        print(
            f"… {out.dropped} line(s) dropped here: the output was not being read fast enough",
            file=sys.stderr,
        )
    _render_result(result, json_output)
    raise typer.Exit(0 if result.status == "succeeded" else 1)


FOLLOW_REACH = 60.0  # seconds with no orchestrator of --server reachable before giving up
FOLLOW_STEADY = 10.0  # seconds a follow must have held for its loss to restart that count


@method_app.command("follow", short_help="Wait for a placed step's outcome, by its id.")
@command
def follow(
    step_id: str = typer.Argument(
        ..., metavar="STEP", help="The step's id ('recorded' event of run --json)."
    ),
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """Wait for the outcome of a step placed on a worker through any orchestrator of a
    shared database (serve --database postgresql://…), and print it as 'run' does: any
    orchestrator of the database answers, whichever one it was sent to — that one may have
    died since. 'run' does this by itself when its orchestrator closes the connection and
    --server lists several (comma-separated); this is for a client that went away too.
    Exit 0 when the method succeeded, 1 when it failed. Example:
    swamp model method follow 3f2a… --server wss://orch-1:7420,wss://orch-2:7420
    """
    from swamp.admin.routes import running_server, server_urls
    from swamp.errors import UserError

    server = route.server or running_server(route.repo_dir)
    if not server:
        raise UserError(
            "following a step needs its orchestrators: pass --server URL[,URL…] or set "
            "SWAMP_SERVE_URL"
        )
    result = _follow(step_id, route, server_urls(server))
    _render_result(result, json_output)
    raise typer.Exit(0 if result.status == "succeeded" else 1)


def _follow_after(step_id: str, route: Route, lost: str, why: str):
    """The step's outcome through the other orchestrators of ``--server`` (a list), after
    the one it was sent to (``lost``) closed the connection."""
    from swamp.admin.routes import server_urls
    from swamp.domain.text import printable

    urls = server_urls(route.server or "")
    at = urls.index(lost) + 1 if lost in urls else 0  # (one URL: a load balancer, again)
    print(
        f"… the connection to {printable(lost or urls[0])} closed ({printable(why)}): "
        f"following step {step_id} through another orchestrator",
        file=sys.stderr,
        flush=True,
    )
    return _follow(step_id, route, urls[at:] + urls[:at])


def unreachable(exc) -> bool:
    """An orchestrator that could not be reached, or closed the connection, or of an earlier
    version (it does not know the verb): not an answer about the step."""
    from swamp.errors import ChannelClosed, PeerError, UnknownMethod

    if isinstance(exc, UnknownMethod):
        return True
    return not exc.answered and (type(exc) is PeerError or isinstance(exc, ChannelClosed))


def _follow(step_id: str, route: Route, order: tuple[str, ...]):
    """The step's outcome through the first of ``order`` that can be reached, then the next
    should it close too: any orchestrator of the database answers for it once it has an
    outcome (``model.method.follow``), whoever runs it now."""
    import trio

    from swamp.admin.routes import connect_any
    from swamp.cli.common import run_async
    from swamp.errors import PeerError, SwampError
    from swamp.protocol.messages import MethodFollowRequest

    async def follow():
        deadline = trio.current_time() + FOLLOW_REACH
        failed: SwampError | None = None
        while True:
            for url in order:
                since = trio.current_time()
                try:
                    async with connect_any(
                        (url,),
                        server_token=route.server_token,
                        ca_cert=route.ca_cert,
                        repo_dir=route.repo_dir,
                    ) as api:
                        return await api.method_follow(MethodFollowRequest(step_id))
                except SwampError as exc:  # not reached, or lost too: the next one
                    if not unreachable(exc):
                        raise
                    failed = exc
                    if trio.current_time() - since >= FOLLOW_STEADY:  # it held a while
                        deadline = trio.current_time() + FOLLOW_REACH
            if trio.current_time() >= deadline:
                assert failed is not None
                raise PeerError(
                    f"no orchestrator of --server answered for step {step_id} in "
                    f"{FOLLOW_REACH:g}s (the last: {failed.message}); its outcome will be "
                    f"recorded: swamp model method follow {step_id} --server …"
                )
            await trio.sleep(1)

    return run_async(follow)


def _render_result(result, json_output: bool) -> None:
    if json_output:
        print(json.dumps({"result": result.to_json()}), flush=True)
        return
    from swamp.domain.text import printable

    where = result.worker or "orchestrator"
    outputs = ", ".join(f"{o.name} v{o.version}" for o in result.outputs)
    if outputs:  # where to find it: 'swamp data query' by the instance's name
        outputs = f"{outputs} of {result.model}"
    if result.status == "succeeded":
        line = (
            f"✓ {result.model_type}.{result.method} succeeded on {where} in "
            f"{result.duration_ms}ms" + (f"; wrote {outputs}" if outputs else "")
        )
    else:
        line = f"✗ {result.model_type}.{result.method} failed on {where}: {result.error}"
    print(printable(line), file=sys.stderr)
