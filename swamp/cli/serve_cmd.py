"""``swamp serve``."""

from __future__ import annotations

import logging
from pathlib import Path

import typer

from swamp.cli.common import JSON, REPO_DIR, command, repo_path, run_async


class EscapingFormatter(logging.Formatter):
    """Log messages quote what peers sent (names, reasons): control characters are escaped, so
    no peer can forge a log line or send escape sequences to the operator's terminal."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        from swamp.domain.text import printable

        record.message = printable(record.message, keep_tab=True)
        return super().formatMessage(record)


def _from_file(ctx: typer.Context, repo) -> tuple[dict[str, object], set[str]]:
    """The settings of the repo's ``swamp.toml`` ``[serve]`` table that apply (by parameter
    name; paths relative to the repo), and the names of the parameters they set. Every
    option of this command may be there under its long name without dashes; one given on the
    command line or in the environment wins (``swamp.domain.settings``)."""
    from swamp.domain.settings import Kind, from_file

    options = {}  # key in the file → the option
    names: dict[str, str] = {}  # key in the file → the parameter's name
    for param in ctx.command.params:
        if param.name in (None, "repo_dir", "json_output") or not getattr(param, "opts", None):
            continue
        key = max(param.opts, key=len).lstrip("-")
        options[key] = param
        names[key] = param.name
    known = {
        key: (
            Kind.FLAG
            if getattr(p, "is_flag", False)
            else Kind.TEXTS
            if p.multiple
            else Kind.NUMBER
            if p.type.name in ("int", "integer")
            else Kind.TEXT
        )
        for key, p in options.items()
    }
    given = {
        key
        for key, p in options.items()
        if getattr(ctx.get_parameter_source(names[key]), "name", "DEFAULT")
        not in ("DEFAULT", "DEFAULT_MAP")
    }
    table = repo.config().get("serve")
    values: dict[str, object] = {}
    for key, value in from_file(table, known, given=given, where=f"{CONFIG} [serve]").items():
        if options[key].type.name == "path":
            value = repo.root / value
        values[names[key]] = value
    return values, set(values)


CONFIG = "swamp.toml"


@command
def serve(
    ctx: typer.Context,
    repo_dir: Path = REPO_DIR,
    host: str = typer.Option(
        "127.0.0.1",
        "--host",
        envvar="SWAMP_SERVE_HOST",
        help="Address to listen on. Anything but loopback needs --auth token.",
    ),
    port: int = typer.Option(
        7420, "--port", envvar="SWAMP_SERVE_PORT", help="Port to listen on; 0 picks a free one."
    ),
    auth: str = typer.Option(
        "token",
        "--auth",
        envvar="SWAMP_SERVE_AUTH",
        help="token: admin frames need a credential — the local one this "
        "server writes to .swamp/serve.json (the CLI in the repo "
        "finds it), or a server token (swamp server token create "
        "NAME). none: anyone who can reach the port is an admin "
        "(loopback only).",
    ),
    allow_origin: list[str] = typer.Option(
        None,
        "--allow-origin",
        metavar="URL",
        show_default=False,
        help="Admit requests from web pages of this origin (https://host[:port]); repeatable. "
        "By default any request that carries an Origin header — every browser's — is "
        "refused.",
    ),
    trusted_host: list[str] = typer.Option(
        None,
        "--trusted-host",
        metavar="NAME",
        show_default=False,
        help="Another name clients may use for this server in the Host header (loopback "
        "binds accept only localhost and IP addresses otherwise: a DNS rebinding guard); "
        "repeatable.",
    ),
    ship_env: str = typer.Option(
        None,
        "--ship-env",
        envvar="SWAMP_SHIP_ENV",
        metavar="NAME,...",
        show_default=False,
        help="Variables of this process every dispatch carries to its worker. Nothing else is "
        "shipped unless a model (env = [...] in models/*.toml) or a run (--env NAME) "
        "names it.",
    ),
    tls_cert: Path = typer.Option(
        None, "--tls-cert", help="PEM certificate: serve wss:// and https://."
    ),
    tls_key: Path = typer.Option(None, "--tls-key", help="PEM private key for --tls-cert."),
    tls: str = typer.Option(
        None,
        "--tls",
        envvar="SWAMP_SERVE_TLS",
        metavar="auto|off",
        show_default=False,
        help="auto: serve wss:// and https:// with this orchestrator's own CA, made once and "
        "kept in .swamp/tls/; workers trust it by its pin (printed at start), nothing else to "
        "distribute. off: plain text. Default: auto unless --host is loopback or --tls-cert "
        "is given.",
    ),
    tls_name: list[str] = typer.Option(
        None,
        "--tls-name",
        metavar="NAME",
        show_default=False,
        help="A host name or address the --tls auto certificate names, besides this host's "
        "name, the bind address and loopback; repeatable (for clients that check names: "
        "curl, browsers, --ca-cert).",
    ),
    grace_window: str = typer.Option(
        "60s",
        "--grace-window",
        help="How long a disconnected worker keeps its place in the pool, e.g. 60s.",
    ),
    heartbeat: str = typer.Option(
        "5s", "--heartbeat", help="Heartbeat interval; a peer silent for three is dropped."
    ),
    worker_retention: str = typer.Option(
        "24h",
        "--worker-retention",
        help="Forget workers disconnected for longer than this, and release their fleet "
        "token slots, e.g. 24h.",
    ),
    queue_timeout: str = typer.Option(
        None,
        "--queue-timeout",
        envvar="SWAMP_QUEUE_TIMEOUT",
        show_default=False,
        help="How long a placed step waits for a free matching worker before it fails, "
        "e.g. 5m (default 10m); 0 waits forever. A run's own --queue-timeout wins.",
    ),
    queue_aging: str = typer.Option(
        "30s",
        "--queue-aging",
        envvar="SWAMP_QUEUE_AGING",
        help="A waiting step gains one point of priority each time this passes, so no step "
        "waits forever behind higher-priority ones, e.g. 30s, 2m, 500ms.",
    ),
    pyz: Path = typer.Option(
        None,
        "--pyz",
        show_default=False,
        help="The build GET /swamp.pyz serves to machines (default: the swamp.pyz this runs "
        "from, if it runs from one).",
    ),
    private_downloads: bool = typer.Option(
        False,
        "--private-downloads",
        help="GET /swamp.pyz needs an admin credential (it holds no secret: open by default).",
    ),
    verify_on_enroll: bool = typer.Option(
        False,
        "--verify-on-enroll",
        envvar="SWAMP_VERIFY_ON_ENROLL",
        help="Probe every enrolling worker (first connect and reconnect) before it gets work; "
        "one that fails stays 'unverified' with its reason in 'swamp worker list'.",
    ),
    default_timeout: str = typer.Option(
        "24h",
        "--default-timeout",
        envvar="SWAMP_DEFAULT_TIMEOUT",
        help="How long a dispatch may run on a worker when neither the run (--timeout) nor its "
        "model (timeout = ...) says, e.g. 6h; 0: as long as it takes. Past it the method is "
        "stopped and the step fails (execution_timeout).",
    ),
    write_quota_bytes: str = typer.Option(
        "256MiB",
        "--write-quota-bytes",
        envvar="SWAMP_WRITE_QUOTA_BYTES",
        help="The most one dispatch may write through the data plane, in all (256MiB, 1GiB); "
        "a write past it is refused (quota_exceeded) and nothing of it is kept.",
    ),
    write_quota_records: int = typer.Option(
        10_000,
        "--write-quota-records",
        envvar="SWAMP_WRITE_QUOTA_RECORDS",
        help="The most data versions one dispatch may write.",
    ),
    step_log_cap: str = typer.Option(
        "32MiB",
        "--step-log-cap",
        envvar="SWAMP_STEP_LOG_CAP",
        help="The most of one dispatch's output kept for 'swamp logs' (32MiB, 1GiB); past "
        "it the oldest part goes, and a line says how much where it was.",
    ),
    max_fan_out: int = typer.Option(
        10_000,
        "--max-fan-out",
        envvar="SWAMP_MAX_FAN_OUT",
        help="The most items a workflow step's forEach may run it for (1 to 1000000); a "
        "list longer than this fails the step's job, naming this setting.",
    ),
    database: str = typer.Option(
        None,
        "--database",
        envvar="SWAMP_DATABASE_URL",
        metavar="URL",
        show_default=False,
        help="Keep every record in this PostgreSQL database (postgresql://user@host:5432/db) "
        "instead of the repo's SQLite file; give the password in PGPASSWORD or ~/.pgpass, or "
        "the whole URL in SWAMP_DATABASE_URL, not on the command line. Needs the postgres "
        "extra (pip install 'swamp[postgres]'). Several orchestrators may share one: each "
        "takes any worker and any client (see docs/usage.md).",
    ),
    advertise_url: str = typer.Option(
        None,
        "--advertise-url",
        envvar="SWAMP_ADVERTISE_URL",
        metavar="URL",
        show_default=False,
        help="With --database: the ws:// (wss:// with TLS) URL the other orchestrators on the "
        "database reach this one at, to send it the steps its workers claimed. Default: the "
        "URL it listens on (this machine's name when it listens on every address).",
    ),
    json_output: bool = JSON,
) -> None:
    """Run the orchestrator: websocket control plane, HTTP data plane and /health on one port.

    Any option may also be set in the repo's swamp.toml, in its [serve] table, under its long
    name without dashes (port = 7420, heartbeat = "5s", verify-on-enroll = true); the command
    line and the environment win over the file.

    Prints the ws:// URL it listens on and writes it to .swamp/serve.json (mode 0600, with
    the local admin credential the CLI in this repo presents). Before accepting traffic it
    reconciles what a previous run left: active leases expire, workers that were connected
    are marked disconnected (they reconnect by themselves), steps left waiting in the queue
    are orphaned. Stop with Ctrl-C or SIGTERM.

    A placed step with no free matching worker waits in the queue (see 'swamp worker queue')
    and is dispatched the moment one enrolls or frees a slot. GET /metrics gives supply and
    demand in the Prometheus format (with a server token as the bearer credential).

    Secure by default: admin frames need a credential; requests from web pages (an Origin
    header) and, on loopback, unknown Host names are refused; workers get none of this
    process's environment unless it is named (--ship-env, a model's env, a run's --env).
    """

    from swamp.domain.durations import parse_duration, parse_timeout
    from swamp.domain.priority import parse_aging
    from swamp.domain.quota import WriteQuota, parse_size
    from swamp.domain.workflow_run import MAX_FAN_OUT_LIMIT
    from swamp.errors import UserError
    from swamp.orchestrator.server import ServeOptions
    from swamp.orchestrator.server import serve as run
    from swamp.repo import Repo

    repo = Repo.find(repo_path(repo_dir))
    filed, in_file = _from_file(ctx, repo)
    o = {**ctx.params, **filed}

    def what(name: str) -> str:
        key = name.replace("_", "-")
        return f"{CONFIG} [serve] {key}" if name in in_file else f"--{key}"

    if o["max_fan_out"] < 1:
        raise UserError(f"invalid {what('max_fan_out')} {o['max_fan_out']}: expected 1 or more")
    if o["max_fan_out"] > MAX_FAN_OUT_LIMIT:
        raise UserError(
            f"invalid {what('max_fan_out')} {o['max_fan_out']}: at most {MAX_FAN_OUT_LIMIT:,} "
            "(split a longer list between steps or runs)"
        )
    if o["write_quota_records"] < 1:
        raise UserError(
            f"invalid {what('write_quota_records')} {o['write_quota_records']}: expected 1 or more"
        )
    if o["database"]:
        from swamp.domain.database import has_password

        source = getattr(ctx.get_parameter_source("database"), "name", "")
        exposed = (
            f"{CONFIG} [serve] database goes wherever the repo goes"
            if "database" in in_file
            else "--database is visible to every user of this machine (ps)"
            if source == "COMMANDLINE"
            else None
        )
        if exposed and has_password(o["database"]):
            typer.echo(
                f"warning: the password in {exposed}: give it in PGPASSWORD or ~/.pgpass, or "
                "the URL in SWAMP_DATABASE_URL",
                err=True,
            )
    options = ServeOptions(
        host=o["host"],
        port=o["port"],
        auth=o["auth"],
        tls_cert=o["tls_cert"],
        tls_key=o["tls_key"],
        tls=o["tls"],
        tls_names=tuple(o["tls_name"] or ()),
        grace_seconds=parse_duration(o["grace_window"], what=what("grace_window")),
        heartbeat_seconds=parse_duration(o["heartbeat"], what=what("heartbeat")),
        worker_retention=parse_duration(o["worker_retention"], what=what("worker_retention")),
        verify_on_enroll=o["verify_on_enroll"],
        allow_origins=tuple(o["allow_origin"] or ()),
        trusted_hosts=tuple(o["trusted_host"] or ()),
        ship_env=tuple(n.strip() for n in (o["ship_env"] or "").split(",") if n.strip()),
        queue_timeout=o["queue_timeout"],
        queue_aging=parse_aging(o["queue_aging"], what=what("queue_aging")),
        pyz=o["pyz"],
        private_downloads=o["private_downloads"],
        default_timeout=parse_timeout(o["default_timeout"], what=what("default_timeout")),
        write_quota=WriteQuota(
            parse_size(o["write_quota_bytes"], what=what("write_quota_bytes")),
            o["write_quota_records"],
        ),
        step_log_cap=parse_size(o["step_log_cap"], what=what("step_log_cap")),
        max_fan_out=o["max_fan_out"],
        database=o["database"] or None,
        advertise_url=o["advertise_url"] or None,
        json=json_output,
    )
    handler = logging.StreamHandler()
    handler.setFormatter(EscapingFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.basicConfig(level=logging.INFO, handlers=[handler])
    logging.getLogger("hypercorn.error").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    run_async(run, repo, options)  # (Ctrl-C before it listens: "interrupted", 130)
