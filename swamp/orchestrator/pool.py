"""The live pool: who is enrolled, connected, and how many slots each uses.

The durable truth is the ``swamp/worker`` records; this is the in-memory index the scheduler
reads. Every change that could let waiting work proceed calls :meth:`Pool.changed`, which wakes
whoever awaits :meth:`Pool.wait_changed` (an event, not a poll).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import trio

from swamp.domain.placement import WorkerView
from swamp.domain.workers import WorkerStatus
from swamp.protocol.rpc import RpcChannel
from swamp.store.datastore import Record


@dataclass(eq=False)
class Member:
    name: str
    instance_id: str
    machine_id: str
    token_name: str
    labels: dict[str, str]
    platform: str
    arch: str
    capacity: int
    version: str
    channel: RpcChannel | None
    active: set[str] = field(default_factory=set)
    status: str = WorkerStatus.IDLE.value
    enrolled_at: str = ""
    last_seen_at: str = ""
    record: Record | None = None  # the latest worker record this process wrote
    verify_failure_reason: str | None = None

    @property
    def connected(self) -> bool:
        return self.channel is not None and not self.channel.closed

    def view(self) -> WorkerView:
        return WorkerView(
            self.name,
            self.instance_id,
            self.labels,
            self.platform,
            self.arch,
            self.status,
            self.connected,
            self.capacity,
            len(self.active),
        )

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "instanceId": self.instance_id,
            "tokenName": self.token_name,
            "status": self.status if self.connected else WorkerStatus.DISCONNECTED.value,
            "labels": dict(self.labels),
            "platform": self.platform,
            "arch": self.arch,
            "capacity": self.capacity,
            "activeDispatchIds": sorted(self.active),
            "enrolledAt": self.enrolled_at,
            "lastSeenAt": self.last_seen_at,
            "swampVersion": self.version,
            **(
                {"verifyFailureReason": self.verify_failure_reason}
                if self.status == WorkerStatus.UNVERIFIED.value and self.connected
                else {}
            ),
        }


class Pool:
    def __init__(self) -> None:
        self.members: dict[str, Member] = {}
        self._changed = trio.Event()

    def __repr__(self) -> str:
        connected = sum(1 for m in self.members.values() if m.connected)
        return f"<Pool members={len(self.members)} connected={connected}>"

    def get(self, name: str) -> Member | None:
        return self.members.get(name)

    def by_instance_id(self, instance_id: str) -> Member | None:
        for member in self.members.values():
            if member.instance_id == instance_id:
                return member
        return None

    def put(self, member: Member) -> None:
        self.members[member.name] = member
        self.changed()

    def remove(self, name: str) -> None:
        if self.members.pop(name, None) is not None:
            self.changed()

    def views(self) -> list[WorkerView]:
        return [m.view() for m in self.members.values()]

    def of_token(self, token_name: str) -> list[Member]:
        return [m for m in self.members.values() if m.token_name == token_name]

    def changed(self) -> None:
        self._changed.set()
        self._changed = trio.Event()

    async def wait_changed(self) -> None:
        await self._changed.wait()

    def statistics(self) -> dict:
        connected = [m for m in self.members.values() if m.connected]
        return {
            "members": len(self.members),
            "connected": len(connected),
            "slots": sum(m.capacity for m in connected),
            "busySlots": sum(len(m.active) for m in connected),
        }
