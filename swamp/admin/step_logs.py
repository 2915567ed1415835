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
from swamp.domain.run_record import RunRecord
from swamp.domain.step_logs import LogRef, parse_log_ref
from swamp.errors import NotFound, UserError
from swamp.orchestrator.step_logs import StepLogs
from swamp.protocol.messages import LogChunkItem, LogItem, LogsPage, LogsRequest
from swamp.store.datastore import Datastore
from swamp.store.step_logs import LogInfo, LogStore

PAGE_BYTES = 512 * 1024  # of line text (a page's frame stays under the 4 MiB frame limit)
WAIT_MAX = 60.0


async def read(
    request: LogsRequest,
    *,
    store: Datastore,
    logs: LogStore,
    live: StepLogs | None,
    running: frozenset[str] | set[str] = frozenset(),
) -> LogsPage:
    """One page; with ``request.wait``, the first that has something (or the last, once
    nothing more can come). ``live`` is the running orchestrator's step logs (None straight
    on the repo: nothing there is live); ``running``, the ids of the runs it runs."""
    ref = parse_log_ref(request.ref)
    wait = min(max(float(request.wait), 0.0), WAIT_MAX)
    deadline = trio.current_time() + wait
    while True:
        page = _page(ref, request, store=store, logs=logs, live=live, running=running)
        now = trio.current_time()
        if page.chunks or not page.live or not request.chunks or live is None or now >= deadline:
            return page
        with trio.move_on_after(deadline - now):
            await live.written()


def _page(
    ref: LogRef,
    request: LogsRequest,
    *,
    store: Datastore,
    logs: LogStore,
    live: StepLogs | None,
    running: frozenset[str] | set[str],
) -> LogsPage:
    run, infos = _resolve(ref, store, logs)
    if run is not None:
        infos = _of_step(run, infos, ref.step)
        is_live = live is not None and (run.run_id in running or live.live_run(run.run_id))
    else:
        is_live = live is not None and any(live.live(i.log_id) for i in infos)
    chosen = [i for i in infos if request.log is None or i.log_id == request.log]
    # whether anything more can come is decided before reading: what was written before
    # is then in what is read
    chunks, more = (
        logs.chunks([i.log_id for i in chosen], after=max(0, request.after), limit_bytes=PAGE_BYTES)
        if request.chunks
        else ([], False)
    )
    return LogsPage(
        kind="run" if run is not None else "dispatch",
        id=run.run_id if run is not None else infos[0].log_id,
        cursor=chunks[-1].id if chunks else max(0, request.after),
        more=more,
        live=is_live,
        cap_bytes=live.cap if live is not None else 0,
        logs=[_item(i, live) for i in infos],
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
        status=str(run.status) if run is not None else None,
        workflow=run.workflow if run is not None else None,
    )


def _resolve(
    ref: LogRef, store: Datastore, logs: LogStore
) -> tuple[RunRecord | None, list[LogInfo]]:
    """The run ``ref`` names and its logs, or (None, the one dispatch's log)."""
    if len(ref.id) == 32:  # a whole id: found by its key, not by a scan of the runs
        infos = logs.logs_of_run(ref.id)
        if infos and infos[0].owner.workflow:
            whole = RunBook(store).exact(infos[0].owner.workflow, ref.id)
            if whole is not None:
                return whole, infos
        exact = [i for i in logs.logs_with_prefix(ref.id) if i.log_id == ref.id]
        if exact and ref.step is None:
            return None, exact
    try:
        run = RunBook(store).get(ref.id)
    except NotFound:
        run = None
    if run is not None:
        return run, logs.logs_of_run(run.run_id)
    if ref.step is not None:
        raise NotFound(f"no workflow run {ref.id!r}: see 'swamp workflow history'")
    found = logs.logs_with_prefix(ref.id)
    if not found:
        raise NotFound(
            f"no workflow run or dispatch {ref.id!r} with stored output: see 'swamp workflow "
            "history', or the dispatch id 'swamp model method run' printed"
        )
    if len(found) > 1:
        ids = ", ".join(i.log_id for i in found[:3])
        raise UserError(f"dispatch id {ref.id!r} is ambiguous ({ids}…): give more of it")
    return None, found


def _of_step(run: RunRecord, infos: list[LogInfo], step: str | None) -> list[LogInfo]:
    """The logs of ``step`` (``STEP`` or ``JOB.STEP``) of the run: none yet is fine for a
    step of the run; a name the run does not have is an error that lists its steps."""
    if step is None:
        return infos
    names = {(j.name, s.name) for j in run.jobs for s in j.steps}
    matched = {(j, s) for j, s in names if step in (s, f"{j}.{s}")}
    if not matched:
        shown = ", ".join(sorted(f"{j}.{s}" for j, s in names)[:20])
        raise NotFound(f"run {run.run_id[:12]} has no step {step!r} (its steps: {shown})")
    return [i for i in infos if (i.owner.job, i.owner.step) in matched]


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
