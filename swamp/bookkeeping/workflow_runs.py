"""Workflow runs (``swamp/workflow-run``): one item per run, a version at every transition.

The model name is the workflow's name, the item ``run-<id>``; the attributes are the whole run —
inputs, status, each job and step with its status, worker, queue wait, error and times — so a
crash loses no step that had finished, and ``swamp data query`` reads runs like any data.
"""

from __future__ import annotations

import time

from swamp.bookkeeping.records import collect_ended, decoded, has_fields
from swamp.domain.run_record import RunRecord, Status
from swamp.errors import NotFound, UserError
from swamp.models.builtin import WORKFLOW_RUN
from swamp.store.datastore import Datastore, Key, Record, iso

TYPE = WORKFLOW_RUN.type
POLICY = WORKFLOW_RUN.resources[0].policy
INTERRUPTED = "interrupted: orchestrator restart"
_RUN_FIELDS = has_fields("runId", "workflow", "status", "startedAt")


def key(workflow: str, run_id: str) -> Key:
    return Key(TYPE, workflow, f"run-{run_id}")


class RunBook:
    def __init__(self, store: Datastore, *, clock=time.time) -> None:
        self.store = store
        self.clock = clock

    def save(self, run: RunRecord) -> Record:
        return self.store.write(key(run.workflow, run.run_id), run.to_json(), policy=POLICY)

    def all(self, workflow: str | None = None) -> list[RunRecord]:
        """Runs, newest first."""
        runs = list(
            decoded(
                self.store.latest_of_type(TYPE, model_name=workflow),
                lambda record: RunRecord.from_json(_RUN_FIELDS(record)),
            )
        )
        runs.sort(key=lambda r: r.started_at, reverse=True)
        return runs

    def get(self, ref: str) -> RunRecord:
        """A run by its id or an unambiguous prefix of it (at least 4 characters)."""
        if len(ref) < 4:
            raise UserError(f"a run id prefix needs at least 4 characters, got {ref!r}")
        found = [r for r in self.all() if r.run_id.startswith(ref)]
        if not found:
            raise NotFound(f"no workflow run {ref!r}: see 'swamp workflow history'")
        if len(found) > 1:
            ids = ", ".join(r.run_id[:12] for r in found[:5])
            raise UserError(f"run id {ref!r} is ambiguous ({ids}…): give more of it")
        return found[0]

    def reconcile(self) -> int:
        """Boot: a run the previous orchestrator left running ended with it."""
        now = iso(self.clock())
        count = 0
        for run in self.all():
            if run.status != Status.RUNNING:
                continue
            for job in run.jobs:
                for step in job.steps:
                    if step.status == Status.RUNNING:
                        step.status, step.error, step.ended_at = Status.FAILED, INTERRUPTED, now
                if job.status == Status.RUNNING:
                    job.status, job.ended_at = Status.FAILED, now
            run.status, run.error, run.ended_at = Status.FAILED, INTERRUPTED, now
            self.save(run)
            count += 1
        return count

    def collect(self, *, older_than_seconds: float) -> int:
        cutoff = iso(self.clock() - older_than_seconds)
        total = 0
        for workflow in {r.workflow for r in self.all()}:
            total += collect_ended(self.store, TYPE, workflow, open_state="running", cutoff=cutoff)
        return total
