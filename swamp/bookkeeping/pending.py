"""Queue episodes (``swamp/pending-dispatch``): instance ``pending``, one item per wait.

A record is written only when a step actually has to wait (a step that finds a free worker at
once leaves no trace here), and ended when the wait ends. They are the demand side of the fleet:
``swamp worker queue`` on the repo lists the ``waiting`` ones, and any query can count them.
"""

from __future__ import annotations

import time

from swamp.bookkeeping.records import (
    RESTART,
    Orphaned,
    collect_ended,
    decoded,
    everything,
    has_fields,
)
from swamp.domain import queue as rules
from swamp.domain.queue import PendingState
from swamp.models.builtin import PENDING_DISPATCH
from swamp.store.datastore import Key, Record, iso
from swamp.store.records import Records

TYPE = PENDING_DISPATCH.type
POLICY = PENDING_DISPATCH.resources[0].policy
INSTANCE = "pending"


def key(queue_id: str) -> Key:
    return Key(TYPE, INSTANCE, f"pending-{queue_id}")


class PendingBook:
    def __init__(self, db: Records, *, clock=time.time, owner: str = "") -> None:
        self.db = db
        self.clock = clock
        self.owner = owner  # whose waits (a shared database's orchestrator; "" alone)

    async def enqueue(self, attrs: dict) -> Record:
        """The ``waiting`` record of a new episode (``attrs`` has its queueId and requirement)."""
        record = dict(attrs, state=PendingState.WAITING.value)
        if self.owner:
            record["orchestrator"] = self.owner
        return await self.db.write(key(attrs["queueId"]), record, policy=POLICY, expected_version=0)

    async def end(
        self,
        queue_id: str,
        state: PendingState,
        *,
        dispatch_id: str | None = None,
        reason: str | None = None,
        current: Record | None = None,
    ) -> Record | None:
        now = iso(self.clock())

        def decide(current):
            if current is None:
                return None
            return rules.end(
                current.attributes, state, now_iso=now, dispatch_id=dispatch_id, reason=reason
            )

        record, _ = await self.db.transition(key(queue_id), decide, policy=POLICY, current=current)
        return record

    async def waiting(self) -> list[dict]:
        """Every ``waiting`` episode, oldest first."""
        items = [
            a
            for a in decoded(
                await self.db.latest_of_type(TYPE, model_name=INSTANCE),
                has_fields("queueId", "state", "queuedAt"),
            )
            if a["state"] == PendingState.WAITING.value
        ]
        items.sort(key=lambda a: a["queuedAt"])
        return items

    async def reconcile(self, orphaned: Orphaned = everything, *, why: str = RESTART) -> int:
        """Boot: a wait the previous orchestrator (or a dead one, as ``orphaned`` says) left
        ``waiting`` has no one waiting any more."""
        count = 0
        for attrs in await self.waiting():
            if not orphaned(attrs):
                continue
            ended = await self.end(attrs["queueId"], PendingState.ORPHANED, reason=why)
            if ended is not None:
                count += 1
        return count

    async def collect(self, *, older_than_seconds: float) -> int:
        """Delete ended episodes whose end is older than the retention (bounded, like leases)."""
        cutoff = iso(self.clock() - older_than_seconds)
        return await collect_ended(
            self.db, TYPE, INSTANCE, open_state=PendingState.WAITING.value, cutoff=cutoff
        )
