"""The pool's durable shadow: worker status versions, written behind, in order.

While the orchestrator runs, the pool (in memory) is the truth the scheduler reads; the
``swamp/worker`` records are its history, for ``worker list`` straight on the repo, for queries
and for the next boot. Status changes happen where nothing may wait on the disk — a socket's
close callback, the end of a dispatch — so they are written behind (``write_behind``), in the
order they happened. Nothing is coalesced: every change is a version.
"""

from __future__ import annotations

import trio

from swamp.bookkeeping.workers import WorkerBook
from swamp.orchestrator.pool import Member
from swamp.orchestrator.write_behind import WriteBehind


class WorkerRecords:
    def __init__(self, workers: WorkerBook) -> None:
        self.workers = workers
        self.writer = WriteBehind("worker records")

    def __repr__(self) -> str:
        return f"<WorkerRecords {self.writer!r}>"

    @property
    def written(self) -> int:
        return self.writer.written

    def status(
        self,
        member: Member,
        status: str,
        *,
        reason: str | None = None,
        active: list[str] | None = None,
    ) -> None:
        """Queue a status version for ``member`` (never waits)."""
        active = list(active) if active is not None else None

        def write():
            return self.workers.set_status(
                member.name, status, reason=reason, active=active, current=member.record
            )

        def then(record) -> None:
            if record is not None:
                member.record = record
                member.last_seen_at = record.attributes["lastSeenAt"]

        self.writer.put(f"{member.name} as {status}", write, then)

    async def settled(self) -> None:
        await self.writer.settled()

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        await self.writer.run(task_status=task_status)
