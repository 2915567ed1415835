"""``swamp worker``: connect a worker, list the pool, manage enrollment tokens."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import typer

from swamp.cli.common import (CA_CERT, JSON, REPO_DIR, SERVER, SERVER_TOKEN, admin_call, command,
                              emit_json, repo_path, run_async, table)
from swamp.domain.labels import format_labels
from swamp.domain.text import printable

app = typer.Typer(help="Workers: connect one, list the pool, manage enrollment tokens.",
                  no_args_is_help=True, rich_markup_mode=None)
token_app = typer.Typer(help="Enrollment tokens: what a worker presents to join the pool.",
                        no_args_is_help=True, rich_markup_mode=None)
app.add_typer(token_app, name="token")


@app.command("connect", short_help="Enroll a worker and run what it is sent.")
@command
def connect(
    url: str = typer.Argument(None, envvar="SWAMP_ORCHESTRATOR_URL", show_default=False,
                              help="The orchestrator's ws:// or wss:// URL"),
    token: str = typer.Option(None, "--token", envvar="SWAMP_WORKER_TOKEN", show_default=False,
                              help="Enrollment token <name.secret>. Prefer the variable or a "
                                   "file: argv is visible to every user of the machine"),
    token_file: Path = typer.Option(None, "--token-file", envvar="SWAMP_WORKER_TOKEN_FILE",
                                    show_default=False,
                                    help="Read the token from this file, e.g. a Kubernetes or "
                                         "Docker secret mount; a trailing newline is trimmed. "
                                         "Not with --token."),
    label: list[str] = typer.Option(None, "--label", show_default=False,
                                    help="A k=v label placements can match; repeatable. Merged "
                                         "with SWAMP_WORKER_LABELS (k=v,k2=v2); the flag wins "
                                         "for the same key."),
    cache_dir: Path = typer.Option(None, "--cache-dir", envvar="SWAMP_WORKER_CACHE_DIR",
                                   show_default=False,
                                   help="Keeps the machine id across restarts, so a restarted "
                                        "worker re-enrolls as itself (default: a fresh temp dir: "
                                        "every process is a new machine)."),
    ca_cert: Path = CA_CERT,
    concurrency: int = typer.Option(1, "--concurrency", envvar="SWAMP_WORKER_CONCURRENCY",
                                    help="Dispatch slots: how many methods run at once"),
    data_plane_url: str = typer.Option(None, "--data-plane-url", envvar="SWAMP_DATA_PLANE_URL",
                                       show_default=False,
                                       help="Base URL of the data plane, for split deployments "
                                            "(default: the connect URL's host over http/https)"),
    insecure: bool = typer.Option(
        False, "--insecure", envvar="SWAMP_WORKER_INSECURE",
        help="Allow plain ws:// and http:// to a host other than this one: the token and "
             "dispatch credentials then cross the network unencrypted. Without it the worker "
             "refuses, and asks for wss://."),
    protocol_version: int = typer.Option(None, "--protocol-version", hidden=True,
                                         help="Announce another protocol version (for "
                                              "compatibility testing)."),
    json_output: bool = JSON,
) -> None:
    """Enroll with the orchestrator and run what it dispatches, until stopped.

    Needs nothing but environment variables: SWAMP_ORCHESTRATOR_URL=wss://… plus
    SWAMP_WORKER_TOKEN (or SWAMP_WORKER_TOKEN_FILE) make 'swamp worker connect' enough. Every
    flag has a variable (shown with each option); an explicit flag wins.

    Reconnects after a drop (backoff 1s doubling to 30s) for as long as the token lives. A
    revoked, expired, wrong or unknown token, an exhausted enrollment allowance, or a protocol
    mismatch stops it with exit 1. SIGINT/SIGTERM stop it with exit 0. --json prints one JSON
    event per line.
    """
    import os

    from swamp.domain.labels import merge_labels
    from swamp.worker.agent import run_worker
    from swamp.worker.config import WorkerConfig, read_token
    from swamp.worker.events import Reporter

    config = WorkerConfig(
        url=url or "", token=read_token(token, token_file),
        labels=merge_labels(os.environ.get("SWAMP_WORKER_LABELS"), label or []),
        cache_dir=cache_dir, ca_cert=ca_cert, concurrency=concurrency,
        data_plane_url=data_plane_url, json=json_output, protocol_version=protocol_version,
        insecure=insecure)
    status = run_async(run_worker, config, Reporter(json_lines=json_output))
    raise typer.Exit(status)


def _list_via(server, server_token, ca_cert, repo_dir, all_workers: bool) -> dict:
    if server:
        return admin_call(server, "worker.list", {"all": all_workers},
                          server_token=server_token, ca_cert=ca_cert, repo_dir=repo_dir)
    from swamp.bookkeeping.workers import WorkerBook, worker_items
    from swamp.repo import Repo

    store = Repo.find(repo_path(repo_dir)).open_store()
    try:
        return worker_items(WorkerBook(store).all(), show_all=all_workers)
    finally:
        store.close()


@app.command("list", short_help="The pool: workers, status, slots, labels.")
@command
def list_workers(
    all_workers: bool = typer.Option(False, "--all", help="Include disconnected workers."),
    server: str = SERVER, server_token: str = SERVER_TOKEN, ca_cert: Path = CA_CERT,
    repo_dir: Path = REPO_DIR, json_output: bool = JSON,
) -> None:
    """The pool: every enrolled worker with its status, slots and labels.

    Reads the running orchestrator with --server (live slot counts), else the repo's records.
    Disconnected workers are hidden unless --all.
    """

    data = _list_via(server, server_token, ca_cert, repo_dir, all_workers)
    if json_output:
        emit_json(data)
        return
    rows = [[w["name"], w["status"], f"{len(w.get('activeDispatchIds', []))}/{w['capacity']}",
             format_labels(w.get("labels", {})), f"{w['platform']}/{w['arch']}",
             w.get("lastSeenAt", "-")] for w in data["workers"]]
    if rows:
        print(table(["NAME", "STATUS", "SLOTS", "LABELS", "PLATFORM/ARCH", "LAST SEEN"], rows))
    else:
        print("No connected workers." if data["hiddenDisconnected"] else "No workers yet: "
              "mint a token with 'swamp worker token create NAME --duration 1h' and connect one.")
    for worker in data["workers"]:
        if worker["status"] == "unverified":
            print(printable(f"{worker['name']} is unverified: "
                            f"{worker.get('verifyFailureReason', '?')}"))
    if any(w["status"] == "unverified" for w in data["workers"]):
        print("Unverified workers get no work; 'swamp worker verify NAME' shows every seam.")
    hidden = data["hiddenDisconnected"]
    if hidden:
        print(f"{hidden} disconnected worker{'s' if hidden != 1 else ''} hidden: "
              "'swamp worker list --all' shows them.")


@app.command("verify", short_help="Probe workers end to end, seam by seam.")
@command
def verify(
    name: str = typer.Argument(None, show_default=False,
                               help="Verify only this worker (default: every connected one)."),
    label: list[str] = typer.Option(None, "--label", show_default=False,
                                    help="Verify only workers with this k=v label; repeatable "
                                         "(all must match)."),
    server: str = SERVER, server_token: str = SERVER_TOKEN, ca_cert: Path = CA_CERT,
    repo_dir: Path = REPO_DIR, json_output: bool = JSON,
) -> None:
    """Prove each worker end to end: run the fleet probe on it through the normal dispatch path
    and check every seam — the dispatch's environment arrives (env), a query over the control
    socket answers (capability), a resource written over HTTP reads back (data-plane), plus any
    seam an installed plugin adds. Probes run concurrently and never change a worker's status.

    Prints one row per worker (pass / fail / error, and for a failure the seam that broke and
    why) and a summary. Exit 1 if any worker did not pass, or if there was nothing to verify.
    Needs a running orchestrator (--server, SWAMP_SERVE_URL, or the repo's .swamp/serve.json).
    """
    from swamp.domain.labels import parse_labels
    from swamp.errors import UserError

    labels = parse_labels(label or [])
    server = server or _running_server(repo_dir)
    if not server:
        raise UserError("worker verify needs a running orchestrator: pass --server URL or set "
                        "SWAMP_SERVE_URL (or run it in the repo where 'swamp serve' runs)")
    params = {"labels": labels, **({"name": name} if name else {})}
    data = admin_call(server, "worker.verify", params, timeout=180,
                      server_token=server_token, ca_cert=ca_cert, repo_dir=repo_dir)
    if json_output:
        emit_json(data)
    elif data["workers"]:
        marks = {"pass": "✓ pass", "fail": "✗ fail", "error": "! error"}
        rows = [[v["name"], marks.get(v["status"], v["status"]),
                 f"{v.get('platform') or '-'}/{v.get('arch') or '-'}",
                 v.get("error") or "; ".join(v["failures"]) or
                 f"{len(v['seams'])} seams ok ({', '.join(v['seams'])})"]
                for v in data["workers"]]
        print(table(["WORKER", "RESULT", "PLATFORM/ARCH", "DETAILS"], rows))
        print()
        if data["passed"] == data["total"]:
            print(f"All {data['total']} worker(s) passed verification.")
        else:
            parts = [f"{data['failed']} failed" if data["failed"] else "",
                     f"{data['errors']} gave no verdict" if data["errors"] else ""]
            print(f"{' and '.join(p for p in parts if p)} of {data['total']} worker(s).")
    else:
        selection = f" matching {format_labels(labels)}" if labels else ""
        print(f"No connected workers{selection} to verify.", file=sys.stderr)
    if not data["workers"] or data["passed"] != data["total"]:
        raise typer.Exit(1)


def _running_server(repo_dir) -> str | None:
    from swamp.errors import UserError
    from swamp.repo import Repo

    try:
        return Repo.find(repo_path(repo_dir)).running_server()
    except UserError:
        return None


# -- tokens -------------------------------------------------------------------------------------


@token_app.command("create", short_help="Mint an enrollment token (one or a fleet).")
@command
def token_create(
    name: str = typer.Argument(..., help="Token name: lowercase letters, digits, - and _."),
    duration: str = typer.Option(..., "--duration", help="How long it admits and keeps workers: "
                                                         "30s, 15m, 2h, 7d, 1w."),
    max_enrollments: str = typer.Option(
        "1", "--max-enrollments", metavar="N|unlimited",
        help="How many machines may enroll with it. 1: one worker named after the token. More "
             "(or unlimited): a fleet; each machine is named <token>-<hash of its machine id> "
             "and labelled fleet=<token>."),
    label: list[str] = typer.Option(
        None, "--label", show_default=False,
        help="Pin a k=v label on every worker of this token; repeatable. A worker that claims "
             "another value for the key is refused."),
    allow_labels: str = typer.Option(
        None, "--allow-labels", metavar="KEY,...", show_default=False,
        help="The only label keys a worker may set itself (default: any). An empty value "
             "allows none; a worker setting another key is refused."),
    max_concurrency: int = typer.Option(
        None, "--max-concurrency", metavar="N", show_default=False,
        help="At most N slots per worker; a worker asking for more gets N."),
    server: str = SERVER, server_token: str = SERVER_TOKEN, ca_cert: Path = CA_CERT,
    repo_dir: Path = REPO_DIR, json_output: bool = JSON,
) -> None:
    """Mint an enrollment token and print NAME.SECRET once (only a hash is stored).

    One fleet token can enroll a whole autoscaling group: --max-enrollments 8 or unlimited.
    A name that is revoked or expired may be minted again; a live one is refused.

    What its workers may say about themselves is the token's to limit: --label pins labels,
    --allow-labels lists the keys they may set, --max-concurrency caps their slots. Example:
    swamp worker token create gpu --duration 7d --max-enrollments unlimited --label gpu=true
    --allow-labels zone --max-concurrency 4
    """
    from swamp.domain.claims import ClaimPolicy
    from swamp.domain.durations import parse_duration
    from swamp.domain.labels import parse_labels
    from swamp.domain.tokens import parse_max_enrollments

    seconds = parse_duration(duration, what="--duration")
    allowance = parse_max_enrollments(max_enrollments)
    allowed = None if allow_labels is None else [k.strip() for k in allow_labels.split(",")
                                                 if k.strip()]
    claims = ClaimPolicy.build(pinned=parse_labels(label or []), allowed_keys=allowed,
                               max_concurrency=max_concurrency)
    if server:
        params = {"name": name, "duration": duration, "maxEnrollments": allowance,
                  "labels": dict(claims.pinned), "maxConcurrency": claims.max_concurrency,
                  "allowLabels": None if allowed is None else sorted(claims.allowed_keys)}
        item = admin_call(server, "worker.token.create", params,
                          server_token=server_token, ca_cert=ca_cert, repo_dir=repo_dir)
    else:
        from swamp.bookkeeping.tokens import TokenBook, token_item
        from swamp.repo import Repo

        store = Repo.find(repo_path(repo_dir)).open_store()
        try:
            token, credential = TokenBook(store).mint(name, duration_seconds=seconds,
                                                      max_enrollments=allowance, claims=claims)
        finally:
            store.close()
        item = dict(token_item(token, time.time()), token=credential)
    if json_output:
        emit_json(item)
        return
    print(f"token {item['name']} expires {item['expiresAt']}")
    if item["maxEnrollments"] != 1:
        print(f"fleet token: up to {item['maxEnrollments']} machines, each labelled "
              f"fleet={item['name']}")
    limits = ClaimPolicy.from_attributes(item).describe()
    if limits:
        print(f"its workers: {limits}")
    print()
    print(f"  {item['token']}")
    print()
    print("This is shown once and never again: store it now. Give it to a worker with "
          "SWAMP_WORKER_TOKEN=<token> swamp worker connect URL")


@token_app.command("list", short_help="Tokens: state, deadline, enrollments.")
@command
def token_list(
    server: str = SERVER, server_token: str = SERVER_TOKEN, ca_cert: Path = CA_CERT,
    repo_dir: Path = REPO_DIR, json_output: bool = JSON,
) -> None:
    """Every enrollment token: state, deadline, enrollments used / allowed."""
    if server:
        items = admin_call(server, "worker.token.list", {},
                           server_token=server_token, ca_cert=ca_cert, repo_dir=repo_dir)
        items = items["tokens"]
    else:
        from swamp.bookkeeping.tokens import TokenBook, token_item
        from swamp.repo import Repo

        store = Repo.find(repo_path(repo_dir)).open_store()
        try:
            now = time.time()
            items = [token_item(t, now) for t in TokenBook(store).all()]
        finally:
            store.close()
    if json_output:
        emit_json(items)
        return
    if not items:
        print("No enrollment tokens: mint one with 'swamp worker token create NAME "
              "--duration 1h'.")
        return
    from swamp.domain.claims import ClaimPolicy

    rows = [[t["name"], t["state"], t["expiresAt"], f"{t['enrollments']} / "
             f"{t['maxEnrollments']}", ClaimPolicy.from_attributes(t).describe() or "-"]
            for t in items]
    print(table(["NAME", "STATE", "EXPIRES", "ENROLLMENTS", "WORKER LIMITS"], rows))


@token_app.command("revoke", short_help="Revoke a token; its workers are cut off.")
@command
def token_revoke(
    name: str = typer.Argument(..., help="The token to revoke."),
    server: str = SERVER, server_token: str = SERVER_TOKEN, ca_cert: Path = CA_CERT,
    repo_dir: Path = REPO_DIR, json_output: bool = JSON,
) -> None:
    """Revoke a token: its connected workers are disconnected within a second and can never
    enroll with it again. Works through a running server or straight on the repo (a running
    server notices the change)."""
    if server:
        item = admin_call(server, "worker.token.revoke", {"name": name},
                          server_token=server_token, ca_cert=ca_cert, repo_dir=repo_dir)
    else:
        from swamp.bookkeeping.tokens import TokenBook, token_item
        from swamp.repo import Repo

        store = Repo.find(repo_path(repo_dir)).open_store()
        try:
            token, revoked = TokenBook(store).revoke(name)
        finally:
            store.close()
        item = dict(token_item(token, time.time()), alreadyRevoked=not revoked)
    if json_output:
        emit_json(item)
        return
    if item["alreadyRevoked"]:
        print(f"token {name} was already {item['state']}")
    else:
        print(f"token {name} revoked at {item.get('revokedAt')}")
