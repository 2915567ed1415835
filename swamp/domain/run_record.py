"""A workflow run as recorded (``swamp/workflow-run``): typed inside, a JSON object on disk
and on the wire.

The engine changes these values as the run goes; :meth:`RunRecord.to_json` is what is saved at
every transition and what ``workflow run`` and ``workflow history get`` answer, and
:meth:`RunRecord.from_json` reads it back — from this version or an older one: a key this
code does not know is kept as it was (``extra``) and written back unchanged, so nothing a
record holds is lost when a restart marks it failed. Wire names are camelCase; a field that is
``None`` is not written.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any


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


@dataclass
class StepRecord:
    """One step of a job (one expansion of a ``forEach`` step, ``template`` its step)."""

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
