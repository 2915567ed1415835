"""``swamp worker``: connect a worker, list the pool, manage enrollment tokens."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from swamp.cli.common import (
    CA_CERT,
    JSON,
    ROUTE,
    Route,
    command,
    emit_json,
    run_async,
    table,
    with_admin,
)
from swamp.domain.labels import format_labels
from swamp.domain.text import printable
from swamp.domain.workers import WorkerStatus

app = typer.Typer(
    help="Workers: connect one, list the pool, manage enrollment tokens.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
token_app = typer.Typer(
    help="Enrollment tokens: what a worker presents to join the pool.",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(token_app, name="token")


@app.command("connect", short_help="Enroll a worker and run what it is sent.")
@command
def connect(
    url: str = typer.Argument(
        None,
        envvar="SWAMP_ORCHESTRATOR_URL",
        show_default=False,
        help="The orchestrator's ws:// or wss:// URL; or several, comma-separated (orchestrators "
        "on one database): the first reached is used, the next after a drop",
    ),
    token: str = typer.Option(
        None,
        "--token",
        envvar="SWAMP_WORKER_TOKEN",
        show_default=False,
        help="Enrollment token <name.secret>, or <scheme>:<reference> for a token source "
        "(file:PATH, env:NAME, or a plugin's, e.g. exec:COMMAND). Prefer the variable or a "
        "file: argv is visible to every user of the machine",
    ),
    token_file: Path = typer.Option(
        None,
        "--token-file",
        envvar="SWAMP_WORKER_TOKEN_FILE",
        show_default=False,
        help="Read the token from this file, e.g. a Kubernetes or "
        "Docker secret mount; a trailing newline is trimmed. "
        "Not with --token.",
    ),
    token_fd: int = typer.Option(
        None,
        "--token-fd",
        hidden=True,
        help="Read the token from this inherited file descriptor (how the worker starts "
        "itself again without the token in its environment or command line).",
    ),
    label: list[str] = typer.Option(
        None,
        "--label",
        show_default=False,
        help="A k=v label placements can match; repeatable. Merged "
        "with SWAMP_WORKER_LABELS (k=v,k2=v2); the flag wins "
        "for the same key.",
    ),
    cache_dir: Path = typer.Option(
        None,
        "--cache-dir",
        envvar="SWAMP_WORKER_CACHE_DIR",
        show_default=False,
        help="Keeps the machine id across restarts, so a restarted "
        "worker re-enrolls as itself (default: a fresh temp dir: "
        "every process is a new machine).",
    ),
    ca_cert: Path = CA_CERT,
    ca_pin: str = typer.Option(
        None,
        "--ca-pin",
        envvar="SWAMP_CA_PIN",
        show_default=False,
        metavar="sha256:HEX",
        help="The pin of the orchestrator's own CA ('swamp serve --tls auto' and 'swamp worker "
        "token create' print it): trust exactly the certificates that CA signs, whatever name "
        "reaches it. Nothing else to distribute; with --ca-cert, that file must be the CA.",
    ),
    concurrency: str = typer.Option(
        "1",
        "--concurrency",
        envvar="SWAMP_WORKER_CONCURRENCY",
        metavar="N|auto",
        help="Dispatch slots: how many methods run at once; auto: one per CPU of this machine",
    ),
    max_dispatches: int = typer.Option(
        None,
        "--max-dispatches",
        envvar="SWAMP_WORKER_MAX_DISPATCHES",
        show_default=False,
        help="Run this many dispatches, then drain and exit 0 (one-shot CI runners: 1).",
    ),
    idle_timeout: str = typer.Option(
        None,
        "--idle-timeout",
        envvar="SWAMP_WORKER_IDLE_TIMEOUT",
        show_default=False,
        help="Drain and exit 0 after this long with no dispatch running, e.g. 10m (counted "
        "from enrollment, and again each time the last dispatch ends).",
    ),
    drain_timeout: str = typer.Option(
        None,
        "--drain-timeout",
        envvar="SWAMP_WORKER_DRAIN_TIMEOUT",
        show_default=False,
        help="A drain still running after this long stops its dispatches, as a second signal "
        "would (default: no limit; the service manager's grace period rules).",
    ),
    data_plane_url: str = typer.Option(
        None,
        "--data-plane-url",
        envvar="SWAMP_DATA_PLANE_URL",
        show_default=False,
        help="Base URL of the data plane, for split deployments "
        "(default: the connect URL's host over http/https)",
    ),
    insecure: bool = typer.Option(
        False,
        "--insecure",
        envvar="SWAMP_WORKER_INSECURE",
        help="Allow plain ws:// and http:// to a host other than this one: the token and "
        "dispatch credentials then cross the network unencrypted. Without it the worker "
        "refuses, and asks for wss://.",
    ),
    protocol_version: int = typer.Option(
        None,
        "--protocol-version",
        hidden=True,
        help="Announce another protocol version (for compatibility testing).",
    ),
    verbose: bool = typer.Option(
        False,
        "--verbose",
        "-v",
        envvar="SWAMP_WORKER_VERBOSE",
        help="A line for every dispatch as it starts and ends (always so with --json).",
    ),
    json_output: bool = JSON,
) -> None:
    """Enroll with the orchestrator and run what it dispatches, until stopped.

    Needs nothing but environment variables: SWAMP_ORCHESTRATOR_URL=wss://… plus
    SWAMP_WORKER_TOKEN (or SWAMP_WORKER_TOKEN_FILE) make 'swamp worker connect' enough. Every
    flag has a variable (shown with each option); an explicit flag wins.

    The token may come from a source: SWAMP_WORKER_TOKEN=file:/run/secrets/swamp, env:NAME, or
    a plugin's scheme (exec:COMMAND, a vault). It is asked once at start, and again only when
    the orchestrator refuses the token in hand for good or its deadline passes: a different
    answer (a rotated secret) is enrolled with, the same one stops the worker as before.

    Reconnects after a drop (backoff 1s doubling to 30s) for as long as the token lives.

    Drain: the first SIGTERM, SIGINT or SIGHUP (or --max-dispatches, or --idle-timeout) makes
    it take no new work and tell the orchestrator so at once; the dispatches running finish
    and report, then it exits 0. A second signal stops the running dispatches (they fail as
    "worker stopped") and exits 3; a third exits at once.

    Exit status: 0 every intentional stop (a drain); 1 a permanent rejection (a revoked,
    expired, wrong or unknown token, a single-machine token bound elsewhere, a protocol
    mismatch, a wrong --ca-pin), which would repeat if restarted, or an unexpected error; 2 bad
    input, or a token source that gave no token (one line naming it); 3 a forced stop (a
    second signal or --drain-timeout); 4 no orchestrator reached for the whole connect timeout
    (a restart may help: the unit restarts it). A full fleet is not a rejection: the worker is
    told the allowance is exhausted and waits for a place, asking again. --json prints one
    JSON event per line (connecting, enrolled, token_renewed, dispatch_started,
    dispatch_finished, draining, drain_complete, forcing, stopped {reason, exitCode};
    fleet_full and waiting_for_place while a fleet token's places are all taken).
    """
    import os

    from swamp.domain.durations import parse_duration
    from swamp.domain.labels import merge_labels
    from swamp.errors import UserError
    from swamp.worker import handoff
    from swamp.worker.config import WorkerConfig, parse_concurrency
    from swamp.worker.token_sources import Supply, supply

    if token_fd is not None:
        if token or token_file:
            raise UserError("pass the token one way: --token-fd, or the token, or its file")
        given = Supply(handoff.read_token_fd(token_fd), "the token")
    else:
        from swamp.plugins import default_token_sources

        given = supply(token, token_file, sources=default_token_sources)
    config = WorkerConfig(
        url=url or "",
        token=given.token,
        token_again=given.again,
        token_source=given.source,
        labels=merge_labels(os.environ.get("SWAMP_WORKER_LABELS"), label or []),
        cache_dir=cache_dir,
        ca_cert=ca_cert,
        ca_pin=ca_pin,
        concurrency=parse_concurrency(concurrency),
        max_dispatches=max_dispatches,
        idle_timeout=(
            parse_duration(idle_timeout, what="--idle-timeout (SWAMP_WORKER_IDLE_TIMEOUT)")
            if idle_timeout
            else None
        ),
        drain_timeout=(
            parse_duration(drain_timeout, what="--drain-timeout (SWAMP_WORKER_DRAIN_TIMEOUT)")
            if drain_timeout
            else None
        ),
        data_plane_url=data_plane_url,
        json=json_output,
        protocol_version=protocol_version,
        insecure=insecure,
    )
    secrets, variables = handoff.exposed(config.token, token)
    if secrets:  # in the environment or on the command line: in view
        handoff.hide(config.token, secrets, variables)
    elif token:  # a reference: kept in memory for asking again, and out of view
        handoff.blank(token)
    from swamp.worker.agent import run_worker
    from swamp.worker.events import Reporter

    status = run_async(run_worker, config, Reporter(json_lines=json_output, verbose=verbose))
    raise typer.Exit(status)


@app.command("unit", short_help="Print a systemd unit that runs a worker.")
@command
def unit(
    exec_start: str = typer.Option(
        None,
        "--exec",
        show_default=False,
        help="How to start swamp on that machine, e.g. '/usr/bin/python3 -I /opt/swamp/swamp.pyz' "
        "(default: how this swamp was started: this python and this pyz, or the swamp "
        "program).",
    ),
    env_file: str = typer.Option(
        "/etc/swamp/worker.env", "--env-file", help="The EnvironmentFile the unit reads."
    ),
    user: str = typer.Option(None, "--user", help="Run as this user (default: root)."),
    json_output: bool = JSON,
) -> None:
    """Print a systemd service for 'swamp worker connect', configured from an EnvironmentFile
    (keep it mode 0600: it holds the token). SIGTERM drains (TimeoutStopSec=300 lets running
    steps finish); Restart=on-failure with RestartPreventExitStatus=1 2, so neither a drained
    worker (exit 0), a rejected one (exit 1) nor a misconfigured one (exit 2) is restarted.
    Install it with: swamp worker unit > /etc/systemd/system/swamp-worker.service &&
    systemctl daemon-reload && systemctl enable --now swamp-worker"""
    from swamp.errors import UserError

    exec_start = exec_start or _this_swamp()
    for what, value in (("--exec", exec_start), ("--env-file", env_file)):
        if not value.startswith("/") or "\n" in value:
            raise UserError(f"{what} must be an absolute path (got {value!r})")
    if user is not None and not user.replace("-", "").replace("_", "").isalnum():
        raise UserError(f"invalid --user {user!r}")
    from swamp.domain.provisioning import unit as render_unit

    text = render_unit(exec_start=exec_start, env_file=env_file, user=user)
    if json_output:
        emit_json({"path": "/etc/systemd/system/swamp-worker.service", "content": text})
        return
    print(text, end="")


def _this_swamp() -> str:
    """The command that started this swamp, as a unit's ExecStart: the interpreter and the
    pyz it runs from, else the ``swamp`` program on PATH (or beside this interpreter)."""
    import os
    import shutil

    from swamp.orchestrator.downloads import running_pyz

    pyz = running_pyz()
    if pyz is not None:
        return f"{os.path.abspath(sys.executable)} -I {os.path.realpath(pyz)}"
    beside = os.path.join(os.path.dirname(sys.executable), "swamp")
    found = shutil.which("swamp") or (beside if os.access(beside, os.X_OK) else None)
    if found:
        return os.path.abspath(found)
    return f"{os.path.abspath(sys.executable)} -m swamp"


@app.command("list", short_help="The pool: workers, status, slots, labels.")
@command
def list_workers(
    all_workers: bool = typer.Option(False, "--all", help="Include disconnected workers."),
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """The pool: every enrolled worker with its status, slots and labels.

    Reads the running orchestrator with --server (live slot counts), else the repo's records.
    Disconnected workers are hidden unless --all.
    """
    from swamp.protocol.messages import WorkerListRequest

    reply = with_admin(
        lambda api: api.worker_list(WorkerListRequest(all=all_workers)),
        route,
    )
    if json_output:
        emit_json(reply.to_json())
        return
    ours = reply.orchestrator_version
    behind = [w for w in reply.workers if ours and w.swamp_version and w.swamp_version != ours]
    headers = ["NAME", "STATUS", "SLOTS", "LABELS", "PLATFORM/ARCH", "LAST SEEN"]
    rows = [
        [
            w.name,
            f"{w.status} ({w.drain_reason})" if w.drain_reason else w.status,
            f"{len(w.active_dispatch_ids)}/{w.capacity}",
            format_labels(w.labels),
            f"{w.platform}/{w.arch}",
            w.last_seen_at or "-",
            *([w.swamp_version or "?"] if behind else []),
        ]
        for w in reply.workers
    ]
    if rows:
        print(table([*headers, "VERSION"] if behind else headers, rows))
    else:
        print(
            "No connected workers."
            if reply.hidden_disconnected
            else "No workers yet: "
            "mint a token with 'swamp worker token create NAME --duration 1h' and connect one."
        )
    unverified = [w for w in reply.workers if w.status == WorkerStatus.UNVERIFIED]
    for worker in unverified:
        print(printable(f"{worker.name} is unverified: {worker.verify_failure_reason or '?'}"))
    if unverified:
        print("Unverified workers get no work; 'swamp worker verify NAME' shows every seam.")
    unresponsive = [w for w in reply.workers if w.status == WorkerStatus.UNRESPONSIVE]
    for worker in unresponsive:
        print(printable(f"{worker.name} is unresponsive: {worker.unresponsive_reason or '?'}"))
    if unresponsive:
        print(
            "Unresponsive workers get no work until they reconnect (restart them); the steps "
            "they were sent went back to the queue."
        )
    for worker in behind:
        print(
            printable(f"{worker.name} runs swamp {worker.swamp_version}, the orchestrator {ours}.")
        )
    if behind:
        print(
            "Workers of another version still run work; the orchestrator's own build is at "
            "its /swamp.pyz ('swamp worker token create NAME --cloud-init' provisions with it)."
        )
    hidden = reply.hidden_disconnected
    if hidden:
        print(
            f"{hidden} disconnected worker{'s' if hidden != 1 else ''} hidden: "
            "'swamp worker list --all' shows them."
        )


@app.command("queue", short_help="Demand: the steps waiting for a worker.")
@command
def queue(
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """The steps waiting for a free matching worker, oldest first (with the workflow, job
    and step each belongs to, for a workflow's step; its priority — as given, and ↑ as raised
    by waiting, live only — and its submitter: local, token:NAME), then one line per
    requirement: how many wait, the oldest wait, and the supply — matching workers connected
    and their free slots. A requirement with waiting steps and no matching worker needs a
    worker with those labels; one whose workers are all full needs more of them.

    Reads the running orchestrator with --server (live), else the repo's records
    (swamp/pending-dispatch, state waiting). --json prints {items, summary}.
    """
    from swamp.domain.queue import format_age

    reply = with_admin(
        lambda api: api.worker_queue(),
        route,
    )
    if json_output:
        emit_json(reply.to_json())
        return
    if not reply.items:
        print("No steps are waiting for a worker.")
        return
    rows = [
        [
            item.requirement,
            item.workflow_name or "-",  # a workflow's step; "-" for a run of its own
            item.job_name or "-",
            item.step_name or "-",
            item.model_name or item.model_type,
            item.method_name,
            item.queued_at,
            format_age(item.age_ms / 1000),
            _priority(item.priority, item.effective_priority),
            item.submitter or "-",
        ]
        for item in reply.items
    ]
    headers = [
        "REQUIREMENT",
        "WORKFLOW",
        "JOB",
        "STEP",
        "MODEL",
        "METHOD",
        "QUEUED AT",
        "AGE",
        "PRIORITY",  # last: the columns scripts read before stay where they were
        "SUBMITTER",
    ]
    print(table(headers, rows))
    print()
    for line in reply.summary:
        print(
            printable(
                f"{line.requirement}: {line.waiting} waiting, oldest "
                f"{format_age(line.oldest_wait_ms / 1000)}; {line.connected} matching "
                f"worker{'s' if line.connected != 1 else ''} connected, "
                f"{line.free_slots} free slot{'s' if line.free_slots != 1 else ''}"
            )
        )


def _priority(given: int, now: int | None) -> str:
    """``5``, or ``5↑8`` once waiting has raised it to 8."""
    return f"{given}↑{now}" if now is not None and now != given else str(given)


@app.command("drain", short_help="Ask a worker to finish its steps and leave (exit 0).")
@command
def drain(
    name: str = typer.Argument(..., help="The worker, by name (see 'swamp worker list')."),
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """Ask a connected worker to drain, as SIGTERM on its machine would: it takes no new
    step from now on (the pool shows it draining, and the queue gives its steps to others),
    finishes the ones it runs (within its --drain-timeout), then exits 0. Use it to take a
    machine out of a fleet without losing a step, from wherever the CLI reaches the
    orchestrator. A worker already draining is left as it is.

    Needs a running orchestrator: the one that holds the worker, or any other serving the
    same database, which asks it (--server, SWAMP_SERVE_URL, or the repo's
    .swamp/serve.json) and the admin scope. --json prints {name, running, already}.
    """
    from swamp.protocol.messages import WorkerDrainRequest

    reply = with_admin(
        lambda api: api.worker_drain(WorkerDrainRequest(name=name)), route, prefer_server=True
    )
    if json_output:
        emit_json(reply.to_json())
        return
    if reply.already:
        print(f"Worker {printable(reply.name)} is draining already ({reply.running} running).")
        return
    print(
        f"Worker {printable(reply.name)} is draining: it takes no new step, finishes its "
        f"{reply.running} running, then exits."
    )


@app.command("verify", short_help="Probe workers end to end, seam by seam.")
@command
def verify(
    name: str = typer.Argument(
        None, show_default=False, help="Verify only this worker (default: every connected one)."
    ),
    label: list[str] = typer.Option(
        None,
        "--label",
        show_default=False,
        help="Verify only workers with this k=v label; repeatable (all must match).",
    ),
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """Prove each worker end to end: run the fleet probe on it through the normal dispatch path
    and check every seam — the dispatch's environment arrives (env), a query over the control
    socket answers (capability), a resource written over HTTP reads back (data-plane), plus any
    seam an installed plugin adds. Probes run concurrently and never change a worker's status.

    Prints one row per worker (pass / fail / error, and for a failure the seam that broke and
    why) and a summary. Exit 1 if any worker did not pass, or if there was nothing to verify.
    Needs a running orchestrator (--server, SWAMP_SERVE_URL, or the repo's .swamp/serve.json);
    where several serve one database, any of them asks each to probe its own workers.
    """
    from swamp.domain.labels import parse_labels
    from swamp.protocol.messages import VerifyRequest

    labels = parse_labels(label or [])
    report = with_admin(
        lambda api: api.worker_verify(VerifyRequest(name=name, labels=labels)),
        route,
        prefer_server=True,
    )
    if json_output:
        emit_json(report.to_json())
    elif report.workers:
        marks = {"pass": "✓ pass", "fail": "✗ fail", "error": "! error"}
        rows = [
            [
                v.name,
                marks[v.status],
                f"{v.platform or '-'}/{v.arch or '-'}",
                v.error
                or "; ".join(v.failures)
                or f"{len(v.seams)} seams ok ({', '.join(v.seams)})",
            ]
            for v in report.workers
        ]
        print(table(["WORKER", "RESULT", "PLATFORM/ARCH", "DETAILS"], rows))
        print()
        if report.passed == report.total:
            print(f"All {report.total} worker(s) passed verification.")
        else:
            parts = [
                f"{report.failed} failed" if report.failed else "",
                f"{report.errors} gave no verdict" if report.errors else "",
            ]
            print(f"{' and '.join(p for p in parts if p)} of {report.total} worker(s).")
    else:
        selection = f" matching {format_labels(labels)}" if labels else ""
        print(f"No connected workers{selection} to verify.", file=sys.stderr)
    if not report.workers or report.passed != report.total:
        raise typer.Exit(1)


# -- tokens -------------------------------------------------------------------------------------


@token_app.command("create", short_help="Mint an enrollment token (one or a fleet).")
@command
def token_create(
    name: str = typer.Argument(..., help="Token name: lowercase letters, digits, - and _."),
    duration: str = typer.Option(
        ..., "--duration", help="How long it admits and keeps workers: 30s, 15m, 2h, 7d, 1w."
    ),
    max_enrollments: str = typer.Option(
        "1",
        "--max-enrollments",
        metavar="N|unlimited",
        help="How many machines may enroll with it. 1: one worker named after the token. More "
        "(or unlimited): a fleet; each machine is named <token>-<hash of its machine id> "
        "and labelled fleet=<token>.",
    ),
    label: list[str] = typer.Option(
        None,
        "--label",
        show_default=False,
        help="Pin a k=v label on every worker of this token; repeatable. A worker that claims "
        "another value for the key is refused.",
    ),
    allow_labels: str = typer.Option(
        None,
        "--allow-labels",
        metavar="KEY,...",
        show_default=False,
        help="The only label keys a worker may set itself (default: any). An empty value "
        "allows none; a worker setting another key is refused.",
    ),
    max_concurrency: int = typer.Option(
        None,
        "--max-concurrency",
        metavar="N",
        show_default=False,
        help="At most N slots per worker (1-1024); a worker asking for more gets N. Without "
        "it a worker gets at most 64.",
    ),
    cloud_init: bool = typer.Option(
        False,
        "--cloud-init",
        help="Print #cloud-config user-data that makes a machine a worker with this token: "
        "python3, the orchestrator's build (sha256 checked), an environment file (0600) and "
        "a systemd unit.",
    ),
    kubernetes: bool = typer.Option(
        False,
        "--kubernetes",
        help="Print Kubernetes manifests instead: a StatefulSet (each pod keeps its machine id on "
        "a volume), its Secret, ConfigMap and headless Service.",
    ),
    compose: bool = typer.Option(False, "--compose", help="Print a Compose service instead."),
    orchestrator_url: str = typer.Option(
        None,
        "--orchestrator-url",
        show_default=False,
        help="The URL machines connect to (default: the running server's), e.g. wss://host:7420.",
    ),
    output: Path = typer.Option(
        None,
        "--output",
        help="Write the provisioning file here, a new file (mode 0600: it holds the token); "
        "with --compose the token goes to swamp_token beside it. An existing file or a "
        "link is refused.",
    ),
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """Mint an enrollment token and print NAME.SECRET once (only a hash is stored).

    One fleet token can enroll a whole autoscaling group: --max-enrollments 8 or unlimited.
    A name that is revoked or expired may be minted again; a live one is refused.

    What its workers may say about themselves is the token's to limit: --label pins labels,
    --allow-labels lists the keys they may set, --max-concurrency caps their slots. Example:
    swamp worker token create gpu --duration 7d --max-enrollments unlimited --label gpu=true
    --allow-labels zone --max-concurrency 4

    With --cloud-init (or --kubernetes, --compose) it prints, instead, a file that provisions
    a machine as a worker with the new token, downloading the orchestrator's own build
    (swamp serve must serve one: it runs from swamp.pyz, or --pyz).
    """
    from swamp.domain.claims import ClaimPolicy
    from swamp.domain.durations import parse_duration
    from swamp.domain.labels import parse_labels
    from swamp.domain.tokens import parse_max_enrollments
    from swamp.errors import UserError
    from swamp.protocol.messages import TokenCreateRequest

    parse_duration(duration, what="--duration")  # bad input is refused here, on either route
    allowed = (
        None if allow_labels is None else [k.strip() for k in allow_labels.split(",") if k.strip()]
    )
    claims = ClaimPolicy.build(
        pinned=parse_labels(label or []), allowed_keys=allowed, max_concurrency=max_concurrency
    )
    request = TokenCreateRequest(
        name=name,
        duration=duration,
        max_enrollments=parse_max_enrollments(max_enrollments),
        labels=dict(claims.pinned),
        allow_labels=allowed,
        max_concurrency=max_concurrency,
    )
    chosen = [("cloud-init", cloud_init), ("kubernetes", kubernetes), ("compose", compose)]
    kinds = [kind for kind, on in chosen if on]
    if len(kinds) > 1:
        raise UserError("choose one of --cloud-init, --kubernetes, --compose")
    if output is not None and not kinds:
        raise UserError("--output goes with --cloud-init, --kubernetes or --compose")
    if kinds:  # everything that can fail is checked and claimed before the token is minted
        build = _served_build(orchestrator_url, route)
        with _NewFiles(_outputs(kinds[0], output)) as files:
            item = with_admin(
                lambda api: api.token_create(request),
                route,
            )
            _provision(kinds[0], build, item, files, json_output=json_output)
        return
    item = with_admin(
        lambda api: api.token_create(request),
        route,
    )
    if json_output:
        emit_json(item.to_json())
        return
    print(f"token {item.name} expires {item.expires_at}")
    if item.max_enrollments != 1:
        print(
            f"fleet token: up to {item.max_enrollments} machines, each labelled fleet={item.name}"
        )
    limits = ClaimPolicy.from_attributes(item.to_json()).describe()
    if limits:
        print(f"its workers: {limits}")
    if item.ca_pin:
        print(f"ca pin: {item.ca_pin} (the orchestrator's own CA: workers trust it by this)")
    print()
    print(f"  {item.token}")
    print()
    pin = f"SWAMP_CA_PIN={item.ca_pin} " if item.ca_pin else ""
    print(
        "This is shown once and never again: store it now. Give it to a worker with "
        f"SWAMP_WORKER_TOKEN=<token> {pin}swamp worker connect URL"
    )


def _served_build(url: str | None, route: Route):
    """What a provisioning file carries, asked of the orchestrator *before* the token is
    minted, so a failure here mints nothing: its URL, the sha256 of the build it serves, and
    its own CA (``serve --tls auto``) with that CA's pin — read over a connection this CLI
    verified (the repo's own server, or ``--ca-cert``), so what machines will trust is what
    this command trusted. The URL must reach the orchestrator from here as well as from the
    machines."""
    import httpx

    from swamp.admin.routes import own_ca, running_server
    from swamp.domain.provisioning import Build, check_url, is_sha256
    from swamp.domain.urls import sends_in_clear
    from swamp.errors import PeerError, UserError
    from swamp.tls.trust import client_context, only_certificate, pem_pin

    server, repo_dir, ca_cert = route.server, route.repo_dir, route.ca_cert
    if url:
        what = "--orchestrator-url"
    elif server:
        url, what = server, "--server"
    else:
        url, what = running_server(repo_dir), "the running server's URL"
    if not url:
        raise UserError(
            "provisioning needs the orchestrator's URL: pass --orchestrator-url wss://host:port "
            "(or run it in the repo of a running 'swamp serve')"
        )
    check_url(url, what=what)
    if sends_in_clear(url):  # the worker refuses it; the checksum would come in clear text
        raise UserError(
            f"refusing to provision machines for {url}: the token would go to it in clear "
            "text (the worker refuses that), and the build's checksum would be read from it "
            "unprotected; serve with TLS (off loopback 'swamp serve' does: --tls auto) and "
            "pass its wss:// URL"
        )
    base = ("https://" if url.startswith("wss://") else "http://") + url.split("://", 1)[1]
    base = base.rstrip("/")
    own = None if ca_cert else own_ca(url, repo_dir)
    verify = client_context(ca_file=ca_cert, ca_pem=own) if base.startswith("https") else True
    try:
        with httpx.Client(timeout=10, verify=verify) as http:
            answer = http.get(f"{base}/swamp.pyz.sha256")
            ca_answer = http.get(f"{base}/tls/ca.pem") if answer.status_code == 200 else None
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        hint = "" if ca_cert or own else " (an orchestrator with its own CA: pass --ca-cert)"
        raise PeerError(
            f"cannot reach the orchestrator at {base} from here: {exc}{hint}; the URL must "
            "work both from this command and from the machines"
        ) from None
    if answer.status_code in (401, 403):
        raise PeerError(
            f"the orchestrator at {base} keeps its build private (--private-downloads): the "
            "machines could not download it either; provision from an orchestrator that serves "
            "it openly"
        )
    if answer.status_code != 200:
        raise PeerError(
            f"the orchestrator at {base} serves no build (HTTP {answer.status_code}): start it "
            "from swamp.pyz, or with 'swamp serve --pyz PATH'"
        )
    words = answer.text.split()
    sha256 = words[0] if words else ""
    if not is_sha256(sha256):
        raise PeerError(
            f"the orchestrator at {base} sent a malformed checksum for its build (not 64 "
            "lowercase hex digits): nothing was minted"
        )
    ca_pem = ca_pin = None
    if ca_answer is not None and ca_answer.status_code == 200 and base.startswith("https"):
        try:  # the one certificate in the answer, as the machines will read it: nothing more
            ca_pem = only_certificate(ca_answer.text)
            ca_pin = pem_pin(ca_pem)
        except ValueError:
            raise PeerError(f"the orchestrator at {base} sent an unreadable CA") from None
    elif ca_cert:  # the operator's CA: its certificates only, as a plain PEM text
        from swamp.tls.certificates import pem, pem_blocks

        try:
            blocks = pem_blocks(Path(ca_cert).read_text(errors="replace"), "CERTIFICATE")
        except (OSError, ValueError) as exc:
            raise UserError(f"cannot read --ca-cert {ca_cert}: {exc}") from None
        if not blocks:
            raise UserError(f"--ca-cert {ca_cert} holds no certificate")
        ca_pem = "".join(pem("CERTIFICATE", block) for block in blocks)
    return Build(
        url=url,
        download=f"{base}/swamp.pyz",
        sha256=sha256,
        bootstrap=_bootstrap_program(),
        ca_pem=ca_pem,
        ca_pin=ca_pin,
    )


def _bootstrap_program() -> str:
    """The text of swamp/bootstrap.py, which provisioning files carry to new machines."""
    from importlib.resources import files

    return files("swamp").joinpath("bootstrap.py").read_text()


def _outputs(kind: str, output: Path | None) -> list[tuple[Path, str]]:
    """The files a provisioning command writes, each with what it is: ``--output``, and for
    Compose the token's secret file beside it."""
    from swamp.domain.provisioning import TOKEN_FILE

    if output is None:
        return []
    files = [(output, "--output")]
    if kind == "compose":
        files.append((output.parent / TOKEN_FILE, "the token file of --compose"))
    return files


class _NewFiles:
    """Files created for us alone before the token is minted: new (``O_EXCL``: an existing
    file is never overwritten), not through a link (``O_NOFOLLOW``), mode 0600. If anything
    fails before they are written, they are removed again: a refused command leaves nothing."""

    def __init__(self, files: list[tuple[Path, str]]) -> None:
        self.paths = [path for path, _ in files]
        self.roles = [role for _, role in files]
        self.fds: list[int] = []

    def __enter__(self) -> _NewFiles:
        import os

        from swamp.errors import UserError

        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        for path, role in zip(self.paths, self.roles, strict=True):
            try:
                self.fds.append(os.open(path, flags, 0o600))
            except FileExistsError:
                self._discard()
                raise UserError(
                    f"{role} {path} exists already (a file or a link): it is not overwritten; "
                    "choose a new path, or remove it first"
                ) from None
            except OSError as exc:
                self._discard()
                raise UserError(f"cannot create {role} {path}: {exc.strerror}") from None
        return self

    def write(self, index: int, text: str) -> None:
        import os

        data = text.encode()
        while data:
            data = data[os.write(self.fds[index], data) :]

    def __exit__(self, kind, exc, tb) -> None:
        import os

        if kind is not None:
            self._discard()
            return
        for fd in self.fds:
            os.close(fd)

    def _discard(self) -> None:
        """Close and remove the files we created (only if the path still names them)."""
        import os

        for path, fd in zip(self.paths, self.fds, strict=False):
            mine = os.fstat(fd)
            try:
                there = os.lstat(path)
                if (there.st_dev, there.st_ino) == (mine.st_dev, mine.st_ino):
                    os.unlink(path)
            except OSError:
                pass
            os.close(fd)
        self.fds = []


def _provision(kind: str, build, item, files: _NewFiles, *, json_output: bool) -> None:
    from swamp.domain import provisioning

    provisioning.check_token(item.token)  # the orchestrator's answer, before any file has it
    if kind == "cloud-init":
        text = provisioning.cloud_init(build, token=item.token)
    elif kind == "kubernetes":
        text = provisioning.kubernetes(build, name=item.name, token=item.token)
    else:
        text = provisioning.compose(build)
    if not files.paths:
        if json_output:  # the token item, with the file that provisions a machine with it
            emit_json({**item.to_json(), "provisioning": {"kind": kind, "content": text}})
            return
        print(text, end="")
        if kind == "compose":  # the token is not in the compose file: say where it goes
            print(
                f"write the token to ./{provisioning.TOKEN_FILE} beside the compose file "
                f"(mode 0600): {item.token}",
                file=sys.stderr,
            )
        return
    files.write(0, text)
    written = {"kind": kind, "path": str(files.paths[0])}
    if kind == "compose":
        files.write(1, item.token + "\n")
        written["tokenFile"] = str(files.paths[1])
    if json_output:
        emit_json({"name": item.name, "provisioning": written})
    else:
        where = f" and {files.paths[1]}" if kind == "compose" else ""
        print(
            f"wrote {files.paths[0]}{where} (mode 0600: the token for {item.name})",
            file=sys.stderr,
        )


@token_app.command("list", short_help="Tokens: state, deadline, enrollments.")
@command
def token_list(
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """Every enrollment token: state, deadline, enrollments used / allowed."""
    from swamp.domain.claims import ClaimPolicy

    reply = with_admin(
        lambda api: api.token_list(),
        route,
    )
    if json_output:
        emit_json([t.to_json() for t in reply.tokens])
        return
    if not reply.tokens:
        print("No enrollment tokens: mint one with 'swamp worker token create NAME --duration 1h'.")
        return
    rows = [
        [
            t.name,
            t.state,
            t.expires_at,
            f"{t.enrollments} / {t.max_enrollments}",
            ClaimPolicy.from_attributes(t.to_json()).describe() or "-",
        ]
        for t in reply.tokens
    ]
    print(table(["NAME", "STATE", "EXPIRES", "ENROLLMENTS", "WORKER LIMITS"], rows))


@token_app.command("revoke", short_help="Revoke a token; its workers are cut off.")
@command
def token_revoke(
    name: str = typer.Argument(..., help="The token to revoke."),
    route: Route = ROUTE,
    json_output: bool = JSON,
) -> None:
    """Revoke a token: its connected workers are disconnected within a second and can never
    enroll with it again. Works through a running server or straight on the repo (a running
    server notices the change)."""
    from swamp.protocol.messages import TokenRevokeRequest

    item = with_admin(
        lambda api: api.token_revoke(TokenRevokeRequest(name)),
        route,
    )
    if json_output:
        emit_json(item.to_json())
    elif item.already_revoked:
        print(f"token {name} was already {item.state}")
    else:
        print(f"token {name} revoked at {item.revoked_at}")
