"""Dispatch: run a method here, or place it on a worker through the queue.

A placed step is a loop of *acquire a worker* (the queue: at once when one is free, else it
waits, under a deadline fixed once for the whole run) and *one episode* on it (lease,
credential, frame, relay, result). After each episode a pure rule
(:func:`~swamp.domain.episodes.next_move`) says what happens: the step is finished; it goes back
in the queue (the worker had no free slot, or was lost before the step had any effect — after
the fence, so a worker alive behind a partition has killed its copy first); or it fails with
a reason (write-then-drop, ``retry = "never"``, a refusal).
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import NamedTuple

import trio

from swamp.bookkeeping.leases import key as lease_key
from swamp.domain import environment
from swamp.domain.durations import parse_timeout
from swamp.domain.episodes import Ending, EpisodeEnd, Move, next_move
from swamp.domain.placement import Placement
from swamp.domain.priority import check_priority
from swamp.domain.query import Predicate
from swamp.domain.queue import effective_timeout, parse_queue_timeout
from swamp.domain.read_scope import ReadScope
from swamp.domain.scheduler import Requirement
from swamp.domain.step_logs import LogOwner
from swamp.domain.workers import WorkerStatus
from swamp.errors import (
    BY_CODE,
    DispatchFailed,
    ExecutionTimeout,
    MalformedFrame,
    StoreBroken,
    SwampError,
)
from swamp.ids import new_id, ordered_id
from swamp.models.context import LocalContext
from swamp.models.framework import ModelType
from swamp.models.runner import run_method
from swamp.orchestrator.episode import Emit, Episode, Episodes, Step, Work, safe_emit
from swamp.orchestrator.peers import (
    Claim,
    Peers,
    decode_step,
    encode_ending,
    encode_step,
    placement_of,
)
from swamp.orchestrator.pool import Member, Pool
from swamp.orchestrator.queue import DispatchQueue, StepInfo
from swamp.orchestrator.step_logs import StepLogs
from swamp.orchestrator.step_records import StepRecords
from swamp.plugins import ModelRegistry, default_seams
from swamp.protocol.messages import DispatchResult, Recorded, Redispatched, RunResult, Started
from swamp.protocol.rpc import no_events
from swamp.repo import ModelInstance
from swamp.store.datastore import Datastore, Record, iso
from swamp.store.reader import Reader
from swamp.store.records import Records

log = logging.getLogger("swamp.dispatch")
BUSY_BACKOFF, BUSY_BACKOFF_CAP = 0.05, 2.0  # after a worker_busy answer, before queueing again
UNTIL_OURS_RETRY, UNTIL_OURS_MAX = 1.0, 10.0  # looks at a lost worker's lease not ended here
LOSSES = (Ending.LOST, Ending.UNACKNOWLEDGED)  # endings after which a step may run again
__all__ = ["DispatchService", "RunRequest", "run_here", "Emit"]


@dataclass
class RunRequest:
    model: ModelInstance
    method: str
    args: dict
    placement: Placement
    env_names: tuple[str, ...] = ()  # the run's --env: more of the orchestrator's variables
    read_scope: ReadScope | None = None  # None: the model's own data only
    queue_timeout: str | None = None  # the run's --queue-timeout (beats serve's)
    timeout: str | None = None  # the run's --timeout (beats the model's)
    workflow: str | None = None  # which run/step this is, when a workflow placed it
    run_id: str | None = None  # (its output is kept under the run's id)
    job: str | None = None
    step: str | None = None
    started_at: str | None = None  # when the run was asked for (its result says so)
    priority: int = 0  # among waiting steps, higher goes first (swamp.domain.priority)
    submitter: str = ""  # who asked (local, token:NAME): the queue shares slots between them
    # a step taken over from an orchestrator that died: its id, and its dispatches so far
    step_id: str | None = None
    attempts: int = 0
    tell_step: bool = False  # its client follows it elsewhere if need be: tell it the step's id

    def shipped_names(self, every_dispatch: tuple[str, ...]) -> tuple[str, ...]:
        """``serve --ship-env``, then the model's ``env``, then the run's ``--env``."""
        return tuple(dict.fromkeys((*every_dispatch, *self.model.env, *self.env_names)))

    def scope(self) -> ReadScope:
        return self.read_scope or ReadScope.of(self.model.type, self.model.name)

    def owner(self, model_type: str) -> LogOwner:
        """Whose output its lines are (``swamp logs``): the run's step, or the instance."""
        return LogOwner(
            model_type,
            self.model.name,
            self.method,
            run_id=self.run_id,
            workflow=self.workflow,
            job=self.job,
            step=self.step,
        )

    def execution_timeout(self, default: float | None = None) -> float | None:
        """Seconds the method may run once dispatched (each attempt): the run's ``--timeout``,
        else the model's ``timeout``, else ``default`` (``None``: as long as it takes)."""
        text = self.timeout if self.timeout is not None else self.model.timeout
        if text is None:
            return default
        seconds = parse_timeout(text, what="--timeout")  # "0": none, whatever the default
        return None if seconds is None else float(seconds)


# -- a placed step as recorded on a shared database -----------------------------------------


def encode_request(request: RunRequest, args: dict) -> dict:
    """A :class:`RunRequest` as a step record keeps it (``swamp.orchestrator.step_records``):
    its environment by name only (the values are the orchestrator's own, wherever it runs);
    ``args``, the method's arguments as checked (the model's merged in)."""
    model = request.model
    scope = request.scope()
    return {
        "model": {
            "name": model.name,
            "type": model.type,
            "args": {},  # (in ``args``, checked and merged: a model file's are not all JSON)
            "env": list(model.env),
            "retry": model.retry,
            "timeout": model.timeout,
        },
        "method": request.method,
        "args": args,
        "placement": request.placement.to_json(),
        "env": list(request.env_names),
        "reads": sorted([list(item) for item in scope.items]),
        "readPatterns": list(scope.type_patterns),
        "queueTimeout": request.queue_timeout,
        "timeout": request.timeout,
        "priority": request.priority,
        "submitter": request.submitter,
        "startedAt": request.started_at,
    }


def decode_request(data: dict, step_id: str) -> RunRequest:
    """The :class:`RunRequest` a step record holds (a row is another process's data:
    ``MalformedFrame`` when it is not one this version reads)."""

    def texts(value) -> tuple[str, ...]:
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise MalformedFrame("a recorded step's names are text")
        return tuple(value)

    def optional_text(value) -> str | None:
        if value is not None and not isinstance(value, str):
            raise MalformedFrame("a recorded step's timeouts are text")
        return value

    model = data.get("model")
    if not isinstance(model, dict):
        raise MalformedFrame("a recorded step names its model")
    name, kind, model_args = model.get("name"), model.get("type"), model.get("args")
    method, args = data.get("method"), data.get("args")
    placement = data.get("placement")
    placement = placement_of(placement) if isinstance(placement, dict) else None
    priority = data.get("priority", 0)
    if not (
        isinstance(name, str)
        and isinstance(kind, str)
        and isinstance(model_args, dict)
        and isinstance(method, str)
        and isinstance(args, dict)
        and placement is not None
        and placement.is_remote()
        and isinstance(priority, int)
        and not isinstance(priority, bool)
    ):
        raise MalformedFrame("a recorded step is not one this version reads")
    reads = data.get("reads") or []
    if not isinstance(reads, list) or not all(
        isinstance(r, list) and len(r) == 2 and all(isinstance(x, str) for x in r) for r in reads
    ):
        raise MalformedFrame("a recorded step's reads are pairs of text")
    retry = model.get("retry")
    instance = ModelInstance(
        name=name,
        type=kind,
        args=model_args,
        source="recorded",
        env=texts(model.get("env") or []),
        retry=retry if retry in ("unwritten", "never") else "never",
        timeout=optional_text(model.get("timeout")),
    )
    submitter = data.get("submitter")
    return RunRequest(
        instance,
        method,
        args,
        placement,
        env_names=texts(data.get("env") or []),
        read_scope=ReadScope(
            frozenset((a, b) for a, b in reads), texts(data.get("readPatterns") or [])
        ),
        queue_timeout=optional_text(data.get("queueTimeout")),
        timeout=optional_text(data.get("timeout")),
        started_at=optional_text(data.get("startedAt")),
        priority=priority,
        submitter=submitter if isinstance(submitter, str) else "",
        step_id=step_id,
    )


class Plan(NamedTuple):
    """A run request resolved and checked (:meth:`DispatchService.prepare`)."""

    model_type: ModelType
    args: dict
    queue_timeout: float | None  # the run's own --queue-timeout, seconds (None: serve's)
    timeout: float | None  # seconds each attempt may run on a worker (None: as long as it takes)


class DispatchService:
    def __init__(
        self,
        store: Datastore | None,
        db: Records,
        registry: ModelRegistry,
        pool: Pool,
        episodes: Episodes,
        queue: DispatchQueue,
        *,
        environ: dict[str, str] | None = None,
        ship_env: tuple[str, ...] = (),
        fence: Callable[[Member], float] = lambda member: 0,
        peer_fence: float = 0,
        queue_timeout: float | None = None,
        observe: Callable[[str, str], None] = lambda what, value: None,
        reader: Reader | None = None,
        default_timeout: float | None = None,
        logs: StepLogs | None = None,
        clock=time.time,
        peers: Peers | None = None,
        steps: StepRecords | None = None,
    ) -> None:
        self.peers = peers
        # a shared database's step records: a placed step outlives this orchestrator
        self.steps = steps  # the other orchestrators on a shared database (None: alone)
        self.store = store
        self.db = db  # the same store, awaited: method data goes through it
        self.logs = logs  # where the lines of a method run here are kept (a worker's: episodes)
        self.reader = reader  # queries off the event loop; None: on it (tests, the CLI)
        # serve --default-timeout: how long a dispatch may run when neither its run nor its
        # model says (a worker that acknowledges and never answers holds a step no longer)
        self.default_timeout = default_timeout
        self.registry = registry
        self.pool = pool
        self.episodes = episodes
        self.queue = queue
        self.clock = clock
        # after losing a worker, wait this long before running its step elsewhere (fencing):
        # it depends on the heartbeat the worker was told
        self.fence = fence
        self.peer_fence = peer_fence  # …and after losing another orchestrator's worker
        # why a client's step for a worker is refused now (``Membership.letting_go``: set by
        # compose), or None; a step taken over waits for the workers to come back instead
        self.letting_go: Callable[[], str | None] = lambda: None
        self.queue_timeout = queue_timeout  # serve --queue-timeout; None: the default
        self.environ = dict(os.environ if environ is None else environ)
        self.environ_here = environment.for_methods_here(self.environ)  # methods run here
        self.ship_env = environment.check_names(ship_env, source="--ship-env")
        self.observe = observe  # metrics: ("outcome", "succeeded" | "failed" | a code)

    def __repr__(self) -> str:
        return f"<DispatchService {self.episodes!r} {self.queue!r}>"

    @property
    def active(self):
        return self.episodes.active

    async def query(
        self,
        predicate: Predicate,
        *,
        budget: float,
        all_versions: bool = False,
        limit: int | None = None,
        scope: ReadScope | None = None,
        peer: object = None,
        newest_first: bool = False,
    ) -> list[Record]:
        """A query for a peer (a running method's worker, ``peer``; or an operator): off the
        event loop when there is a reader, and within ``budget`` seconds either way. A store
        whose file was replaced or deleted answers nothing (a reader would read the new one)."""
        replaced = self.store.replaced() if self.store is not None else None
        if replaced:
            raise StoreBroken(replaced)
        if self.reader is not None:
            return await self.reader.query(
                predicate,
                budget=budget,
                all_versions=all_versions,
                limit=limit,
                scope=scope,
                peer=peer,
                newest_first=newest_first,
            )
        return await self.db.query(
            predicate,
            budget=budget,
            all_versions=all_versions,
            limit=limit,
            scope=scope,
            newest_first=newest_first,
        )

    def prepare(self, request: RunRequest) -> Plan:
        """Resolve and validate once, before anything runs, waits or is written (a bad
        timeout is an input error here, not after the step waited)."""
        model_type = self.registry.runnable(request.model.type)
        method = model_type.method(request.method)
        args = method.validate({**request.model.args, **request.args})
        queue_timeout = (
            parse_queue_timeout(request.queue_timeout, what="--queue-timeout")
            if request.queue_timeout is not None
            else None
        )
        timeout = request.execution_timeout(self.default_timeout)
        if request.priority:
            check_priority(request.priority)
        return Plan(model_type, args, queue_timeout, timeout)

    async def run(self, request: RunRequest, emit: Emit) -> RunResult:
        plan = self.prepare(request)
        model_type, args = plan.model_type, plan.args
        worker = dispatch_id = log_id = None
        if not request.placement.is_remote():
            if self.logs is not None:
                log_id = ordered_id()
                async with self.logs.opened(log_id, request.owner(model_type.type), worker=None):
                    result = await run_here(
                        self.db,
                        model_type,
                        request,
                        args,
                        self.logs.capture(log_id, emit),
                        env=self.environ_here,
                    )
            else:
                result = await run_here(
                    self.db, model_type, request, args, emit, env=self.environ_here
                )
        else:
            if self.steps is not None and request.workflow is None:
                return await self._run_recorded(request, plan, emit)
            return await self._run_unrecorded(request, plan, emit)
        return self.result_of(request, model_type.type, result, worker, dispatch_id, log_id)

    async def _run_unrecorded(
        self, request: RunRequest, plan: Plan, emit: Emit, step_id: str | None = None
    ) -> RunResult:
        try:
            result, worker, dispatch_id = await self._run_remote(
                request, plan, emit, step_id=step_id
            )
        except DispatchFailed as exc:
            self.observe("outcome", exc.code)
            raise
        self.observe("outcome", result.status)
        log_id = dispatch_id if self.episodes.logs is not None else None
        return self.result_of(request, plan.model_type.type, result, worker, dispatch_id, log_id)

    async def _until_ours_to_decide(self, episode: Episode, dispatch_id: str, worker: str) -> bool:
        """Its worker was lost, and its lease could not be ended here (a shared database:
        away, or the lease no longer this one's). Whether the step runs again is decided only
        once the lease has ended: here (tried again), or by the orchestrator its worker
        carried the run to, which let it go. Taken for dead meanwhile (its row gone from the
        registry), this one never decides — whoever took its steps over does, and the worker
        may have carried the run there — and it stops at its next hold of its lock. Whether
        the lease says the run had an effect."""
        if self.peers is None:
            return False
        pause, said = UNTIL_OURS_RETRY, False
        while True:
            try:
                if await self.peers.table.get(self.peers.me) is None:
                    log.warning(
                        "dispatch %s on worker %s: this orchestrator was taken for dead; "
                        "another decides what becomes of its step",
                        dispatch_id[:12],
                        worker,
                    )
                    await trio.sleep_forever()
                ended_here = await self.episodes.end_again(episode)
                record = await self.db.latest(lease_key(dispatch_id))
                attrs = record.attributes if record is not None else {}
                if ended_here or (record is not None and attrs.get("state") != "active"):
                    return bool(attrs.get("hasWrites"))
            except SwampError as exc:
                if not said:  # (once: the database is away, and every lost step waits)
                    log.warning("dispatch %s waits for the database: %s", dispatch_id[:12], exc)
                    said = True
            await trio.sleep(pause)
            pause = min(pause * 2, UNTIL_OURS_MAX)

    def adopted_work(self, request: RunRequest) -> Work:
        """What a run carried here from a dead orchestrator is, as its step's record says
        (``swamp.orchestrator.adoption``): its model, read scope, timeout and log owner (its
        arguments and environment went to the worker already)."""
        model_type = self.registry.runnable(request.model.type)
        model_type.method(request.method)
        return Work(
            model_type=model_type,
            model_name=request.model.name,
            method=request.method,
            args={},
            environment={},
            read_scope=request.scope(),
            timeout=request.execution_timeout(self.default_timeout),
            owner=request.owner(model_type.type),
        )

    def result_of(
        self,
        request: RunRequest,
        model_type: str,
        result: DispatchResult,
        worker: str | None,
        dispatch_id: str | None,
        log_id: str | None,
    ) -> RunResult:
        return RunResult(
            status=result.status,
            model=request.model.name,
            model_type=model_type,
            method=request.method,
            duration_ms=result.duration_ms,
            outputs=result.outputs,
            worker=worker,
            dispatch_id=dispatch_id,
            error=result.error,
            result=result.result,
            started_at=request.started_at,
            log_id=log_id,
        )

    async def _run_recorded(self, request: RunRequest, plan: Plan, emit: Emit) -> RunResult:
        """A placed step on a shared database: recorded first (its client, if it asks, is told
        its id), its outcome as its client hears it — so a client that loses this
        orchestrator reads it through another (``swamp.orchestrator.step_records``)."""
        assert self.steps is not None
        step_id = request.step_id
        if step_id is None:  # (a step taken over is recorded already)
            step_id = new_id()
            if not self.steps.opened(step_id, encode_request(request, plan.args)):
                request.step_id = None  # not JSON: run as a step nobody can follow
                return await self._run_unrecorded(request, plan, emit, step_id)
            request.step_id = step_id
        try:
            if request.tell_step:
                await safe_emit(emit, Recorded(step_id).to_json())
            result, worker, dispatch_id = await self._run_remote(request, plan, emit)
        except SwampError as exc:
            if isinstance(exc, DispatchFailed):
                self.observe("outcome", exc.code)
            error = {"code": exc.code, "message": exc.message}
            await self.steps.ended(step_id, {"error": error}, wait=False)
            raise
        except Exception as exc:  # (a defect: the step still ends, saying so)
            error = {"code": "internal", "message": f"the step failed here: {exc!r}"[:400]}
            await self.steps.ended(step_id, {"error": error}, wait=False)
            raise
        except trio.Cancelled:  # its caller left (or this orchestrator stops): it ended so
            cancelled = {"code": "cancelled", "message": "the step was cancelled"}
            with trio.CancelScope(shield=True):
                await self.steps.ended(step_id, {"error": cancelled}, wait=False)
            raise
        self.observe("outcome", result.status)
        log_id = dispatch_id if self.episodes.logs is not None else None
        reply = self.result_of(request, plan.model_type.type, result, worker, dispatch_id, log_id)
        await self.steps.ended(step_id, {"reply": reply.to_json()}, wait=False)
        return reply

    async def _run_remote(
        self, request: RunRequest, plan: Plan, emit: Emit, *, step_id: str | None = None
    ) -> tuple[DispatchResult, str, str]:
        model_type = plan.model_type
        timeout = effective_timeout(plan.queue_timeout, self.queue_timeout)
        deadline = trio.current_time() + timeout if timeout > 0 else None  # once, for the run
        work = Work(
            model_type=model_type,
            model_name=request.model.name,
            method=request.method,
            args=plan.args,
            environment=environment.ship(self.environ, request.shipped_names(self.ship_env)),
            read_scope=request.scope(),
            timeout=plan.timeout,
            owner=request.owner(model_type.type),
        )
        info = StepInfo(
            model_type.type,
            request.model.name,
            request.method,
            request.workflow,
            request.job,
            request.step,
            request.priority,
            request.submitter,
        )
        step_id = request.step_id or step_id or new_id()
        attempt, busy = request.attempts, 0
        straight = True  # (false once it came back from an orchestrator it was sent straight to)
        steps = self.steps if self.steps is not None and self.steps.runs(step_id) else None
        acquire_emit = emit
        if steps is not None:  # its record says so while it waits (see step_records)

            async def acquire_emit(event: dict) -> None:
                if event.get("kind") == "queued":
                    steps.waiting(step_id)
                await emit(event)

        while True:
            grant = await self.queue.acquire(
                request.placement, info, deadline=deadline, emit=acquire_emit, straight=straight
            )
            if steps is not None and grant.queue_id is not None:
                try:
                    await steps.left_queue(step_id)
                except BaseException:  # (cancelled: the slot it was given goes back)
                    if grant.member is not None:
                        self.queue.release(grant.member, grant.dispatch_id)
                    raise
            member, dispatch_id = grant.member, grant.dispatch_id
            attempt += 1
            if grant.claim is not None:  # another orchestrator's worker runs it
                assert self.peers is not None
                episode, dispatch_id = await self._run_there(
                    grant.claim, work, Step(step_id, attempt), emit, request.placement
                )
                worker_name = episode.end.worker
                if grant.claim.direct and episode.end.how is not Ending.SUCCEEDED:
                    self.peers.missed(Requirement.of(request.placement), grant.claim.orchestrator)
                    straight = False  # once: then it waits for a claim, however hints change
                    if episode.end.how in (Ending.BUSY, Ending.REFUSED):
                        # sent straight, and nothing ran there (nobody free, unreachable, or
                        # refused before anything ran — an orchestrator of an earlier
                        # version): it waits for a claim now
                        attempt -= 1
                        continue
            else:
                assert member is not None
                worker_name = member.name
                try:
                    self._set_busy(member)
                    episode = await self.episodes.run(
                        member, dispatch_id, work, Step(step_id, attempt), emit
                    )
                finally:
                    self.queue.release(member, dispatch_id)
                    if member.connected and not member.active:
                        self._set_status(member, WorkerStatus.IDLE.value)
                if (
                    not episode.lease_ended
                    and episode.end.how in LOSSES
                    and await self._until_ours_to_decide(episode, dispatch_id, worker_name)
                ):
                    # its lease says it had an effect (told to an orchestrator its worker
                    # carried it to): never run again
                    episode = replace(episode, end=replace(episode.end, has_writes=True))
            then = next_move(
                episode.end,
                model=request.model.name,
                method=f"{model_type.type}.{request.method}",
                retry=request.model.retry,
            )
            if then.move is Move.FINISH:
                assert episode.result is not None  # it finishes only when the method ran
                return episode.result, worker_name, dispatch_id
            if then.move is Move.FAIL:
                raise BY_CODE.get(then.code, DispatchFailed)(then.reason)
            if then.move is Move.FENCE_THEN_REQUEUE:
                if member is not None:
                    fence = self.fence(member)
                elif grant.claim is not None and self.peers is not None:  # (its workers' fence)
                    fence = self.peers.fence_of(grant.claim.orchestrator, self.peer_fence)
                else:
                    fence = self.peer_fence
                log.warning(
                    "worker %s lost before the step had an effect (%s): queueing it again "
                    "after %gs",
                    worker_name,
                    then.reason,
                    fence,
                )
                await safe_emit(
                    emit, Redispatched(worker=worker_name, reason=then.reason).to_json()
                )
                # Fencing: if the lost worker is alive behind a partition (or frozen), its own
                # deadline (or its reaper's) kills the first copy before this one can start.
                await trio.sleep(fence)
            else:
                # The worker counted a slot we think is free (one still letting go of a
                # cancelled dispatch): back off a little, so the same answer cannot spin.
                busy += 1
                log.info("worker %s had no free slot: queueing the step again", worker_name)
                await trio.sleep(min(BUSY_BACKOFF_CAP, BUSY_BACKOFF * 2 ** (busy - 1)))

    async def _run_there(
        self, claim: Claim, work: Work, step: Step, emit: Emit, placement: Placement
    ) -> tuple[Episode, str]:
        """Send the step to the orchestrator that claimed it for its worker, relaying what it
        says; its result comes back as the episode's (with its dispatch's id there)."""
        assert self.peers is not None
        params = encode_step(
            model_type=work.model_type.type,
            model_name=work.model_name,
            method=work.method,
            args=work.args,
            environment=work.environment,
            read_scope=work.read_scope,
            timeout=work.timeout,
            owner=work.owner,
            step_id=step.id,
            attempt=step.attempt,
        )
        if claim.direct:
            params["placement"] = placement.to_json()
        end, result, dispatch_id = await self.peers.run_there(claim, params, emit)
        if result is None:
            return Episode(end), dispatch_id
        try:
            return Episode(end, DispatchResult.decode(result)), dispatch_id
        except MalformedFrame as exc:
            return Episode(EpisodeEnd(Ending.MALFORMED, end.worker, exc.message)), dispatch_id

    async def run_claimed(self, member: Member, dispatch_id: str, params: dict, emit) -> dict:
        """Run another orchestrator's step on the slot of ``member`` we claimed for it (as
        ``dispatch_id``): the episode is ours (its lease, its credential, its log), its events
        go to ``emit``; the answer says how it ended."""
        try:
            sent = decode_step(params)
            model_type = self.registry.runnable(sent.model_type)
            model_type.method(sent.method)
        except BaseException:
            self.queue.release(member, dispatch_id)
            raise
        work = Work(
            model_type=model_type,
            model_name=sent.model_name,
            method=sent.method,
            args=sent.args,
            environment=sent.environment,
            read_scope=sent.read_scope,
            timeout=sent.timeout,
            owner=sent.owner,
            tell_effects=True,
        )
        try:
            self._set_busy(member)
            episode = await self.episodes.run(
                member,
                dispatch_id,
                work,
                Step(sent.step_id, sent.attempt),
                no_events if emit is None else emit,
            )
        finally:
            self.queue.release(member, dispatch_id)
            if member.connected and not member.active:
                self._set_status(member, WorkerStatus.IDLE.value)
        return encode_ending(episode.end, episode.result, dispatch_id)

    def _set_busy(self, member: Member) -> None:
        if member.status != WorkerStatus.BUSY.value:
            self._set_status(member, WorkerStatus.BUSY.value)

    def _set_status(self, member: Member, status: str) -> None:
        """Busy and idle are the pool's live view (``worker list --server``, ``/metrics``), not
        versions: a flip per dispatch would be two durable writes on the hot path for a fact
        that is stale a millisecond later. Real status changes (enrolled, unverified,
        draining, disconnected) are versions; they are written where they happen."""
        if member.status in (WorkerStatus.DRAINING.value, WorkerStatus.UNRESPONSIVE.value):
            return  # until it leaves or reconnects: its slots no longer make it busy or idle
        member.status = status
        member.last_seen_at = iso(self.clock())


async def run_here(
    db: Records,
    model_type: ModelType,
    request: RunRequest,
    args: dict,
    emit: Emit,
    *,
    env: dict[str, str],
) -> DispatchResult:
    """Run a method in this process (the orchestrator's, or the CLI's on a repo)."""
    ctx = LocalContext(
        db=db,
        emit=emit,
        model_type=model_type,
        model_name=request.model.name,
        method=request.method,
        dispatch_id=None,
        env={**env, **environment.step_identity(new_id(), 1)},
        probe_seams=default_seams,
    )
    await safe_emit(emit, Started(where="orchestrator").to_json())
    timeout = request.execution_timeout()
    with trio.move_on_after(math.inf if timeout is None else timeout) as timer:
        outcome = await run_method(model_type.method(request.method), args, ctx)
    if timer.cancelled_caught:
        raise ExecutionTimeout(
            f"{model_type.type}.{request.method} ran longer than its timeout ({timeout:g}s) "
            "and was stopped"
        )
    return outcome.to_message()
