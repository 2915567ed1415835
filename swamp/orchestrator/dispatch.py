"""Dispatch: run a method locally, or on the least-loaded matching worker.

For a placed step: choose a worker (a pure decision over the pool), reserve its slot at once (so
concurrent decisions never overbook), acquire a step lease, issue a dispatch credential that is
kept fresh while the dispatch runs, send ``worker.dispatch`` and relay the worker's events as they
arrive. When the worker's socket drops mid-dispatch, the lease decides: no writes yet → the lease
expires and the step runs again on any matching worker (waiting up to the grace window for one to
come back); writes happened → the step fails (write-then-drop), because running it again could
duplicate them.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace

import trio

from swamp.bookkeeping.leases import LeaseBook
from swamp.bookkeeping.tokens import TokenBook
from swamp.domain import environment
from swamp.domain.leases import LeaseState
from swamp.domain.placement import Placement, choose_worker
from swamp.domain.read_scope import ReadScope
from swamp.domain.workers import WorkerStatus
from swamp.errors import (
    ChannelClosed,
    DispatchFailed,
    MalformedFrame,
    NoMatchingWorker,
    SwampError,
    WorkerLostError,
    WriteThenDrop,
)
from swamp.models.context import LocalContext
from swamp.models.fleet_probe import FLEET_PROBE, MARKER_ENV
from swamp.models.fleet_probe import INSTANCE as FLEET_PROBE_INSTANCE
from swamp.models.framework import ModelType
from swamp.models.runner import run_method
from swamp.orchestrator.credentials import Credentials
from swamp.orchestrator.pool import Member, Pool
from swamp.orchestrator.records import WorkerRecords
from swamp.plugins import ModelRegistry
from swamp.protocol.messages import (
    Dispatched,
    DispatchRequest,
    DispatchResult,
    Effects,
    LogLine,
    OutputHandle,
    Redispatched,
    RunResult,
    Started,
    Verdict,
    decode_event,
)
from swamp.repo import ModelInstance
from swamp.store.datastore import Datastore, Record
from swamp.store.retry import retry_busy

log = logging.getLogger("swamp.dispatch")
PROBE_TIMEOUT = 60
CANCEL_SETTLE = 30  # how long a cancelled dispatch waits for the worker to report it stopped
Emit = Callable[[dict], Awaitable[None]]


@dataclass
class RunRequest:
    model: ModelInstance
    method: str
    args: dict
    placement: Placement
    env_names: tuple[str, ...] = ()  # the run's --env: more of the orchestrator's variables
    read_scope: ReadScope | None = None  # None: the model's own data only
    environment: dict[str, str] = field(default_factory=dict)  # extra, for this dispatch only
    probe: bool = False  # a fleet probe: targets any connected worker, takes no slot

    def shipped_names(self, every_dispatch: tuple[str, ...]) -> tuple[str, ...]:
        """``serve --ship-env``, then the model's ``env``, then the run's ``--env``."""
        return tuple(dict.fromkeys((*every_dispatch, *self.model.env, *self.env_names)))

    def scope(self) -> ReadScope:
        return self.read_scope or ReadScope.of(self.model.type, self.model.name)


@dataclass(frozen=True)
class Step:
    """Which step a dispatch runs, and which run of it this is (after a lost worker a step is
    dispatched again: same id, next attempt)."""

    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    attempt: int = 1


@dataclass
class ActiveDispatch:
    """What the data plane and the capability verbs need to know of a running dispatch."""

    id: str
    member: Member
    model_type: ModelType
    model_name: str
    read_scope: ReadScope
    has_writes: bool = False
    outputs: list[dict] = field(default_factory=list)
    credential: str | None = None
    lease: Record | None = None  # the latest lease record this process wrote


class WorkerLost(Exception):
    def __init__(self, worker: str, reason: str, has_writes: bool) -> None:
        super().__init__(reason)
        self.worker = worker
        self.reason = reason
        self.has_writes = has_writes


class DispatchService:
    def __init__(
        self,
        store: Datastore,
        registry: ModelRegistry,
        pool: Pool,
        credentials: Credentials,
        *,
        grace_seconds: float,
        environ: dict[str, str] | None = None,
        ship_env: tuple[str, ...] = (),
        records: WorkerRecords,
        fence_seconds: float = 0,
        clock=time.time,
    ) -> None:
        self.store = store
        self.registry = registry
        self.pool = pool
        self.credentials = credentials
        self.leases = LeaseBook(store, clock=clock)
        self.records = records
        self.tokens = TokenBook(store, clock=clock)
        self.clock = clock
        # after losing a worker, wait this long before running its step elsewhere (fencing)
        self.fence_seconds = fence_seconds
        self.grace_seconds = grace_seconds
        self.environ = dict(os.environ if environ is None else environ)
        self.ship_env = environment.check_names(ship_env, source="--ship-env")
        self.active: dict[str, ActiveDispatch] = {}
        self.completed = 0

    def __repr__(self) -> str:
        return f"<DispatchService active={len(self.active)} completed={self.completed}>"

    def prepare(self, request: RunRequest) -> tuple[ModelType, dict]:
        """Resolve and validate before anything runs or is written."""
        model_type = self.registry.runnable(request.model.type)
        method = model_type.method(request.method)
        args = method.validate({**request.model.args, **request.args})
        return model_type, args

    async def run(self, request: RunRequest, emit: Emit) -> RunResult:
        model_type, args = self.prepare(request)
        if not request.placement.is_remote():
            result = await self._run_local(request, model_type, args, emit)
            worker = dispatch_id = None
        else:
            result, worker, dispatch_id = await self._run_remote(request, model_type, args, emit)
        return RunResult(
            status=result.status,
            model=request.model.name,
            model_type=model_type.type,
            method=request.method,
            duration_ms=result.duration_ms,
            outputs=result.outputs,
            worker=worker,
            dispatch_id=dispatch_id,
            error=result.error,
            result=result.result,
        )

    async def _run_local(
        self, request: RunRequest, model_type: ModelType, args: dict, emit: Emit
    ) -> DispatchResult:
        return await run_here(self.store, model_type, request, args, emit, env=self.environ)

    # -- remote ------------------------------------------------------------------------------

    async def _run_remote(
        self, request: RunRequest, model_type: ModelType, args: dict, emit: Emit
    ) -> tuple[DispatchResult, str, str]:
        placement = request.placement
        if request.probe:
            member = self.pool.get(placement.target or "")
            if member is None or not member.connected:
                raise NoMatchingWorker(f"worker {placement.target!r} is not connected")
            try:
                return await self._dispatch_once(
                    member, uuid.uuid4().hex, request, model_type, args, emit, step=Step()
                )
            except WorkerLost as exc:
                raise WorkerLostError(
                    f"worker {exc.worker} was lost during the probe ({exc.reason})"
                ) from None
        lost: WorkerLost | None = None
        give_up_at = 0.0
        step_id = uuid.uuid4().hex
        attempts = 0
        while True:
            choice = choose_worker(placement, self.pool.views())
            if choice.worker is None:
                if lost is None:
                    raise NoMatchingWorker(self._no_worker_message(placement, choice))
                gone = self._never_returns(placement)
                if gone:
                    raise NoMatchingWorker(
                        f"worker {lost.worker} was lost ({lost.reason}) before the step wrote "
                        f"anything, and {gone}"
                    )
                with trio.move_on_at(give_up_at):
                    await self.pool.wait_changed()
                    continue
                raise NoMatchingWorker(
                    f"worker {lost.worker} was lost ({lost.reason}) before the step wrote "
                    f"anything, and no worker matching {placement.describe()} was free within "
                    f"the {self.grace_seconds:g}s grace window to run it again"
                )
            member = self.pool.members[choice.worker.name]
            dispatch_id = uuid.uuid4().hex
            attempts += 1
            step = Step(step_id, attempts)
            try:
                return await self._dispatch_once(
                    member, dispatch_id, request, model_type, args, emit, step=step
                )
            except WorkerLost as exc:
                if exc.has_writes:
                    raise WriteThenDrop(
                        f"worker {exc.worker} disconnected after {model_type.type}."
                        f"{request.method} had run a command or written data ({exc.reason}); "
                        "failing the step "
                        "rather than running it twice (write-then-drop)"
                    ) from None
                if request.model.retry == "never":
                    raise WorkerLostError(
                        f"worker {exc.worker} was lost ({exc.reason}); model "
                        f'{request.model.name!r} declares retry = "never", so the step is not '
                        "run again"
                    ) from None
                lost = exc
                gone = self._never_returns(placement)
                if gone:
                    raise NoMatchingWorker(
                        f"worker {exc.worker} was lost ({exc.reason}) before the step wrote "
                        f"anything, and {gone}"
                    ) from None
                log.warning(
                    "worker %s lost before writing (%s): dispatching again after %gs",
                    exc.worker,
                    exc.reason,
                    self.fence_seconds,
                )
                await _safe_emit(emit, Redispatched(worker=exc.worker, reason=exc.reason).to_json())
                # Fencing: if the lost worker is alive behind a partition (or frozen), its own
                # deadline (or its reaper's) kills the first copy before this one can start.
                await trio.sleep(self.fence_seconds)
                give_up_at = trio.current_time() + self.grace_seconds

    async def _dispatch_once(
        self,
        member: Member,
        dispatch_id: str,
        request: RunRequest,
        model_type: ModelType,
        args: dict,
        emit: Emit,
        *,
        step: Step,
    ) -> tuple[DispatchResult, str, str]:
        active = ActiveDispatch(
            dispatch_id, member, model_type, request.model.name, read_scope=request.scope()
        )
        credential = None
        if not request.probe:
            member.active.add(dispatch_id)  # reserve the slot now: decide, then act
        try:
            active.lease = await retry_busy(
                lambda: self.leases.acquire(
                    lease_id=dispatch_id,
                    worker=member.name,
                    model_type=model_type.type,
                    model_name=request.model.name,
                    method=request.method,
                )
            )
            if not request.probe:  # a probe never changes a worker's scheduling status
                self._set_busy(member)
            credential = self.credentials.issue_dispatch(member.name, dispatch_id)
            self.active[dispatch_id] = active
            params = DispatchRequest(
                dispatch_id=dispatch_id,
                model_type=model_type.type,
                model_name=request.model.name,
                method=request.method,
                args=args,
                environment={
                    **environment.ship(self.environ, request.shipped_names(self.ship_env)),
                    **request.environment,
                },
                credential=credential,
                takes_slot=not request.probe,
                step_id=step.id,
                attempt=step.attempt,
            ).to_json()
            await _safe_emit(
                emit, Dispatched(worker=member.name, dispatch_id=dispatch_id).to_json()
            )
            try:
                channel = member.channel
                if channel is None:
                    raise ChannelClosed("the worker disconnected before the dispatch was sent")
                active.credential = credential
                reply = await channel.call(
                    "worker.dispatch",
                    params,
                    timeout=None,
                    on_event=lambda event: _relay(emit, event, active),
                    # cancelled: the slot stays taken until the worker says the method stopped
                    settle=CANCEL_SETTLE,
                )
            except ChannelClosed as exc:
                if active.has_writes:
                    await self._end_lease(
                        active,
                        LeaseState.FAILED,
                        "worker disconnected after writing (write-then-drop)",
                    )
                else:
                    await self._end_lease(
                        active, LeaseState.EXPIRED, f"worker lost before writing: {exc.message}"
                    )
                raise WorkerLost(member.name, exc.message, active.has_writes) from None
            except SwampError as exc:
                await self._end_lease(active, LeaseState.FAILED, exc.message)
                raise DispatchFailed(
                    f"worker {member.name} refused the dispatch ({exc.code}): {exc.message}"
                ) from None
            try:
                result = DispatchResult.decode(reply)
            except MalformedFrame as exc:
                await self._end_lease(active, LeaseState.FAILED, "malformed result")
                raise DispatchFailed(
                    f"worker {member.name} sent a malformed result: {exc.message}"
                ) from None
            if result.status == "succeeded":
                await self._end_lease(active, LeaseState.COMPLETED)
            else:
                await self._end_lease(active, LeaseState.FAILED, str(result.error))
            self.completed += 1
            if active.outputs:  # what the data plane saw written is the truth
                result = replace(result, outputs=[OutputHandle(**o) for o in active.outputs])
            return result, member.name, dispatch_id
        except trio.Cancelled:
            with trio.CancelScope(shield=True):
                await self._end_lease(active, LeaseState.FAILED, "dispatch cancelled")
            raise
        finally:
            if credential is not None:
                self.credentials.revoke(credential)
            self.active.pop(dispatch_id, None)
            if not request.probe:
                member.active.discard(dispatch_id)
                if member.connected and not member.active:
                    self._set_status(member, WorkerStatus.IDLE.value)
                self.pool.changed()

    async def _end_lease(
        self, active: ActiveDispatch, state: LeaseState, error: str | None = None
    ) -> None:
        """End the lease durably (retried while the database is locked); a lease that cannot be
        ended is expired by the next boot's reconciliation, so the step's outcome stands."""
        try:
            active.lease = await retry_busy(
                lambda: self.leases.end(active.id, state, error=error, current=active.lease)
            )
        except SwampError as exc:
            log.warning("could not end lease %s as %s: %s", active.id, state.value, exc)

    async def probe(self, name: str, *, timeout: float = PROBE_TIMEOUT) -> Verdict:
        """Run the fleet probe on one worker through the ordinary dispatch path."""
        marker = secrets.token_hex(8)
        request = RunRequest(
            model=ModelInstance(FLEET_PROBE_INSTANCE, FLEET_PROBE.type, {}, "built-in"),
            method="verify",
            args={"marker": marker},
            placement=Placement(target=name),
            environment={MARKER_ENV: marker},
            probe=True,
        )

        async def ignore(event: dict) -> None:
            return None

        try:
            with trio.fail_after(timeout):
                result = await self.run(request, ignore)
        except trio.TooSlowError:
            return Verdict(name, "error", error=f"the probe got no answer within {timeout:g}s")
        except SwampError as exc:
            return Verdict(name, "error", error=exc.message)
        summary = result.result
        if result.status != "succeeded" or not isinstance(summary, dict):
            return Verdict(name, "error", error=result.error or "the probe returned no verdict")
        try:
            return Verdict.decode(
                {
                    "name": name,
                    "status": "pass" if summary.get("ok") is True else "fail",
                    "platform": summary.get("platform"),
                    "arch": summary.get("arch"),
                    "seams": summary.get("seams") or {},
                    "failures": summary.get("failures") or [],
                }
            )
        except MalformedFrame as exc:
            return Verdict(name, "error", error=f"the probe's verdict is malformed: {exc.message}")

    def _never_returns(self, placement: Placement) -> str | None:
        """Why a targeted worker can never come back (its token is dead), or ``None``."""
        member = self.pool.get(placement.target or "")
        if member is None or member.connected:
            return None
        token = self.tokens.get(member.token_name)
        if token is None or not token.live(self.clock()):
            state = token.effective_state(self.clock()).value if token else "deleted"
            return (
                f"its target {member.name!r} can never return: token {member.token_name!r} "
                f"has been {state}"
            )
        return None

    def _no_worker_message(self, placement: Placement, choice) -> str:
        member = self.pool.get(placement.target or "")
        if member is not None and member.status == WorkerStatus.UNVERIFIED.value:
            return (
                f"worker {member.name!r} is unverified ({member.verify_failure_reason}); it "
                f"gets no work until it passes: see 'swamp worker verify {member.name}'"
            )
        if member is not None and not member.connected:
            return (
                f"worker {member.name!r} is disconnected (it keeps its place for the grace "
                "window); retry when it is back"
            )
        return _no_worker_message(placement, choice)

    def _set_busy(self, member: Member) -> None:
        if member.status != WorkerStatus.BUSY.value:
            self._set_status(member, WorkerStatus.BUSY.value)

    def _set_status(self, member: Member, status: str) -> None:
        member.status = status
        self.records.status(member, status, active=sorted(member.active))

    async def keep_credentials_fresh(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """Slide every running dispatch's credential expiry, so a dispatch keeps its data-plane
        access for as long as it runs (one timer for all of them, not a task per dispatch)."""
        task_status.started()
        while True:
            await trio.sleep(self.credentials.ttl / 3)
            for active in list(self.active.values()):
                if active.credential:
                    self.credentials.extend(active.credential)

    async def record_write(self, active: ActiveDispatch) -> None:
        """Durably mark the lease write-bearing *before* the first write is persisted."""
        if not active.has_writes:
            active.lease = await retry_busy(
                lambda: self.leases.mark_writes(active.id, current=active.lease)
            )
            active.has_writes = True


def _no_worker_message(placement: Placement, choice) -> str:
    if choice.matching and choice.full == choice.matching:
        return (
            f"all {choice.matching} connected worker(s) matching {placement.describe()} "
            "are busy (every slot in use); retry when one frees up"
        )
    return (
        f"no connected worker matches {placement.describe()}: see 'swamp worker list' "
        "for the pool and its labels"
    )


async def run_here(
    store: Datastore,
    model_type: ModelType,
    request: RunRequest,
    args: dict,
    emit: Emit,
    *,
    env: dict[str, str],
) -> DispatchResult:
    """Run a method in this process (the orchestrator's, or the CLI's on a repo)."""
    ctx = LocalContext(
        store=store,
        emit=emit,
        model_type=model_type,
        model_name=request.model.name,
        method=request.method,
        dispatch_id=None,
        env={**env, **environment.step_identity(uuid.uuid4().hex, 1)},
    )
    await _safe_emit(emit, Started(where="orchestrator").to_json())
    outcome = await run_method(model_type.method(request.method), args, ctx)
    return outcome.to_message()


async def _relay(emit: Emit, event: object, active: ActiveDispatch) -> None:
    """What a worker says mid-dispatch, checked: a log line goes, with the worker's name, to
    whoever runs the step; word that the method had an effect marks the dispatch (if the worker
    is lost now, the step must not run again). Nothing else is a worker's to say."""
    worker = active.member.name
    try:
        decoded = decode_event(event)
        if isinstance(decoded, Effects):
            active.has_writes = True
            return
        if not isinstance(decoded, LogLine):
            raise MalformedFrame(f"a worker does not send {decoded.kind!r} events")
    except MalformedFrame as exc:
        log.warning("dropped a malformed event from worker %s: %s", worker, exc.message)
        return
    await _safe_emit(emit, replace(decoded, worker=worker).to_json())


async def _safe_emit(emit: Emit, event: dict) -> None:
    """Events are best effort: a client that went away must not break the dispatch."""
    try:
        await emit(event)
    except ChannelClosed:
        pass
