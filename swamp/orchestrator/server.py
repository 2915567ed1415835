"""``swamp serve``: compose the orchestrator and run it until a signal says stop.

Order matters: open the store, reconcile what a previous orchestrator left behind (active leases
→ expired, connected workers → disconnected) *before* accepting traffic, build the parts
(``swamp.orchestrator.compose``), start their services, then listen, announce the URL (stdout and
``.swamp/serve.json``), and run the checkpointer and the bookkeeping GC in the root nursery.
"""

from __future__ import annotations

import functools
import gc
import json
import logging
import signal
import socket
import sqlite3
import ssl
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

import trio

from swamp.bookkeeping.leases import LeaseBook, journaled_lease
from swamp.bookkeeping.pending import PendingBook
from swamp.bookkeeping.records import RESTART, Orphaned, everything
from swamp.bookkeeping.tokens import TokenBook
from swamp.bookkeeping.workers import WorkerBook
from swamp.bookkeeping.workflow_runs import RunBook
from swamp.bookkeeping.workflow_runs import key as run_key
from swamp.concurrency import open_unwrapping_nursery
from swamp.domain import environment, tls_mode
from swamp.domain.adhoc_runs import runs_to_forget
from swamp.domain.database import check_database_url, shown
from swamp.domain.names import is_adhoc_instance
from swamp.domain.priority import DEFAULT_AGING
from swamp.domain.queue import effective_timeout, format_age, parse_queue_timeout
from swamp.domain.quota import WriteQuota
from swamp.domain.request_policy import RequestPolicy
from swamp.domain.step_logs import DEFAULT_CAP_BYTES
from swamp.domain.urls import is_loopback
from swamp.domain.worker_names import is_fleet
from swamp.domain.workflow_run import MAX_EXPANSIONS
from swamp.errors import CannotListen, SwampError, UserError
from swamp.ids import new_id
from swamp.orchestrator import listener
from swamp.orchestrator.admin_auth import new_local_credential
from swamp.orchestrator.admission import PENDING_MESSAGE_BYTES
from swamp.orchestrator.compose import Settings, compose
from swamp.orchestrator.downloads import Download, served_build
from swamp.orchestrator.peers import Peers
from swamp.orchestrator.pool import Pool
from swamp.orchestrator.step_logs import StepLogs
from swamp.orchestrator.storage import Storage, open_postgres, open_sqlite
from swamp.orchestrator.takeover import Takeovers
from swamp.plugins import default_registry
from swamp.protocol import messages
from swamp.repo import Repo
from swamp.store.checkpoints import run_checkpoints
from swamp.store.journal import replay
from swamp.store.records import Operations, Records, SqliteRecords
from swamp.store.retry import retry_busy
from swamp.store.step_logs import LogStore
from swamp.tls import authority
from swamp.tls.authority import ServerTls

if TYPE_CHECKING:  # (PostgreSQL's driver: only when serving one)
    from swamp.store.pg_peers import PgPeers
    from swamp.store.pg_step_logs import PgLogStore

log = logging.getLogger("swamp.serve")

GC_INTERVAL = 600
LEASE_RETENTION = 3600
RUN_RETENTION = 7 * 24 * 3600  # ended workflow runs are kept a week
STEP_RECORD_LIFE = 24 * 3600  # a shared database's placed steps, a day after they ended


@dataclass
class ServeOptions:
    host: str = "127.0.0.1"
    port: int = 7420
    auth: str = "token"
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls: str | None = None  # --tls auto|off; None: auto off loopback (see swamp.domain.tls_mode)
    tls_names: tuple[str, ...] = ()  # --tls-name: what the auto certificate names first
    grace_seconds: float = 60
    heartbeat_seconds: float = 5
    worker_retention: float = 24 * 3600
    verify_on_enroll: bool = False
    allow_origins: tuple[str, ...] = ()
    trusted_hosts: tuple[str, ...] = ()
    ship_env: tuple[str, ...] = ()
    queue_timeout: str | None = None  # --queue-timeout / SWAMP_QUEUE_TIMEOUT; None: 10m
    queue_aging: float = DEFAULT_AGING  # --queue-aging: seconds per point a waiting step gains
    pyz: Path | None = None  # the build GET /swamp.pyz serves (default: the one running)
    private_downloads: bool = False
    write_quota: WriteQuota = WriteQuota()
    default_timeout: float | None = 24 * 3600  # --default-timeout; None: none
    step_log_cap: int = DEFAULT_CAP_BYTES  # --step-log-cap
    max_fan_out: int = MAX_EXPANSIONS  # --max-fan-out: a forEach's most items
    database: str | None = None  # --database / SWAMP_DATABASE_URL: PostgreSQL's; None: the repo's
    advertise_url: str | None = None  # --advertise-url: where the other orchestrators reach it
    json: bool = False


def check_options(options: ServeOptions) -> RequestPolicy:
    if options.auth not in ("none", "token"):
        raise UserError(f"invalid --auth {options.auth!r}: expected token or none")
    if not is_loopback(options.host) and options.auth != "token":
        raise UserError(
            f"refusing to serve on {options.host} with --auth none: anyone who can reach it "
            "could run commands. Drop --auth none (admin frames then need a credential: the "
            "local one in .swamp/, or a server token from 'swamp server token create NAME'), "
            "or bind to 127.0.0.1"
        )
    if options.database is not None:
        check_database_url(options.database, what="--database (SWAMP_DATABASE_URL)")
    if options.advertise_url is not None:
        if options.database is None:
            raise UserError(
                "--advertise-url tells the other orchestrators on a shared database where this "
                "one is: it goes with --database"
            )
        tls = tls_mode.decide(host=options.host, tls=options.tls, has_cert=bool(options.tls_cert))
        scheme = "ws://" if tls == tls_mode.OFF else "wss://"
        if not options.advertise_url.startswith(scheme) or len(options.advertise_url) <= len(
            scheme
        ):
            raise UserError(
                f"invalid --advertise-url {options.advertise_url[:80]!r}: expected {scheme}"
                "HOST:PORT (the scheme this orchestrator serves)"
            )
    environment.check_names(options.ship_env, source="--ship-env")
    if options.queue_timeout is not None:
        parse_queue_timeout(options.queue_timeout, what="--queue-timeout (SWAMP_QUEUE_TIMEOUT)")
    if options.pyz is not None and not Path(options.pyz).is_file():
        raise UserError(f"--pyz {options.pyz} is not a file")
    tls_mode.decide(host=options.host, tls=options.tls, has_cert=bool(options.tls_cert))
    if bool(options.tls_cert) != bool(options.tls_key):
        raise UserError("--tls-cert and --tls-key go together: pass both or neither")
    for path in (options.tls_cert, options.tls_key):
        if path and not Path(path).is_file():
            raise UserError(f"TLS file {path} does not exist")
    if options.tls_cert:
        try:
            ssl.create_default_context(ssl.Purpose.CLIENT_AUTH).load_cert_chain(
                options.tls_cert, options.tls_key
            )
        except (ssl.SSLError, OSError) as exc:
            raise UserError(f"cannot load the TLS certificate/key: {exc}") from exc
    for name in options.tls_names:
        tls_mode.check_name(name)
    if options.tls_names and options.tls is None and is_loopback(options.host):
        raise UserError("--tls-name names the certificate of --tls auto: add --tls auto")
    if not 0 <= options.port <= 65535:
        raise UserError(f"invalid --port {options.port}: expected 0-65535")
    return RequestPolicy.build(
        loopback=is_loopback(options.host),
        bind_host=options.host,
        allow_origins=options.allow_origins,
        trusted_hosts=options.trusted_hosts,
    )


GC_THRESHOLDS = (50_000, 2, 1000)


def tune_collector() -> None:
    """An orchestrator's heap is mostly long-lived (a socket, a channel and a member per
    worker), and the cyclic collector's default pace rescans it ever more often as the fleet
    grows: with it, the CPU an enrollment costs doubled between the first and the last
    thousand of 10,000 workers. What boot loaded is frozen out of its sight; the youngest
    generation is collected every 50,000 allocations instead of 700, the middle one every
    second time (in small steps: with a longer stride, one step of half a second landed in
    the last thousand enrollments), and a full collection is considered a thousandth as
    often as that. Cycles are still collected."""
    gc.freeze()
    gc.set_threshold(*GC_THRESHOLDS)


def raise_file_limit() -> None:
    """Use the hard limit on open files: every worker and client holds a socket."""
    try:
        import resource
    except ImportError:  # not on Windows
        return
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY:
            hard = 1 << 20
        if soft != resource.RLIM_INFINITY and soft < hard:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as exc:
        log.info("could not raise the open-file limit: %s", exc)


async def collect_bookkeeping(db: Records, pool: Pool, *, worker_retention: float) -> int:
    """One GC pass: ended leases, lapsed lifetimes, and workers disconnected for longer than the
    retention together with their fleet bindings (which frees their slots on the token)."""
    removed = await LeaseBook(db).collect(older_than_seconds=LEASE_RETENTION)
    removed += await PendingBook(db).collect(older_than_seconds=LEASE_RETENTION)
    removed += await RunBook(db).collect(older_than_seconds=RUN_RETENTION)
    removed += await db.collect_garbage()
    workers = WorkerBook(db)
    stale = await workers.stale(older_than_seconds=worker_retention, live=pool.members.keys())
    tokens = TokenBook(db)
    by_token: dict[str, list[str]] = {}
    for attrs in stale:
        if isinstance(attrs.get("machineId"), str):
            by_token.setdefault(attrs.get("tokenName", ""), []).append(attrs["machineId"])
    for name, machine_ids in by_token.items():
        token = await tokens.get(name) if name else None
        if token is not None and is_fleet(token) and await tokens.prune(name, machine_ids):
            log.info("released %d stale binding(s) of fleet token %s", len(machine_ids), name)
    removed += await workers.forget([a["name"] for a in stale])
    return removed


async def forget_adhoc_runs(
    db: Records,
    runs: list[tuple[str, str, float]],
    *,
    batch: int = 100,
    logs: LogStore | None = None,
    clock: Callable[[], float] = time.time,
) -> int:
    """The data of ad-hoc runs past their retention (``swamp.domain.adhoc_runs``), a few
    instances to a transaction, and what they printed."""
    forget = runs_to_forget(runs, now=clock())
    removed = 0

    async def delete(tx: Operations, instances: list[tuple[str, str]]) -> int:
        return sum([await tx.delete_instance(model_type, name) for model_type, name in instances])

    for at in range(0, len(forget), batch):
        removed += await db.transact(functools.partial(delete, instances=forget[at : at + batch]))
    if logs is not None:
        removed += await logs.forget_instances(forget)
    return removed


async def collect_step_logs(
    db: Records,
    logs: LogStore,
    *,
    live: Callable[[str], bool] = lambda run_id: False,
    clock: Callable[[], float] = time.time,
) -> int:
    """Step output goes with what it belongs to: the logs of workflow runs that are no
    longer recorded (collected, or deleted) — unless ``live`` says the run is still printing
    — and of other dispatches (ad-hoc runs, named instances) as ad-hoc runs go: after the
    retention, or past the newest of their type (``swamp.domain.adhoc_runs``); an ad-hoc run
    whose data was forgotten has its logs forgotten with it (:func:`forget_adhoc_runs`)."""
    gone = [
        run_id
        for run_id, workflow in await logs.runs()
        if await db.latest(run_key(workflow, run_id)) is None and not live(run_id)
    ]
    removed = await logs.forget_runs(gone)
    # ad-hoc runs' logs are kept as ad-hoc runs are, the newest of each type; a named
    # instance's apart, the newest of that instance (a thousand quick ad-hoc runs never
    # push out a long build's); a log still being written is never among them
    others = [
        (model_type if is_adhoc_instance(name) else f"{model_type} {name}", log_id, last)
        for model_type, name, log_id, last in await logs.others()
    ]
    forget = runs_to_forget(others, now=clock())
    removed += await logs.forget_logs(log_id for _, log_id in forget)
    removed += await logs.forget_orphans()
    return removed


async def _collect_garbage(
    storage: Storage, pool: Pool, worker_retention: float, logs: StepLogs
) -> None:
    db = storage.db
    interval = max(1.0, min(GC_INTERVAL, worker_retention / 2))
    while True:
        await trio.sleep(interval)
        try:
            runs = await storage.adhoc_runs()
            removed = await forget_adhoc_runs(db, runs, logs=logs.store)
            removed += await collect_bookkeeping(db, pool, worker_retention=worker_retention)
            removed += await collect_step_logs(db, logs.store, live=logs.live_run)
            if storage.steps is not None:  # the outcomes followers had a day to read
                removed += await storage.steps.collect(time.time() - STEP_RECORD_LIFE)
        except (SwampError, sqlite3.Error) as exc:  # e.g. a locked database: next pass
            log.warning("garbage collection skipped: %s", exc)
            continue
        except Exception:  # a bug in a pass must not stop the orchestrator
            log.exception("garbage collection failed; the next pass runs as planned")
            continue
        if removed:
            log.info("garbage collection removed %d record(s)", removed)


async def _listen(app, config, stop: trio.Event, options: ServeOptions, task_status) -> None:
    """The listener (one port: websockets and HTTP), with a port that cannot be bound reported
    in one line."""
    try:
        await listener.serve(
            app,
            app.websocket,
            config,
            max_message_size=PENDING_MESSAGE_BYTES,  # raised once a socket is trusted
            shutdown_trigger=stop.wait,
            task_status=task_status,
        )
    except OSError as exc:
        raise CannotListen(
            f"cannot listen on {options.host}:{options.port}: {exc.strerror or exc} (is "
            "another program using the port? pass --port, or --port 0 for a free one)"
        ) from None


def _announce(
    options: ServeOptions,
    repo: Repo,
    url: str,
    data_plane: str,
    swept: dict,
    queue_timeout: float,
    download: Download | None,
    own_tls: ServerTls | None,
    records: str,
) -> None:
    info = {
        "event": "listening",
        "url": url,
        "dataPlaneUrl": data_plane,
        "repo": str(repo.root),
        "records": records,
        "auth": options.auth,
        "reconciled": swept,
        "verifyOnEnroll": options.verify_on_enroll,
        "queueTimeoutSeconds": queue_timeout,
        "queueAgingSeconds": options.queue_aging,
        **(
            {"download": f"{data_plane}/swamp.pyz", "downloadSha256": download.sha256}
            if download
            else {}
        ),
        "shipEnv": list(options.ship_env),
        "tls": "auto" if own_tls else ("cert" if options.tls_cert else "off"),
        **({"caPin": own_tls.pin, "tlsNames": list(own_tls.names)} if own_tls else {}),
    }
    if options.json:
        print(json.dumps(info), flush=True)
    else:
        print(f"swamp serve: listening on {url} (repo {repo.root})", flush=True)
        if options.database is not None:
            print(f"  records: {records} (PostgreSQL)", flush=True)
        if own_tls:
            print(
                f"  tls: its own CA ({own_tls.ca_file}), certificate for "
                f"{', '.join(own_tls.names)}",
                flush=True,
            )
            print(f"  ca pin: {own_tls.pin} (workers: --ca-pin / SWAMP_CA_PIN)", flush=True)
        if options.verify_on_enroll:
            print("  verify on enroll: each worker is probed before it gets work", flush=True)
        if options.auth == "none":
            print(
                "  auth: none — anyone who can reach this port is an admin (loopback only)",
                flush=True,
            )
        else:
            print(
                f"  admin: the CLI in this repo uses the local credential in "
                f"{repo.serve_file}; elsewhere pass --server-token",
                flush=True,
            )
        if options.ship_env:
            print(f"  every dispatch ships: {', '.join(options.ship_env)}", flush=True)
        if download:
            print(f"  workers download this build from {data_plane}/swamp.pyz", flush=True)
        waits = f"up to {format_age(queue_timeout)}" if queue_timeout else "without limit"
        print(
            f"  queue: a placed step waits {waits} for a matching worker (--queue-timeout), "
            f"gaining a point of priority every {options.queue_aging:g}s (--queue-aging)",
            flush=True,
        )
        print(
            f"  workers connect with: SWAMP_WORKER_TOKEN=<name.secret> swamp worker connect {url}",
            flush=True,
        )


async def serve(repo: Repo, options: ServeOptions, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
    policy = check_options(options)
    download = served_build(options.pyz, repo.state_dir)  # a bad --pyz: nothing is served
    with repo.serve_lock():  # before anything is read or written: one orchestrator per repo
        own_tls = await trio.to_thread.run_sync(_own_tls, repo, options)
        if own_tls is not None:
            options = replace(options, tls_cert=own_tls.cert_file, tls_key=own_tls.key_file)
        await _serve(repo, options, policy, download, own_tls, task_status=task_status)


def _own_tls(repo: Repo, options: ServeOptions) -> ServerTls | None:
    """The CA and server certificate of ``--tls auto`` (made or renewed now), else None."""
    mode = tls_mode.decide(host=options.host, tls=options.tls, has_cert=bool(options.tls_cert))
    if mode != tls_mode.AUTO:
        return None
    names = tls_mode.certificate_names(
        host=options.host,
        hostnames=authority.host_names(),
        extra=[tls_mode.check_name(n) for n in options.tls_names],
    )
    own = authority.ensure(repo.state_dir, names)
    if own.issued:
        log.info("issued a server certificate for %s", ", ".join(own.names))
    return own


async def _serve(
    repo: Repo,
    options: ServeOptions,
    policy: RequestPolicy,
    download: Download | None,
    own_tls: ServerTls | None,
    *,
    task_status,
) -> None:
    raise_file_limit()
    peers = takeovers = None
    if options.database is None:
        storage = open_sqlite(repo)
    else:
        me = new_id()  # this orchestrator's, for its life: what it writes names it
        storage = await open_postgres(options.database, orchestrator=me)
        assert storage.peers is not None
        from swamp.store.pg_step_logs import PgLogStore  # (the driver is there: it opened)

        db, logs = storage.db, storage.logs
        assert storage.steps is not None
        takeovers = Takeovers(storage.steps, me, db)

        async def reconcile(dead: str) -> dict:
            assert storage.peers is not None
            serving = frozenset(row.id for row in await storage.peers.orchestrators()) - {dead}
            changed = await reconcile_left(
                db,
                lambda attrs: attrs.get("orchestrator") == dead,
                why=f"its orchestrator ({dead[:12]}) died",
                dead=dead,
                serving=serving,
            )
            assert isinstance(logs, PgLogStore)
            changed["logs"] = await logs.end_left(time.time(), dead)  # its lines stopped
            changed["logs"] += await end_unnamed_logs(logs, storage.peers, gone=(me, dead))
            # its open steps are ours now (after its leases expired: what they say is final),
            # with the answers claimers kept for it (forgetting it deletes them)
            kept = await storage.peers.kept_answers(dead)
            assert peers is not None  # (made below, before anything is reconciled)
            fence = peers.fence_of(dead, takeovers.fence)  # (its workers' fence, if longer)
            changed["steps"] = await takeovers.take(dead, kept, fence=fence)
            return changed

        peers = Peers(
            storage.peers,
            options.database,
            reconcile=reconcile,
            ca_pem=own_tls.ca_pem if own_tls else None,
            me=me,
            heartbeat=options.heartbeat_seconds,
        )
    # where the records are, for the CLI in the repo while this runs and after it stopped
    # (once they are reachable: a database that cannot be opened changes nothing here)
    repo.remember_database(None if options.database is None else shown(options.database))
    try:
        async with open_unwrapping_nursery() as nursery:
            if peers is not None:
                await nursery.start(peers.hold_liveness)
            await _serve_on(
                repo,
                options,
                policy,
                download,
                own_tls,
                storage,
                peers=peers,
                takeovers=takeovers,
                task_status=task_status,
            )
            nursery.cancel_scope.cancel()
    finally:
        if storage.store is not None:
            try:
                storage.store.checkpoint()
            except sqlite3.Error as exc:  # the store went read-only or away: the log stays
                log.warning("the last WAL checkpoint failed: %s", exc)
        await storage.aclose()


async def reconcile_left(
    db: Records,
    orphaned: Orphaned,
    *,
    why: str = RESTART,
    dead: str | None = None,
    serving: frozenset[str] = frozenset(),
) -> dict:
    """What orchestrators that are gone left (``orphaned`` says which records): active leases
    expired, the workers they held disconnected, their waits orphaned, their workflow runs
    interrupted. At boot (all of it, on a database of its own), and on a shared database when
    a peer (``dead``) died (``swamp.orchestrator.peers``): its leases whose runs an
    orchestrator of ``serving`` carries move to it (``swamp.domain.carrying``)."""
    moved: list[str] = []
    expired = await retry_busy(
        lambda: LeaseBook(db).reconcile(orphaned, why=why, dead=dead, serving=serving, moved=moved)
    )
    return {
        "leases": expired,
        **({"carried": len(set(moved))} if moved else {}),
        "workers": await retry_busy(lambda: WorkerBook(db).reconcile(orphaned, why=why)),
        "queued": await retry_busy(lambda: PendingBook(db).reconcile(orphaned, why=why)),
        "runs": await retry_busy(lambda: RunBook(db).reconcile(orphaned)),
    }


async def end_unnamed_logs(logs: PgLogStore, table: PgPeers, *, gone: tuple[str, ...]) -> int:
    """End the step logs no orchestrator named (an earlier version's, left open) — only once
    none but ``gone`` (this one, one being buried) serves the database: an orchestrator of
    that version may be alive beside this one, still writing them."""
    if any(row.id not in gone for row in await table.orchestrators()):
        return 0
    return await logs.end_left(time.time(), None)


def advertised(url: str, host: str) -> str:
    """Where the other orchestrators reach this one by default: the URL it listens on, with
    this machine's name for an address that means every one (theirs, on another machine)."""
    if host in ("0.0.0.0", "::", ""):
        scheme, _, rest = url.partition("://")
        port = rest.rsplit(":", 1)[1]
        return f"{scheme}://{socket.getfqdn()}:{port}"
    return url


def _unowned(attrs: dict) -> bool:
    """A record no orchestrator on a shared database wrote (an earlier version's): its
    writer is gone."""
    return not attrs.get("orchestrator")


async def _serve_on(
    repo: Repo,
    options: ServeOptions,
    policy: RequestPolicy,
    download: Download | None,
    own_tls: ServerTls | None,
    storage: Storage,
    *,
    peers: Peers | None = None,
    takeovers: Takeovers | None = None,
    task_status,
) -> None:
    import hypercorn.config

    store, db, journal = storage.store, storage.db, storage.journal
    if isinstance(db, SqliteRecords) and journal is not None:
        # what the last orchestrator journaled goes in before anything reads the leases
        journaled = await retry_busy(lambda: replay(db, journal, admit=journaled_lease))
        if journaled:
            log.info(
                "took %d lease row(s) the last orchestrator journaled into the store", journaled
            )
    swept = {"tokens": await retry_busy(TokenBook(db).migrate)}
    if peers is None:
        swept.update(await reconcile_left(db, everything))
        # the logs it left open ended with it
        await retry_busy(lambda: storage.logs.end_open(time.time()))
    else:
        # a shared database: what an orchestrator that is gone left (the living's is theirs)
        swept.update(await reconcile_left(db, _unowned))
        from swamp.store.pg_step_logs import PgLogStore

        for what, count in (await peers.bury_at_boot()).items():
            swept[what] = swept.get(what, 0) + count
        assert isinstance(storage.logs, PgLogStore) and storage.peers is not None
        await end_unnamed_logs(storage.logs, storage.peers, gone=(peers.me,))
    messages.prepare()  # every message's code, before the first frame (and the gc freeze)
    tune_collector()
    if any(swept.values()):
        log.info(
            "boot reconciliation: expired %d lease(s), disconnected %d worker(s), orphaned %d "
            "queued step(s), failed %d interrupted workflow run(s), moved the bindings of %d "
            "token(s) to records of their own",
            swept["leases"],
            swept["workers"],
            swept["queued"],
            swept["runs"],
            swept["tokens"],
        )
    queue_timeout = effective_timeout(
        None,
        parse_queue_timeout(options.queue_timeout, what="--queue-timeout")
        if options.queue_timeout is not None
        else None,
    )
    local_credential = new_local_credential() if options.auth == "token" else None
    parts = compose(
        repo,
        store,
        journal,
        default_registry(),
        Settings(
            auth=options.auth,
            grace_seconds=options.grace_seconds,
            heartbeat_seconds=options.heartbeat_seconds,
            verify_on_enroll=options.verify_on_enroll,
            ship_env=options.ship_env,
            queue_timeout=queue_timeout,
            queue_aging=options.queue_aging,
            default_timeout=options.default_timeout,
            private_downloads=options.private_downloads,
            write_quota=options.write_quota,
            max_fan_out=options.max_fan_out,
            local_credential=local_credential,
            step_log_cap=options.step_log_cap,
            tls=bool(options.tls_cert),
        ),
        db=db,
        policy=policy,
        download=download,
        own_tls=own_tls,
        logs=storage.logs,
        peers=peers,
        steps=storage.steps,
        takeovers=takeovers,
        database=options.database,
    )
    app = parts.app

    config = hypercorn.config.Config()
    host = f"[{options.host}]" if ":" in options.host else options.host
    config.bind = [f"{host}:{options.port}"]
    # Hypercorn serves only an upgrade on a kept-alive HTTP connection (the listener hands every
    # other one to swamp.protocol.websocket). Its limit is one for all its sockets, and it buffers a
    # message whole before the app sees it, trusted or not: such a socket keeps the limit of an
    # untrusted one (our own clients never upgrade that way).
    config.websocket_max_message_size = PENDING_MESSAGE_BYTES
    config.graceful_timeout = 3
    config.ssl_handshake_timeout = 10
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    if options.tls_cert:
        config.certfile, config.keyfile = str(options.tls_cert), str(options.tls_key)

    stop = trio.Event()

    async def stop_on_signal() -> None:
        """The first SIGINT or SIGTERM shuts down; later ones are heard and change nothing
        until the services stop (the receiver stays open: a second one must not land in
        whatever code runs meanwhile). The last writes after that (at most
        ``CLOSE_SECONDS``) are not covered: a second SIGTERM then ends the process."""
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                name = signal.Signals(signum).name
                if stop.is_set():
                    log.info("received %s: already shutting down", name)
                    continue
                log.info("received %s: shutting down", name)
                await parts.membership.shutdown()
                stop.set()

    try:
        async with open_unwrapping_nursery() as nursery:
            await nursery.start(parts.run)
            async with open_unwrapping_nursery() as server:
                binds = await server.start(
                    lambda task_status: _listen(app, config, stop, options, task_status)
                )
                address = binds[0].split("://", 1)[1]
                scheme = "wss" if options.tls_cert else "ws"
                url = f"{scheme}://{address}"
                data_plane = f"{'https' if options.tls_cert else 'http'}://{address}"
                if peers is not None:
                    await peers.listening(options.advertise_url or advertised(url, options.host))
                repo.write_serve_file(
                    url,
                    data_plane,
                    admin_credential=local_credential,
                    ca_pin=own_tls.pin if own_tls else None,
                    shared_records=storage.shared,
                )
                _announce(
                    options,
                    repo,
                    url,
                    data_plane,
                    swept,
                    queue_timeout,
                    download,
                    own_tls,
                    storage.where,
                )
                if store is not None:
                    nursery.start_soon(run_checkpoints, store)
                nursery.start_soon(
                    _collect_garbage, storage, parts.pool, options.worker_retention, parts.logs
                )
                nursery.start_soon(stop_on_signal)  # (cancelled once the services stop)
                task_status.started(url)
            # The listener has returned: every connection is closed or past its graceful timeout.
            with trio.move_on_after(5):
                await parts.settled()
            nursery.cancel_scope.cancel()
    finally:
        repo.remove_serve_file()
        await parts.close()
        print("swamp serve: stopped", file=sys.stderr, flush=True)
