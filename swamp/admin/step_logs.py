"""``logs.read``: a page of what a run's steps, or one dispatch, printed.

A reference is resolved the same way on both routes: a workflow run by its id or a prefix of
it (as ``workflow history get``), perhaps narrowed to a step; else a dispatch (or an ad-hoc
run in the orchestrator's process) by its log id or a prefix. A page is the chunks after the
reader's cursor, oldest first, up to :data:`PAGE_BYTES` of text; a reader that follows asks
again with the new cursor and, when there is nothing new yet, the orchestrator answers when
the next batch is written (or after the wait). The store is the buffer: a slow reader only
asks less often, and nothing it does reaches the dispatch path.
"""

from __future__ import annotations

import trio

from swamp.bookkeeping.workflow_runs import RunBook
from swamp.bookkeeping.workflow_runs import key as run_key
from swamp.domain.step_logs import LogRef, parse_log_ref
from swamp.errors import NotFound, UserError
from swamp.orchestrator.step_logs import StepLogs
from swamp.protocol.messages import LogChunkItem, LogItem, LogsPage, LogsRequest
from swamp.store.records import Records
from swamp.store.step_logs import LogInfo, LogStore, StoredChunk

PAGE_BYTES = 512 * 1024  # of line text (a page's frame stays under the 4 MiB frame limit)
WAIT_MAX = 60.0


async def read(
    request: LogsRequest,
    *,
    db: Records,
    logs: LogStore,
    live: StepLogs | None,
    running: frozenset[str] | set[str] = frozenset(),
) -> LogsPage:
    """One page; with ``request.wait``, the first that has something (or the last, once
    nothing more can come). ``live`` is the running orchestrator's step logs (None straight
    on the repo: nothing there is live); ``running``, the ids of the runs it runs."""
    ref = parse_log_ref(request.ref)
    wait = min(max(float(request.wait), 0.0), WAIT_MAX)
    if live is not None:  # what has ended is all stored before it is read
        await live.caught_up()
    deadline = trio.current_time() + wait
    while True:
        page = await _page(ref, request, db=db, logs=logs, live=live, running=running)
        now = trio.current_time()
        if page.chunks or not page.live or not request.chunks or live is None or now >= deadline:
            return page
        with trio.move_on_after(deadline - now):
            await live.written()


async def _page(
    ref: LogRef,
    request: LogsRequest,
    *,
    db: Records,
    logs: LogStore,
    live: StepLogs | None,
    running: frozenset[str] | set[str],
) -> LogsPage:
    """A page costs the page: the run is known by its header, its logs by the index, and
    only the logs of the page's chunks are listed in it."""
    header, infos = await _resolve(ref, db, logs)
    after = max(0, request.after)
    run_id: str | None = header["runId"] if header is not None else None
    if run_id is not None:
        is_live = live is not None and (run_id in running or live.live_run(run_id))
    else:
        is_live = live is not None and any(live.live(i.log_id) for i in infos or [])
    # whether anything more can come is decided before reading: what was written before
    # is then in what is read
    chunks: list[StoredChunk] = []
    more = False
    if request.chunks:
        if request.log is not None:  # one log of the ref
            pool = infos if infos is not None else await logs.logs_by_id([request.log])
            ids = [
                i.log_id
                for i in pool
                if i.log_id == request.log and run_id in (None, i.owner.run_id)
            ]
            chunks, more = await logs.chunks(ids, after=after, limit_bytes=PAGE_BYTES)
        elif infos is None and run_id is not None:  # every log of the run: one cursor
            chunks, more = await logs.chunks_of_run(run_id, after=after, limit_bytes=PAGE_BYTES)
        else:
            ids = [i.log_id for i in infos or []]
            chunks, more = await logs.chunks(ids, after=after, limit_bytes=PAGE_BYTES)
    if header is not None:
        count, still_open = (
            await logs.run_counts(header["runId"])
            if infos is None
            else (len(infos), sum(1 for i in infos if i.ended_at is None))
        )
        shown = await logs.logs_by_id(sorted({c.log_id for c in chunks}))
    else:
        shown = list(infos or [])
        count, still_open = len(shown), sum(1 for i in shown if i.ended_at is None)
    return LogsPage(
        kind="run" if header is not None else "dispatch",
        id=header["runId"] if header is not None else shown[0].log_id,
        cursor=chunks[-1].id if chunks else after,
        more=more,
        live=is_live,
        cap_bytes=live.cap if live is not None else 0,
        logs=[_item(i, live) for i in shown],
        chunks=[
            LogChunkItem(
                id=c.id,
                log=c.log_id,
                first=c.first_line,
                first_byte=c.first_byte,
                size=c.size,
                streams=c.streams,
                lines=c.lines,
            )
            for c in chunks
        ],
        status=str(header["status"]) if header is not None else None,
        workflow=header["workflow"] if header is not None else None,
        log_count=count,
        open_logs=still_open,
    )


async def _resolve(
    ref: LogRef, db: Records, logs: LogStore
) -> tuple[dict | None, list[LogInfo] | None]:
    """(the run's header, None: every log of it), (its header, the logs of its step), or
    (None, the one dispatch's log). Only the header of a run is read, never its steps."""
    header: dict | None = None
    if len(ref.id) == 32:  # a whole id: found by its key, not by a scan of the runs
        workflow = await logs.run_workflow(ref.id)
        if workflow:
            record = await db.latest(run_key(workflow, ref.id))
            header = dict(record.attributes) if record is not None else None
        if header is None:
            exact = [i for i in await logs.logs_with_prefix(ref.id) if i.log_id == ref.id]
            if exact and ref.step is None:
                return None, exact
    if header is None:
        try:
            header = await RunBook(db).header(ref.id)
        except NotFound:
            header = None
    if header is not None:
        if ref.step is None:
            return header, None
        return header, await _of_step(db, logs, header, ref.step)
    if ref.step is not None:
        raise NotFound(f"no workflow run {ref.id!r}: see 'swamp workflow history'")
    found = await logs.logs_with_prefix(ref.id)
    if not found:
        raise NotFound(
            f"no workflow run or dispatch {ref.id!r} with stored output: see 'swamp workflow "
            "history', or the dispatch id 'swamp model method run' printed"
        )
    if len(found) > 1:
        ids = ", ".join(i.log_id for i in found[:3])
        raise UserError(f"dispatch id {ref.id!r} is ambiguous ({ids}…): give more of it")
    return None, found


async def _of_step(db: Records, logs: LogStore, header: dict, step: str) -> list[LogInfo]:
    """The logs of ``step`` (``STEP`` or ``JOB.STEP``) of the run: none yet is fine for a
    step of the run; a name the run does not have is an error that lists its steps. The
    run's steps are read only when the step has no log yet."""
    found = await logs.logs_of_step(header["runId"], step)
    if found:
        return found
    run = await RunBook(db).get(header["runId"])
    names = {(j.name, s.name) for j in run.jobs for s in j.steps}
    if not any(step in (s, f"{j}.{s}") for j, s in names):
        shown = ", ".join(sorted(f"{j}.{s}" for j, s in names)[:20])
        raise NotFound(f"run {run.run_id[:12]} has no step {step!r} (its steps: {shown})")
    return []


def _item(info: LogInfo, live: StepLogs | None) -> LogItem:
    owner = info.owner
    return LogItem(
        id=info.log_id,
        model_type=owner.model_type,
        model_name=owner.model_name,
        method=owner.method,
        attempt=info.attempt,
        started_at=info.started_at,
        lines=info.lines,
        bytes=info.bytes,
        dropped_lines=info.dropped_lines,
        dropped_bytes=info.dropped_bytes,
        live=live is not None and live.live(info.log_id),
        run_id=owner.run_id,
        workflow=owner.workflow,
        job=owner.job,
        step=owner.step,
        worker=info.worker,
        ended_at=info.ended_at,
    )
