"""The pool's durable shadow: worker status versions, written behind, in order.

While the orchestrator runs, the pool (in memory) is the truth the scheduler reads; the
``swamp/worker`` records are its history, for ``worker list`` straight on the repo, for queries
and for the next boot. Status changes happen where nothing may wait on the disk — a socket's
close callback, the end of a dispatch — so they are queued here and written by one task, in
the order they happened, retried while another process holds the database (``retry_busy``).
Nothing is coalesced: every change is a version.
"""

from __future__ import annotations

import logging
from collections import deque
from dataclasses import dataclass

import trio

from swamp.bookkeeping.workers import WorkerBook
from swamp.errors import SwampError
from swamp.orchestrator.pool import Member
from swamp.store.retry import retry_busy

log = logging.getLogger("swamp.records")


@dataclass(frozen=True)
class StatusChange:
    member: Member
    status: str
    reason: str | None
    active: tuple[str, ...] | None


class WorkerRecords:
    def __init__(self, workers: WorkerBook) -> None:
        self.workers = workers
        self._queue: deque[StatusChange] = deque()
        self._changed = trio.Event()
        self._idle = trio.Event()
        self._idle.set()
        self.written = 0
        self.failed = 0

    def __repr__(self) -> str:
        return f"<WorkerRecords queued={len(self._queue)} written={self.written}>"

    def status(
        self,
        member: Member,
        status: str,
        *,
        reason: str | None = None,
        active: list[str] | None = None,
    ) -> None:
        """Queue a status version for ``member`` (never waits)."""
        self._queue.append(
            StatusChange(member, status, reason, tuple(active) if active is not None else None)
        )
        self._idle = trio.Event() if self._idle.is_set() else self._idle
        self._changed.set()

    async def settled(self) -> None:
        """Wait until everything queued so far is written (or given up on)."""
        await self._idle.wait()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            while not self._queue:
                self._idle.set()
                self._changed = trio.Event()
                await self._changed.wait()
            change = self._queue.popleft()
            await self._write(change)

    async def _write(self, change: StatusChange) -> None:
        member = change.member
        try:
            record = await retry_busy(
                lambda: self.workers.set_status(
                    member.name,
                    change.status,
                    reason=change.reason,
                    active=list(change.active) if change.active is not None else None,
                    current=member.record,
                )
            )
        except SwampError as exc:
            self.failed += 1
            log.warning("could not record %s as %s: %s", member.name, change.status, exc)
            return
        if record is not None:
            member.record = record
            member.last_seen_at = record.attributes["lastSeenAt"]
            self.written += 1
