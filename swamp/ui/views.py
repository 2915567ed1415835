"""What each page shows, read from where the CLI reads it: the live pool, the queue, the
admin API (``swamp.admin.local.RepoAdmin``, the same operations as ``worker queue``,
``workflow history`` and ``swamp logs``).

Each view returns the HTML of the page's ``main`` part; :mod:`swamp.ui.routes` wraps it in the
layout. The fleet page is bounded whatever the fleet's size: a summary line per fleet and one
page of :data:`PAGE_ROWS` workers (``?page=N``), filtered by labels as ``worker verify
--label`` selects (``?label=k=v``, repeated: all must match).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import trio

from swamp.bookkeeping.workflow_runs import TYPE as RUN_TYPE
from swamp.bookkeeping.workflow_runs import headers_of, summary
from swamp.domain.labels import parse_labels
from swamp.domain.names import NAME_PATTERN
from swamp.domain.query import parse
from swamp.domain.text import printable
from swamp.domain.workers import WorkerStatus, is_schedulable
from swamp.errors import NotFound, SwampError
from swamp.orchestrator.dispatch import DispatchService
from swamp.orchestrator.metrics import fleet_of
from swamp.orchestrator.pool import Member, Pool
from swamp.protocol.admin import AdminApi
from swamp.protocol.messages import (
    DataQueryRequest,
    LogsRequest,
    RunRef,
)
from swamp.store.datastore import iso, parse_iso
from swamp.ui.html import badge, path_part, query, table, text

PAGE_ROWS = 100  # workers on one page of the fleet
QUEUE_ROWS = 200  # waiting steps listed (the summaries count them all)
RUN_ROWS = 100  # runs listed
RUNS_BUDGET = 10.0  # seconds the runs page's query may take
_RUN_HEADERS = parse(f'modelType == "{RUN_TYPE}"')
TAIL_LINES = 60  # lines of live output shown per dispatch or step
HISTORY_ROWS = 25  # enrollment versions and recent dispatches on a worker's page
_WORKER_NAME = NAME_PATTERN  # a worker's name: checked before it goes into a query


@dataclass
class Sources:
    """Where the pages read: the live parts of the orchestrator and its admin API."""

    pool: Pool
    dispatch: DispatchService
    api: AdminApi
    clock: Callable[[], float] = time.time
    order: _Order = field(default_factory=lambda: _Order())


@dataclass(frozen=True)
class Viewer:
    """What the page may offer the viewer: action buttons (an admin session) and the CSRF
    token their forms carry."""

    may_act: bool
    csrf: str


def _ago(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    if seconds < 86400:
        return f"{seconds / 3600:.1f}h"
    return f"{seconds / 86400:.1f}d"


def _labels(labels: dict[str, str]) -> str:
    return " ".join(
        f'<span class="label">{text(k)}={text(v)}</span>' for k, v in sorted(labels.items())
    )


def _status_of(member: Member) -> str:
    return member.status if member.connected else WorkerStatus.DISCONNECTED.value


def _why(member: Member) -> str:
    return member.drain_reason or member.verify_failure_reason or member.unresponsive_reason or ""


def _running(sources: Sources, member: Member) -> str:
    active = sources.dispatch.active
    out = []
    for dispatch_id in sorted(member.active):
        one = active.get(dispatch_id)
        what = f"{one.model_type.type} {one.model_name}" if one is not None else "starting"
        out.append(f'<span class="running" title="{text(dispatch_id)}">{text(what)}</span>')
    return " ".join(out) or '<span class="dim">—</span>'


# -- fleet -------------------------------------------------------------------------------------


def fleet(
    sources: Sources, labels: list[str], page_number: int = 1, only: str | None = None
) -> str:
    """Workers grouped by fleet, then one page of them, sorted by fleet and name; ``labels``
    select (all must match), ``only`` keeps one fleet."""
    selector = parse_labels(labels, source="label") if labels else {}
    now, loop_now = sources.clock(), trio.current_time()
    # One pass over the pool (10,000 members a page, up to twice a second while watched):
    # the groups' counts and who is shown; the order by fleet and name is the cache's.
    groups: dict[str, _Group] = {}
    chosen: set[str] | None = set() if selector or only is not None else None
    connected = 0
    for m in sources.pool.members.values():
        fleet_name = m.fleet or m.token_name  # fleet_of, inline
        if only is not None and fleet_name != only:
            continue
        if selector and any(m.labels.get(k) != v for k, v in selector.items()):
            continue
        if chosen is not None:
            chosen.add(m.name)
        group = groups.get(fleet_name)
        if group is None:
            group = groups[fleet_name] = _Group()
        group.workers += 1
        channel = m.channel
        if channel is not None and not channel.closed:
            connected += 1
            group.statuses[m.status] += 1
            if m.status in _SCHEDULABLE:
                group.slots += m.capacity
                group.busy += len(m.active)
        else:
            group.statuses[_DISCONNECTED] += 1
    summary_rows = []
    for name in sorted(groups):
        g = groups[name]
        statuses = " ".join(f"{badge(s)}&nbsp;{n}" for s, n in sorted(g.statuses.items()))
        summary_rows.append(
            [
                f'<a href="/ui/{query(label=[*labels], fleet=name)}">{text(name)}</a>',
                str(g.workers),
                f"{g.busy}/{g.slots}",
                statuses,
            ]
        )
    order = sources.order.of(sources.pool)
    names = order if chosen is None else [n for n in order if n in chosen]
    pages = max(1, -(-len(names) // PAGE_ROWS))
    page_number = min(max(1, page_number), pages)
    pool_members = sources.pool.members
    shown = [
        pool_members[n] for n in names[(page_number - 1) * PAGE_ROWS : page_number * PAGE_ROWS]
    ]
    rows = []
    for m in shown:
        why = _why(m)
        rows.append(
            [
                f'<a href="/ui/workers/{path_part(m.name)}">{text(m.name)}</a>',
                text(fleet_of(m)),
                badge(_status_of(m)) + (f' <span class="why">{text(why)}</span>' if why else ""),
                f"{len(m.active)}/{m.capacity}",
                _running(sources, m),
                _labels(m.labels),
                text(m.version),
                text(f"{m.platform}/{m.arch}"),
                _seen(m, now, loop_now),
            ]
        )
    filter_form = (
        '<form class="filter" method="get" action="/ui/">'
        f'<input name="label" placeholder="label=value" value="{text(" ".join(labels))}" '
        'aria-label="label selector">'
        '<button type="submit">Filter</button></form>'
    )
    head = (
        f"<h1>Fleet <small>{len(names)} workers, {connected} connected"
        f"{' matching ' + text(' '.join(labels)) if labels else ''}"
        f"{' in fleet ' + text(only) if only else ''}</small></h1>{filter_form}"
    )
    if not names and (labels or only):
        return head + '<p class="empty">No worker matches.</p>'
    if not names:
        return (
            head + '<p class="empty">No workers yet: see <code>swamp worker token create'
            "</code> and <code>swamp worker connect</code>.</p>"
        )
    return (
        head
        + table(["fleet", "workers", "busy/slots", "status"], summary_rows, cls="summary")
        + table(
            [
                "worker",
                "fleet",
                "status",
                "slots",
                "running",
                "labels",
                "version",
                "platform",
                "last seen",
            ],
            rows,
            cls="workers",
        )
        + _pager("/ui/", page_number, pages, label=labels, fleet=only)
    )


_SCHEDULABLE = frozenset(s.value for s in WorkerStatus if is_schedulable(s.value))
_DISCONNECTED = WorkerStatus.DISCONNECTED.value


class _Order:
    """The pool's members by fleet and name, sorted again only when who is in the pool
    changed (a set comparison, in C): slot and status changes — most of a busy fleet's
    events — leave it as it was."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.members: set[str] = set()

    def of(self, pool: Pool) -> list[str]:
        if pool.members.keys() != self.members:
            self.members = set(pool.members)
            self.names = [
                m.name for m in sorted(pool.members.values(), key=lambda m: (fleet_of(m), m.name))
            ]
        return self.names


@dataclass
class _Group:
    """One fleet's line: how many workers, in which statuses, and their slots (schedulable
    workers' slots only, as ``/metrics`` counts supply)."""

    workers: int = 0
    slots: int = 0
    busy: int = 0
    statuses: Counter = field(default_factory=Counter)


def _seen(member: Member, now: float, loop_now: float) -> str:
    seen = member.last_seen(now, loop_now)
    return f'<time datetime="{text(seen)}">{text(seen[11:19] if seen else "—")}</time>'


def _pager(base: str, page_number: int, pages: int, **params: object) -> str:
    if pages <= 1:
        return ""
    links = []
    if page_number > 1:
        links.append(f'<a href="{base}{query(**params, page=page_number - 1)}">← previous</a>')
    links.append(f"page {page_number} of {pages}")
    if page_number < pages:
        links.append(f'<a href="{base}{query(**params, page=page_number + 1)}">next →</a>')
    return f'<p class="pager">{" · ".join(links)}</p>'


# -- queue -------------------------------------------------------------------------------------


async def queue(sources: Sources) -> str:
    """Waiting steps: by requirement (demand against supply, as ``swamp worker queue``
    and ``/metrics`` count them: one source, the live queue), by priority and by submitter."""
    reply = await sources.api.worker_queue()
    items = reply.items
    head = f"<h1>Queue <small>{len(items)} waiting</small></h1>"
    if not items:
        return head + '<p class="empty">Nothing is waiting for a worker.</p>'
    by_requirement = table(
        ["requirement", "waiting", "oldest wait", "matching workers", "free slots"],
        [
            [
                f"<code>{text(s.requirement)}</code>",
                str(s.waiting),
                _ago(s.oldest_wait_ms / 1000),
                str(s.connected),
                str(s.free_slots),
            ]
            for s in reply.summary
        ],
        cls="summary",
    )
    priorities = Counter(i.priority for i in items)
    submitters = Counter(i.submitter or "—" for i in items)
    by_priority = table(
        ["priority", "waiting"],
        [[str(p), str(n)] for p, n in sorted(priorities.items(), reverse=True)],
        cls="summary narrow",
    )
    by_submitter = table(
        ["submitter", "waiting"],
        [[text(s), str(n)] for s, n in submitters.most_common()],
        cls="summary narrow",
    )
    rows = [
        [
            text(i.queue_id[:12]),
            f"<code>{text(i.requirement)}</code>",
            text(f"{i.model_type} {i.model_name or ''} {i.method_name}"),
            text("/".join(x for x in (i.workflow_name, i.job_name, i.step_name) if x) or "—"),
            str(i.priority)
            + (
                f" (now {i.effective_priority})"
                if i.effective_priority not in (None, i.priority)
                else ""
            ),
            text(i.submitter or "—"),
            _ago(i.age_ms / 1000),
        ]
        for i in items[:QUEUE_ROWS]
    ]
    more = (
        f'<p class="dim">and {len(items) - QUEUE_ROWS} more (swamp worker queue lists all)</p>'
        if len(items) > QUEUE_ROWS
        else ""
    )
    return (
        head
        + by_requirement
        + f'<div class="side">{by_priority}{by_submitter}</div>'
        + table(
            [
                "queue id",
                "requirement",
                "method",
                "workflow step",
                "priority",
                "submitter",
                "waiting",
            ],
            rows,
            cls="items",
        )
        + more
    )


# -- one worker --------------------------------------------------------------------------------


async def worker(sources: Sources, name: str, viewer: Viewer) -> str:
    if not _WORKER_NAME.fullmatch(name):
        raise NotFound(f"no worker named {printable(name[:80])!r}")
    member = sources.pool.get(name)
    history = await sources.api.data_query(
        DataQueryRequest(f'modelType == "swamp/worker" && modelName == "{name}"', all_versions=True)
    )
    if member is None and not history.records:
        raise NotFound(f"no worker named {name!r}: see the fleet page")
    versions = sorted(history.records, key=lambda r: r.version, reverse=True)
    latest = versions[0].attributes if versions else {}
    leases = await sources.api.data_query(
        DataQueryRequest(
            f'modelType == "swamp/step-lease" && attributes.workerName == "{name}"', limit=500
        )
    )
    recent = sorted(
        leases.records, key=lambda r: str(r.attributes.get("createdAt", "")), reverse=True
    )[:HISTORY_ROWS]
    parts = []
    if member is not None:
        now, loop_now = sources.clock(), trio.current_time()
        facts = [
            (
                "status",
                badge(_status_of(member)) + (f" {text(_why(member))}" if _why(member) else ""),
            ),
            ("fleet", text(fleet_of(member))),
            ("token", text(member.token_name)),
            ("slots", f"{len(member.active)}/{member.capacity}"),
            ("labels", _labels(member.labels) or "—"),
            ("version", text(member.version)),
            ("platform", text(f"{member.platform}/{member.arch}")),
            ("enrolled", text(member.enrolled_at)),
            ("last seen", _seen(member, now, loop_now)),
            ("instance", text(member.instance_id)),
        ]
    else:
        facts = [
            ("status", badge(str(latest.get("status", "?")))),
            ("token", text(latest.get("tokenName", "?"))),
            ("labels", _labels(latest.get("labels") or {}) or "—"),
            ("last seen", text(latest.get("lastSeenAt", "—"))),
        ]
    parts.append(f"<h1>Worker <small>{text(name)}</small></h1>")
    drainable = (
        member is not None and member.connected and member.status != WorkerStatus.DRAINING.value
    )
    if drainable and viewer.may_act:  # as 'swamp worker drain NAME'
        parts.append(
            f'<form method="post" action="/ui/workers/{path_part(name)}/drain" class="act">'
            f'<input type="hidden" name="csrf" value="{text(viewer.csrf)}">'
            '<button type="submit" class="danger">Drain: finish its steps, then leave'
            "</button></form>"
        )
    parts.append(
        '<dl class="facts">' + "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts) + "</dl>"
    )
    if member is not None and member.active:
        parts.append("<h2>Running now</h2>")
        for dispatch_id in sorted(member.active):
            parts.append(await tail(sources, dispatch_id, dispatch_id[:12]))
    parts.append("<h2>Recent dispatches</h2>")
    parts.append(
        table(
            ["dispatch", "method", "state", "started", "ended"],
            [
                [
                    text(str(a.get("dispatchId", ""))[:12]),
                    text(
                        f"{a.get('modelType', '?')} {a.get('modelName', '')} "
                        f"{a.get('methodName', '')}"
                    ),
                    badge(str(a.get("state", "?"))),
                    text(a.get("createdAt", "")),
                    text(a.get("endedAt", "") or "—"),
                ]
                for a in (r.attributes for r in recent)
            ],
        )
        if recent
        else '<p class="empty">None recorded.</p>'
    )
    parts.append("<h2>Enrollment history</h2>")
    parts.append(
        table(
            ["version", "status", "reason", "at", "instance"],
            [
                [
                    str(r.version),
                    badge(str(r.attributes.get("status", "?"))),
                    text(
                        r.attributes.get("disconnectReason")
                        or r.attributes.get("drainReason")
                        or r.attributes.get("verifyFailureReason")
                        or r.attributes.get("unresponsiveReason")
                        or ""
                    ),
                    text(r.created_at),
                    text(str(r.attributes.get("instanceId", ""))[:12]),
                ]
                for r in versions[:HISTORY_ROWS]
            ],
        )
    )
    return "".join(parts)


async def tail(sources: Sources, ref: str, title: str) -> str:
    """The last lines a dispatch (or a run's step) printed, as ``swamp logs`` reads them."""
    try:
        page = await sources.api.logs_read(LogsRequest(ref=ref))
    except SwampError as exc:
        return f'<p class="dim">{text(title)}: {text(exc.message)}</p>'
    lines: list[tuple[str, str]] = []
    for chunk in page.chunks:
        for line, stream in zip(chunk.lines, chunk.streams, strict=False):
            lines.append((line, stream))
    lines = lines[-TAIL_LINES:]
    body = "\n".join(
        f'<span class="{"err" if s == "e" else "out"}">{text(line, keep_tab=True)}</span>'
        for line, s in lines
    )
    more = " · earlier lines: <code>swamp logs " + text(ref) + "</code>" if page.more else ""
    return (
        f'<div class="tail"><div class="tail-head">{text(title)}'
        f"{' · live' if page.live else ''}{more}</div><pre>{body or '(no output yet)'}</pre></div>"
    )


# -- runs --------------------------------------------------------------------------------------


async def runs(sources: Sources) -> str:
    """The :data:`RUN_ROWS` runs written last (running ones, and those just ended, first):
    a query sorted and cut in SQL, off the event loop — never every header of a week of runs."""
    records = await sources.dispatch.query(
        _RUN_HEADERS, budget=RUNS_BUDGET, limit=RUN_ROWS, newest_first=True
    )
    found = [summary(h) for h in headers_of(records)]
    shown = f"the latest {len(found)}" if len(found) >= RUN_ROWS else str(len(found))
    head = f"<h1>Runs <small>{shown}</small></h1>"
    if not found:
        return (
            head + '<p class="empty">No workflow runs yet: <code>swamp workflow run NAME'
            "</code>.</p>"
        )
    rows = [
        [
            f'<a href="/ui/runs/{path_part(str(r["runId"]))}">{text(str(r["runId"])[:12])}</a>',
            text(r.get("workflow")),
            badge(str(r.get("status"))),
            f"{r.get('succeeded', 0)}/{r.get('steps', 0)}",
            text(r.get("startedAt")),
            text(r.get("endedAt") or "—"),
            text(r.get("error") or ""),
        ]
        for r in found
    ]
    return head + table(
        ["run", "workflow", "status", "steps ok", "started", "ended", "error"], rows
    )


def _cancel_form(run_id: str, viewer: Viewer, step: str | None, label: str, cls: str) -> str:
    """A button that cancels the run, or one running step of it (``workflow cancel``)."""
    which = f'<input type="hidden" name="step" value="{text(step)}">' if step else ""
    what = (
        "cancel this step alone: it fails, its dependants follow their conditions"
        if step
        else "cancel the run: its running steps are stopped, the rest skipped"
    )
    return (
        f'<form method="post" action="/ui/runs/{path_part(run_id)}/cancel" class="{cls}">'
        f'<input type="hidden" name="csrf" value="{text(viewer.csrf)}">{which}'
        f'<button type="submit" class="danger" title="{what}">{text(label)}</button></form>'
    )


def _duration(start: str | None, end: str | None, now: float) -> str:
    begun = parse_iso(start) if start else None
    if begun is None:
        return "—"
    ended = parse_iso(end) if end else None
    return _ago((ended if ended is not None else now) - begun)


async def run(sources: Sources, run_id: str, viewer: Viewer, step: str | None = None) -> str:
    """One run: its jobs and steps (status, worker, time), each step's last lines, and the
    output of the step asked for (``?step=JOB.STEP``)."""
    reply = await sources.api.workflow_history_get(RunRef(run_id))
    record = reply.run
    now = sources.clock()
    status = str(record.get("status"))
    the_id = str(record.get("runId", run_id))
    parts = [
        f"<h1>Run <small>{text(record.get('workflow'))} · {text(the_id[:12])}</small> "
        f"{badge(status)}</h1>"
    ]
    if status == "running" and viewer.may_act:
        parts.append(_cancel_form(the_id, viewer, None, "Cancel run", "act"))
    if record.get("error"):
        parts.append(f'<p class="error">{text(record.get("error"))}</p>')
    for job in record.get("jobs") or []:
        parts.append(f"<h2>{text(job.get('name'))} {badge(str(job.get('status')))}</h2>")
        rows = []
        for s in job.get("steps") or []:
            ref = f"{job.get('name')}.{s.get('name')}"
            printed = s.get("logTail") or []
            stop = (
                _cancel_form(the_id, viewer, ref, "Cancel", "small")
                if s.get("status") == "running" and viewer.may_act
                else ""
            )
            rows.append(
                [
                    f'<a href="/ui/runs/{path_part(the_id)}{query(step=ref)}">'
                    f"{text(s.get('name'))}</a>",
                    badge(str(s.get("status"))) + stop,
                    (
                        f'<a href="/ui/workers/{path_part(str(s["worker"]))}">'
                        f"{text(s['worker'])}</a>"
                        if s.get("worker")
                        else "—"
                    ),
                    text(
                        " ".join(
                            str(x)
                            for x in (s.get("modelType"), s.get("model"), s.get("method"))
                            if x
                        )
                    ),
                    _duration(s.get("startedAt"), s.get("endedAt"), now),
                    f'<code class="line">{text(printed[-1], keep_tab=True)}</code>'
                    if printed
                    else text(s.get("error") or s.get("reason") or ""),
                ]
            )
        parts.append(
            table(["step", "status", "worker", "method", "time", "output"], rows, cls="steps")
        )
    if reply.next_offset is not None:
        parts.append('<p class="dim">More steps: <code>swamp workflow history get</code>.</p>')
    if step:
        parts.append(f"<h2>Output of {text(step)}</h2>")
        parts.append(await tail(sources, f"{the_id}/{step}", step))
    parts.append(f'<p class="dim">as of {text(iso(now)[11:19])}</p>')
    return "".join(parts)
