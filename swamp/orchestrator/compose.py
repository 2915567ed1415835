"""The composition root: every part of a running orchestrator, built once, in one place.

Each part is handed what it uses through its constructor, in dependency order — nothing is wired
by assigning to another object after it is made. Where two parts need each other, the circle is
broken here and said so:

- the pool tells the queue of every member change: the queue *subscribes* to the pool it is
  given (an event; the pool knows no queue);
- membership probes workers under ``--verify-on-enroll`` through the verifier, which dispatches
  through the episodes, which report an unresponsive worker to membership: the probe is handed
  to membership's task when it starts (:meth:`Orchestrator.run`), not to its constructor;
- a change another process made to the repo (a revoked server token) closes admin sockets and
  web sessions: the live tokens' repo watcher is given that action (one read of the server
  tokens, then admission's and the logins' plain calls) as a callable it awaits;
- the web pages (``swamp.ui``) read the pool, the queue and the admin API, and are told what
  changed by them: the pool's watcher, the queue's observer and the engine's saves mark the
  pages' topics out of date (``Live``: plain calls that never wait), and the data plane hands
  ``/ui/`` to the pages.

``swamp serve`` (``swamp.orchestrator.server``) opens the store and the journal, reconciles,
calls :func:`compose`, runs the parts and closes what it opened. The admin API the admin frames
perform is the one the CLI uses on a repo (``swamp.admin.local``), here holding the live parts;
the frames themselves know only its contract (``swamp.protocol.admin``).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from swamp.admin.local import RepoAdmin
from swamp.bookkeeping.leases import LeaseBook
from swamp.bookkeeping.server_tokens import ServerTokenBook
from swamp.bookkeeping.tokens import TokenBook
from swamp.bookkeeping.workers import WorkerBook
from swamp.concurrency import open_unwrapping_nursery
from swamp.domain import environment
from swamp.domain.carrying import lost_worker_fence
from swamp.domain.peers import let_go_after, rerun_fence
from swamp.domain.priority import DEFAULT_AGING
from swamp.domain.quota import WriteQuota
from swamp.domain.request_policy import RequestPolicy
from swamp.domain.step_logs import DEFAULT_CAP_BYTES
from swamp.domain.workers import fence_seconds
from swamp.domain.workflow_run import MAX_EXPANSIONS
from swamp.orchestrator.admin import Admin
from swamp.orchestrator.admin_auth import AdminAuth
from swamp.orchestrator.admission import Admission
from swamp.orchestrator.adoption import Adoptions
from swamp.orchestrator.app import App
from swamp.orchestrator.bookkeeper import Bookkeeper
from swamp.orchestrator.credentials import Credentials
from swamp.orchestrator.dataplane import DataPlane
from swamp.orchestrator.dispatch import DispatchService
from swamp.orchestrator.downloads import Download
from swamp.orchestrator.enrollment import Enrollment
from swamp.orchestrator.episode import Episodes
from swamp.orchestrator.live_tokens import LiveTokens
from swamp.orchestrator.membership import Membership
from swamp.orchestrator.metrics import Metrics
from swamp.orchestrator.peers import DEATH_GRACE, Peers
from swamp.orchestrator.pool import Member, Pool
from swamp.orchestrator.queue import DispatchQueue
from swamp.orchestrator.records import WorkerRecords
from swamp.orchestrator.self_fence import SelfFence
from swamp.orchestrator.step_logs import StepLogs
from swamp.orchestrator.step_records import StepRecords
from swamp.orchestrator.takeover import Takeovers
from swamp.orchestrator.verification import Verifier
from swamp.plugins import ModelRegistry
from swamp.protocol.rpc import SilenceSweeper
from swamp.repo import Repo
from swamp.store.datastore import Datastore
from swamp.store.journal import Journal
from swamp.store.reader import Reader
from swamp.store.records import Records, SqliteRecords
from swamp.store.step_logs import LogStore, SqliteLogs, SqliteLogStore
from swamp.tls.authority import ServerTls
from swamp.ui.live import Live
from swamp.ui.routes import Pages, cookie_name
from swamp.ui.sessions import Logins
from swamp.ui.views import Sources

if TYPE_CHECKING:  # (PostgreSQL's driver is there only where a shared database is served)
    from swamp.store.pg_steps import PgSteps

log = logging.getLogger("swamp.serve")

CLOSE_SECONDS = 5.0  # the longest the last lease rows may take to go in at shutdown


def _fence(member: Member) -> float:
    return fence_seconds(member.heartbeat)


def _peer_fence(heartbeat: float) -> float:
    """How long a step whose worker was lost at another orchestrator (or whose orchestrator
    died) waits before it runs again: its worker may carry it that long."""
    return max(
        rerun_fence(fence_seconds(heartbeat), death_grace=DEATH_GRACE),
        lost_worker_fence(heartbeat, carrying=True),
    )


def _carried_fence(member: Member) -> float:
    """A shared database's: its workers carry their runs across a lost socket."""
    return lost_worker_fence(member.heartbeat, carrying=True)


@dataclass(frozen=True)
class Settings:
    """What ``swamp serve``'s options say to the parts (``ServeOptions``, decided)."""

    auth: str = "token"
    grace_seconds: float = 60
    heartbeat_seconds: float = 5
    verify_on_enroll: bool = False
    ship_env: tuple[str, ...] = ()
    queue_timeout: float | None = 600
    queue_aging: float = DEFAULT_AGING  # seconds per point of priority a waiting step gains
    default_timeout: float | None = 24 * 3600
    private_downloads: bool = False
    tls: bool = False  # serve speaks TLS: the web pages' cookie is Secure
    write_quota: WriteQuota = WriteQuota()
    max_fan_out: int = MAX_EXPANSIONS  # the most items a forEach may run its step for
    local_credential: str | None = None  # the CLI's credential in .swamp/ (auth token)
    step_log_cap: int = DEFAULT_CAP_BYTES  # the most of one step's output kept (oldest goes)


@dataclass
class Orchestrator:
    """The parts, as :func:`compose` made them (for ``serve``, tests and harnesses)."""

    store: Datastore | None  # the repo's SQLite file (None: the records are in PostgreSQL)
    db: Records  # the records, awaited (swamp.store.records): the books' way in
    metrics: Metrics
    pool: Pool
    credentials: Credentials
    sweeper: SilenceSweeper
    bookkeeper: Bookkeeper
    logs: StepLogs
    records: WorkerRecords
    membership: Membership
    live_tokens: LiveTokens
    enrollment: Enrollment
    episodes: Episodes
    queue: DispatchQueue
    reader: Reader | None  # queries on a thread of their own (SQLite's; None on PostgreSQL)
    dispatch: DispatchService
    verifier: Verifier
    auth: AdminAuth
    admission: Admission
    admin: Admin
    dataplane: DataPlane
    app: App
    verify_on_enroll: bool
    live: Live
    pages: Pages
    peers: Peers | None = None  # the other orchestrators (a shared database; None: alone)
    takeovers: Takeovers | None = None  # the steps of dead ones this one settles
    self_fence: SelfFence | None = None  # lets the workers go when the database is lost
    adoptions: Adoptions | None = None  # runs carried here by workers of a dead one

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Every background service, in the order they were made; started before the listener
        accepts anything (the repo watcher takes its baseline now)."""
        async with open_unwrapping_nursery() as nursery:
            # -- write-behind: what goes to disk after the event (see compose) ---------------
            await nursery.start(self.bookkeeper.run)
            await nursery.start(self.logs.run)
            # -- the gateway: members, live tokens, silent sockets ---------------------------
            prober = self.verifier.probe if self.verify_on_enroll else None
            await nursery.start(functools.partial(self.membership.run, prober))
            await nursery.start(self.live_tokens.run)
            await nursery.start(self.sweeper.run)
            # -- dispatch episodes ----------------------------------------------------------
            await nursery.start(self.episodes.keep_credentials_fresh)
            await nursery.start(self.episodes.watch_acknowledgements)
            # -- the web pages: stored step output marks them out of date --------------------
            await nursery.start(self.live.watch_logs, self.logs.written)
            # -- the other orchestrators on a shared database --------------------------------
            if self.peers is not None:
                await nursery.start(self.peers.run, self.queue, self.dispatch.run_claimed)
            if self.self_fence is not None:
                await nursery.start(self.self_fence.run)
            if self.adoptions is not None:
                await nursery.start(self.adoptions.serve)
            if self.dispatch.steps is not None:
                await nursery.start(self.dispatch.steps.run)
                if self.takeovers is not None and self.peers is not None:
                    await nursery.start(
                        functools.partial(
                            self.takeovers.serve,
                            self.dispatch.steps,
                            self.dispatch,
                            self.peers,
                            fence=self.dispatch.peer_fence,
                        )
                    )
            task_status.started()

    async def settled(self) -> None:
        """What was written behind has gone in (the listener has closed every socket)."""
        await self.bookkeeper.settled()  # the last status versions (disconnected) go in

    async def close(self) -> None:
        """After the services stopped (and when they were cancelled): what is still in memory
        goes in, within :data:`CLOSE_SECONDS`."""
        with trio.move_on_after(CLOSE_SECONDS) as scope:
            scope.shield = True
            # leases still running go in active: the next boot expires them
            await self.bookkeeper.flush()
            await self.logs.flush()  # the last lines printed
        if self.reader is not None:
            self.reader.close()


def compose(
    repo: Repo,
    store: Datastore | None,
    journal: Journal | None,
    registry: ModelRegistry,
    settings: Settings,
    *,
    db: Records | None = None,
    policy: RequestPolicy,
    download: Download | None = None,
    own_tls: ServerTls | None = None,
    logs: LogStore | None = None,
    peers: Peers | None = None,
    steps: PgSteps | None = None,
    takeovers: Takeovers | None = None,
    database: str | None = None,
) -> Orchestrator:
    """Build every part, each from the ones before it. ``db`` and ``logs`` are the records' and
    the step logs' seams if the caller made them already (serve, for its boot: one for the
    whole orchestrator, its transactions its own), else ``store`` behind them. Without a
    ``store`` (PostgreSQL) there is no file to watch, check or read on a thread."""
    if db is None:
        if store is None:
            raise ValueError("compose needs the store or the seam it is behind")
        db = SqliteRecords(store)
    if logs is None:
        if store is None:
            raise ValueError("compose needs the store or the step logs' own")
        logs = SqliteLogs(SqliteLogStore(store))
    metrics = Metrics()
    pool = Pool()
    credentials = Credentials()
    sweeper = SilenceSweeper(tick=min(1.0, settings.heartbeat_seconds / 2))
    auth = AdminAuth(
        mode=settings.auth,
        server_tokens=ServerTokenBook(db),
        local_credential=settings.local_credential,
        peers=peers,
    )
    admission = Admission()
    live = Live()  # the web pages' topics: marked out of date by the events below

    # -- write-behind: what is written after the event ---------------------------------------
    # One bookkeeper for all of it: lease rows (through ``journal``, opened by serve before the
    # replay), worker status versions and queue episodes (when each is durable: its docstring).
    # on a shared database, what this orchestrator writes names it (its leftovers, if it dies,
    # are told from what the living hold: swamp.orchestrator.peers)
    owner = peers.me if peers is not None else ""
    bookkeeper = Bookkeeper(LeaseBook(db, owner=owner), journal)
    records = WorkerRecords(WorkerBook(db, owner=owner), bookkeeper)
    # every line a dispatch prints, in batches (swamp.orchestrator.step_logs)
    step_logs = StepLogs(logs, cap=settings.step_log_cap)

    # -- the gateway: membership, live tokens, enrollment --------------------------------------
    membership = Membership(
        pool,
        credentials,
        records,
        grace_seconds=settings.grace_seconds,
        heartbeat_seconds=settings.heartbeat_seconds,
        verify_on_enroll=settings.verify_on_enroll,
    )
    tokens = TokenBook(db)
    # the web pages' login codes and sessions (in memory only); a session ended early ends the
    # event streams of its open pages
    logins = Logins(on_end=live.sessions_ended)

    async def close_revoked() -> None:
        """The admin sockets of server tokens revoked meanwhile close, and their web sessions
        end: judged against one read of the server tokens, then plain calls."""
        still_valid = await auth.validity()
        admission.close_revoked_admins(still_valid)
        logins.end_revoked(still_valid)

    live_tokens = LiveTokens(store, pool, tokens, on_repo_change=[close_revoked], peers=peers)
    enrollment = Enrollment(
        pool, tokens, records, membership, live_tokens, on_rejection=metrics.on_rejection
    )

    # -- dispatch ----------------------------------------------------------------------------
    episodes = Episodes(
        bookkeeper, credentials, on_unacknowledged=membership.unresponsive, logs=step_logs
    )
    pool.watch(live.member_changed)

    def observe_queue(what: str, value: float) -> None:
        metrics.on_queue(what, value)
        live.queue_event(what, value)

    queue = DispatchQueue(  # subscribes to the pool; asks the live tokens of a dead target
        pool,
        db,
        bookkeeper,
        tokens=live_tokens.token,
        aging=settings.queue_aging,
        observe=observe_queue,
        peers=peers,
    )
    reader = Reader(repo.db_path) if store is not None else None  # PostgreSQL's: awaited
    metrics.watch(pool, queue)
    # a shared database's placed steps: recorded, so they outlive this orchestrator
    step_records = (
        StepRecords(steps, peers.me, url=database)
        if steps is not None and peers is not None
        else None
    )
    dispatch = DispatchService(
        store,
        db,
        registry,
        pool,
        episodes,
        queue,
        ship_env=settings.ship_env,
        fence=_fence if peers is None else _carried_fence,
        queue_timeout=settings.queue_timeout,
        observe=metrics.on_dispatch,
        reader=reader,
        default_timeout=settings.default_timeout,
        logs=step_logs,
        peers=peers,
        peer_fence=fence_seconds(settings.heartbeat_seconds)
        if peers is None
        else _peer_fence(settings.heartbeat_seconds),
        steps=step_records,
    )
    unset = [n for n in settings.ship_env if n not in dispatch.environ]
    if unset:
        log.warning("--ship-env names variables this process does not have: %s", ", ".join(unset))
    verifier = Verifier(
        episodes, pool, shipped=environment.ship(dispatch.environ, dispatch.ship_env)
    )

    # -- the surfaces: admin frames, the data plane, the app -----------------------------------
    api = RepoAdmin(
        repo,
        store,
        db=db,
        live_tokens=live_tokens,
        pool=pool,
        dispatch=dispatch,
        verifier=verifier,
        ca_pin=own_tls.pin if own_tls else None,
        logs=step_logs,
        max_fan_out=settings.max_fan_out,
        on_run_saved=live.run_saved,
        peers=peers,
    )
    admin = Admin(api, repo=repo, pool=pool, dispatch=dispatch, login=logins.issue)
    pages = Pages(
        Sources(pool, dispatch, api),
        logins=logins,
        live=live,
        auth=auth,
        policy=policy,
        secure=settings.tls,
        cookie=cookie_name(str(repo.db_path.resolve()), secure=settings.tls),
    )
    dataplane = DataPlane(
        dispatch,
        credentials,
        pool,
        metrics=metrics,
        download=download,
        private_downloads=settings.private_downloads,
        quota=settings.write_quota,
        ca_pem=own_tls.ca_pem if own_tls else None,
        admit=auth.admit,
        pages=pages,
    )
    app = App(
        enrollment=enrollment,
        membership=membership,
        sweeper=sweeper,
        dispatch=dispatch,
        admin=admin,
        dataplane=dataplane,
        auth=auth,
        policy=policy,
        admission=admission,
    )
    dispatch.letting_go = lambda: membership.letting_go
    if peers is not None:
        membership.telling = peers.telling
    # a shared database's runs carried across a worker's move (swamp.domain.carrying)
    adoptions = (
        Adoptions(db, steps, peers, episodes, queue, dispatch)
        if steps is not None and peers is not None
        else None
    )
    enrollment.adoptions = adoptions
    return Orchestrator(
        store=store,
        db=db,
        metrics=metrics,
        pool=pool,
        credentials=credentials,
        sweeper=sweeper,
        bookkeeper=bookkeeper,
        logs=step_logs,
        records=records,
        membership=membership,
        live_tokens=live_tokens,
        enrollment=enrollment,
        episodes=episodes,
        queue=queue,
        reader=reader,
        dispatch=dispatch,
        verifier=verifier,
        auth=auth,
        admission=admission,
        admin=admin,
        dataplane=dataplane,
        app=app,
        verify_on_enroll=settings.verify_on_enroll,
        live=live,
        pages=pages,
        peers=peers,
        takeovers=takeovers,
        adoptions=adoptions,
        self_fence=None
        if peers is None
        else SelfFence(
            peers,
            membership,
            after=let_go_after(
                death_grace=DEATH_GRACE, fence=fence_seconds(settings.heartbeat_seconds)
            ),
        ),
    )
