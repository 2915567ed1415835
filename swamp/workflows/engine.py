"""Running a workflow: every job and step is a task that starts when its own dependencies end.

There are no levels: a node waits on the completion events of exactly the nodes it depends on,
then :func:`~swamp.domain.workflow_run.decide` says run or skip. Concurrency caps are capacity
limiters (the workflow's over its jobs, a job's over its steps, a step's over its ``forEach``
expansions). A model-method step becomes a :class:`~swamp.orchestrator.dispatch.RunRequest` with
its effective placement and ``queueTimeout`` and goes through the step runner — the dispatch
service, hence the elastic queue — and its events come back tagged with the job and step.

A ``forEach`` step is one task that waits for its dependencies once, then feeds its expansions
to tasks of their own a window at a time (:meth:`_Run.feed_window`: the slots of the connected
workers, at least :data:`FEED_FLOOR`, at most the step's or job's cap), so an item waiting its
turn costs its step record and nothing more. The run is stored step by step
(``swamp.bookkeeping.workflow_runs``): a transition marks what changed and one task writes the
changes every :data:`BATCH_WINDOW`, each changed step once; the run's start and end are
written at once. A cancelled run (Ctrl-C, ``workflow cancel``) cancels its running steps on
their workers and is saved ``cancelled``.
"""

from __future__ import annotations

import functools
import json
import logging
import math
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import trio

from swamp.bookkeeping.workflow_runs import RunBook, RunWriter
from swamp.concurrency import open_unwrapping_nursery
from swamp.domain.expressions import ExpressionError, has_template, render
from swamp.domain.names import check_instance_name, is_adhoc_instance
from swamp.domain.placement import Placement as StepPlacement
from swamp.domain.placement import unmet
from swamp.domain.read_scope import ALL_DATA
from swamp.domain.run_record import JobRecord, RunRecord, Status, StepRecord
from swamp.domain.workflow import Job, Step, Workflow
from swamp.domain.workflow import Placement as Fields
from swamp.domain.workflow_run import (
    MAX_EXPANSIONS,
    RUN_PLACES,
    combined,
    decide,
    expansion_items,
    expansion_name,
    input_value,
    job_status,
    no_items,
    run_status,
)
from swamp.errors import NeedsOrchestrator, QueueTimeout, SwampError, UserError
from swamp.protocol.messages import (
    Dispatched,
    LogLine,
    Message,
    Queued,
    Redispatched,
    RunEvent,
    RunResult,
    StepEvent,
    decode_event,
)
from swamp.store.datastore import iso
from swamp.store.records import Records
from swamp.store.retry import retry_busy
from swamp.workflows.loader import Workflows

log = logging.getLogger("swamp.workflows")
LOG_TAIL = 20  # the last lines of each step's output, kept in the run record
MAX_LOOKUPS = 256  # pieces of data one rendered field may read (each read, evaluated again)
EXPRESSION_BUDGET = 2.0  # seconds a data.query() or data.latest() may take (on the event loop)
BATCH_WINDOW = 0.2  # seconds a run's changes gather before they are written together
FLUSH_CHUNK = 500  # steps one write transaction takes at most (the loop runs between them)
FEED_FLOOR = 64  # expansions of a forEach started at once, when fewer slots are connected
Emit = Callable[[dict], Awaitable[None]]
StepRunner = Callable[..., Awaitable[RunResult]]  # (RunRequest, emit) → result


Rendered = Callable[[object], Awaitable[object]]  # a step's templates rendered (its binding's)


class _LookUp(Exception):
    """An expression asked for data not read yet (see :meth:`_Run.rendered`)."""

    def __init__(self, key: tuple) -> None:
        super().__init__(key)
        self.key = key


def _answer(found: dict, key: tuple):
    """What was read for ``key``, or ask for it."""
    if key not in found:
        raise _LookUp(key)
    return found[key]


@dataclass
class Host:
    """What a run needs from where it runs: a step runner and the live pool (if any)."""

    run_step: StepRunner
    workers_connected: Callable[[dict], list[dict]] = lambda selector: []
    placed: bool = True  # False on the repo: placed steps need a running orchestrator
    # told a run's id each time its changes were saved (the web pages: must not wait)
    saved: Callable[[str], None] = lambda run_id: None


@dataclass
class _Affinity:
    """One affinity group: the worker its first placed step ran on. While a step is choosing
    (``claimed``) the others wait for ``changed``; if it ends without a worker, the next one
    chooses."""

    changed: trio.Event = field(default_factory=trio.Event)
    worker: str | None = None
    claimed: bool = False

    def follow(self, worker: str) -> None:
        """The choosing step was dispatched to ``worker`` (again, after a lost worker: the
        group follows it to where it really runs)."""
        self.worker = worker
        self.changed.set()
        self.changed = trio.Event()

    def settle(self, worker: str | None) -> None:
        """The choosing step ended: where it last ran is the group's worker (none: the next
        step of the group chooses)."""
        self.worker = worker or self.worker
        self.claimed = False
        self.changed.set()
        self.changed = trio.Event()


@dataclass
class _Group:
    """A step of the job file and what it became: itself, or its ``forEach`` expansions
    (``names``, and the ``items`` they run for, by index). ``done`` is set when all have
    ended: what depends on the step waits for that one event."""

    step: Step
    names: list[str]
    items: list = field(default_factory=list)
    done: trio.Event = field(default_factory=trio.Event)


@dataclass
class _Steps:
    """What every step task of one job shares: the groups, the step records by name, and the
    caps (the job's limiter, the step's own)."""

    groups: dict[str, _Group]
    records: dict[str, StepRecord]
    limiters: tuple[trio.CapacityLimiter, trio.CapacityLimiter | None]


class RunCancelled(Exception):
    pass


class Engine:
    def __init__(
        self,
        workflows: Workflows,
        db: Records,
        host: Host,
        *,
        clock=time.time,
        max_fan_out: int = MAX_EXPANSIONS,
        owner: str = "",
    ) -> None:
        self.owner = owner  # this orchestrator's id on a shared database: its runs say so
        self.workflows = workflows
        self.db = db  # the runs' records and the data expressions read (swamp.store.records)
        self.runs = RunBook(db, clock=clock)
        self.host = host
        self.clock = clock
        self.max_fan_out = max_fan_out  # serve's --max-fan-out
        self.live: dict[str, trio.CancelScope] = {}  # run id → its scope (for workflow cancel)
        self.running: dict[str, _Run] = {}  # run id → the run (to cancel one of its steps)
        self.cancel_reasons: dict[str, str] = {}
        self.ended: dict[str, trio.Event] = {}  # run id → set once its end is saved

    def ending(self, run_id: str) -> trio.Event | None:
        """Set when the live run ``run_id`` has ended and saved its end (``None``: not live
        here): what ``workflow cancel`` waits on, not a re-read of the runs."""
        return self.ended.get(run_id)

    def cancel(self, run_id: str, reason: str) -> bool:
        scope = self.live.get(run_id)
        if scope is None:
            return False
        self.cancel_reasons[run_id] = reason
        scope.cancel()
        return True

    def cancel_step(self, run_id: str, step: str, reason: str) -> trio.Event | None:
        """Cancel the running step ``JOB.STEP`` of a live run: it ends failed with ``reason``
        (its dependants follow their conditions, as after any failure); the run goes on. The
        event is set once its end is saved; ``None``: no such step is running here."""
        run = self.running.get(run_id)
        return run.cancel_step(step, reason) if run is not None else None

    async def run(
        self,
        workflow: Workflow,
        inputs: dict,
        emit: Emit,
        *,
        chain: tuple[str, ...] = (),
        # the workflow's declared limit: its end is a run recorded as timed out, not a
        # cancellation of whoever started it
        timeout: float | None = None,  # noqa: ASYNC109
        priority: int | None = None,  # the run's --priority: as the workflow's own priority
        submitter: str = "",  # who asked: its steps wait in the queue as theirs
        on_start: Callable[[str], None] | None = None,  # told the run's id as it starts
    ) -> RunRecord:
        run = _Run(self, workflow, inputs, emit, chain, priority=priority, submitter=submitter)
        if on_start is not None:
            on_start(run.id)
        self.live[run.id] = scope = trio.CancelScope(
            deadline=trio.current_time() + timeout if timeout else math.inf
        )
        self.ended[run.id] = trio.Event()
        self.running[run.id] = run
        try:
            with scope:
                await run.execute()
            if scope.cancelled_caught:
                reason = self.cancel_reasons.pop(run.id, None) or (
                    f"timed out after {timeout:g}s" if timeout else "cancelled"
                )
                await run.cancelled(reason)
        except trio.Cancelled:  # whoever ran it went away (Ctrl-C), or its parent step's cancel
            why = self.cancel_reasons.pop(run.id, None)
            with trio.CancelScope(shield=True):
                await run.cancelled(why or "cancelled: the client went away")
            raise
        finally:
            self.live.pop(run.id, None)
            self.running.pop(run.id, None)
            self.cancel_reasons.pop(run.id, None)
            self.ended.pop(run.id).set()
        return run.record


class _Run:
    def __init__(
        self,
        engine: Engine,
        workflow: Workflow,
        inputs: dict,
        emit: Emit,
        chain: tuple[str, ...],
        *,
        priority: int | None = None,
        submitter: str = "",
    ) -> None:
        self.engine = engine
        self.workflow = workflow
        self.emit_raw = emit
        self.chain = (*chain, workflow.name)
        self.id = uuid.uuid4().hex
        self.inputs = inputs
        self.record = RunRecord(
            run_id=self.id,
            workflow=workflow.name,
            started_at=iso(engine.clock()),
            inputs=inputs,
            jobs=[
                JobRecord(job.name, steps=[StepRecord(s.name) for s in job.steps])
                for job in workflow.jobs
            ],
        )
        self.jobs = {j.name: j for j in self.record.jobs}
        self.writer = RunWriter(engine.db, self.record, owner=engine.owner)
        for job_record in self.record.jobs:
            for entry in job_record.steps:
                self.writer.add(job_record.name, entry)
        self.unwritten = trio.Event()  # set when something changed since the last write
        self.job_done = {job.name: trio.Event() for job in workflow.jobs}
        self.job_limiter = trio.CapacityLimiter(workflow.concurrency or math.inf)
        self.affinity: dict[str, _Affinity] = {}
        # the instance of this run's latest ad-hoc step of each type: data.latest(type, …)
        self.adhoc: dict[str, str] = {}
        self.priority = priority  # the run's own (--priority, a parent step's), or None
        self.submitter = submitter  # who asked: the queue shares slots between submitters
        # a forEach step whose workers never came: an expansion waited its whole queue
        # timeout with no matching worker connected; its unfed expansions fail with this
        self.no_workers: dict[tuple[str, str], str] = {}  # (job, step) → why
        # each running step's scope (by job and step name) and, once cancelled, why (workflow
        # cancel --step); the run a running nested-workflow step started
        self.step_scopes: dict[tuple[str, str], trio.CancelScope] = {}
        self.step_cancels: dict[tuple[str, str], tuple[str, trio.Event]] = {}
        self.children: dict[tuple[str, str], str] = {}

    def cancel_step(self, ref: str, reason: str) -> trio.Event | None:
        """Cancel the running step ``ref`` (``JOB.STEP``; names may hold dots: each split is
        tried, and a ref that names two running steps is refused as ambiguous)."""
        places = [
            (ref[:i], ref[i + 1 :])
            for i, char in enumerate(ref)
            if char == "." and (ref[:i], ref[i + 1 :]) in self.step_scopes
        ]
        if not places:
            return None
        if len(places) > 1:
            named = ", ".join(f"step {step!r} of job {job!r}" for job, step in places)
            raise UserError(f"{ref!r} names more than one running step ({named})")
        place = places[0]
        cancelled = self.step_cancels.setdefault(place, (reason, trio.Event()))
        child = self.children.get(place)
        if child is not None:  # a nested run: it records the same reason as it unwinds
            self.engine.cancel_reasons.setdefault(child, reason)
        self.step_scopes[place].cancel()
        return cancelled[1]

    # -- bookkeeping -------------------------------------------------------------------------

    def changed(self, step: StepRecord | None = None) -> None:
        """``step`` (else the run or a job) changed: written with the next batch."""
        if step is None:
            self.writer.header_changed()
        else:
            self.writer.changed(step)
        self.unwritten.set()

    async def save(self) -> None:
        """Write every change now (the run's start and end, a cancellation)."""
        while self.writer.pending:
            try:
                await retry_busy(lambda: self.writer.flush(limit=FLUSH_CHUNK))
            except SwampError as exc:  # the run goes on; its records catch up at the next write
                log.warning("could not save workflow run %s: %s", self.id, exc)
                return
            if self.writer.pending:
                await trio.lowlevel.checkpoint()  # the loop runs between long batches
        self.engine.host.saved(self.id)

    async def keep_saving(self) -> None:
        """The run's writer: a change wakes it, it lets more gather for one batch window,
        then writes them all (each changed step once)."""
        while True:
            await self.unwritten.wait()
            await trio.sleep(BATCH_WINDOW)
            self.unwritten = trio.Event()
            await self.save()

    async def emit(self, message: Message) -> None:
        try:
            await self.emit_raw(message.to_json())
        except SwampError:
            pass  # a client that went away does not stop the run

    def now(self) -> str:
        return iso(self.engine.clock())

    # -- the run -----------------------------------------------------------------------------

    async def execute(self) -> None:
        await self.save()
        await self.emit(
            RunEvent(
                "started",
                self.id,
                self.workflow.name,
                jobs=[
                    {"name": j.name, "steps": [s.name for s in j.steps]} for j in self.workflow.jobs
                ],
            )
        )
        async with open_unwrapping_nursery() as saving:
            saving.start_soon(self.keep_saving)
            async with open_unwrapping_nursery() as nursery:
                for job in self.workflow.jobs:
                    nursery.start_soon(self.job, job)
            saving.cancel_scope.cancel()
        status = run_status(j.status for j in self.record.jobs)
        self.record.status, self.record.ended_at = status, self.now()
        failed = self.first_failure()
        if failed:
            self.record.error = failed
        self.changed()
        await self.save()
        await self.emit(
            RunEvent("finished", self.id, self.workflow.name, status=status.value, detail=failed)
        )

    def first_failure(self) -> str | None:
        for job in self.record.jobs:
            for step in job.steps:
                if step.status == Status.FAILED and not step.allowed_failure:
                    return f"{job.name}.{step.name}: {step.error or 'failed'}"
            if job.status == Status.FAILED and job.error:
                return f"{job.name}: {job.error}"
        return None

    async def cancelled(self, reason: str) -> None:
        now = self.now()
        for job in self.record.jobs:
            for step in job.steps:
                if step.status == Status.RUNNING:
                    step.status, step.ended_at = Status.CANCELLED, now
                    self.changed(step)
                elif step.status == Status.PENDING:
                    step.status, step.reason = Status.SKIPPED, reason
                    self.changed(step)
            if job.status in (Status.RUNNING, Status.PENDING):
                job.status, job.ended_at = Status.CANCELLED, now
        self.record.status, self.record.ended_at = Status.CANCELLED, now
        self.record.error = reason
        self.changed()
        await self.save()
        await self.emit(
            RunEvent("finished", self.id, self.workflow.name, status="cancelled", detail=reason)
        )

    # -- jobs --------------------------------------------------------------------------------

    async def job(self, job: Job) -> None:
        state = self.jobs[job.name]
        try:
            for dep in job.depends_on:
                await self.job_done[dep.name].wait()
            verdict = decide(job.depends_on, {n: j.status for n, j in self.jobs.items()})
            if verdict != "run":
                state.status, state.reason = Status.SKIPPED, verdict
                for entry in state.steps:
                    entry.status, entry.reason = Status.SKIPPED, f"job skipped: {verdict}"
                    self.changed(entry)
                self.changed()
                for entry in state.steps:
                    await self.emit(
                        StepEvent("skipped", job.name, entry.name, self.id, detail=entry.reason)
                    )
                await self.emit(
                    RunEvent(
                        "job_finished",
                        self.id,
                        self.workflow.name,
                        job=job.name,
                        status="skipped",
                        detail=verdict,
                    )
                )
                return
            async with self.job_limiter:
                await self.run_job(job, state)
        finally:
            self.job_done[job.name].set()

    async def run_job(self, job: Job, state: JobRecord) -> None:
        state.status, state.started_at = Status.RUNNING, self.now()
        self.changed()
        await self.emit(RunEvent("job_started", self.id, self.workflow.name, job=job.name))
        placement = job.placement.under(self.workflow.placement)
        try:
            groups = await self.expand(job)
        except UserError as exc:
            state.status, state.error, state.ended_at = Status.FAILED, exc.message, self.now()
            for entry in state.steps:
                entry.status, entry.reason = Status.SKIPPED, "the job could not start"
                self.changed(entry)
            self.changed()
            await self.emit(
                RunEvent(
                    "job_finished",
                    self.id,
                    self.workflow.name,
                    job=job.name,
                    status="failed",
                    detail=exc.message,
                )
            )
            return
        # the job's steps are now what its steps became: each stored in this order
        for entry in state.steps:
            self.writer.drop(entry)
        state.steps = []
        # a fan-out over zero items ran nothing: it says so, as a skipped step of its own,
        # and what depends on it sees it skipped (the combined status of no expansions)
        nothing: list[str] = []
        for group in groups.values():
            step = group.step
            if step.for_each is not None and not group.names:
                reason = no_items(step.for_each.items)
                entry = StepRecord(step.name, Status.SKIPPED, template=step.name, reason=reason)
                group.names = [step.name]
                group.done.set()
                state.steps.append(entry)
                self.writer.add(job.name, entry)
                nothing.append(step.name)
                log.info("workflow run %s: %s.%s: %s", self.id, job.name, step.name, reason)
                continue
            template = step.name if step.for_each else None
            for name in group.names:
                entry = StepRecord(name, template=template)
                state.steps.append(entry)
                self.writer.add(job.name, entry)
        self.changed()
        records = {r.name: r for r in state.steps}
        for name in nothing:
            await self.emit(
                StepEvent("skipped", job.name, name, self.id, detail=records[name].reason)
            )
        limit = job.concurrency or self.workflow.concurrency
        job_steps = trio.CapacityLimiter(limit or math.inf)
        per_template = {
            s.name: trio.CapacityLimiter(s.concurrency) for s in job.steps if s.concurrency
        }
        affinity = self.affinity_group(job)
        async with open_unwrapping_nursery() as nursery:
            for group in groups.values():
                if group.done.is_set():
                    continue
                nursery.start_soon(
                    self.template,
                    job,
                    group,
                    _Steps(groups, records, (job_steps, per_template.get(group.step.name))),
                    placement,
                    affinity,
                )
        status = job_status((r.status, bool(r.allowed_failure)) for r in state.steps)
        state.status, state.ended_at = status, self.now()
        self.changed()
        await self.emit(
            RunEvent("job_finished", self.id, self.workflow.name, job=job.name, status=status.value)
        )

    def affinity_group(self, job: Job) -> _Affinity | None:
        if self.workflow.placement.affinity:
            return self.affinity.setdefault("", _Affinity())
        if job.placement.affinity:
            return self.affinity.setdefault(job.name, _Affinity())
        return None

    def context(self, binding: dict | None = None, looked_up: dict | None = None) -> dict:
        """What an expression sees. Its data functions answer from ``looked_up`` (what was read
        for this evaluation); what is not there yet is asked for (:class:`_LookUp`) and read
        by :meth:`rendered`, which evaluates again."""
        found = {} if looked_up is None else looked_up

        def latest(model: str, name: str) -> dict | None:
            if not isinstance(model, str) or not isinstance(name, str):
                raise ExpressionError("data.latest(model, name) takes two strings")
            return _answer(found, ("latest", model, name))

        def query(predicate: str) -> list[dict]:
            if not isinstance(predicate, str):
                raise ExpressionError("data.query(predicate) takes a string")
            return _answer(found, ("query", predicate))

        return {
            "inputs": self.inputs,
            "self": binding or {},
            "run": {
                "id": self.id,
                "workflow": self.workflow.name,
                "startedAt": self.record.started_at,
            },
            "data": {"latest": latest, "query": query},
            "workers": {"connected": self.workers_connected},
        }

    async def rendered(self, value: object, binding: dict | None = None) -> object:
        """``value`` rendered (:func:`render`): the expression is evaluated, and each piece of
        data it asks for is read (awaited: the store may be a server) before it is evaluated
        again with it — the evaluation stays a plain function, the reads are the shell's."""
        looked_up: dict = {}
        for _ in range(MAX_LOOKUPS + 1):
            try:
                return render(value, self.context(binding, looked_up))
            except _LookUp as wanted:
                looked_up[wanted.key] = await self.look_up(wanted.key)
        raise ExpressionError(
            f"the expressions of one field read at most {MAX_LOOKUPS} pieces of data (data.latest, "
            "data.query): split the reads between steps"
        )

    async def expand(self, job: Job) -> dict[str, _Group]:
        """Every step of the job, with its ``forEach`` expanded now (the job has started): the
        names of its expansions and the items they run for (kept as the list gave them, not a
        binding each)."""
        out: dict[str, _Group] = {}
        for step in job.steps:
            if step.for_each is None:
                out[step.name] = _Group(step, [step.name])
                continue
            try:
                items = await self.rendered(step.for_each.items)
            except SwampError as exc:  # (a data read refused, too: the job fails saying so)
                raise UserError(f"step {step.name!r}: forEach.in: {exc.message}") from None
            items = expansion_items(items, step=step.name, cap=self.engine.max_fan_out)
            seen: set[str] = set()
            names: list[str] = []
            templated = has_template(step.name)
            for index, item in enumerate(items):
                if templated:
                    try:
                        binding = {step.for_each.item: item}
                        name = str(await self.rendered(step.name, binding))
                    except ExpressionError:
                        name = f"{step.name}-{index}"
                else:
                    name = expansion_name(step.name, item, index)
                if name in seen:
                    name = f"{name}-{index}"
                seen.add(name)
                names.append(name)
            out[step.name] = _Group(step, names, items)
        places = len(self.writer.steps) + sum(len(g.names) for g in out.values())
        if places > RUN_PLACES:
            raise UserError(
                f"job {job.name!r} would number the run's steps to {places:,}; a run numbers "
                f"at most {RUN_PLACES:,} (split the work between runs)"
            )
        return out

    # -- steps -------------------------------------------------------------------------------

    async def template(
        self,
        job: Job,
        group: _Group,
        steps: _Steps,
        placement: Fields,
        affinity: _Affinity | None,
    ) -> None:
        """One step of the job file: wait for what it depends on (once, for all of its
        expansions), then run it — or feed its expansions to tasks, a window at a time."""
        step, records = group.step, steps.records
        try:
            for dep in step.depends_on:
                await steps.groups[dep.name].done.wait()
            statuses = {
                dep.name: combined(records[m].status for m in steps.groups[dep.name].names)
                for dep in step.depends_on
            }
            verdict = decide(step.depends_on, statuses)
            if verdict != "run":
                for name in group.names:
                    await self.finish(job, name, records[name], Status.SKIPPED, reason=verdict)
                return
            if step.for_each is None:
                await self.step(job, step, step.name, None, steps, placement, affinity)
                return
            window = trio.Semaphore(self.feed_window(job, step))
            async with open_unwrapping_nursery() as nursery:
                for index, name in enumerate(group.names):
                    await window.acquire()
                    why = self.no_workers.get((job.name, step.name))
                    if why is not None:  # its workers never came: the rest is not fed
                        window.release()
                        for rest in group.names[index:]:
                            records[rest].allowed_failure = step.allow_failure or None
                            await self.finish(job, rest, records[rest], Status.FAILED, error=why)
                        break
                    binding = {step.for_each.item: group.items[index]}
                    nursery.start_soon(
                        self.fed, window, job, step, name, binding, steps, placement, affinity
                    )
        finally:
            group.done.set()

    def feed_window(self, job: Job, step: Step) -> int:
        """How many expansions of ``step`` run (or wait in the queue) at once: as many as the
        connected workers have slots, at least :data:`FEED_FLOOR`, at most the step's or
        job's cap. The rest wait here, as their step record and item."""
        slots = 0
        for worker in self.engine.host.workers_connected({}):
            capacity = worker.get("capacity")
            slots += capacity if isinstance(capacity, int) else 1
        caps = [c for c in (step.concurrency, job.concurrency or self.workflow.concurrency) if c]
        return min([max(FEED_FLOOR, slots), *caps])

    async def fed(
        self,
        window: trio.Semaphore,
        job: Job,
        step: Step,
        name: str,
        binding: dict,
        steps: _Steps,
        placement: Fields,
        affinity: _Affinity | None,
    ) -> None:
        try:
            await self.step(job, step, name, binding, steps, placement, affinity)
        finally:
            window.release()

    async def step(
        self,
        job: Job,
        step: Step,
        name: str,
        binding: dict | None,
        steps: _Steps,
        placement: Fields,
        affinity: _Affinity | None,
    ) -> None:
        """One step (or expansion) whose dependencies let it run, under its caps."""
        record = steps.records[name]
        job_limiter, template_limiter = steps.limiters
        async with job_limiter:
            if template_limiter is None:
                await self.run_step(job, step, name, binding, record, placement, affinity)
            else:
                async with template_limiter:
                    await self.run_step(job, step, name, binding, record, placement, affinity)

    async def finish(
        self,
        job: Job,
        name: str,
        record: StepRecord,
        status: Status,
        *,
        reason: str | None = None,
        error: str | None = None,
    ) -> None:
        record.status = status
        if record.started_at:
            record.ended_at = self.now()
        if reason:
            record.reason = reason
        if error:
            record.error = error
        self.changed(record)
        detail = reason or error
        await self.emit(
            StepEvent(status.value, job.name, name, self.id, worker=record.worker, detail=detail)
        )

    async def run_step(
        self,
        job: Job,
        step: Step,
        name: str,
        binding: dict | None,
        record: StepRecord,
        job_placement: Fields,
        group: _Affinity | None,
    ) -> None:
        context = functools.partial(self.rendered, binding=binding)
        if step.guard is not None:
            try:
                skip = await context(step.guard)
            except SwampError as exc:  # (a data read refused, too: the step fails saying so)
                await self.finish(job, name, record, Status.FAILED, error=f"guard: {exc.message}")
                record.allowed_failure = step.allow_failure or None
                return
            if skip is True:
                await self.finish(job, name, record, Status.SKIPPED, reason=f"guard {step.guard}")
                return
        record.status, record.started_at = Status.RUNNING, self.now()
        self.changed(record)
        await self.emit(StepEvent("started", job.name, name, self.id))
        place = (job.name, name)
        status, error = Status.FAILED, None
        self.step_scopes[place] = scope = trio.CancelScope()
        try:
            with scope:
                try:
                    if step.task.kind == "workflow":
                        status, error = await self.run_child(job, step, name, context, record)
                    else:
                        fields = step.placement.under(job_placement)
                        status, error = await self.run_method(
                            job, step, name, context, record, fields, group
                        )
                except SwampError as exc:  # the step fails with the reason; its siblings run on
                    status, error = Status.FAILED, exc.message
        finally:
            del self.step_scopes[place]
        cancelled = self.step_cancels.pop(place, None)
        if scope.cancelled_caught and cancelled is not None:  # on its own, not with the run
            status, error = Status.FAILED, cancelled[0]
        if status == Status.FAILED and step.allow_failure:
            record.allowed_failure = True
        await self.finish(job, name, record, status, error=error)
        if cancelled is not None:  # who cancelled it reads it ended
            await self.save()
            cancelled[1].set()

    async def run_method(
        self,
        job: Job,
        step: Step,
        name: str,
        context: Rendered,
        record: StepRecord,
        fields: Fields,
        group: _Affinity | None,
    ) -> tuple[Status, str | None]:
        from swamp.orchestrator.dispatch import RunRequest

        task = step.task
        model_ref = str(await context(task.model))
        model_name = str(await context(task.model_name)) if task.model_name else None
        if model_name is not None:  # what a template gave is checked as a name, as it is used
            check_instance_name(model_name, what=f"modelName of step {name!r}")
        method = str(await context(task.method))
        args = await context(task.inputs)
        if not isinstance(args, dict):
            raise UserError(f"inputs gave {type(args).__name__}, not a table of arguments")
        target = await context(fields.target) if fields.target else None
        labels = await context(fields.labels) if fields.labels else {}
        platform = await context(fields.platform) if fields.platform else None
        if not isinstance(labels, dict):
            raise UserError("labels must give a table of k = v")
        placement = StepPlacement(
            target=str(target) if target else None,
            labels={str(k): str(v) for k, v in labels.items()},
            platform=str(platform) if platform else None,
        )
        if placement.is_remote() and not self.engine.host.placed:
            raise NeedsOrchestrator(
                f"step {name!r} is placed ({placement.describe()}): run the workflow through a "
                "running orchestrator (swamp serve; --server URL or SWAMP_SERVE_URL)"
            )
        pin = group if placement.is_remote() else None
        chooser = None  # the group this step chooses the worker of
        if pin is not None:
            placement, chooses = await self.pinned(pin, placement, name)
            chooser = pin if chooses else None
        instance = self.engine.workflows.instance(model_ref, model_name)
        if is_adhoc_instance(instance.name):
            self.adhoc[instance.type] = instance.name
        request = RunRequest(
            instance,
            method,
            {k: v for k, v in args.items()},
            placement,
            read_scope=self.engine.workflows.repo.read_scope(instance),
            queue_timeout=fields.queue_timeout,  # each item's own, from when it was fed
            timeout=fields.timeout,
            workflow=self.workflow.name,
            run_id=self.id,
            job=job.name,
            step=name,
            priority=self.priority_of(job, step) or 0,
            submitter=self.submitter,
        )
        record.model, record.model_type, record.method = instance.name, instance.type, method
        if placement.is_remote():
            record.requirement = placement.describe()

        async def relay(payload: dict) -> None:
            await self.relay(job, name, record, payload, chooser)

        try:
            result = await self.engine.host.run_step(request, relay)
        except QueueTimeout as exc:
            if step.for_each is not None and not self.any_worker_for(placement):
                self.no_workers.setdefault(
                    (job.name, step.name),
                    f"not started: {name} waited its queue timeout and no worker matching "
                    f"{placement.describe()} is connected ({exc.message})",
                )
            raise
        finally:
            if chooser is not None:
                chooser.settle(record.worker)
        record.worker = result.worker or record.worker or "orchestrator"
        if result.dispatch_id:
            record.dispatch_id = result.dispatch_id
        return Status(result.status), result.error

    def priority_of(self, job: Job, step: Step) -> int | None:
        """The nearest priority: the step's, its job's, then the run's (``--priority``, or
        the parent step's for a nested run), then the workflow's; ``None`` if none says."""
        for own in (step.placement.priority, job.placement.priority, self.priority):
            if own is not None:
                return own
        return self.workflow.placement.priority

    def any_worker_for(self, placement: StepPlacement) -> bool:
        """Whether a connected, schedulable worker has the placement's labels (and name, if it
        targets one): a step that timed out in the queue while one is there waited its turn on
        a busy fleet; without one, its workers never came."""
        found = self.engine.host.workers_connected(dict(placement.labels))
        return any(placement.target in (None, w.get("name")) for w in found)

    async def pinned(
        self, group: _Affinity, placement: StepPlacement, name: str
    ) -> tuple[StepPlacement, bool]:
        """The first placed step of an affinity group chooses (``True``); the others follow
        it to the worker it runs on, and fail if that worker has left, or lacks what the step
        itself asks for (labels, platform) — rather than run there anyway."""
        while group.worker is None:
            if not group.claimed:
                group.claimed = True
                return placement, True
            await group.changed.wait()
        worker = group.worker
        connected = {w["name"]: w for w in self.engine.host.workers_connected({})}
        if worker not in connected:
            raise UserError(
                f"worker {worker!r}, which this step's affinity group ran on, is no longer "
                "connected: failing the step to keep the group on one worker"
            )
        found = connected[worker]
        missing = unmet(
            placement,
            labels=found.get("labels") or {},
            platform=str(found.get("platform", "")),
            arch=str(found.get("arch", "")),
        )
        if missing:
            raise UserError(
                f"step {name!r} asks for {', '.join(missing)}, which worker {worker!r} (where "
                "its affinity group runs) does not have: move the step out of the group, or "
                "give the group's first step the same placement"
            )
        return StepPlacement(target=worker), False

    async def relay(
        self, job: Job, name: str, record: StepRecord, payload: dict, pin: _Affinity | None
    ) -> None:
        try:
            event = decode_event(payload)
        except SwampError:
            return
        match event:
            case Queued(requirement=requirement):
                record.queued_at = self.now()
                await self.emit(StepEvent("queued", job.name, name, self.id, detail=requirement))
            case Dispatched(worker=worker, dispatch_id=dispatch_id):
                record.worker, record.dispatch_id = worker, dispatch_id
                if record.queued_at is not None:
                    record.queued_ms = _ms_between(record.queued_at, self.now())
                if pin is not None:  # the choosing step's: the group goes where it runs
                    pin.follow(worker)
                self.changed(record)
                await self.emit(StepEvent("dispatched", job.name, name, self.id, worker=worker))
            case Redispatched(worker=worker, reason=reason):
                await self.emit(
                    StepEvent("redispatch", job.name, name, self.id, worker=worker, detail=reason)
                )
            case LogLine(line=line, stream=stream, worker=worker):
                if record.log_tail is None:
                    record.log_tail = []
                tail = record.log_tail
                tail.append(line[:500])
                del tail[:-LOG_TAIL]
                await self.emit(
                    StepEvent(
                        "log", job.name, name, self.id, worker=worker, line=line, stream=stream
                    )
                )
            case StepEvent() | RunEvent():
                await self.emit(event)  # a nested workflow's own events

    async def run_child(
        self, job: Job, step: Step, name: str, context: Rendered, record: StepRecord
    ) -> tuple[Status, str | None]:
        child_name = str(await context(step.task.workflow))
        if child_name in self.chain:
            cycle = " -> ".join((*self.chain, child_name))
            return Status.FAILED, f"workflow cycle: {cycle}"
        if len(self.chain) >= 10:
            return Status.FAILED, "workflows nest at most 10 deep"
        child = self.engine.workflows.checked(child_name)
        inputs = await context(step.task.inputs)
        if not isinstance(inputs, dict):
            return Status.FAILED, "inputs for a nested workflow must give a table"
        inputs = check_inputs(child, inputs)
        place = (job.name, name)

        def started(child_id: str) -> None:
            record.child_run_id = child_id  # known while it runs (and if it is cancelled)
            self.children[place] = child_id

        try:
            result = await self.engine.run(
                child,
                inputs,
                self.emit_raw,
                chain=self.chain,
                priority=self.priority_of(job, step),
                submitter=self.submitter,
                on_start=started,
            )
        finally:
            self.children.pop(place, None)
        record.child_run_id = result.run_id
        return Status(result.status), result.error

    # -- expression host functions -----------------------------------------------------------

    async def look_up(self, key: tuple) -> object:
        """One piece of data an expression asked for: ``("latest", model, name)`` — the newest
        version of data ``name`` of ``model``: an instance in models/, a type (the instance of
        this run's latest ad-hoc step of that type: each ad-hoc step is an instance of its own,
        and another run's is not this run's business), or the name a step gave with modelName;
        ``None`` if none — or ``("query", predicate)``. Never infrastructure records."""
        from swamp.domain.query import parse
        from swamp.store.datastore import Key

        db = self.engine.db
        if key[0] == "query":
            try:
                predicate = parse(key[1])
            except SwampError as exc:
                raise ExpressionError(f"in data.query({key[1]!r}): {exc.message}") from None
            found = await db.query(predicate, limit=1000, scope=ALL_DATA, budget=EXPRESSION_BUDGET)
            return [r.to_json() for r in found]
        _, model, name = key
        if "/" in model:
            own = self.adhoc.get(model)
            record = await db.latest(Key(model, own, name)) if own else None
            return record.to_json() if record is not None else None
        instances = self.engine.workflows.repo.model_instances()
        if model in instances:
            record = await db.latest(Key(instances[model].type, model, name))
            return record.to_json() if record is not None else None
        found = await db.query(
            parse(f"modelName == {json.dumps(model)} && name == {json.dumps(name)}"),
            scope=ALL_DATA,
            budget=EXPRESSION_BUDGET,
        )
        found.sort(key=lambda r: r.created_at)
        return found[-1].to_json() if found else None

    def workers_connected(self, selector: dict | None = None) -> list[dict]:
        if selector is not None and not isinstance(selector, dict):
            raise ExpressionError(
                "workers.connected() takes a table of labels, e.g. {'fleet': 'x'}"
            )
        return self.engine.host.workers_connected(selector or {})


def check_inputs(workflow: Workflow, raw: dict) -> dict:
    """The run's inputs: defaults from the schema applied, then checked against it (exit 2)."""
    if workflow.inputs is None:
        if raw:
            raise UserError(f"workflow {workflow.name!r} declares no inputs; got {sorted(raw)}")
        return {}
    import fastjsonschema

    properties = workflow.inputs.get("properties") or {}
    values = {}
    for key, value in raw.items():
        kind = (properties.get(key) or {}).get("type")
        values[key] = input_value(value, kind, key)
    try:
        return fastjsonschema.compile(workflow.inputs, use_default=True)(values)
    except fastjsonschema.JsonSchemaValueException as exc:  # (a bad schema: refused at load)
        raise UserError(f"workflow {workflow.name!r} inputs: {exc.message}") from None


def _ms_between(a: str, b: str) -> int:
    from swamp.store.datastore import parse_iso

    start, end = parse_iso(a), parse_iso(b)
    return max(0, round((end - start) * 1000)) if start is not None and end is not None else 0
