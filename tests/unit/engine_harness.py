"""The workflow engine in-process: a real repo and SQLite store, and workers that are objects.

The workers sit behind the engine's own seam, :class:`~swamp.workflows.engine.Host`: a step is
given to a worker (its target, else the first one with the labels it asks for, as the queue
would), which says it was dispatched, runs the model's method in this process against the real
store (as a CLI on a repo does), and ends — unless the test scripted it to fail, or holds it
until the test lets it go. ``workers.connected()`` answers from the same fleet. Nothing waits on
time: a test waits on a step having started (:meth:`Fleet.started`) and releases it by an event.
"""

from __future__ import annotations

import os
import textwrap
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import trio

from swamp.orchestrator.dispatch import RunRequest, run_here
from swamp.plugins import default_registry
from swamp.protocol.messages import Dispatched, RunResult
from swamp.repo import Repo
from swamp.store.datastore import Datastore
from swamp.store.records import SqliteRecords
from swamp.workflows.engine import Emit, Engine, Host, check_inputs
from swamp.workflows.loader import Workflows


@dataclass
class Worker:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    capacity: int = 4
    active: set[str] = field(default_factory=set)  # the steps it runs now

    def view(self) -> dict:
        """What ``workers.connected()`` says of it."""
        return {
            "name": self.name,
            "labels": dict(self.labels),
            "platform": "linux",
            "arch": "x86_64",
            "capacity": self.capacity,
            "freeSlots": self.capacity - len(self.active),
            "status": "idle" if not self.active else "busy",
        }


@dataclass
class Dispatch:
    step: str
    worker: str
    args: dict


class Fleet:
    """In-process workers, and the script of how steps end (by step name, as expanded)."""

    def __init__(self, store: Datastore, *workers: Worker) -> None:
        self.store = store
        self.registry = default_registry()
        self.workers = {w.name: w for w in workers}
        self.failing: dict[str, str] = {}  # step → its error
        self.held: dict[str, trio.Event] = {}  # step → the event that lets it end
        self.dispatches: list[Dispatch] = []
        self._started: dict[str, trio.Event] = {}

    def fail(self, step: str, error: str) -> None:
        self.failing[step] = error

    def hold(self, step: str) -> trio.Event:
        """Keep ``step`` running until the returned event is set."""
        self.held[step] = trio.Event()
        return self.held[step]

    async def started(self, step: str) -> Dispatch:
        """Wait until ``step`` has been dispatched."""
        await self._event(step).wait()
        return next(d for d in self.dispatches if d.step == step)

    def running(self) -> dict[str, set[str]]:
        return {w.name: set(w.active) for w in self.workers.values() if w.active}

    def connected(self, selector: dict) -> list[dict]:
        return [
            w.view()
            for w in sorted(self.workers.values(), key=lambda w: w.name)
            if all(w.labels.get(k) == str(v) for k, v in selector.items())
        ]

    def _event(self, step: str) -> trio.Event:
        return self._started.setdefault(step, trio.Event())

    def _choose(self, request: RunRequest) -> Worker:
        placement = request.placement
        if placement.target is not None:
            return self.workers[placement.target]
        for worker in self.workers.values():
            if all(worker.labels.get(k) == v for k, v in placement.labels.items()):
                return worker
        raise AssertionError(f"no worker for {placement.describe()}")  # the test's own mistake

    async def run_step(self, request: RunRequest, emit: Emit) -> RunResult:
        step = request.step or request.method
        worker = self._choose(request)
        dispatch_id = uuid.uuid4().hex
        worker.active.add(step)
        self.dispatches.append(Dispatch(step, worker.name, dict(request.args)))
        try:
            await emit(Dispatched(worker=worker.name, dispatch_id=dispatch_id).to_json())
            self._event(step).set()
            if step in self.held:
                await self.held[step].wait()
            if step in self.failing:
                return RunResult(
                    status="failed",
                    model=request.model.name,
                    model_type=request.model.type,
                    method=request.method,
                    worker=worker.name,
                    dispatch_id=dispatch_id,
                    error=self.failing[step],
                )
            model_type = self.registry.runnable(request.model.type)
            args = model_type.method(request.method).validate(
                {**request.model.args, **request.args}
            )
            outcome = await run_here(
                SqliteRecords(self.store), model_type, request, args, emit, env=dict(os.environ)
            )
            result = RunResult(
                status=outcome.status,
                model=request.model.name,
                model_type=model_type.type,
                method=request.method,
                outputs=outcome.outputs,
                error=outcome.error,
                result=outcome.result,
            )
            return replace(result, worker=worker.name, dispatch_id=dispatch_id)
        finally:
            worker.active.discard(step)


@dataclass
class Rig:
    """A repo, its store, the engine over them and the fleet behind its seam."""

    repo: Repo
    store: Datastore
    fleet: Fleet
    engine: Engine
    events: list[dict] = field(default_factory=list)

    def workflow(self, name: str, toml: str) -> None:
        path = self.repo.root / "workflows" / f"{name}.toml"
        path.write_text(textwrap.dedent(toml))

    async def run(self, name: str, inputs: dict | None = None) -> dict:
        """Run workflow ``name`` to its end; its record as the store keeps it (JSON)."""
        workflow = self.engine.workflows.checked(name)
        record = await self.engine.run(workflow, check_inputs(workflow, inputs or {}), self.emit)
        assert await self.engine.runs.get(record.run_id) == record  # saved as it ended
        return record.to_json()

    async def emit(self, event: dict) -> None:
        self.events.append(event)

    def steps(self, record: dict, job: str | None = None) -> dict[str, dict]:
        return {
            s["name"]: s
            for j in record["jobs"]
            if job is None or j["name"] == job
            for s in j["steps"]
        }

    def said(self, what: str) -> list[tuple[str, str]]:
        """(job, step) of every step event ``what``, in order."""
        return [
            (e["job"], e["step"])
            for e in self.events
            if e.get("kind") == "step" and e["what"] == what
        ]


@asynccontextmanager
async def open_rig(root: Path, *workers: Worker) -> AsyncIterator[Rig]:
    repo, _ = Repo.init(root / "repo")
    store = repo.open_store()
    try:
        fleet = Fleet(store, *workers)
        host = Host(run_step=fleet.run_step, workers_connected=fleet.connected)
        engine = Engine(Workflows(repo, fleet.registry), SqliteRecords(store), host)
        yield Rig(repo, store, fleet, engine)
    finally:
        store.close()
