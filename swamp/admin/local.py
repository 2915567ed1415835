"""The admin operations, performed on a repo: the one implementation of each.

The CLI uses it straight on a repo (the live parts absent); ``swamp serve`` uses it
for every admin frame, handing it the live orchestrator. What only a running orchestrator can do
— place a method on a worker, probe workers — says so in one line on the other route. What the
live orchestrator does besides (arm a new token's deadline, cut off a revoked token's workers at
once) a running server also does for a change made straight on the repo, when its repo watcher
notices it (within a second), so the observable result is the same on both routes.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import trio

from swamp.bookkeeping.pending import PendingBook
from swamp.bookkeeping.server_tokens import ServerToken, ServerTokenBook
from swamp.bookkeeping.tokens import TokenBook, token_item
from swamp.bookkeeping.workers import WorkerBook, worker_items
from swamp.bookkeeping.workers import key as worker_key
from swamp.bookkeeping.workflow_runs import RunBook
from swamp.compat import tomllib
from swamp.concurrency import open_unwrapping_nursery
from swamp.domain.claims import ClaimPolicy
from swamp.domain.durations import parse_duration
from swamp.domain.environment import check_names
from swamp.domain.labels import check_labels
from swamp.domain.placement import Placement
from swamp.domain.priority import check_priority
from swamp.domain.query import parse as parse_predicate
from swamp.domain.queue import parse_queue_timeout, requirement_text
from swamp.domain.run_record import Status, page
from swamp.domain.scheduler import PoolIndex, Requirement, Slots
from swamp.domain.scopes import parse_scope
from swamp.domain.text import printable
from swamp.domain.tokens import parse_max_enrollments
from swamp.domain.workers import WorkerStatus, is_schedulable
from swamp.domain.workflow import check_workflow_name, explicit
from swamp.domain.workflow_run import MAX_EXPANSIONS
from swamp.errors import (
    CallTimeout,
    ChannelClosed,
    Conflict,
    DatabaseUnavailable,
    MalformedFrame,
    MalformedReply,
    NeedsOrchestrator,
    NotFound,
    SwampError,
    UnknownMethod,
    UserError,
    from_wire,
)
from swamp.ids import ordered_id
from swamp.orchestrator.dispatch import DispatchService, RunRequest, run_here
from swamp.orchestrator.live_tokens import CLOSE_REVOKED, LiveTokens
from swamp.orchestrator.peers import Peers
from swamp.orchestrator.pool import Pool
from swamp.orchestrator.step_logs import StepLogs
from swamp.orchestrator.verification import PROBE_TIMEOUT, Verifier
from swamp.plugins import ModelRegistry, default_registry
from swamp.protocol.messages import (
    DataQueryRequest,
    Empty,
    LogsPage,
    LogsRequest,
    Message,
    MethodFollowRequest,
    MethodRunRequest,
    NameRequest,
    PlacementSpec,
    QueryReply,
    QueueItem,
    QueueReply,
    QueueSummary,
    RecordItem,
    RunRef,
    RunResult,
    ServerTokenCreateRequest,
    ServerTokenItem,
    ServerTokenListReply,
    TokenCreateRequest,
    TokenItem,
    TokenListReply,
    TokenRevokeRequest,
    Verdict,
    VerifyReport,
    VerifyRequest,
    WorkerDrainReply,
    WorkerDrainRequest,
    WorkerListReply,
    WorkerListRequest,
    WorkflowHistoryReply,
    WorkflowListReply,
    WorkflowRequest,
    WorkflowRunReply,
    WorkflowRunRequest,
    WorkflowShowReply,
    WorkflowValidateReply,
)
from swamp.protocol.rpc import EventSink, no_events
from swamp.repo import Repo
from swamp.store.datastore import Datastore, iso, parse_iso
from swamp.store.reader import ADMIN_BUDGET
from swamp.store.records import Records, SqliteRecords
from swamp.store.retry import retry_busy
from swamp.store.step_logs import SqliteLogs, SqliteLogStore
from swamp.tls import authority
from swamp.workflows.engine import Engine, Host, check_inputs
from swamp.workflows.loader import Workflows

CANCEL_WAIT = 5.0  # seconds workflow cancel waits for the run to save its end
MAX_STEP_REF = 512  # JOB.STEP of a step to cancel
DRAIN_ASK_TIMEOUT = 30.0  # a worker answers once it has begun its drain and said so
# an orchestrator asked to probe its own workers for another answers within its probe's
# deadline; past this (under the client's own wait), its workers are reported without verdict
VERIFY_WAIT = PROBE_TIMEOUT + 30.0


class RepoAdmin:
    def __init__(
        self,
        repo: Repo,
        store: Datastore | None,
        *,
        db: Records | None = None,
        live_tokens: LiveTokens | None = None,
        pool: Pool | None = None,
        dispatch: DispatchService | None = None,
        verifier: Verifier | None = None,
        registry: ModelRegistry | None = None,
        clock=time.time,
        ca_pin: str | None = None,
        logs: StepLogs | None = None,
        max_fan_out: int = MAX_EXPANSIONS,
        on_run_saved: Callable[[str], None] = lambda run_id: None,
        peers: Peers | None = None,
    ) -> None:
        self.peers = peers  # the other orchestrators on a shared database (None: alone)
        self.repo = repo
        self.on_run_saved = on_run_saved  # the web pages: a run's changes were saved
        self.live_logs = logs  # the running orchestrator's step logs (None on the repo)
        self._step_logs = logs
        self.max_fan_out = max_fan_out
        # the orchestrator's own CA, which a token's machines pin: the live server's (None
        # unless it serves --tls auto), else the repo's from an earlier 'serve --tls auto'
        self.ca_pin = ca_pin if live_tokens is not None else authority.ca_pin(repo.state_dir)
        self.store = store  # the repo's file (None: the orchestrator's records are elsewhere)
        # the books' way in: the orchestrator's one seam, or this store's own on the repo
        if db is None:
            if store is None:
                raise ValueError("a repo admin needs the store or the seam it is behind")
            db = SqliteRecords(store)
        self.db = db
        self.live_tokens = live_tokens
        self.pool = pool
        self.dispatch = dispatch
        self.verifier = verifier
        self._engine: Engine | None = None
        self._registry = registry
        self.tokens = TokenBook(self.db, clock=clock)
        self.server_tokens = ServerTokenBook(self.db)
        self.clock = clock

    def __repr__(self) -> str:
        return f"<RepoAdmin {self.repo.root} {'live' if self.dispatch else 'on the repo'}>"

    @property
    def step_logs(self) -> StepLogs:
        """Where the lines of what runs here are kept: the orchestrator's, or (on the repo)
        one that writes them in this process as they come."""
        if self._step_logs is None:
            if self.store is None:
                raise ValueError("a repo admin without a store is given its step logs")
            self._step_logs = StepLogs(SqliteLogs(SqliteLogStore(self.store)))
        return self._step_logs

    @property
    def registry(self) -> ModelRegistry:
        if self._registry is None:
            self._registry = self.dispatch.registry if self.dispatch else default_registry()
        return self._registry

    # -- tokens --------------------------------------------------------------------------------

    async def token_create(self, request: TokenCreateRequest) -> TokenItem:
        seconds = parse_duration(request.duration, what="--duration")
        allowance = parse_max_enrollments(request.max_enrollments)
        claims = ClaimPolicy.build(
            pinned=check_labels(request.labels, source="--label"),
            allowed_keys=request.allow_labels,
            max_concurrency=request.max_concurrency,
        )
        token, credential = await retry_busy(
            lambda: self.tokens.mint(
                request.name, duration_seconds=seconds, max_enrollments=allowance, claims=claims
            )
        )
        if self.live_tokens is not None:
            await self.live_tokens.reread(token.name)
            self.live_tokens.arm_token_deadline(token)
        item = token_item(token, self.clock(), await self.tokens.bindings(token.name))
        return TokenItem.decode(dict(item, token=credential, caPin=self.ca_pin))

    async def token_list(self, request: Empty = Empty()) -> TokenListReply:
        now = self.clock()
        return TokenListReply(
            [
                TokenItem.decode(token_item(t, now, await self.tokens.bindings(t.name)))
                for t in await self.tokens.all()
            ]
        )

    async def token_revoke(self, request: TokenRevokeRequest) -> TokenItem:
        token, revoked = await retry_busy(lambda: self.tokens.revoke(request.name))
        if self.live_tokens is not None:
            await self.live_tokens.reread(request.name)  # before its members go: dead
            await self.live_tokens.disconnect_token(
                request.name, CLOSE_REVOKED, f"token {request.name!r} has been revoked"
            )
        item = token_item(token, self.clock(), await self.tokens.bindings(token.name))
        return TokenItem.decode(dict(item, alreadyRevoked=not revoked))

    # -- admin server tokens: on the repo only (whoever manages admin credentials owns the repo)

    async def server_token_create(self, request: ServerTokenCreateRequest) -> ServerTokenItem:
        scope = parse_scope(request.scope)
        held, credential = await retry_busy(lambda: self.server_tokens.create(request.name, scope))
        return _server_token_item(held, token=credential)

    async def server_token_list(self, request: Empty = Empty()) -> ServerTokenListReply:
        return ServerTokenListReply([_server_token_item(a) for a in await self.server_tokens.all()])

    async def server_token_revoke(self, request: NameRequest) -> ServerTokenItem:
        held = await retry_busy(lambda: self.server_tokens.revoke(request.name))
        if self.live_tokens is not None:  # the sockets it opened close, here and elsewhere
            self.live_tokens.recheck_soon()
        return _server_token_item(held)

    # -- across orchestrators (a shared database) -----------------------------------------------

    async def _holder(self, name: str) -> str | None:
        """The other orchestrator serving the database that holds worker ``name``'s socket,
        as its record says (``None``: alone, ours, disconnected, or one that died)."""
        if self.peers is None:
            return None
        record = await self.db.latest(worker_key(name))
        attrs = record.attributes if record is not None else {}
        if attrs.get("status") == WorkerStatus.DISCONNECTED.value:
            return None
        holder = attrs.get("orchestrator")
        return self.peers.serving(holder if isinstance(holder, str) else None)

    async def _ask(self, orchestrator: str, verb: str, request: Message, wait: float) -> dict:
        assert self.peers is not None
        return await self.peers.ask(orchestrator, verb, request.to_json(), wait=wait)

    async def _unverified(
        self, orchestrator: str, labels: dict, name: str | None, why: str
    ) -> VerifyReport:
        """The workers an unreachable orchestrator holds (as their records say), each without
        a verdict and saying why."""
        verdicts = [
            Verdict(attrs["name"], "error", error=why)
            for attrs in await WorkerBook(self.db).all()
            if attrs.get("orchestrator") == orchestrator
            and attrs.get("status") != WorkerStatus.DISCONNECTED.value
            and (name is None or attrs["name"] == name)
            and all((attrs.get("labels") or {}).get(k) == v for k, v in labels.items())
        ]
        return VerifyReport(workers=verdicts)

    # -- workers -------------------------------------------------------------------------------

    async def worker_list(self, request: WorkerListRequest) -> WorkerListReply:
        live = None
        if self.pool is not None:
            now, loop_now = self.clock(), trio.current_time()
            live = {
                m.name: m.to_json(last_seen=m.last_seen(now, loop_now))
                for m in self.pool.members.values()
            }
        records = await WorkerBook(self.db).all()
        if self.peers is not None:  # which orchestrator holds each worker's socket: its URL
            for item in live.values() if live is not None else ():
                item["orchestrator"] = self.peers.me
        where = self.peers.url_of if self.peers is not None else None
        return WorkerListReply.decode(
            worker_items(records, live, show_all=request.all, where=where)
        )

    async def worker_drain(
        self, request: WorkerDrainRequest, *, here: bool = False
    ) -> WorkerDrainReply:
        """Ask a connected worker to drain (as SIGTERM would): it answers once it has begun
        and said so, so the pool already shows it draining when this returns. On a shared
        database, one another orchestrator holds is asked through it (``here``: a peer's ask,
        never passed on)."""
        if self.pool is None:
            raise NeedsOrchestrator(
                "worker drain asks a connected worker through the orchestrator that holds it: "
                "pass --server URL or set SWAMP_SERVE_URL (or run it in the repo where "
                "'swamp serve' runs)"
            )
        member = self.pool.get(request.name)
        channel = member.channel if member is not None else None
        if (member is None or channel is None or channel.closed) and not here:
            holder = await self._holder(request.name)
            if holder is not None:
                return WorkerDrainReply.decode(
                    await self._ask(holder, "peer.worker.drain", request, DRAIN_ASK_TIMEOUT)
                )
        if member is None or channel is None or channel.closed:
            raise NotFound(
                f"no connected worker named {request.name[:100]!r}: see 'swamp worker list'"
            )
        if member.status == WorkerStatus.DRAINING.value:
            return WorkerDrainReply(member.name, running=len(member.active), already=True)
        try:
            reply = await channel.call("drain.ask", {}, timeout=DRAIN_ASK_TIMEOUT)
        except UnknownMethod:
            raise Conflict(
                f"worker {member.name!r} (swamp {member.version or 'older'}) cannot be asked to "
                "drain: send it SIGTERM on its machine, or upgrade it"
            ) from None
        except (ChannelClosed, CallTimeout) as exc:
            raise Conflict(
                f"worker {member.name!r} did not take the request: {exc.message}"
            ) from None
        running = reply.get("running") if isinstance(reply, dict) else None
        return WorkerDrainReply(
            member.name, running=running if isinstance(running, int) else len(member.active)
        )

    async def worker_verify(self, request: VerifyRequest, *, here: bool = False) -> VerifyReport:
        """Probe the selected connected workers, concurrently, through the dispatch path. On a
        shared database each orchestrator probes the ones it holds, at once (``here``: a
        peer's ask, for its own only)."""
        if self.pool is None or self.verifier is None:
            raise NeedsOrchestrator(
                "worker verify needs a running orchestrator: pass --server URL or set "
                "SWAMP_SERVE_URL (or run it in the repo where 'swamp serve' runs)"
            )
        labels = check_labels(request.labels, source="labels")
        members = [m for m in self.pool.members.values() if m.connected]
        others = [] if here or self.peers is None else list(self.peers.known)
        if request.name:
            members = [m for m in members if m.name == request.name]
            holder = None if members or here else await self._holder(request.name)
            if holder is not None:
                others = [holder]
            elif not members:
                raise NotFound(
                    f"no connected worker named {request.name!r}: see 'swamp worker list'"
                )
            else:
                others = []
        if labels:
            members = [m for m in members if all(m.labels.get(k) == v for k, v in labels.items())]
        verdicts: dict[str, Verdict] = {}
        verifier = self.verifier

        def keep(verdict: Verdict) -> None:
            # a worker that just moved may be seen by two (its old socket, dead, not yet
            # noticed here): a verdict beats an error
            held = verdicts.get(verdict.name)
            if held is None or (held.status == "error" and verdict.status != "error"):
                verdicts[verdict.name] = verdict

        async def probe(member_name: str) -> None:
            keep(await verifier.probe(member_name))

        async def ask(orchestrator: str) -> None:
            try:
                report = VerifyReport.decode(
                    await self._ask(orchestrator, "peer.worker.verify", request, VERIFY_WAIT)
                )
            except SwampError as exc:  # no answer there: its workers get none, and say why
                report = await self._unverified(orchestrator, labels, request.name, exc.message)
            for verdict in report.workers:
                keep(verdict)

        async with open_unwrapping_nursery() as nursery:
            for member in members:
                nursery.start_soon(probe, member.name)
            for orchestrator in others:
                if self.peers is not None and self.peers.serving(orchestrator):
                    nursery.start_soon(ask, orchestrator)
        ordered = [verdicts[name] for name in sorted(verdicts)]
        return VerifyReport(
            workers=ordered,
            total=len(ordered),
            passed=sum(v.status == "pass" for v in ordered),
            failed=sum(v.status == "fail" for v in ordered),
            errors=sum(v.status == "error" for v in ordered),
        )

    async def worker_queue(self, request: Empty = Empty()) -> QueueReply:
        """The steps waiting for a worker, oldest first, and demand against supply for each
        requirement: live from the orchestrator, or from the records on the repo."""
        supply: Callable[[Placement], tuple[int, int]]
        if self.dispatch is not None and self.peers is not None:
            # a shared database: ours live, the others' as their records say (theirs wait
            # for their workers, and ours; their workers' slots as their holders last wrote)
            me, queue, now = self.peers.me, self.dispatch.queue, self.clock()
            theirs = [a for a in await PendingBook(self.db).waiting() if _elsewhere(a, me)]
            items = sorted(
                [*queue.items(), *(_queue_item(a, now) for a in theirs)],
                key=lambda item: item.queued_at,
            )
            workers = await WorkerBook(self.db).all() if items else []  # (nothing waits: none)
            elsewhere = _record_supply([a for a in workers if _elsewhere(a, me)])

            def supply(placement: Placement) -> tuple[int, int]:
                (ours, ours_free), (others, others_free) = (
                    queue.supply(placement),
                    elsewhere(placement),
                )
                return ours + others, ours_free + others_free

        elif self.dispatch is not None:
            queue = self.dispatch.queue
            items = queue.items()
            supply = queue.supply
        else:
            now = self.clock()
            items = [_queue_item(a, now) for a in await PendingBook(self.db).waiting()]
            supply = _record_supply(await WorkerBook(self.db).all())
        return QueueReply(items=items, summary=_summarize(items, supply))

    # -- workflows -----------------------------------------------------------------------------

    @property
    def workflows(self) -> Workflows:
        return self.engine.workflows

    @property
    def engine(self) -> Engine:
        """One per orchestrator (its live runs can be cancelled), or per CLI process."""
        if self._engine is None:
            if self.dispatch is not None:
                host = Host(
                    run_step=self.dispatch.run,
                    workers_connected=self._connected,
                    saved=self.on_run_saved,
                )
            else:
                host = Host(run_step=self._run_here, placed=False)
            self._engine = Engine(
                Workflows(self.repo, self.registry),
                self.db,
                host,
                max_fan_out=self.max_fan_out,
                owner=self.peers.me if self.peers is not None else "",
            )
        return self._engine

    def _connected(self, selector: dict) -> list[dict]:
        """``workers.connected(selector)``: the schedulable workers whose labels match."""
        check_labels({k: str(v) for k, v in selector.items()}, source="workers.connected()")
        assert self.pool is not None  # asked only by the live orchestrator's engine
        out: list[dict] = []
        for member in sorted(self.pool.members.values(), key=lambda m: m.name):
            if not member.connected or not is_schedulable(member.status):
                continue
            if any(member.labels.get(k) != str(v) for k, v in selector.items()):
                continue
            out.append(
                {
                    "name": member.name,
                    "labels": dict(member.labels),
                    "platform": member.platform,
                    "arch": member.arch,
                    "capacity": member.capacity,
                    "freeSlots": member.capacity - len(member.active),
                    "status": member.status,
                }
            )
        return out

    async def _run_here(self, run: RunRequest, emit: EventSink) -> RunResult:
        model_type = self.registry.runnable(run.model.type)
        args = model_type.method(run.method).validate({**run.model.args, **run.args})
        logs, log_id = self.step_logs, ordered_id()
        async with logs.opened(log_id, run.owner(model_type.type), worker=None):
            outcome = await run_here(
                self.db, model_type, run, args, logs.capture(log_id, emit), env=dict(os.environ)
            )
        return RunResult(
            status=outcome.status,
            model=run.model.name,
            model_type=model_type.type,
            method=run.method,
            duration_ms=outcome.duration_ms,
            outputs=outcome.outputs,
            error=outcome.error,
            result=outcome.result,
            started_at=run.started_at,
            log_id=log_id,
        )

    async def workflow_list(self, request: Empty = Empty()) -> WorkflowListReply:
        items = []
        for name in self.workflows.names():
            loaded = self.workflows.read(name)
            wf = loaded.workflow
            items.append(
                {
                    "name": name,
                    "description": wf.description if wf else "",
                    "jobs": len(wf.jobs) if wf else 0,
                    "steps": sum(len(j.steps) for j in wf.jobs) if wf else 0,
                    "placed": wf.placed_steps() if wf else False,
                    "problems": len(loaded.errors),
                }
            )
        return WorkflowListReply(items)

    async def workflow_show(self, request: WorkflowRequest) -> WorkflowShowReply:
        name = _needs_name(request)
        loaded = self.workflows.load(name)
        raw = tomllib.loads((self.workflows.dir / f"{name}.toml").read_text(encoding="utf-8"))
        return WorkflowShowReply(
            workflow=explicit(raw), problems=[_problem(p) for p in loaded.problems]
        )

    async def workflow_validate(self, request: WorkflowRequest) -> WorkflowValidateReply:
        names = [check_workflow_name(request.name)] if request.name else self.workflows.names()
        out: list[dict[str, Any]] = []
        for name in names:
            loaded = self.workflows.load(name)
            out.append({"name": name, "problems": [_problem(p) for p in loaded.problems]})
        passed = all(p["warning"] for w in out for p in w["problems"])
        return WorkflowValidateReply(workflows=out, passed=passed)

    async def workflow_run(
        self, request: WorkflowRunRequest, on_event: EventSink | None = None, *, submitter: str = ""
    ) -> WorkflowRunReply:
        workflow = self.workflows.checked(check_workflow_name(request.name))
        inputs = check_inputs(workflow, request.inputs)
        timeout = parse_duration(request.timeout, what="--timeout") if request.timeout else None
        priority = None if request.priority is None else check_priority(request.priority)
        if workflow.placed_steps() and self.dispatch is None:
            raise NeedsOrchestrator(
                f"workflow {request.name!r} has placed steps: run it through a running "
                "orchestrator (swamp serve; --server URL or SWAMP_SERVE_URL)"
            )
        record = await self.engine.run(
            workflow,
            inputs,
            on_event or no_events,
            timeout=timeout,
            priority=priority,
            submitter=submitter,
        )
        # the run has ended: nothing changes its record now, and a fan-out's tree as JSON is
        # a tenth of a second at 10,000 steps, which the loop need not wait through
        return await trio.to_thread.run_sync(lambda: _paged(*page(record, 0)))

    async def workflow_history(self, request: WorkflowRequest) -> WorkflowHistoryReply:
        if request.name is not None:
            check_workflow_name(request.name)
        return WorkflowHistoryReply(await RunBook(self.db).summaries(request.name))

    async def workflow_history_get(self, request: RunRef) -> WorkflowRunReply:
        offset = request.offset or 0
        if offset < 0:
            raise UserError(f"invalid offset {offset}: expected 0 or more")
        return _paged(*await RunBook(self.db).page(request.run, offset))

    async def workflow_cancel(self, request: RunRef, *, here: bool = False) -> WorkflowRunReply:
        """Cancel a running run (or one step of it) where it runs: here, or on a shared
        database through the orchestrator running it (``here``: a peer's ask)."""
        header = await RunBook(self.db).header(request.run)
        run_id = header["runId"]
        if header["status"] != Status.RUNNING:
            raise Conflict(f"workflow run {run_id[:12]} has already ended: {header['status']}")
        if self.dispatch is None:
            raise NeedsOrchestrator(
                "a running workflow is cancelled by the orchestrator that runs it: pass "
                "--server URL or set SWAMP_SERVE_URL (or run it in the repo of 'swamp serve')"
            )
        runner = header.get("orchestrator")
        runner = self.peers.serving(runner) if self.peers and isinstance(runner, str) else None
        if runner is not None and not here and self.engine.ending(run_id) is None:
            asked = RunRef(run=run_id, step=request.step, reason=request.reason)
            reply = await self._ask(runner, "peer.workflow.cancel", asked, CANCEL_WAIT + 10.0)
            return WorkflowRunReply.decode(reply)
        reason = request.reason or "cancelled by 'swamp workflow cancel'"
        if request.step is not None:
            return await self._cancel_step(run_id, request.step, reason)
        ended = self.engine.ending(run_id)
        if ended is None or not self.engine.cancel(run_id, reason):
            raise Conflict(
                f"workflow run {run_id[:12]} is not running in this orchestrator "
                "(it ended with the one that ran it; its restart marks it failed)"
            )
        with trio.move_on_after(CANCEL_WAIT):  # it saves itself cancelled as it unwinds
            await ended.wait()
        return _paged(*await RunBook(self.db).page(run_id, 0))  # a page: the header and a range

    async def _cancel_step(self, run_id: str, step: str, reason: str) -> WorkflowRunReply:
        """One running step of a live run: it ends failed with ``reason``, the run goes on."""
        if not isinstance(step, str) or "." not in step or len(step) > MAX_STEP_REF:
            raise UserError(
                f"a step is JOB.STEP (as 'workflow history get' lists it), got {step!r}"
            )
        saved = self.engine.cancel_step(run_id, step, reason)
        if saved is None:
            raise Conflict(
                f"step {printable(step)} of workflow run {run_id[:12]} is not running in this "
                "orchestrator (see 'swamp workflow history get')"
            )
        with trio.move_on_after(CANCEL_WAIT):  # it saves itself ended as it unwinds
            await saved.wait()
        return _paged(*await RunBook(self.db).page(run_id, 0))

    # -- step logs -------------------------------------------------------------------------------

    async def logs_read(self, request: LogsRequest) -> LogsPage:
        from swamp.admin import step_logs

        running = set(self.engine.live) if self.dispatch is not None else set()
        return await step_logs.read(
            request,
            db=self.db,
            logs=self.step_logs.store,
            live=self.live_logs,
            running=running,
        )

    # -- data and runs -------------------------------------------------------------------------

    async def data_query(self, request: DataQueryRequest) -> QueryReply:
        predicate = parse_predicate(request.predicate)
        if request.limit is not None and request.limit < 1:
            raise UserError(f"invalid --limit {request.limit}: expected a positive number")
        if self.dispatch is not None:  # the orchestrator's: off its event loop
            records = await self.dispatch.query(
                predicate,
                budget=ADMIN_BUDGET,
                all_versions=request.all_versions,
                limit=request.limit,
            )
        else:
            records = await self.db.query(
                predicate, all_versions=request.all_versions, limit=request.limit
            )
        return QueryReply([RecordItem.decode(r.to_json()) for r in records])

    async def method_run(
        self, request: MethodRunRequest, on_event: EventSink | None = None, *, submitter: str = ""
    ) -> RunResult:
        emit = on_event or no_events
        priority = check_priority(request.priority)  # checked on both routes, used by a queue
        spec = request.placement
        placement = Placement(
            target=spec.target,
            labels=check_labels(spec.labels, source="placement labels"),
            platform=spec.platform,
        )
        model = self.repo.resolve_model(request.model)
        run = RunRequest(
            model,
            request.method,
            request.args,
            placement,
            env_names=check_names(request.env, source="--env"),
            read_scope=self.repo.read_scope(model),
            queue_timeout=request.queue_timeout,
            timeout=request.timeout,
            started_at=iso(self.clock()),
            priority=priority,
            submitter=submitter,
            tell_step=request.follow,
        )
        if self.dispatch is not None:
            refused = self.dispatch.letting_go() if placement.is_remote() else None
            if refused is not None:  # its workers are let go: the step would wait for none
                raise DatabaseUnavailable(refused)
            return await self.dispatch.run(run, emit)
        if request.queue_timeout is not None:
            parse_queue_timeout(request.queue_timeout, what="--queue-timeout")
        run.execution_timeout()
        if placement.is_remote():
            raise NeedsOrchestrator(
                f"running on a worker ({placement.describe()}) needs a running "
                "orchestrator: pass --server URL or set SWAMP_SERVE_URL"
            )
        return await self._run_here(run, emit)

    async def method_follow(self, request: MethodFollowRequest) -> RunResult:
        """A step's outcome by its id, once it has one, whichever orchestrator placed it (its
        record is on the database they share): how a client whose orchestrator died reads
        it through another."""
        steps = self.dispatch.steps if self.dispatch is not None else None
        if steps is None:
            if self.dispatch is None:
                raise NeedsOrchestrator(
                    "following a step needs a running orchestrator on a shared database: "
                    "pass --server URL"
                )
            raise NotFound(
                "this orchestrator keeps no step records (its database is its own file): a "
                "step is followed through an orchestrator on a shared database"
            )
        if not request.step_id or len(request.step_id) > 64:
            raise UserError("a step is followed by the id its 'recorded' event gave")
        row = await steps.follow(request.step_id)
        outcome = row.outcome or {}
        if "error" in outcome:
            raise from_wire(outcome["error"])
        try:
            return RunResult.decode(outcome.get("reply"), where="a recorded outcome")
        except MalformedFrame as exc:
            raise MalformedReply(f"step {request.step_id[:40]!r}: {exc.message}") from None


def _server_token_item(held: ServerToken, *, token: str | None = None) -> ServerTokenItem:
    """As listed: with the scope it is held to (one minted before scopes is ``admin``)."""
    return ServerTokenItem(
        name=held.name,
        state=held.state,
        created_at=held.created_at,
        scope=held.scope.value,
        revoked_at=held.revoked_at,
        token=token,
    )


def _queue_item(attrs: dict, now: float) -> QueueItem:
    """A ``waiting`` record as the queue lists it."""
    placement = {k: attrs[k] for k in ("target", "labels", "platform") if attrs.get(k)}
    queued = parse_iso(attrs["queuedAt"])
    return QueueItem(
        queue_id=attrs["queueId"],
        requirement=requirement_text(placement),
        placement=PlacementSpec.decode(placement),
        model_type=str(attrs.get("modelType", "?")),
        model_name=attrs.get("modelName"),
        method_name=str(attrs.get("methodName", "?")),
        workflow_name=attrs.get("workflowName"),
        job_name=attrs.get("jobName"),
        step_name=attrs.get("stepName"),
        queued_at=attrs["queuedAt"],
        age_ms=max(0, round((now - queued) * 1000)) if queued is not None else 0,
        priority=attrs["priority"] if isinstance(attrs.get("priority"), int) else 0,
        submitter=attrs["submitter"] if isinstance(attrs.get("submitter"), str) else None,
    )


def _elsewhere(attrs: dict, me: str) -> bool:
    """A record another orchestrator of a shared database wrote as its own."""
    return attrs.get("orchestrator", me) != me


def _record_supply(records: list[dict]) -> Callable[[Placement], tuple[int, int]]:
    """Supply as the worker records tell it (what a running orchestrator last wrote)."""
    index = PoolIndex()
    for attrs in records:
        try:
            index.put(
                Slots(
                    attrs["name"],
                    str(attrs.get("instanceId", "")),
                    dict(attrs.get("labels") or {}),
                    str(attrs.get("platform", "")),
                    str(attrs.get("arch", "")),
                    int(attrs.get("capacity", 1)),
                    len(attrs.get("activeDispatchIds") or []),
                    schedulable=is_schedulable(attrs["status"]),
                )
            )
        except (TypeError, ValueError, AttributeError):
            continue  # a damaged record supplies nothing
    return lambda placement: index.supply(Requirement.of(placement))


def _summarize(
    items: list[QueueItem], supply: Callable[[Placement], tuple[int, int]]
) -> list[QueueSummary]:
    """One line per requirement, in the order of its oldest step."""
    groups: dict[str, list[QueueItem]] = {}
    for item in items:
        groups.setdefault(item.requirement, []).append(item)
    out = []
    for requirement, group in groups.items():
        spec = group[0].placement
        connected, free = supply(
            Placement(target=spec.target, labels=dict(spec.labels), platform=spec.platform)
        )
        out.append(
            QueueSummary(
                requirement=requirement,
                waiting=len(group),
                oldest_wait_ms=max(i.age_ms for i in group),
                connected=connected,
                free_slots=free,
            )
        )
    return out


def _needs_name(request: WorkflowRequest) -> str:
    if not request.name:
        raise UserError("name a workflow: see 'swamp workflow list'")
    return check_workflow_name(request.name)


def _problem(problem) -> dict:
    return {"place": problem.place, "message": problem.message, "warning": problem.warning}


def _paged(shown: dict, more: int | None) -> WorkflowRunReply:
    """A run's reply: a page of it, and where the next starts (see ``run_record.page``)."""
    return WorkflowRunReply(shown, next_offset=more)
