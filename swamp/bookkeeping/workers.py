"""Worker records (``swamp/worker``): one item ``state`` per worker, a version per status change."""

from __future__ import annotations

import time
from collections.abc import Callable, Collection
from typing import Any

from swamp import __version__
from swamp.bookkeeping.records import RESTART, Orphaned, decoded, everything, has_fields
from swamp.domain.workers import WORKER_LIFECYCLE, WorkerStatus
from swamp.models.builtin import WORKER
from swamp.store.datastore import Key, Record, iso
from swamp.store.records import Records

TYPE = WORKER.type
POLICY = WORKER.resources[0].policy
_KNOWN = frozenset(s.value for s in WorkerStatus)
# The reason a status carries, and the field it is kept in (cleared on any other status).
_REASON_FIELD = {
    WorkerStatus.DISCONNECTED.value: "disconnectReason",
    WorkerStatus.UNVERIFIED.value: "verifyFailureReason",
    WorkerStatus.DRAINING.value: "drainReason",
    WorkerStatus.UNRESPONSIVE.value: "unresponsiveReason",
}


def key(name: str) -> Key:
    return Key(TYPE, name, "state")


class WorkerBook:
    def __init__(self, db: Records, *, clock=time.time, owner: str = "") -> None:
        self.db = db
        self.clock = clock
        # on a database several orchestrators share: the one writing. A record names the
        # orchestrator that holds the worker's socket, and only that one changes its status
        # (one that lost the worker to another writes nothing for it)
        self.owner = owner

    async def enrolled(
        self,
        *,
        name: str,
        instance_id: str,
        machine_id: str,
        token: str,
        labels: dict,
        platform: str,
        arch: str,
        capacity: int,
        version: str,
        status: str = WorkerStatus.IDLE.value,
        reason: str | None = None,
    ) -> Record:
        """A full record for a (re-)enrollment: ``idle``, or ``unverified`` while it is probed."""
        now = iso(self.clock())
        previous = await self.db.latest(key(name))
        attrs: dict[str, Any] = {
            "name": name,
            "instanceId": instance_id,
            "machineId": machine_id,
            "tokenName": token,
            "status": status,
            "labels": labels,
            "platform": platform,
            "arch": arch,
            "capacity": capacity,
            "activeDispatchIds": [],
            "swampVersion": version,
            "enrolledAt": previous.attributes.get("enrolledAt", now)
            if previous and previous.attributes.get("machineId") == machine_id
            else now,
            "connectedAt": now,
            "lastSeenAt": now,
        }
        if self.owner:
            attrs["orchestrator"] = self.owner
        if reason:
            attrs[_REASON_FIELD.get(status, "verifyFailureReason")] = reason
        return await self.db.write(key(name), attrs, policy=POLICY)

    async def set_status(
        self,
        name: str,
        status: str,
        *,
        active: list[str] | None = None,
        reason: str | None = None,
        current: Record | None = None,
        only_if: Orphaned | None = None,
    ) -> Record | None:
        """A new version with the status; no write if nothing changed, or if the worker is
        held by another orchestrator than this book's (or ``only_if`` says no)."""
        now = iso(self.clock())

        def decide(current):
            if current is None:
                return None
            attrs = dict(current.attributes)
            if self.owner and attrs.get("orchestrator", self.owner) != self.owner:
                return None  # another orchestrator holds it now
            if only_if is not None and not only_if(attrs):
                return None
            ids = list(active) if active is not None else attrs.get("activeDispatchIds", [])
            if status in (WorkerStatus.IDLE.value, WorkerStatus.DISCONNECTED.value):
                ids = []
            if (
                attrs.get("status") == status
                and attrs.get("activeDispatchIds") == ids
                and attrs.get(_REASON_FIELD.get(status, ""), reason) == reason
            ):
                return None  # nothing changed: no new version
            if attrs.get("status") in _KNOWN and status in _KNOWN:
                WORKER_LIFECYCLE.check(WorkerStatus(attrs["status"]), WorkerStatus(status))
            attrs.update(status=status, activeDispatchIds=ids, lastSeenAt=now)
            for field in _REASON_FIELD.values():
                attrs.pop(field, None)
            if status == WorkerStatus.DISCONNECTED.value:
                attrs["disconnectedAt"] = now
            if status in _REASON_FIELD and reason:
                attrs[_REASON_FIELD[status]] = reason
            return attrs

        record, _ = await self.db.transition(key(name), decide, policy=POLICY, current=current)
        return record

    async def all(self) -> list[dict]:
        return list(decoded(await self.db.latest_of_type(TYPE), has_fields("name", "status")))

    async def stale(self, *, older_than_seconds: float, live: Collection[str]) -> list[dict]:
        """Workers disconnected for longer than the retention and not in the live pool."""
        cutoff = iso(self.clock() - older_than_seconds)
        return [
            a
            for a in await self.all()
            if a.get("status") == WorkerStatus.DISCONNECTED.value
            and a["name"] not in live
            and a.get("disconnectedAt", a.get("lastSeenAt", "")) < cutoff
        ]

    async def forget(self, names: Collection[str]) -> int:
        return await self.db.delete_items([key(n) for n in names]) if names else 0

    async def reconcile(self, orphaned: Orphaned = everything, *, why: str = RESTART) -> int:
        """Boot: whatever was connected when the last orchestrator died is disconnected now
        (on a shared database, what ``orphaned`` says a dead one held — checked again on the
        record it changes: the worker may have moved to a live one meanwhile)."""
        count = 0
        for attrs in await self.all():
            if attrs.get("status") != WorkerStatus.DISCONNECTED.value and orphaned(attrs):
                written = await WorkerBook(self.db, clock=self.clock).set_status(
                    attrs["name"], WorkerStatus.DISCONNECTED.value, reason=why, only_if=orphaned
                )
                count += written is not None
        return count


_ITEM_FIELDS = (
    "name",
    "status",
    "labels",
    "platform",
    "arch",
    "capacity",
    "activeDispatchIds",
    "lastSeenAt",
    "enrolledAt",
    "instanceId",
    "tokenName",
    "swampVersion",
    "disconnectedAt",
    "disconnectReason",
    "verifyFailureReason",
    "drainReason",
    "unresponsiveReason",
)


def worker_items(
    records: list[dict],
    live: dict[str, dict] | None = None,
    *,
    show_all: bool = False,
    where: Callable[[str], str | None] | None = None,
) -> dict:
    """The listing shape shared by the CLI and the server: live state wins over records; the
    answering swamp's version comes along, so a worker of another version can be pointed out.
    ``where`` (several orchestrators on one database) gives the URL of the orchestrator a
    record names: a worker held by one that is not serving names none."""

    merged = {r["name"]: r for r in records}
    merged.update(live or {})
    items = [{k: r[k] for k in _ITEM_FIELDS if k in r} for r in merged.values()]
    for item, r in zip(items, merged.values(), strict=True):
        url = where(r["orchestrator"]) if where and isinstance(r.get("orchestrator"), str) else None
        if url and r.get("status") != WorkerStatus.DISCONNECTED.value:
            item["orchestrator"] = url
    items.sort(key=lambda r: r["name"])
    hidden = 0
    if not show_all:
        hidden = sum(1 for r in items if r["status"] == WorkerStatus.DISCONNECTED.value)
        items = [r for r in items if r["status"] != WorkerStatus.DISCONNECTED.value]
    return {
        "workers": items,
        "count": len(items),
        "hiddenDisconnected": hidden,
        "orchestratorVersion": __version__,
    }
