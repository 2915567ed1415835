"""The records of placed steps on a shared database: written behind, read by followers.

A step placed through an orchestrator on PostgreSQL is recorded (``swamp.store.pg_steps``) so
that it outlives that orchestrator: its request when it is accepted, its outcome as its
client is answered. :class:`StepRecords` writes both in batches — one task, one transaction
(a statement per kind) for everything due — so the hot path pays no round trip for either:
a reply never waits for the database. (Awaiting the outcome's batch cost every step about
half a millisecond of p50 for one case only: an orchestrator dying in the moment between its
reply and that batch, whose step its taker then fails ``outcome_lost`` — never runs again.)

Rows are encoded as they are handed over: a request that is not JSON (a value from a model
file no JSON can hold) is not recorded, and only its step cannot be followed.

:meth:`StepRecords.follow` is the other end: a client whose orchestrator died asks another for
its step by id and is answered with the outcome once it is written, whoever writes it (the
end of a followed row sends a ``NOTIFY`` whose payload is its id: only its followers look).
"""

from __future__ import annotations

import json
import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from swamp.errors import CallTimeout, DatabaseUnavailable, NotFound, SwampError

if TYPE_CHECKING:  # (PostgreSQL's driver is there only where a shared database is served)
    from swamp.store.pg_steps import PgSteps, StepRow

log = logging.getLogger("swamp.dispatch")
MAX_WAITING = 10_000  # requests (and outcomes) not written yet; past it the oldest go
RETRY_CAP = 5.0  # seconds between attempts while the database is away
RECONNECT_CAP = 10.0  # seconds between attempts to listen again
_ENCODE = json.JSONEncoder(separators=(",", ":"), sort_keys=True).encode


@dataclass
class _Ending:
    step_id: str
    outcome: str  # encoded
    at: float
    done: trio.Event


class StepRecords:
    """Writes the step rows of this orchestrator (``me``) and answers followers."""

    def __init__(self, table: PgSteps, me: str, *, url: str | None = None, clock=time.time):
        self.table = table
        self.me = me
        self.url = url  # where to LISTEN for followed steps ending (None: no listener)
        self.clock = clock
        self._opened: deque[tuple[str, str, float]] = deque()
        self._ended: list[_Ending] = []
        self._waits: list[tuple[str, bool]] = []  # waiting for a worker, or not any more
        self._left: list[trio.Event] = []  # set when the batch with those marks was written
        self._open: set[str] = set()  # recorded here, outcome not written yet
        self._due = trio.Event()
        self._followers: dict[str, trio.Event] = {}  # by step id: set when it may have ended
        self.dropped = 0  # rows dropped past MAX_WAITING

    def __repr__(self) -> str:
        return f"<StepRecords opened={len(self._opened)} ended={len(self._ended)}>"

    def opened(self, step_id: str, request: dict) -> bool:
        """Record a step's request (written with the next batch; never waits). False when
        it cannot be recorded (not JSON): that step cannot be followed."""
        try:
            encoded = _ENCODE(request)
        except (TypeError, ValueError) as exc:
            log.warning("step %s is not recorded (its request is not JSON: %s)", step_id, exc)
            return False
        self._opened.append((step_id, encoded, self.clock()))
        self._open.add(step_id)
        if len(self._opened) > MAX_WAITING:
            self._bound()
        self._due.set()
        return True

    async def adopt(self, step_id: str) -> None:
        """A step taken over, about to run here as this orchestrator's own: its record is
        kept as one opened here (its wait marked), from not waiting (written now)."""
        self._open.add(step_id)
        await self.left_queue(step_id)

    def waiting(self, step_id: str) -> None:
        """The step waits for a worker (written with the next batch; never waits): its
        taker may run it again with no lease to say otherwise."""
        if step_id in self._open:
            self._waits.append((step_id, True))
            self._due.set()

    async def left_queue(self, step_id: str) -> None:
        """The step leaves the queue for a worker: written before it is dispatched (a step
        that waited has waited: this costs it one round trip). Returns after the attempt."""
        if step_id not in self._open:
            return
        written = trio.Event()
        self._waits.append((step_id, False))
        self._left.append(written)
        self._due.set()
        await written.wait()

    def runs(self, step_id: str) -> bool:
        """Whether the step was recorded here and its outcome is not written yet."""
        return step_id in self._open

    async def ended(self, step_id: str, outcome: dict, *, wait: bool = True) -> None:
        """Record a step's outcome; returns once its batch was written (or failed) — at once
        with ``wait=False``, as the step's own client is answered: a follower reads it from
        the batch that writes it (a reply never waits for the database, and an orchestrator
        that dies in the moment between leaves a step its taker fails ``outcome_lost``, never
        runs again)."""
        try:
            encoded = _ENCODE(outcome)
        except (TypeError, ValueError) as exc:  # (a reply is JSON already: never, but)
            log.warning("the outcome of step %s is not recorded: %s", step_id, exc)
            self._open.discard(step_id)
            return
        ending = _Ending(step_id, encoded, self.clock(), trio.Event())
        self._ended.append(ending)
        if len(self._ended) > MAX_WAITING:
            self._bound()
        self._due.set()
        if wait:
            await ending.done.wait()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        if self.url is None:  # (a table given whole: tests)
            await self._run(self.table, task_status=task_status)
            return
        from swamp.store import pg
        from swamp.store.pg_steps import PgSteps

        # a connection of its own: the batches never hold one the dispatch path waits for
        async with pg.Pool(self.url, size=1) as pool:
            await self._run(PgSteps(pool), task_status=task_status)

    async def _run(self, writer: PgSteps, *, task_status) -> None:
        async with trio.open_nursery() as nursery:
            if self.url is not None:
                await nursery.start(self._listen)
            task_status.started()
            pause = 0.1
            while True:
                await self._due.wait()
                self._due = trio.Event()
                opened, self._opened = list(self._opened), deque()
                ended, self._ended = self._ended, []
                waits, self._waits = self._waits, []
                left, self._left = self._left, []
                try:
                    await writer.write(
                        self.me, opened, [(e.step_id, e.outcome, e.at) for e in ended], waits
                    )
                    pause = 0.1
                except (DatabaseUnavailable, CallTimeout) as exc:
                    log.warning("could not record %d step(s): %s", len(opened) + len(ended), exc)
                    # again with the next batch; the clients are answered meanwhile
                    self._opened.extendleft(reversed(opened))
                    self._ended[:0] = [
                        _Ending(e.step_id, e.outcome, e.at, trio.Event()) for e in ended
                    ]
                    self._bound()
                    self._waits[:0] = waits
                    for ending in ended:
                        ending.done.set()
                    for written in left:  # (dispatched all the same: a database away)
                        written.set()
                    await trio.sleep(pause)
                    pause = min(RETRY_CAP, pause * 2)
                    self._due.set()
                    continue
                except Exception:  # a batch the database refuses as it is: never retried
                    log.exception("recording %d step(s) failed", len(opened) + len(ended))
                    for step_id, _, _ in opened:
                        self._open.discard(step_id)
                for written in left:
                    written.set()
                for ending in ended:
                    self._open.discard(ending.step_id)
                    ending.done.set()
                    self._wake(ending.step_id)

    def _bound(self) -> None:
        """What waits for the database stays within :data:`MAX_WAITING` rows of each kind
        (the oldest go, with a warning: their clients were answered; only a follower misses
        them)."""
        over = len(self._opened) - MAX_WAITING
        for _ in range(max(0, over)):
            self._open.discard(self._opened.popleft()[0])
        ended_over = len(self._ended) - MAX_WAITING
        if ended_over > 0:
            for ending in self._ended[:ended_over]:
                self._open.discard(ending.step_id)
            del self._ended[:ended_over]
        before = self.dropped
        self.dropped += max(0, over) + max(0, ended_over)
        if self.dropped > before and (before == 0 or before // 1000 != self.dropped // 1000):
            log.warning(
                "%d step record(s) dropped: the database is away (a client that loses this "
                "orchestrator cannot follow those steps)",
                self.dropped,
            )

    async def _listen(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        """LISTEN for followed steps ending (a notification's payload is the step's id);
        after a lost connection, every follower looks again (what was sent meanwhile is not
        coming)."""
        from swamp.store import pg
        from swamp.store.pg_steps import CHANNEL

        assert self.url is not None
        started, pause = False, 0.5
        while True:
            try:
                async with await pg.connect(self.url) as conn:
                    await conn.listen(CHANNEL)
                    if started:
                        self._wake_all()
                    else:
                        started = True
                        task_status.started()
                    pause = 0.5
                    while True:
                        batch = await conn.wait_notifications()
                        if batch.missed:
                            self._wake_all()
                        for notification in batch.received:
                            self._wake(notification.payload)
            except SwampError:
                if not started:
                    raise
                await trio.sleep(pause)
                pause = min(RECONNECT_CAP, pause * 2)

    def _wake(self, step_id: str) -> None:
        event = self._followers.pop(step_id, None)
        if event is not None:
            event.set()

    def _wake_all(self) -> None:
        followers, self._followers = self._followers, {}
        for event in followers.values():
            event.set()

    async def follow(self, step_id: str) -> StepRow:
        """The step once it has an outcome (``NotFound`` for a step no orchestrator
        recorded). Waits for as long as it takes: its caller decides how long."""
        while True:
            woken = self._followers.setdefault(step_id, trio.Event())
            try:
                row = await self.table.follow(step_id)
                if row is None:  # (it may have ended as it was marked: read it again)
                    row = await self.table.get(step_id)
            except (DatabaseUnavailable, CallTimeout) as exc:  # not the step's: wait
                log.warning("following step %s waits for the database: %s", step_id[:12], exc)
                await trio.sleep(RETRY_CAP)
                continue
            if row is None:
                if not woken.is_set() and self._followers.get(step_id) is woken:
                    del self._followers[step_id]
                raise NotFound(
                    f"no step {step_id[:40]!r} is recorded: only a step placed on a worker "
                    "through an orchestrator on a shared database can be followed (one "
                    "whose orchestrator died within moments of taking it was not recorded)"
                )
            if row.outcome is not None:
                return row
            await woken.wait()
