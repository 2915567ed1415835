"""The records of placed steps on a shared database: written behind, read by followers.

A step placed through an orchestrator on PostgreSQL is recorded (``swamp.store.pg_steps``) so
that it outlives that orchestrator: its request when it is accepted, its outcome before its
client is answered. :class:`StepRecords` writes both in batches — one task, one transaction
for everything due — so the hot path pays no round trip for the request and shares one for
the outcomes of steps ending together. Its client is answered once the outcome's batch was
written, or failed (then it is still answered, and the outcome written on the next batch: a
database that is away never holds up a reply).

:meth:`StepRecords.follow` is the other end: a client whose orchestrator died asks another for
its step by id and is answered with the outcome once it is written, whoever writes it (a
``NOTIFY`` when it ends, as the row is marked followed).
"""

from __future__ import annotations

import logging
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

import trio

from swamp.errors import NotFound, SwampError

if TYPE_CHECKING:  # (PostgreSQL's driver is there only where a shared database is served)
    from swamp.store.pg_steps import PgSteps, StepRow

log = logging.getLogger("swamp.dispatch")
MAX_WAITING = 10_000  # requests (and outcomes) not written yet; past it the oldest go
RETRY_CAP = 5.0  # seconds between attempts while the database is away


@dataclass
class _Ending:
    step_id: str
    outcome: dict
    at: float
    done: trio.Event


class StepRecords:
    """Writes the step rows of this orchestrator (``me``) and answers followers."""

    def __init__(self, table: PgSteps, me: str, *, url: str | None = None, clock=time.time):
        self.table = table
        self.me = me
        self.url = url  # where to LISTEN for followed steps ending (None: no listener)
        self.clock = clock
        self._opened: deque[tuple[str, dict, float]] = deque()
        self._ended: list[_Ending] = []
        self._due = trio.Event()
        self._changed = trio.Event()  # a followed step ended (here or elsewhere): look again
        self.dropped = 0  # rows dropped past MAX_WAITING

    def __repr__(self) -> str:
        return f"<StepRecords opened={len(self._opened)} ended={len(self._ended)}>"

    def opened(self, step_id: str, request: dict) -> None:
        """Record a step's request (written with the next batch; never waits)."""
        self._opened.append((step_id, request, self.clock()))
        if len(self._opened) > MAX_WAITING:
            self._bound()
        self._due.set()

    async def ended(self, step_id: str, outcome: dict) -> None:
        """Record a step's outcome; returns once its batch was written (or failed)."""
        ending = _Ending(step_id, outcome, self.clock(), trio.Event())
        self._ended.append(ending)
        self._due.set()
        await ending.done.wait()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        from swamp.store import pg_wake
        from swamp.store.pg_steps import CHANNEL

        async with trio.open_nursery() as nursery:
            if self.url is not None:
                await nursery.start(
                    pg_wake.listen, self.url, CHANNEL, self.me, self._wake_followers
                )
            task_status.started()
            pause = 0.1
            while True:
                await self._due.wait()
                self._due = trio.Event()
                opened, self._opened = list(self._opened), deque()
                ended, self._ended = self._ended, []
                try:
                    await self.table.write(
                        self.me, opened, [(e.step_id, e.outcome, e.at) for e in ended]
                    )
                    pause = 0.1
                except SwampError as exc:
                    log.warning("could not record %d step(s): %s", len(opened) + len(ended), exc)
                    # again with the next batch; the clients are answered meanwhile
                    self._opened.extendleft(reversed(opened))
                    self._ended[:0] = [
                        _Ending(e.step_id, e.outcome, e.at, trio.Event()) for e in ended
                    ]
                    self._bound()
                    for ending in ended:
                        ending.done.set()
                    await trio.sleep(pause)
                    pause = min(RETRY_CAP, pause * 2)
                    self._due.set()
                    continue
                except Exception:  # a batch the database refuses as it is: never retried
                    log.exception("recording %d step(s) failed", len(opened) + len(ended))
                for ending in ended:
                    ending.done.set()
                if ended:
                    self._wake_followers()

    def _bound(self) -> None:
        """What waits for the database stays within :data:`MAX_WAITING` rows of each kind
        (the oldest go, with a warning: their clients were answered; only a follower misses
        them)."""
        over = len(self._opened) - MAX_WAITING
        for _ in range(max(0, over)):
            self._opened.popleft()
        ended_over = len(self._ended) - MAX_WAITING
        if ended_over > 0:
            del self._ended[:ended_over]
        before = self.dropped
        self.dropped += max(0, over) + max(0, ended_over)
        if self.dropped > before and (before == 0 or before // 1000 != self.dropped // 1000):
            log.warning(
                "%d step record(s) dropped: the database is away (a client that loses this "
                "orchestrator cannot follow those steps)",
                self.dropped,
            )

    def _wake_followers(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def follow(self, step_id: str) -> StepRow:
        """The step once it has an outcome (``NotFound`` for a step no orchestrator
        recorded). Waits for as long as it takes: its caller decides how long."""
        while True:
            changed = self._changed
            row = await self.table.follow(step_id)
            if row is None:  # (it may have ended as it was marked: read it again)
                row = await self.table.get(step_id)
            if row is None:
                raise NotFound(
                    f"no step {step_id[:40]!r} is recorded: only a step placed on a worker "
                    "through an orchestrator on a shared database can be followed"
                )
            if row.outcome is not None:
                return row
            await changed.wait()
