"""The payloads of the protocol, decoded once at the edge into frozen values (h11's ``_events``).

Every request, reply and streamed event that crosses a socket is one :class:`Message` subclass
here: the schemas. How each goes to and from its JSON object is ``swamp.protocol.codec``'s
(``Message.decode(payload)``, ``message.to_json()``). Both ends use the same classes, so a
field means one thing everywhere. What a field's *value* must be (a well-formed label, a known
model) is the domain's to check afterwards, as an ``invalid_input``.

Wire names are the fields' names in camelCase; ``None`` means "absent" and is not sent.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from swamp.errors import MalformedFrame
from swamp.protocol import codec
from swamp.protocol.codec import JSON, Message


def prepare(*classes: type[Message]) -> None:
    """Write these classes' code (all of them, if none are named) now, not at their first
    frame: a long-running process, before it takes any (``serve`` at boot, a worker as it
    starts), so its first dispatch costs what the others do."""
    every = [c for c in globals().values() if isinstance(c, type) and issubclass(c, Message)]
    codec.prepare(classes or every)


# -- enrollment ------------------------------------------------------------------------------


@dataclass(frozen=True)
class CarriedRun(Message):
    """A dispatch a worker runs on after its socket to another orchestrator was lost
    (``swamp.domain.carrying``): listed at its next enrollment, for at most ``seconds``
    more."""

    dispatch_id: str
    seconds: float
    effects: bool = False  # it had an effect (if it is not adopted, it must not run again)


@dataclass(frozen=True)
class EnrollRequest(Message):
    """``worker.enroll``: who the worker says it is (the orchestrator checks every value)."""

    token: str
    instance_id: str
    machine_id: str
    protocol_version: int
    platform: str
    arch: str
    version: str = ""
    labels: dict[str, str] = field(default_factory=dict)
    capacity: int = 1
    carried: list[CarriedRun] = field(default_factory=list)


@dataclass(frozen=True)
class EnrollReply(Message):
    """What the worker is admitted as. ``carry``: this orchestrator adopts runs carried across
    a lost socket (a shared database); ``carried``: what becomes of each the worker listed
    (``wait``: until told, ``stop``: now) — one it does not name is stopped."""

    worker_name: str
    capacity: int
    token_expires_at: str
    token_expires_at_epoch: float
    heartbeat_seconds: float
    protocol_version: int
    labels: dict[str, str] = field(default_factory=dict)
    reconnect: bool = False
    orchestrator_version: str = ""
    carry: bool = False
    carried: dict[str, str] = field(default_factory=dict)


# -- dispatch --------------------------------------------------------------------------------


@dataclass(frozen=True)
class DispatchRequest(Message):
    """``worker.dispatch``: one run of one method. ``takes_slot`` is false for the fleet probe,
    which runs beside the worker's dispatches without counting against its slots. ``step_id`` is
    the same for every dispatch of one step and ``attempt`` counts them, so a command can tell a
    run again after a lost worker from a first run (``SWAMP_STEP_ID``, ``SWAMP_ATTEMPT``)."""

    dispatch_id: str
    model_type: str
    model_name: str
    method: str
    credential: str
    args: dict = field(default_factory=dict)
    environment: dict[str, str] = field(default_factory=dict)
    takes_slot: bool = True
    step_id: str = ""
    attempt: int = 1


@dataclass(frozen=True)
class AdoptRequest(Message):
    """``worker.adopt``: the orchestrator the worker moved to took over a dispatch it carries
    (the burial of its old holder moved the lease): its events and its answer come here now,
    as a dispatch's would, with this data-plane ``credential``."""

    dispatch_id: str
    credential: str


@dataclass(frozen=True)
class AbandonRequest(Message):
    """``worker.abandon``: a dispatch the worker carries was not adopted: stop it now."""

    dispatch_id: str


@dataclass(frozen=True)
class DrainRequest(Message):
    """``worker.drain``: the worker's drain has started (``signal``, ``max-dispatches``,
    ``idle-timeout``): send it nothing new."""

    reason: str


@dataclass(frozen=True)
class OutputHandle(Message):
    """A resource a method wrote."""

    spec: str
    name: str
    version: int


@dataclass(frozen=True)
class DispatchResult(Message):
    """The reply to ``worker.dispatch`` (and, enriched, to ``model.method.run``)."""

    status: Literal["succeeded", "failed"]
    duration_ms: int = 0
    outputs: list[OutputHandle] = field(default_factory=list)
    error: str | None = None
    result: JSON = None


@dataclass(frozen=True)
class RunResult(Message):
    """The reply to ``model.method.run``: the method's result, where it ran, what it wrote."""

    status: Literal["succeeded", "failed"]
    model: str
    model_type: str
    method: str
    duration_ms: int = 0
    outputs: list[OutputHandle] = field(default_factory=list)
    worker: str | None = None
    dispatch_id: str | None = None
    error: str | None = None
    result: JSON = None
    started_at: str | None = None
    log_id: str | None = None  # its output: 'swamp logs LOG_ID' (a worker's: the dispatch id)


# -- streamed events of a run --------------------------------------------------------------------


LogStream = Literal["log", "stdout", "stderr"]


@dataclass(frozen=True)
class LogLine(Message):
    """A line a method logged (or its command printed); ``worker`` once relayed by the
    orchestrator."""

    line: str
    stream: LogStream = "log"
    worker: str | None = None
    kind: Literal["log"] = "log"


@dataclass(frozen=True)
class Dispatched(Message):
    worker: str
    dispatch_id: str
    kind: Literal["dispatched"] = "dispatched"


@dataclass(frozen=True)
class Redispatched(Message):
    worker: str
    reason: str
    kind: Literal["redispatch"] = "redispatch"


@dataclass(frozen=True)
class Queued(Message):
    """The step found no free matching worker and waits for one (``requirement`` as a phrase,
    ``detail`` when the target is known but cannot take it now)."""

    requirement: str
    queue_id: str
    detail: str | None = None
    kind: Literal["queued"] = "queued"


@dataclass(frozen=True)
class Started(Message):
    where: str
    kind: Literal["started"] = "started"


@dataclass(frozen=True)
class Dropped(Message):
    """Streamed events this caller missed because it was not reading fast enough."""

    count: int
    kind: Literal["dropped"] = "dropped"


@dataclass(frozen=True)
class Recorded(Message):
    """The step is recorded on the database several orchestrators share, as ``step_id``:
    should this orchestrator go, another answers for it (``model.method.follow``)."""

    step_id: str
    kind: Literal["recorded"] = "recorded"


@dataclass(frozen=True)
class Effects(Message):
    """From a worker, mid-dispatch: the method has had an effect outside the data plane (a
    command it ran has exited), so running it again would repeat that effect."""

    kind: Literal["effects"] = "effects"


@dataclass(frozen=True)
class Accepted(Message):
    """From a worker, mid-dispatch: it has taken the dispatch and is running it. A dispatch
    that ends quickly needs none (its answer says as much); one still running after a moment
    sends this once, and one that says nothing at all within a few heartbeats is taken back
    (``swamp.orchestrator.episode``)."""

    kind: Literal["accepted"] = "accepted"


@dataclass(frozen=True)
class StepEvent(Message):
    """A workflow run's step changed: ``what`` is started, queued, dispatched, redispatch, log,
    succeeded, failed or skipped; ``detail`` is the requirement, the reason or the error."""

    what: str
    job: str
    step: str
    run_id: str
    worker: str | None = None
    detail: str | None = None
    line: str | None = None
    stream: str | None = None
    kind: Literal["step"] = "step"


@dataclass(frozen=True)
class RunEvent(Message):
    """A workflow run (or one of its jobs) started or ended."""

    what: str  # started | finished | job_started | job_finished
    run_id: str
    workflow: str
    job: str | None = None
    status: str | None = None
    detail: str | None = None
    jobs: list[dict] = field(default_factory=list)  # with started: each job and its steps
    kind: Literal["run"] = "run"


#: Every event streamed during a run, one class per ``kind``: decoded once, by
#: :func:`decode_event`, and told apart by ``match`` on the class, never by ``kind``.
Event = (
    LogLine
    | Dispatched
    | Redispatched
    | Queued
    | Started
    | Dropped
    | Recorded
    | Effects
    | Accepted
    | StepEvent
    | RunEvent
)
_EVENTS: dict[object, type[Event]] = {
    "step": StepEvent,
    "run": RunEvent,
    "log": LogLine,
    "queued": Queued,
    "dispatched": Dispatched,
    "redispatch": Redispatched,
    "started": Started,
    "dropped": Dropped,
    "recorded": Recorded,
    "effects": Effects,
    "accepted": Accepted,
}


def decode_event(payload: object) -> Event:
    """The event a streamed payload is (``MalformedFrame`` if none): where it leaves the socket."""
    if not isinstance(payload, dict):
        raise MalformedFrame("event: expected an object")
    cls = _EVENTS.get(payload.get("kind"))
    if cls is None:
        raise MalformedFrame(f"event: unknown kind {str(payload.get('kind'))[:40]!r}")
    return cls.decode(payload)


# -- capabilities ----------------------------------------------------------------------------


@dataclass(frozen=True)
class QueryDataRequest(Message):
    """``capability.queryData``: a predicate over what the running dispatch may read."""

    dispatch_id: str
    predicate: str
    limit: int | None = None


@dataclass(frozen=True)
class QueryDataReply(Message):
    records: list[dict] = field(default_factory=list)


# -- admin -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PlacementSpec(Message):
    target: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    platform: str | None = None


@dataclass(frozen=True)
class TokenCreateRequest(Message):
    name: str
    duration: str
    max_enrollments: int | Literal["unlimited"] = 1
    labels: dict[str, str] = field(default_factory=dict)
    allow_labels: list[str] | None = None
    max_concurrency: int | None = None


@dataclass(frozen=True)
class TokenRevokeRequest(Message):
    name: str


@dataclass(frozen=True)
class WorkerListRequest(Message):
    all: bool = False


@dataclass(frozen=True)
class DataQueryRequest(Message):
    predicate: str
    all_versions: bool = False
    limit: int | None = None


@dataclass(frozen=True)
class MethodRunRequest(Message):
    model: str
    method: str
    args: dict = field(default_factory=dict)
    placement: PlacementSpec = field(default_factory=PlacementSpec)
    env: list[str] = field(default_factory=list)
    queue_timeout: str | None = None  # e.g. "5m"; "0" waits forever; absent: the server's
    timeout: str | None = None  # how long it may run on a worker, e.g. "30m"; absent: the model's
    priority: int = 0  # higher goes first among waiting steps (swamp.domain.priority)
    # the client can follow the step through another orchestrator: tell it the step's id (a
    # ``recorded`` event; on a shared database only)
    follow: bool = False


@dataclass(frozen=True)
class MethodFollowRequest(Message):
    """``model.method.follow``: the outcome of a step placed through any orchestrator of a
    shared database, by the id its ``recorded`` event gave; answered once it has one."""

    step_id: str


@dataclass(frozen=True)
class WorkerDrainRequest(Message):
    """``worker.drain.ask``: ask a connected worker to drain, as SIGTERM on its machine would:
    it takes no new step, finishes the ones it runs, then exits 0."""

    name: str


@dataclass(frozen=True)
class WorkerDrainReply(Message):
    name: str
    running: int  # its steps still running, which it finishes before it leaves
    already: bool = False  # it was draining already: nothing changed


@dataclass(frozen=True)
class VerifyRequest(Message):
    name: str | None = None
    labels: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Empty(Message):
    """A request without parameters."""


@dataclass(frozen=True)
class WorkflowRequest(Message):
    """A workflow by name (``None``: all of them, where that makes sense)."""

    name: str | None = None


@dataclass(frozen=True)
class WorkflowRunRequest(Message):
    name: str
    inputs: dict = field(default_factory=dict)
    timeout: str | None = None  # the whole run, e.g. 30m
    priority: int | None = None  # as the workflow's own priority = N (its jobs' and steps' win)


@dataclass(frozen=True)
class RunRef(Message):
    """A workflow run by its id (or a unique prefix of it); with ``offset``, its steps from
    that one on (the next page of a run larger than one frame holds); with ``step``
    (``JOB.STEP``), one running step of it (``workflow cancel --step``)."""

    run: str
    reason: str | None = None
    offset: int | None = None
    step: str | None = None


@dataclass(frozen=True)
class WorkflowRunReply(Message):
    """A run as recorded (``swamp/workflow-run``): status, inputs, each job and step — as many
    steps as fit in about :data:`~swamp.domain.run_record.PAGE_BYTES`; ``next_offset`` says
    where the rest start (ask ``workflow.history.get`` with it)."""

    run: dict
    next_offset: int | None = None


@dataclass(frozen=True)
class WorkflowListReply(Message):
    workflows: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class WorkflowValidateReply(Message):
    workflows: list[dict] = field(default_factory=list)  # {name, problems: [{place, message…}]}
    passed: bool = True


@dataclass(frozen=True)
class WorkflowShowReply(Message):
    workflow: dict
    problems: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class WorkflowHistoryReply(Message):
    runs: list[dict] = field(default_factory=list)


@dataclass(frozen=True)
class QueueItem(Message):
    """A step waiting for a worker (``swamp worker queue``)."""

    queue_id: str
    requirement: str
    model_type: str
    method_name: str
    queued_at: str
    age_ms: int
    model_name: str | None = None
    placement: PlacementSpec = field(default_factory=PlacementSpec)
    workflow_name: str | None = None
    job_name: str | None = None
    step_name: str | None = None
    priority: int = 0  # as given (swamp.domain.priority)
    effective_priority: int | None = None  # raised by waiting (live only: serve's aging)
    submitter: str | None = None  # who asked: local, token:NAME, anyone


@dataclass(frozen=True)
class QueueSummary(Message):
    """Demand against supply for one requirement."""

    requirement: str
    waiting: int
    oldest_wait_ms: int
    connected: int  # schedulable workers that match
    free_slots: int


@dataclass(frozen=True)
class QueueReply(Message):
    items: list[QueueItem] = field(default_factory=list)
    summary: list[QueueSummary] = field(default_factory=list)


@dataclass(frozen=True)
class LogsRequest(Message):
    """``logs.read``: a page of stored output. ``ref`` is RUN, RUN/STEP or DISPATCH (an id or
    a prefix of one); ``log`` narrows it to one of its logs; ``after`` is the cursor (the
    last chunk id read); ``wait``: seconds to wait for more when there is none yet and the
    run or dispatch is live (``--follow``; at most a minute)."""

    ref: str
    log: str | None = None
    after: int = 0
    wait: float = 0
    chunks: bool = True  # False: the logs only, no lines


@dataclass(frozen=True)
class LogItem(Message):
    """One log: a dispatch's output (a step dispatched again has one per attempt)."""

    id: str
    model_type: str
    model_name: str
    method: str
    attempt: int
    started_at: str
    lines: int  # every line it printed
    bytes: int
    dropped_lines: int  # the oldest, past the cap
    dropped_bytes: int
    live: bool
    run_id: str | None = None
    workflow: str | None = None
    job: str | None = None
    step: str | None = None
    worker: str | None = None
    ended_at: str | None = None


@dataclass(frozen=True)
class LogChunkItem(Message):
    """Lines of one log, in order; ``first`` and ``first_byte`` place them in its whole
    output (a gap before them is lines dropped); ``streams``: a character per line, o
    (stdout), e (stderr) or l (a method's log)."""

    id: int
    log: str
    first: int
    first_byte: int
    size: int  # bytes of its lines, newlines included
    streams: str
    lines: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class LogsPage(Message):
    """A page of ``logs.read``: chunks after the cursor, the logs they are of (not every log
    of a run: a 10,000-step run's list would not fit in a frame), the next cursor; ``more``:
    stored chunks remain past this page; ``live``: more may come (the run or the dispatch is
    running in the orchestrator that answered); ``log_count``/``open_logs``: how many logs
    the ref has, and how many of them are still being written."""

    kind: Literal["run", "dispatch"]
    id: str
    cursor: int
    more: bool
    live: bool
    cap_bytes: int
    logs: list[LogItem] = field(default_factory=list)
    chunks: list[LogChunkItem] = field(default_factory=list)
    status: str | None = None  # the run's (kind run)
    workflow: str | None = None
    log_count: int = 0
    open_logs: int = 0


#: The payload of each request method (what ``IncomingCall.params`` must decode as).
REQUESTS: dict[str, type[Message]] = {
    "worker.enroll": EnrollRequest,
    "worker.dispatch": DispatchRequest,
    "capability.queryData": QueryDataRequest,
    "worker.drain": DrainRequest,
    "server.info": Empty,
    "ui.login": Empty,
    "worker.list": WorkerListRequest,
    "worker.token.create": TokenCreateRequest,
    "worker.token.list": Empty,
    "worker.token.revoke": TokenRevokeRequest,
    "model.method.run": MethodRunRequest,
    "model.method.follow": MethodFollowRequest,
    "data.query": DataQueryRequest,
    "worker.verify": VerifyRequest,
    "worker.queue.list": Empty,
    "worker.drain.ask": WorkerDrainRequest,
    "drain.ask": Empty,  # orchestrator → worker: begin your drain
    "workflow.list": Empty,
    "workflow.show": WorkflowRequest,
    "workflow.validate": WorkflowRequest,
    "workflow.run": WorkflowRunRequest,
    "workflow.history": WorkflowRequest,
    "workflow.history.get": RunRef,
    "workflow.cancel": RunRef,
    "logs.read": LogsRequest,
}


# -- admin replies -----------------------------------------------------------------------------


@dataclass(frozen=True)
class BindingItem(Message):
    machine_id: str
    worker_name: str
    enrolled_at: str


@dataclass(frozen=True)
class TokenItem(Message):
    """An enrollment token as listed; ``token`` (the credential) only in the reply to a create,
    ``already_revoked`` only in the reply to a revoke."""

    name: str
    state: str
    created_at: str
    expires_at: str
    max_enrollments: int | Literal["unlimited"]
    enrollments: int
    stored_state: str | None = None
    bindings: list[BindingItem] = field(default_factory=list)
    revoked_at: str | None = None
    pinned_labels: dict[str, str] | None = None
    allowed_label_keys: list[str] | None = None
    max_concurrency: int | None = None
    token: str | None = None
    already_revoked: bool | None = None
    ca_pin: str | None = None  # in the reply to a create: the CA its machines pin, if any


@dataclass(frozen=True)
class TokenListReply(Message):
    tokens: list[TokenItem] = field(default_factory=list)


@dataclass(frozen=True)
class WorkerItem(Message):
    """A worker as listed: its record, with the live pool's view when a server answers."""

    name: str
    status: str
    capacity: int = 1
    labels: dict[str, str] = field(default_factory=dict)
    platform: str = "?"
    arch: str = "?"
    active_dispatch_ids: list[str] = field(default_factory=list)
    last_seen_at: str | None = None
    enrolled_at: str | None = None
    instance_id: str | None = None
    token_name: str | None = None
    swamp_version: str | None = None
    disconnected_at: str | None = None
    disconnect_reason: str | None = None
    verify_failure_reason: str | None = None
    drain_reason: str | None = None
    unresponsive_reason: str | None = None
    orchestrator: str | None = None  # the URL of the one holding its socket (a shared database)


@dataclass(frozen=True)
class WorkerListReply(Message):
    workers: list[WorkerItem] = field(default_factory=list)
    count: int = 0
    hidden_disconnected: int = 0
    orchestrator_version: str | None = None


@dataclass(frozen=True)
class SeamResult(Message):
    ok: bool
    detail: str = ""


@dataclass(frozen=True)
class Verdict(Message):
    """One worker's verification: ``pass``, ``fail`` (a seam broke) or ``error`` (no verdict)."""

    name: str
    status: Literal["pass", "fail", "error"]
    platform: str | None = None
    arch: str | None = None
    seams: dict[str, SeamResult] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def reason(self) -> str:
        if self.status == "error":
            return self.error or "the probe gave no verdict"
        return "; ".join(self.failures) or "the probe failed"


@dataclass(frozen=True)
class VerifyReport(Message):
    workers: list[Verdict] = field(default_factory=list)
    total: int = 0
    passed: int = 0
    failed: int = 0
    errors: int = 0


@dataclass(frozen=True)
class RecordItem(Message):
    """One version of one data item."""

    model_type: str
    model_name: str
    name: str
    version: int
    spec: str
    created_at: str
    size: int = 0
    attributes: dict = field(default_factory=dict)


@dataclass(frozen=True)
class QueryReply(Message):
    records: list[RecordItem] = field(default_factory=list)


@dataclass(frozen=True)
class ServerTokenItem(Message):
    """An admin server token as listed (``token``, the credential, only when created);
    ``scope``: ``metrics``, ``read`` or ``admin`` (``swamp.domain.scopes``)."""

    name: str
    state: str
    created_at: str
    scope: str = "admin"
    revoked_at: str | None = None
    token: str | None = None


@dataclass(frozen=True)
class ServerTokenListReply(Message):
    tokens: list[ServerTokenItem] = field(default_factory=list)


@dataclass(frozen=True)
class NameRequest(Message):
    name: str


@dataclass(frozen=True)
class ServerTokenCreateRequest(Message):
    name: str
    scope: str = "admin"


# (their requests, defined above: the orchestrator's own machine only, swamp.protocol.admin)
REQUESTS.update(
    {
        "server.token.create": ServerTokenCreateRequest,
        "server.token.list": Empty,
        "server.token.revoke": NameRequest,
    }
)
