"""Step leases (``swamp/step-lease``): instance ``leases``, one item ``lease-<id>`` per dispatch."""

from __future__ import annotations

import time

from swamp.bookkeeping.records import collect_ended, decoded, has_fields
from swamp.domain import leases as rules
from swamp.domain.leases import LeaseState
from swamp.models.builtin import STEP_LEASE
from swamp.store.datastore import Datastore, Key, Record, iso

TYPE = STEP_LEASE.type
POLICY = STEP_LEASE.resources[0].policy
INSTANCE = "leases"


def key(lease_id: str) -> Key:
    return Key(TYPE, INSTANCE, f"lease-{lease_id}")


class LeaseBook:
    def __init__(self, store: Datastore, *, clock=time.time) -> None:
        self.store = store
        self.clock = clock

    def acquire(
        self, *, lease_id: str, worker: str, model_type: str, model_name: str, method: str
    ) -> Record:
        attrs = {
            "leaseId": lease_id,
            "dispatchId": lease_id,
            "workerName": worker,
            "modelType": model_type,
            "modelName": model_name,
            "methodName": method,
            "state": LeaseState.ACTIVE.value,
            "hasWrites": False,
            "createdAt": iso(self.clock()),
        }
        return self.store.write(key(lease_id), attrs, policy=POLICY, expected_version=0)

    def mark_writes(self, lease_id: str, *, current: Record | None = None) -> Record | None:
        record, _ = self.store.transition(
            key(lease_id),
            lambda cur: rules.mark_writes(cur.attributes) if cur else None,
            policy=POLICY,
            current=current,
        )
        return record

    def end(
        self,
        lease_id: str,
        state: LeaseState,
        *,
        error: str | None = None,
        current: Record | None = None,
    ) -> Record | None:
        now = iso(self.clock())

        def decide(current):
            if current is None or current.attributes["state"] != LeaseState.ACTIVE.value:
                return None
            return rules.end(current.attributes, state, now_iso=now, error=error)

        record, _ = self.store.transition(key(lease_id), decide, policy=POLICY, current=current)
        return record

    def reconcile(self) -> int:
        """Boot: every lease still active belonged to the previous orchestrator: expire it."""
        count = 0
        for attrs in decoded(
            self.store.latest_of_type(TYPE, model_name=INSTANCE), has_fields("leaseId", "state")
        ):
            if attrs["state"] == LeaseState.ACTIVE.value:
                self.end(attrs["leaseId"], LeaseState.EXPIRED, error="orchestrator restart")
                count += 1
        return count

    def collect(self, *, older_than_seconds: float) -> int:
        """Delete ended leases whose end is older than the retention (the store stays bounded)."""
        cutoff = iso(self.clock() - older_than_seconds)
        return collect_ended(
            self.store, TYPE, INSTANCE, open_state=LeaseState.ACTIVE.value, cutoff=cutoff
        )
