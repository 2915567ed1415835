"""The pool's durable shadow: worker status versions, written behind, in order.

While the orchestrator runs, the pool (in memory) is the truth the scheduler reads; the
``swamp/worker`` records are its history, for ``worker list`` straight on the repo, for queries
and for the next boot. Status changes happen where nothing may wait on the disk — a socket's
close callback, the end of a dispatch — so they are written behind by the bookkeeper
(``swamp.orchestrator.bookkeeper``, which says when they are durable), in the order they
happened. Nothing is coalesced: every change is a version.
"""

from __future__ import annotations

from swamp.bookkeeping.workers import WorkerBook
from swamp.orchestrator.bookkeeper import Bookkeeper, Stream
from swamp.orchestrator.pool import Member


class WorkerRecords:
    def __init__(self, workers: WorkerBook, bookkeeper: Bookkeeper) -> None:
        self.workers = workers
        self.bookkeeper = bookkeeper

    def __repr__(self) -> str:
        return f"<WorkerRecords {self.bookkeeper!r}>"

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

        self.bookkeeper.put(Stream.WORKERS, f"{member.name} as {status}", write, then)

    async def settled(self) -> None:
        """Every status version queued so far is written (not waiting for other streams)."""
        await self.bookkeeper.settled(Stream.WORKERS)
