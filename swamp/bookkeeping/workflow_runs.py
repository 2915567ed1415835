"""Workflow runs, stored step by step: a small header per run, a record per step.

The header (``swamp/workflow-run``, model name the workflow's, item ``run-<id>``) holds the run —
inputs, status, times, error — and its jobs with how many steps each has in each status; every
step is an item of its own (``swamp/workflow-step``, the same model name, item
``<run id>/<place>``) with its status, worker, queue wait, error and times, replaced in place.
A :class:`RunWriter` collects what changed and writes it as one transaction per batch (the
engine's batch window), each changed step once with its latest state, so a transition costs
the same at the 10,000th step as at the first and nothing grows with the run. What a crash
loses is the last batch window at most; the next start's :meth:`RunBook.reconcile` marks the run
and its running steps failed.

Runs written whole by earlier versions (the tree in the header) are read, listed, reconciled and
collected as before. ``swamp data query`` reads headers and steps like any data.
"""

from __future__ import annotations

import time
from collections import Counter

import trio

from swamp.bookkeeping.records import Orphaned, decoded, everything, has_fields
from swamp.domain.run_record import (
    STEPS_APART,
    RunRecord,
    Status,
    StepRecord,
    assemble,
    header_json,
    page,
    step_counts,
    step_json,
)
from swamp.errors import Conflict, NotFound, UserError
from swamp.models.builtin import WORKFLOW_RUN, WORKFLOW_STEP
from swamp.store.datastore import Key, Record, iso
from swamp.store.records import Operations, Records

TYPE = WORKFLOW_RUN.type
POLICY = WORKFLOW_RUN.resources[0].policy
STEP_TYPE = WORKFLOW_STEP.type
STEP_POLICY = WORKFLOW_STEP.resources[0].policy
INTERRUPTED = "interrupted: orchestrator restart"
STEP_SEPARATOR = "/"  # a step's item is <run id>/<place>
PAGE_ROWS = 2000  # steps read for one page of a run at most
_RUN_FIELDS = has_fields("runId", "workflow", "status", "startedAt")


def key(workflow: str, run_id: str) -> Key:
    return Key(TYPE, workflow, f"run-{run_id}")


def step_prefix(run_id: str) -> str:
    return f"{run_id}{STEP_SEPARATOR}"


def step_key(workflow: str, run_id: str, seq: int) -> Key:
    # seven digits: places below RUN_PLACES (domain/workflow_run.py) sort as text in order
    return Key(STEP_TYPE, workflow, f"{step_prefix(run_id)}{seq:07d}")


def _unended(header: dict) -> bool:
    """An ended header that still counts steps running or pending (read from the header)."""
    counts = step_counts(header)
    return bool(counts.get(Status.RUNNING.value) or counts.get(Status.PENDING.value))


class RunWriter:
    """One run's records as its engine changes them. :meth:`add` gives a step its place,
    :meth:`changed` and :meth:`header_changed` say what to write, :meth:`flush` writes it —
    every changed step once, with its state now, and the header with its counts — in one
    transaction. Only the run's own engine writes its records (one orchestrator per repo).

    What a flush writes is taken when it begins; on a store that waits (PostgreSQL) the engine
    goes on meanwhile, and a change made then is written by the next flush (each change is
    numbered: a place is clean only if nothing changed it since its state was taken). One
    flush at a time."""

    def __init__(self, db: Records, run: RunRecord, *, owner: str = "") -> None:
        self.db = db
        self.run = run
        self.owner = owner  # the orchestrator running it, on a shared database ("" alone)
        self.steps: list[StepRecord] = []  # by place
        self.jobs: list[str] = []  # the job of each place
        self.versions: list[int] = []  # the stored version of each place (0: not yet)
        self.stored: list[str | None] = []  # the status stored at each place (counted)
        self.dirty: dict[int, int] = {}  # places to write, oldest change first: its change
        self.changes = 0  # changes numbered (the header's too)
        self.header_change = 0  # the header's latest
        self.dropped: list[int] = []  # places to delete
        self.gone: set[int] = set()  # places dropped (written meanwhile: deleted next)
        self._flushing: trio.Event | None = None  # set when the flush in flight ends
        self.counts: dict[str, Counter[str]] = {}  # job → status → stored steps
        self.header_version = 0
        self.header_dirty = True
        self.writes = 0  # transactions so far

    def __repr__(self) -> str:
        return (
            f"<RunWriter {self.run.run_id[:12]} steps={len(self.steps)} "
            f"dirty={len(self.dirty)} writes={self.writes}>"
        )

    @property
    def pending(self) -> bool:
        return self.header_dirty or bool(self.dirty) or bool(self.dropped)

    def _change(self) -> int:
        self.changes += 1
        return self.changes

    def add(self, job: str, step: StepRecord) -> None:
        step.seq = len(self.steps)
        self.steps.append(step)
        self.jobs.append(job)
        self.versions.append(0)
        self.stored.append(None)
        self.dirty[step.seq] = self._change()

    def changed(self, step: StepRecord) -> None:
        self.dirty[step.seq] = self._change()

    def header_changed(self) -> None:
        self.header_dirty = True
        self.header_change = self._change()

    def drop(self, step: StepRecord) -> None:
        """The step is no longer part of the run (a ``forEach`` step replaced by its
        expansions): its record goes."""
        self.dirty.pop(step.seq, None)
        self.gone.add(step.seq)
        if self.versions[step.seq]:
            self.dropped.append(step.seq)

    async def flush(self, *, limit: int | None = None) -> int:
        """Write what changed (at most ``limit`` steps, oldest change first) and the header, in
        one transaction; the places written. Nothing is marked written unless it committed.

        An ended run's header goes only in the transaction that writes its last changed steps
        (steps first, header last): until then the stored header still says ``running``, so a
        crash between the chunks of the final save leaves a run the next start reconciles,
        not steps ``running`` under an ended header."""
        while self._flushing is not None:  # (never, where the store does not wait)
            await self._flushing.wait()
        self._flushing = trio.Event()
        try:
            return await self._flush(limit)
        finally:
            self._flushing.set()
            self._flushing = None

    async def _flush(self, limit: int | None) -> int:
        places = list(self.dirty)[:limit] if limit else list(self.dirty)
        taken = {seq: self.dirty[seq] for seq in places}
        header_change = self.header_change
        with_header = self.run.status == Status.RUNNING or len(places) == len(self.dirty)
        dropped = list(self.dropped)
        versions: dict[int, int] = {}
        counts = {job: Counter(c) for job, c in self.counts.items()}
        run_id, workflow = self.run.run_id, self.run.workflow
        for seq in dropped:
            if self.stored[seq] is not None:
                counts[self.jobs[seq]][self.stored[seq] or ""] -= 1
        for seq in places:
            job, status = self.jobs[seq], str(self.steps[seq].status)
            job_counts = counts.setdefault(job, Counter())
            if self.stored[seq] is not None:
                job_counts[self.stored[seq] or ""] -= 1
            job_counts[status] += 1
        rows = [
            (seq, self.versions[seq], step_json(run_id, self.jobs[seq], self.steps[seq]))
            for seq in places
        ]
        statuses = {seq: str(self.steps[seq].status) for seq in places}
        header = (
            header_json(
                self.run,
                {job: {s: n for s, n in c.items() if n > 0} for job, c in counts.items()},
            )
            if with_header
            else None
        )
        if header is not None and self.owner:
            header["orchestrator"] = self.owner  # who reconciles it if that one dies
        header_version = self.header_version

        async def write(tx: Operations) -> tuple[dict[int, int], Record | None]:
            versions: dict[int, int] = {}
            for seq, version, row in rows:
                record = await tx.write(
                    step_key(workflow, run_id, seq),
                    row,
                    policy=STEP_POLICY,
                    expected_version=version,
                    fresh=version == 0,
                )
                versions[seq] = record.version
            if dropped:
                await tx.delete_items(step_key(workflow, run_id, seq) for seq in dropped)
            written = None
            if header is not None:
                written = await tx.write(
                    key(workflow, run_id), header, policy=POLICY, expected_version=header_version
                )
            return versions, written

        versions, written = await self.db.transact(write)
        if written is not None:
            self.header_version = written.version
            if self.header_change == header_change:  # else it changed meanwhile: again
                self.header_dirty = False
        self.counts = counts
        for seq, version in versions.items():
            self.versions[seq] = version
            self.stored[seq] = statuses[seq]
            if self.dirty.get(seq) == taken[seq]:
                self.dirty.pop(seq)
            if seq in self.gone and seq not in self.dropped:  # dropped while it was written
                self.dropped.append(seq)
        for seq in dropped:
            self.stored[seq] = None
        del self.dropped[: len(dropped)]
        self.writes += 1
        return len(places)


def summary(header: dict) -> dict:
    """What ``workflow history`` lists of a run, from its header (its steps counted there)."""
    counts = step_counts(header)
    return {
        "runId": header["runId"],
        "workflow": header["workflow"],
        "status": str(header["status"]),
        "startedAt": header["startedAt"],
        "endedAt": header.get("endedAt"),
        "error": header.get("error"),
        "steps": sum(counts.values()),
        "succeeded": counts.get(Status.SUCCEEDED.value, 0),
    }


def headers_of(records: list[Record]) -> list[dict]:
    """The run headers among ``records`` (read by a query of :data:`TYPE`), in their order;
    malformed ones skipped and logged."""
    return list(decoded(records, _RUN_FIELDS))


class RunBook:
    def __init__(self, db: Records, *, clock=time.time) -> None:
        self.db = db
        self.clock = clock

    async def save_whole(self, run: RunRecord) -> Record:
        """A run as earlier versions stored it, the tree in one record (what reconciling such a
        record writes back)."""
        return await self.db.write(key(run.workflow, run.run_id), run.to_json(), policy=POLICY)

    async def headers(self, workflow: str | None = None) -> list[dict]:
        """Every run's header (attributes), newest first."""
        stored = await self.db.latest_of_type(TYPE, model_name=workflow)
        found = list(decoded(stored, _RUN_FIELDS))
        found.sort(key=lambda h: h["startedAt"], reverse=True)
        return found

    async def summaries(self, workflow: str | None = None) -> list[dict]:
        """What ``workflow history`` lists of each run, newest first, from the headers alone."""
        return [summary(header) for header in await self.headers(workflow)]

    async def get(self, ref: str) -> RunRecord:
        """A run by its id or an unambiguous prefix of it (at least 4 characters), every job
        and step."""
        return await self._whole(await self.header(ref))

    async def exact(self, workflow: str, run_id: str) -> RunRecord | None:
        """A run by its workflow and whole id, read by its key (no scan of the runs)."""
        found = await self.db.latest(key(workflow, run_id))
        if found is None:
            return None
        return await self._whole(_RUN_FIELDS(found))

    async def header(self, ref: str) -> dict:
        """A run's header (its steps not read) by its id or an unambiguous prefix of it."""
        if len(ref) < 4:
            raise UserError(f"a run id prefix needs at least 4 characters, got {ref!r}")
        # a range of the key in each workflow's runs: the matches are read, not every run
        # (a page of a run, its cancel, the web pages' run page at a week of runs)
        found = [
            header
            for workflow in await self.db.model_names(TYPE)
            for header in decoded(
                await self.db.latest_with_prefix(TYPE, workflow, f"run-{ref}"), _RUN_FIELDS
            )
            if header["runId"].startswith(ref)
        ]
        if not found:
            raise NotFound(f"no workflow run {ref!r}: see 'swamp workflow history'")
        if len(found) > 1:
            ids = ", ".join(h["runId"][:12] for h in found[:5])
            raise UserError(f"run id {ref!r} is ambiguous ({ids}…): give more of it")
        return found[0]

    async def page(self, ref: str, offset: int) -> tuple[dict, int | None]:
        """A page of a run (see :func:`~swamp.domain.run_record.page`): its steps from place
        ``offset`` on, read from the store as a range of at most :data:`PAGE_ROWS` steps — a
        page costs the page, not the run."""
        header = await self.header(ref)
        if header.get("layout") != STEPS_APART:
            return page(await self._whole(header), offset)
        run_id = header["runId"]
        rows = await self.db.latest_in_range(
            STEP_TYPE,
            header["workflow"],
            step_key(header["workflow"], run_id, max(offset, 0)).name,
            f"{run_id}{chr(ord(STEP_SEPARATOR) + 1)}",
            limit=PAGE_ROWS,
        )
        shown, more = page(assemble(header, [r.attributes for r in rows]), offset)
        if more is None and len(rows) == PAGE_ROWS:  # the page ended with the rows read
            places = [r.attributes.get("seq") for r in rows]
            more = max(p for p in places if isinstance(p, int)) + 1
        return shown, more

    async def status(self, run_id: str) -> str | None:
        """A run's status as its header says (``None``: no such run)."""
        for header in await self.headers():
            if header["runId"] == run_id:
                return str(header["status"])
        return None

    async def _steps(self, header: dict) -> list[Record]:
        if header.get("layout") != STEPS_APART:
            return []
        return await self.db.latest_with_prefix(
            STEP_TYPE, header["workflow"], step_prefix(header["runId"])
        )

    async def _whole(self, header: dict) -> RunRecord:
        return assemble(header, [r.attributes for r in await self._steps(header)])

    async def reconcile(self, orphaned: Orphaned = everything) -> int:
        """Boot: a run the previous orchestrator left running ended with it — the run, its
        running jobs and every step of it that had not ended are failed (``interrupted``): a
        step stored ``pending`` may have started in the last batch window, which the crash
        lost. (A run stored whole by an earlier version was written at every transition: its
        pending steps stay as they were.) A run whose header ended while some of its steps are
        still counted unended (its final save cut short before the header went last) keeps its
        status; those steps are failed the same way. The count of runs changed."""
        now = iso(self.clock())
        count = 0
        for header in await self.headers():
            if not orphaned(header):
                continue  # a live orchestrator's run
            if header["status"] != Status.RUNNING:
                if header.get("layout") == STEPS_APART and _unended(header):
                    await self._interrupt(header, now, run_ended=True)
                    count += 1
                continue
            if header.get("layout") == STEPS_APART:
                await self._interrupt(header, now)
            else:
                run = RunRecord.from_json(header)
                for job in run.jobs:
                    for step in job.steps:
                        if step.status == Status.RUNNING:
                            step.status, step.error, step.ended_at = (
                                Status.FAILED,
                                INTERRUPTED,
                                now,
                            )
                    if job.status == Status.RUNNING:
                        job.status, job.ended_at = Status.FAILED, now
                run.status, run.error, run.ended_at = Status.FAILED, INTERRUPTED, now
                await self.save_whole(run)
            count += 1
        return count

    async def _interrupt(self, header: dict, now: str, *, run_ended: bool = False) -> None:
        stored = await self._steps(header)
        run = assemble(header, [r.attributes for r in stored])
        versions = {r.attributes.get("seq"): r.version for r in stored}
        writer = RunWriter(self.db, run)
        for job in run.jobs:
            for step in job.steps:
                seq = step.seq
                while len(writer.steps) <= seq:  # places of steps no longer stored stay empty
                    writer.steps.append(StepRecord(""))
                    writer.jobs.append("")
                    writer.versions.append(0)
                    writer.stored.append(None)
                writer.steps[seq], writer.jobs[seq] = step, job.name
                writer.versions[seq] = versions.get(seq, 0)
                writer.stored[seq] = str(step.status)
                writer.counts.setdefault(job.name, Counter())[str(step.status)] += 1
                # pending: it may have started in the batch window the crash lost
                if step.status in (Status.RUNNING, Status.PENDING):
                    step.status, step.error, step.ended_at = Status.FAILED, INTERRUPTED, now
                    writer.changed(step)
            if job.status == Status.RUNNING:
                job.status, job.ended_at = Status.FAILED, now
        if not run_ended:
            run.status, run.error, run.ended_at = Status.FAILED, INTERRUPTED, now
        writer.header_version = await self._header_version(run)
        while writer.pending:  # a transaction per thousand steps, not one for them all
            await writer.flush(limit=1000)

    async def _header_version(self, run: RunRecord) -> int:
        record = await self.db.latest(key(run.workflow, run.run_id))
        if record is None:
            raise Conflict(f"workflow run {run.run_id} was removed while reconciling")
        return record.version

    async def collect(self, *, older_than_seconds: float) -> int:
        """Forget runs that ended before the retention, their steps with them; a running
        run is never touched."""
        cutoff = iso(self.clock() - older_than_seconds)
        removed = 0
        for header in await self.headers():
            ended = header.get("endedAt")
            if header["status"] == Status.RUNNING or not isinstance(ended, str) or ended >= cutoff:
                continue
            workflow, run_id = header["workflow"], header["runId"]
            removed += await self.db.delete_with_prefix(STEP_TYPE, workflow, step_prefix(run_id))
            removed += await self.db.delete_items([key(workflow, run_id)])
        return removed
