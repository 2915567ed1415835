"""The dispatches a worker runs live beside its connections, not inside one.

Each dispatch runs as a task of the worker's own (:class:`Runs`); the session that accepted it
*links* it to the call that asked for it — its events go there, its answer is that call's, its
calls home go through that session's socket and data plane. When the socket is lost and the
orchestrator said it adopts carried runs (``swamp.domain.carrying``), the session does not stop
what runs: it *carries* it until :func:`~swamp.domain.carrying.carry_until`. Meanwhile its
events are kept (bounded) and its calls home wait; the next orchestrator that enrolls the
worker lists it, and either adopts it (``worker.adopt``: linked again, the events kept go
first) or stops it. Past the deadline nobody adopted it, it is stopped: by then the lease rules
may run the step elsewhere.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import httpx
import trio

from swamp.errors import ChannelClosed, SwampError, WorkerStopped
from swamp.models.context import Command
from swamp.protocol.messages import Effects, LogLine
from swamp.protocol.rpc import IncomingCall

MAX_KEPT_EVENTS = 1000  # events of a carried run kept for its next link; the rest are counted
CARRY_ENDED = "its orchestrator went away and no other took the run over in time"


@dataclass(frozen=True)
class Link:
    """Where a run's events, answer and calls home go: one session's call and data plane."""

    call: IncomingCall
    http: httpx.AsyncClient
    data_plane: str
    credential: str

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.credential}"}


class Run:
    """One dispatch running on this worker, linked to a session or carried."""

    def __init__(self, dispatch_id: str, *, takes_slot: bool = True) -> None:
        self.id = dispatch_id
        self.takes_slot = takes_slot
        self.scope = trio.CancelScope()
        self.done = trio.Event()
        self.reply: dict | None = None
        self.error: Exception | None = None
        self.stopped: SwampError | None = None  # why it was stopped from this side
        self.link: Link | None = None
        self._linked = trio.Event()
        self._unlinked = trio.Event()  # set when the link of the moment goes
        self.carry_until = math.inf  # trio time; finite while carried
        self._kept: deque[dict] = deque()
        self.dropped = 0  # events of a carried run past the bound
        self.had_effects = False  # ever: told again first whenever it is linked again
        self.commands: set[Command] = set()  # its method's commands running now

    def __repr__(self) -> str:
        state = "done" if self.done.is_set() else "linked" if self.link else "carried"
        return f"<Run {self.id[:12]} {state}>"

    @property
    def carried(self) -> bool:
        """Carried, and still to be adopted (not stopped, not ended)."""
        return self.link is None and not self.done.is_set() and self.stopped is None

    def attach(self, link: Link) -> list[dict]:
        """Link it to ``link``; what it said while carried, to send there first."""
        if self.link is None:
            for command in list(self.commands):
                command.pause(False)
        self.link = link
        self.carry_until = math.inf
        self._linked.set()
        self._unlinked = trio.Event()
        kept: list[dict] = []
        if self.had_effects:  # (the last orchestrator may have died before it wrote it down)
            kept.append(Effects().to_json())
        kept.extend(self._kept)
        if self.dropped:
            said = f"[{self.dropped} line(s) printed while the worker moved were not kept]"
            kept.append(LogLine(line=said).to_json())
        self._kept.clear()
        self.dropped = 0
        return kept

    def detach(self, until: float) -> None:
        """Carry it until ``until`` (trio time), its commands paused: until one adopts it,
        nothing it runs can have an effect — not adopted, it is as if stopped right now."""
        for command in list(self.commands):
            command.pause(True)
        self.link = None
        self.carry_until = until
        self._linked = trio.Event()
        self._unlinked.set()

    def stop(self, why: SwampError) -> None:
        if self.stopped is None:
            self.stopped = why
        self.scope.cancel()

    async def emit(self, event: dict) -> None:
        """An event of the method's: to its link, or kept while carried."""
        if event.get("kind") == "effects":
            self.had_effects = True
        link = self.link
        if link is not None:
            try:
                await link.call.emit(event)
                return
            except ChannelClosed:  # the socket is going: kept, should it be carried
                if self.link is not link:
                    return
        if event.get("kind") == "effects":
            return  # (sent first when linked again: had_effects)
        if len(self._kept) < MAX_KEPT_EVENTS:
            self._kept.append(event)
        else:
            self.dropped += 1

    async def unlinked(self, link: Link) -> None:
        """Until ``link`` is no longer the run's (its socket closed: the session carries the
        run, or stops it — then this is cancelled with the run)."""
        while self.link is link:
            await self._unlinked.wait()

    async def linked(self) -> Link:
        """Its link, once it has one (a call home waits while the run is carried)."""
        while self.link is None:
            await self._linked.wait()
        return self.link


class Runs:
    """Every dispatch this worker runs, in a nursery that outlives each connection."""

    def __init__(self) -> None:
        self.runs: dict[str, Run] = {}
        self.active = 0  # dispatches running (carried ones included)
        self.completed = 0
        self.idle = trio.Event()  # set while none runs
        self.idle.set()
        self.on_change: Callable[[], None] = lambda: None  # the session of the moment's
        self._nursery: trio.Nursery | None = None
        self._carrying = trio.Event()

    def __repr__(self) -> str:
        return f"<Runs active={self.active} carried={len(self.carried())}>"

    async def serve(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            nursery.start_soon(self._end_carries)
            task_status.started()
            await trio.sleep_forever()

    def begin(self, run: Run) -> None:
        """Count ``run`` in (then :meth:`start` or :meth:`run_here` runs it)."""
        if self.active == 0:
            self.idle = trio.Event()
        self.active += 1
        self.runs[run.id] = run

    def start(self, run: Run, body: Callable[[], Awaitable[None]]) -> None:
        """Run ``body`` as ``run`` in this nursery, where it can outlive the session (its
        answer and error are the body's to set)."""
        assert self._nursery is not None, "Runs.serve runs first"

        async def task() -> None:
            try:
                with run.scope:
                    await body()
            finally:
                self._end(run)

        self._nursery.start_soon(task)

    async def run_here(self, run: Run, body: Callable[[], Awaitable[None]]) -> None:
        """Run ``body`` as ``run`` in the caller's task: a run that is never carried (its
        orchestrator adopts none, as on a database of its own) costs no task of its own."""
        try:
            with run.scope:
                await body()
        finally:
            self._end(run)

    def _end(self, run: Run) -> None:
        self.runs.pop(run.id, None)
        run.done.set()
        self.active -= 1
        if self.active == 0:
            self.idle.set()
        self.on_change()

    def carried(self) -> list[Run]:
        return [run for run in self.runs.values() if run.carried]

    def carry(self, run: Run, until: float) -> None:
        run.detach(until)
        self._carrying.set()

    def stop_all(self, why: SwampError) -> int:
        """Stop every run (linked or carried); how many."""
        for run in list(self.runs.values()):
            run.stop(why)
        return len(self.runs)

    async def _end_carries(self) -> None:
        """Stop each carried run at its deadline (one timer for all)."""
        while True:
            self._carrying = trio.Event()
            carried = self.carried()
            if not carried:
                await self._carrying.wait()
                continue
            soonest = min(run.carry_until for run in carried)
            with trio.move_on_at(soonest):
                await self._carrying.wait()
                continue
            now = trio.current_time()
            for run in carried:
                if run.carried and run.carry_until <= now:
                    run.stop(WorkerStopped(CARRY_ENDED))
