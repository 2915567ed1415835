"""A workflow run as recorded: typed inside, a JSON object on the wire, step by step on disk.

The engine changes these values as the run goes; :meth:`RunRecord.to_json` is the whole tree
``workflow run`` and ``workflow history get`` answer, and :meth:`RunRecord.from_json` reads one
back — from this version or an older one: a key this code does not know is kept as it was
(``extra``) and written back unchanged, so nothing a record holds is lost when a restart marks
it failed. Wire names are camelCase; a field that is ``None`` is not written.

On disk a run is stored apart from its steps (:func:`header_json`, :func:`step_json`): a small
header (``swamp/workflow-run``: the run, its jobs and how many steps of each job are in each
status) and one record per step (``swamp/workflow-step``), so that writing a step costs the
same at the 10,000th as at the first and the header never grows with the steps. Earlier
versions stored the whole tree in the header at every transition; :func:`assemble` reads both.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

#: The header's ``layout`` when its steps are records of their own (absent: the whole tree)
STEPS_APART = 2
#: About how many bytes of steps one reply carries (a frame holds 4 MiB, and a 10,000-way
#: fan-out's steps take about 3 MB; a smaller page is a shorter stall where it is encoded)
PAGE_BYTES = 1024 * 1024


class Status(str, Enum):
    """Of a run, a job or a step. Jobs and steps are ``pending`` → ``running`` → ``succeeded`` |
    ``failed`` | ``skipped`` (``cancelled`` with their run); a run is ``running`` → ``succeeded``
    | ``failed`` | ``cancelled``. A ``str`` enum: it is its wire value, in JSON and in
    comparisons."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    SKIPPED = "skipped"
    CANCELLED = "cancelled"

    def __str__(self) -> str:  # as the plain string it was (f-strings, messages)
        return self.value


def _status(value: object) -> Status | str:
    """A recorded status: one of :class:`Status`, or the text an unknown one was."""
    try:
        return Status(value)
    except ValueError:
        return str(value)


# wire name → attribute, in the order they are written (the order a step fills them in)
_STEP_FIELDS = {
    "name": "name",
    "status": "status",
    "template": "template",
    "startedAt": "started_at",
    "model": "model",
    "modelType": "model_type",
    "method": "method",
    "requirement": "requirement",
    "queuedAt": "queued_at",
    "worker": "worker",
    "dispatchId": "dispatch_id",
    "queuedMs": "queued_ms",
    "childRunId": "child_run_id",
    "logTail": "log_tail",
    "allowedFailure": "allowed_failure",
    "endedAt": "ended_at",
    "reason": "reason",
    "error": "error",
}
_JOB_FIELDS = {
    "name": "name",
    "status": "status",
    "steps": "steps",
    "startedAt": "started_at",
    "endedAt": "ended_at",
    "reason": "reason",
    "error": "error",
}
_RUN_FIELDS = {
    "runId": "run_id",
    "workflow": "workflow",
    "status": "status",
    "inputs": "inputs",
    "startedAt": "started_at",
    "jobs": "jobs",
    "endedAt": "ended_at",
    "error": "error",
}


def _out(value: object, fields: dict[str, str], extra: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, name in fields.items():
        item = getattr(value, name)
        if item is None:
            continue
        out[key] = item.value if isinstance(item, Status) else item
    out.update((k, v) for k, v in extra.items() if k not in out)
    return out


def _extra(raw: dict[str, Any], fields: dict[str, str]) -> dict[str, Any]:
    return {k: v for k, v in raw.items() if k not in fields}


@dataclass(slots=True)
class StepRecord:
    """One step of a job (one expansion of a ``forEach`` step, ``template`` its step).
    ``seq`` is where it is stored (its place in the run, in the order steps were made); not
    part of the step's value."""

    name: str
    status: Status | str = Status.PENDING
    template: str | None = None
    started_at: str | None = None
    model: str | None = None
    model_type: str | None = None
    method: str | None = None
    requirement: str | None = None
    queued_at: str | None = None
    worker: str | None = None
    dispatch_id: str | None = None
    queued_ms: int | None = None
    child_run_id: str | None = None
    log_tail: list[str] | None = None
    allowed_failure: bool | None = None
    ended_at: str | None = None
    reason: str | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    seq: int = field(default=-1, compare=False, repr=False)

    def to_json(self) -> dict[str, Any]:
        return _out(self, _STEP_FIELDS, self.extra)

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> StepRecord:
        known = {a: raw[k] for k, a in _STEP_FIELDS.items() if k in raw}
        known["status"] = _status(raw.get("status", "pending"))
        return cls(**known, extra=_extra(raw, _STEP_FIELDS))


@dataclass
class JobRecord:
    name: str
    status: Status | str = Status.PENDING
    steps: list[StepRecord] = field(default_factory=list)
    started_at: str | None = None
    ended_at: str | None = None
    reason: str | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = _out(self, _JOB_FIELDS, self.extra)
        out["steps"] = [s.to_json() for s in self.steps]  # an empty list too
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> JobRecord:
        known = {a: raw[k] for k, a in _JOB_FIELDS.items() if k in raw}
        known["status"] = _status(raw.get("status", "pending"))
        steps = raw.get("steps")
        known["steps"] = (
            [StepRecord.from_json(s) for s in steps if isinstance(s, dict)]
            if isinstance(steps, list)
            else []
        )
        return cls(**known, extra=_extra(raw, _JOB_FIELDS))


@dataclass
class RunRecord:
    run_id: str
    workflow: str
    started_at: str
    status: Status | str = Status.RUNNING
    inputs: dict[str, Any] = field(default_factory=dict)
    jobs: list[JobRecord] = field(default_factory=list)
    ended_at: str | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out = _out(self, _RUN_FIELDS, self.extra)
        out["jobs"] = [j.to_json() for j in self.jobs]  # an empty list too
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> RunRecord:
        """A record as saved (by this version or an older one); ``raw`` has at least
        ``runId``, ``workflow``, ``status`` and ``startedAt`` (``RunBook`` checks)."""
        known = {a: raw[k] for k, a in _RUN_FIELDS.items() if k in raw}
        known["status"] = _status(raw.get("status"))
        jobs = raw.get("jobs")
        known["jobs"] = (
            [JobRecord.from_json(j) for j in jobs if isinstance(j, dict)]
            if isinstance(jobs, list)
            else []
        )
        return cls(**known, extra=_extra(raw, _RUN_FIELDS))


# -- stored step by step -------------------------------------------------------------------------

_JOB_HEADER = {k: v for k, v in _JOB_FIELDS.items() if k != "steps"}
_RUN_HEADER = {k: v for k, v in _RUN_FIELDS.items() if k != "jobs"}
_STEP_PLACE = ("runId", "job", "seq")  # what a stored step adds to the step's own fields


def header_json(run: RunRecord, counts: Mapping[str, Mapping[str, int]]) -> dict[str, Any]:
    """The run's header: the run and its jobs without their steps; ``counts`` (job → status →
    steps) says how many of each job's steps are in each status."""
    out = _out(run, _RUN_HEADER, run.extra)
    out["layout"] = STEPS_APART
    out["jobs"] = [
        {**_out(job, _JOB_HEADER, job.extra), "stepCounts": dict(counts.get(job.name, {}))}
        for job in run.jobs
    ]
    return out


def step_json(run_id: str, job: str, step: StepRecord) -> dict[str, Any]:
    """One step as stored: its own fields, and where it belongs (run, job, place)."""
    return {**step.to_json(), "runId": run_id, "job": job, "seq": step.seq}


def assemble(header: Mapping[str, Any], steps: Iterable[Mapping[str, Any]]) -> RunRecord:
    """The whole run from its header and its stored steps (any order); a header of an earlier
    version holds its steps itself, and ``steps`` is then empty. A stored step that names no
    job of the header, or no place, is left out."""
    if header.get("layout") != STEPS_APART:
        return RunRecord.from_json(dict(header))
    raw = {k: v for k, v in header.items() if k != "layout"}
    jobs = raw.get("jobs")
    raw["jobs"] = [
        {k: v for k, v in j.items() if k != "stepCounts"}
        for j in (jobs if isinstance(jobs, list) else [])
        if isinstance(j, dict)
    ]
    run = RunRecord.from_json(raw)
    by_job = {j.name: j for j in run.jobs}
    placed = [s for s in steps if isinstance(s.get("seq"), int) and s.get("job") in by_job]
    placed.sort(key=lambda s: s["seq"])
    for stored in placed:
        step = StepRecord.from_json({k: v for k, v in stored.items() if k not in _STEP_PLACE})
        step.seq = stored["seq"]
        by_job[stored["job"]].steps.append(step)
    return run


def step_counts(header: Mapping[str, Any]) -> Counter[str]:
    """How many steps a stored run has in each status, from its header alone (either
    layout)."""
    total: Counter[str] = Counter()
    for job in header.get("jobs") or []:
        if not isinstance(job, dict):
            continue
        counts = job.get("stepCounts")
        if isinstance(counts, dict):
            total.update({str(k): v for k, v in counts.items() if isinstance(v, int)})
            continue
        for step in job.get("steps") or []:
            if isinstance(step, dict):
                total[str(step.get("status", "pending"))] += 1
    return total


# -- in pages ------------------------------------------------------------------------------------

_COMPACT = json.JSONEncoder(separators=(",", ":"))


def page(run: RunRecord, offset: int, budget: int = PAGE_BYTES) -> tuple[dict, int | None]:
    """The run as JSON with its steps from place ``offset`` on, in the order they were made,
    as many as fit in ``budget`` bytes of JSON (one at least), each under its job; and the
    place the next page starts at (``None``: this is the last). A step's place is its
    ``seq``; a run stored whole by an earlier version has none, and its steps are placed as
    they are listed, job by job."""
    placed = [
        (step.seq if step.seq >= 0 else index, job.name, step)
        for index, (job, step) in enumerate((j, s) for j in run.jobs for s in j.steps)
    ]
    placed.sort(key=lambda entry: entry[0])
    shown: dict[str, list[dict]] = {}
    used, more = 0, None
    for place, job_name, step in placed:
        if place < offset:
            continue
        data = step.to_json()
        size = len(_COMPACT.encode(data)) + 1
        if used and used + size > budget:
            more = place
            break
        shown.setdefault(job_name, []).append(data)
        used += size
    out = _out(run, _RUN_HEADER, run.extra)
    out["jobs"] = [
        {**_out(job, _JOB_HEADER, job.extra), "steps": shown.get(job.name, [])} for job in run.jobs
    ]
    return out, more


def merge_page(run: dict, more: Mapping[str, Any]) -> None:
    """Add the steps of a later page of ``run`` to it, job by job."""
    by_name = {j["name"]: j for j in run.get("jobs") or []}
    for job in more.get("jobs") or []:
        if job.get("name") in by_name:
            by_name[job["name"]].setdefault("steps", []).extend(job.get("steps") or [])
