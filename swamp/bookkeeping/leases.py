"""Step leases (``swamp/step-lease``): instance ``leases``, one item ``lease-<id>`` per dispatch."""

from __future__ import annotations

import time
from collections.abc import Iterable

from swamp.bookkeeping.records import (
    RESTART,
    Orphaned,
    collect_ended,
    decoded,
    everything,
    has_fields,
)
from swamp.domain import carrying
from swamp.domain import leases as rules
from swamp.domain.leases import LeaseState
from swamp.domain.query import parse as parse_predicate
from swamp.errors import Conflict
from swamp.models.builtin import STEP_LEASE
from swamp.store.datastore import Key, Record, iso
from swamp.store.journal import Entry, take_in
from swamp.store.records import Operations, Records

TYPE = STEP_LEASE.type
POLICY = STEP_LEASE.resources[0].policy
INSTANCE = "leases"
PAGE = 1000  # lease rows read at a time by a scan


_ACTIVE = parse_predicate(
    f'modelType == "{TYPE}" && modelName == "{INSTANCE}" && attributes.state == "active"'
)


def key(lease_id: str) -> Key:
    return Key(TYPE, INSTANCE, f"lease-{lease_id}")


def journaled_lease(entry: Entry) -> bool:
    """Whether a row read back from the journal is a step lease as the orchestrator journals
    them: the lease's type, instance, spec and key (``lease-<its id>``), with well-formed
    attributes. The journal holds nothing else, so nothing else is taken in from it: a line
    that names another record (a server token, a worker) is not ours, however well formed."""
    return (
        entry.policy == POLICY
        and rules.well_formed(entry.attributes)
        and entry.key == key(entry.attributes["leaseId"])
    )


class LeaseBook:
    def __init__(self, db: Records, *, clock=time.time, owner: str = "") -> None:
        self.db = db
        self.clock = clock
        # the orchestrator whose dispatches these are, on a database several share (its rows
        # say so: who reconciles them when it dies); "" on a database of its own
        self.owner = owner

    def opened(
        self,
        *,
        lease_id: str,
        worker: str,
        model_type: str,
        model_name: str,
        method: str,
        step_id: str | None = None,
    ) -> dict:
        """The attributes of a lease that starts now (nothing is written yet); ``step_id``,
        the step it runs (whoever takes over a dead orchestrator's steps reads it)."""
        return {
            "leaseId": lease_id,
            "dispatchId": lease_id,
            "workerName": worker,
            "modelType": model_type,
            "modelName": model_name,
            "methodName": method,
            "state": LeaseState.ACTIVE.value,
            "hasWrites": False,
            "createdAt": iso(self.clock()),
            **({"orchestrator": self.owner} if self.owner else {}),
            **({"stepId": step_id} if step_id else {}),
        }

    async def insert(self, attrs: dict) -> Record:
        """The lease's first (and often only) row: active, or already ended or write-bearing
        when the dispatch got there before its row was written. Its id is the dispatch's, new."""
        return await self.db.write(key(attrs["leaseId"]), attrs, policy=POLICY, fresh=True)

    def journaled(self, attrs: dict) -> Entry:
        """The lease's first row as a journal entry (see ``swamp.store.journal``)."""
        return Entry(key(attrs["leaseId"]), POLICY, attrs, self.clock())

    async def insert_many(
        self, many: list[dict], *, journaled: Iterable[Entry] = ()
    ) -> list[Record | None]:
        """Several first rows in one transaction (one commit for all of them), with the
        journaled rows not in the store yet. A row there already comes back ``None``: a batch
        whose caller was cancelled after its commit landed (a server's round trip) is
        written again by the next, which must not fail all the others for it."""
        entries = list(journaled)

        async def insert(tx: Operations) -> list[Record | None]:
            await take_in(tx, entries)
            written: list[Record | None] = []
            for attrs in many:
                try:
                    written.append(
                        await tx.write(key(attrs["leaseId"]), attrs, policy=POLICY, fresh=True)
                    )
                except Conflict:
                    written.append(None)
            return written

        return await self.db.transact(insert)

    def ended(self, attrs: dict, state: LeaseState, *, error: str | None = None) -> dict:
        """``attrs`` ended now (nothing is written)."""
        return rules.end(attrs, state, now_iso=iso(self.clock()), error=error)

    def write_bearing(self, attrs: dict) -> dict:
        """``attrs`` marked write-bearing (nothing is written)."""
        return rules.mark_writes(attrs) or attrs

    async def mark_writes(self, lease_id: str, *, current: Record | None = None) -> Record | None:
        record, _ = await self.db.transition(
            key(lease_id),
            lambda cur: rules.mark_writes(cur.attributes) if cur else None,
            policy=POLICY,
            current=current,
        )
        return record

    async def end(
        self,
        lease_id: str,
        state: LeaseState,
        *,
        error: str | None = None,
        current: Record | None = None,
        has_writes: bool = False,
    ) -> Record | None:
        """End an active lease; ``has_writes``: it had an effect its row may not say yet. On a
        database several share, only while it is still ours: one a burial moved to the
        orchestrator that carried its run is that one's now (this one was taken for dead).
        The ended row, or ``None`` when this call did not end it (it had ended, or is not
        ours, or is not there)."""
        now = iso(self.clock())

        def decide(current):
            if current is None or current.attributes["state"] != LeaseState.ACTIVE.value:
                return None
            attrs = current.attributes
            if self.owner and attrs.get("orchestrator", "") != self.owner:
                return None
            if has_writes:
                attrs = rules.mark_writes(attrs) or attrs
            return rules.end(attrs, state, now_iso=now, error=error)

        record, changed = await self.db.transition(
            key(lease_id), decide, policy=POLICY, current=current
        )
        return record if changed else None

    async def reconcile(
        self,
        orphaned: Orphaned = everything,
        *,
        why: str = RESTART,
        dead: str | None = None,
        serving: frozenset[str] = frozenset(),
        moved: list[str] | None = None,
    ) -> int:
        """Boot: every lease still active belonged to the previous orchestrator: expire it
        (on a shared database, the ones ``orphaned`` says a dead orchestrator left). Only the
        active ones are held (the store streams the rest past the predicate): a boot after a
        long burst may find hundreds of thousands of ended leases. At the burial of ``dead``,
        a lease whose run an orchestrator of ``serving`` carries moves to it instead, still
        active (its id goes in ``moved``): see ``swamp.domain.carrying``."""
        count = 0
        for attrs in decoded(await self.db.query(_ACTIVE), has_fields("leaseId", "state")):
            if attrs["state"] != LeaseState.ACTIVE.value or not orphaned(attrs):
                continue
            if dead is None:
                await self.end(attrs["leaseId"], LeaseState.EXPIRED, error=why)
                count += 1
                continue
            record = await self._bury(attrs["leaseId"], dead, serving, why)
            now = record.attributes if record is not None else {}
            if now.get("state") == LeaseState.ACTIVE.value and now.get("orchestrator") != dead:
                if moved is not None:
                    moved.append(attrs["leaseId"])
            elif now.get("state") == LeaseState.EXPIRED.value:
                count += 1
        return count

    async def _bury(
        self, lease_id: str, dead: str, serving: frozenset[str], why: str
    ) -> Record | None:
        now = iso(self.clock())

        def decide(current):
            attrs = current.attributes if current is not None else None
            if attrs is None or attrs.get("state") != LeaseState.ACTIVE.value:
                return None
            if attrs.get("orchestrator") != dead:
                return None
            carrier = carrying.bury(attrs, dead, set(serving))
            if carrier is not None:
                return carrying.moved(attrs, carrier)
            return rules.end(attrs, LeaseState.EXPIRED, now_iso=now, error=why)

        record, _ = await self.db.transition(key(lease_id), decide, policy=POLICY)
        return record

    async def mark_carried(
        self,
        lease_id: str,
        *,
        carrier: str,
        worker: str,
        owner: str | None,
        effects: bool = False,
    ) -> dict | None:
        """Mark the lease carried by ``carrier`` for ``worker`` (a compare-and-swap; ``owner``:
        its step's record's; ``effects``: the worker says the run had an effect, which the
        lease then says too); the lease as marked, or ``None`` if it may not be."""

        def decide(current):
            attrs = current.attributes if current is not None else None
            if attrs is None or not carrying.carriable(
                attrs, worker=worker, carrier=carrier, owner=owner
            ):
                return None
            return carrying.mark(attrs, carrier, effects=effects)

        record, _ = await self.db.transition(key(lease_id), decide, policy=POLICY)
        attrs = record.attributes if record is not None else None
        if attrs is None or attrs.get("carriedBy") != carrier:
            return None
        still = carrying.carriable(attrs, worker=worker, carrier=carrier, owner=owner)
        return attrs if still else None

    async def unmark_carried(self, lease_id: str, *, carrier: str) -> Record | None:
        """Take ``carrier``'s mark off the lease (it gave up waiting for the burial); the lease
        as it stands after (it may have moved to the carrier meanwhile)."""
        record, _ = await self.db.transition(
            key(lease_id),
            lambda current: carrying.unmark(
                current.attributes if current is not None else None, carrier
            ),
            policy=POLICY,
        )
        return record

    async def latest_of_steps(self, step_ids: set[str], *, since_epoch: float) -> dict[str, dict]:
        """The latest lease of each of ``step_ids`` among the leases opened since
        ``since_epoch`` (a lease's id starts with its opening time, so this reads that range
        of the table, a page at a time)."""
        low = f"lease-{max(0, int(since_epoch * 1e9)):016x}"
        latest: dict[str, dict] = {}
        while True:
            page = await self.db.latest_in_range(TYPE, INSTANCE, low, "lease-g", limit=PAGE)
            for attrs in decoded(page, has_fields("leaseId", "state")):
                if attrs.get("stepId") in step_ids:
                    latest[attrs["stepId"]] = attrs  # (in id order: the last is the latest)
            if len(page) < PAGE:
                return latest
            low = page[-1].name + "0"  # (just past it: every name is as long)

    async def collect(self, *, older_than_seconds: float) -> int:
        """Delete ended leases whose end is older than the retention (the store stays bounded)."""
        cutoff = iso(self.clock() - older_than_seconds)
        return await collect_ended(
            self.db, TYPE, INSTANCE, open_state=LeaseState.ACTIVE.value, cutoff=cutoff
        )
