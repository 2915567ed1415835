"""Workers' holdings (``swamp.domain.holding``) in the record store, through the async seam
(``swamp.store.records``), so that they work the same on SQLite and on PostgreSQL.

A holding is one record per worker (``swamp/worker-holding``, instance and item the worker's
name), one version kept and replaced by compare-and-swap: :meth:`HoldingBook.take` is a
transition, so two orchestrators taking one worker at once get two epochs, never one twice.
:meth:`HoldingBook.write_fenced` reads the holding, holding it as read, and writes, in one
serializable transaction: a write for a holding another connection has replaced is refused
(:class:`Fenced`) and nothing of it lands; a take waits for a fenced write in flight, so one
that commits lands before the take returns.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from swamp.domain.holding import Holding, fence, taken
from swamp.errors import Fenced
from swamp.models.builtin import WORKER_HOLDING
from swamp.store.datastore import Key, Record, SpecPolicy, iso
from swamp.store.records import Operations, Records

TYPE = WORKER_HOLDING.type
POLICY = WORKER_HOLDING.resources[0].policy


def key(worker: str) -> Key:
    return Key(TYPE, worker, "holding")


def _holding(record: Record | None) -> Holding | None:
    return Holding.from_json(record.attributes) if record is not None else None


class HoldingBook:
    def __init__(self, records: Records, *, clock: Callable[[], float] = time.time) -> None:
        self.records = records
        self.clock = clock

    async def take(self, worker: str, orchestrator: str) -> Holding:
        """``worker`` connected to ``orchestrator``: its next epoch."""
        now = iso(self.clock())
        record, _ = await self.records.transition(
            key(worker),
            lambda current: taken(_holding(current), worker, orchestrator, now).to_json(),
            policy=POLICY,
        )
        assert record is not None  # the decision always writes
        return Holding.from_json(record.attributes)

    async def current(self, worker: str) -> Holding | None:
        return _holding(await self.records.latest(key(worker)))

    async def write_fenced(
        self,
        held: Holding,
        target: Key,
        attributes: dict,
        *,
        policy: SpecPolicy,
        expected_version: int | None = None,
    ) -> Record:
        """Write ``attributes`` at ``target`` for the worker's connection ``held``, if it is
        still the worker's: else :class:`Fenced`, and nothing written."""

        async def write(tx: Operations) -> Record:
            # held as read: a take waits for this transaction, or refuses it (then run again)
            why = fence(_holding(await tx.latest(key(held.worker), hold=True)), held)
            if why is not None:
                raise Fenced(why)
            return await tx.write(
                target, attributes, policy=policy, expected_version=expected_version
            )

        return await self.records.transact(write)
