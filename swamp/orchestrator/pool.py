"""The live pool: who is enrolled, connected, and how many slots each uses.

The durable truth is the ``swamp/worker`` records; this is the in-memory index the scheduler
reads, with its scheduling index (``swamp.domain.scheduler.PoolIndex``) kept in step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from swamp.domain.scheduler import PoolIndex, Slots
from swamp.domain.workers import WorkerStatus, is_schedulable
from swamp.protocol.rpc import RpcChannel
from swamp.store.datastore import Record, iso


@dataclass(eq=False, slots=True)
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
    drain_reason: str | None = None
    unresponsive_reason: str | None = None
    fleet: str = ""  # what /metrics counts it in: its token's pinned fleet label, or its name

    @property
    def heartbeat(self) -> float:
        """The interval this worker was last told: its own deadlines are multiples of it."""
        return self.channel.heartbeat if self.channel is not None else 5.0

    @property
    def connected(self) -> bool:
        return self.channel is not None and not self.channel.closed

    def last_seen(self, now: float, loop_now: float) -> str:
        """When the orchestrator last heard from it. Connected: its socket's last frame — a
        heartbeat counts, so an idle worker is fresh — told from memory (``now`` is the
        wall clock, ``loop_now`` trio's), never written per heartbeat. Otherwise the time it
        was last seen, as kept (its disconnect)."""
        channel = self.channel
        if channel is not None and not channel.closed:  # connected
            return iso(now - max(0.0, loop_now - channel.last_heard))
        return self.last_seen_at

    def to_json(self, *, last_seen: str | None = None) -> dict:
        """Its listing; ``last_seen`` (from :meth:`last_seen`) for a live one."""
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
            "lastSeenAt": last_seen or self.last_seen_at,
            "swampVersion": self.version,
            **(
                {"verifyFailureReason": self.verify_failure_reason}
                if self.status == WorkerStatus.UNVERIFIED.value and self.connected
                else {}
            ),
            **(
                {"drainReason": self.drain_reason}
                if self.status == WorkerStatus.DRAINING.value and self.drain_reason
                else {}
            ),
            **(
                {"unresponsiveReason": self.unresponsive_reason}
                if self.status == WorkerStatus.UNRESPONSIVE.value and self.unresponsive_reason
                else {}
            ),
        }


class Pool:
    """Members by name, and the scheduling index kept in step with them.

    Everything that can change which steps a member may take goes through a method here —
    enrolled, slot reserved or released, status changed, disconnected, left — which updates the
    index and then tells its subscribers (the queue) about the member, so waiting work is looked
    at on the event itself, never on a timer. A freed slot is given back through the queue
    (``DispatchQueue.release``), which calls down.
    """

    def __init__(self) -> None:
        self.members: dict[str, Member] = {}
        self.index = PoolIndex()
        self.listener: Callable[[Member], None] = _nobody  # every subscriber, in one call
        self.watcher: Callable[[Member], None] = _nobody  # the pages (watch): never waits

    def subscribe(self, listener: Callable[[Member], None]) -> None:
        """Be told of every member change, in the event itself (the queue subscribes when it
        is made with this pool: the pool knows no queue)."""
        if self.listener is _nobody:
            self.listener = listener  # the usual one subscriber: called directly
            return
        before = self.listener

        def both(member: Member) -> None:
            before(member)
            listener(member)

        self.listener = both

    def watch(self, watcher: Callable[[Member], None]) -> None:
        """Be told of every change someone looking at the pool would see — what subscribers
        are told, and also every slot taken and given back — in the event itself (the web
        pages mark themselves out of date: the watcher must not wait or do real work)."""
        self.watcher = watcher

    def __repr__(self) -> str:
        connected = sum(1 for m in self.members.values() if m.connected)
        return f"<Pool members={len(self.members)} connected={connected}>"

    def get(self, name: str) -> Member | None:
        return self.members.get(name)

    def by_instance_id(self, instance_id: str) -> Member | None:
        slots = self.index.resolve_target(instance_id)
        member = self.members.get(slots.name) if slots is not None else None
        return member if member is not None and member.instance_id == instance_id else None

    def resolve(self, target: str) -> Member | None:
        """The member a step's target names (its name, or its unique instance id)."""
        slots = self.index.resolve_target(target)
        return self.members.get(slots.name) if slots is not None else None

    def put(self, member: Member) -> None:
        self.members[member.name] = member
        self.index.put(
            Slots(
                member.name,
                member.instance_id,
                dict(member.labels),
                member.platform,
                member.arch,
                member.capacity,
                len(member.active),
                schedulable=_schedulable(member),
            )
        )
        self.listener(member)
        self.watcher(member)

    def remove(self, name: str) -> None:
        member = self.members.pop(name, None)
        if member is not None:
            self.index.remove(name)
            self.listener(member)
            self.watcher(member)

    def refresh(self, member: Member) -> None:
        """Its status or connection changed: re-index it, and tell the queue."""
        if self.members.get(member.name) is member:
            self.index.update(member.name, schedulable=_schedulable(member))
            self.listener(member)
            self.watcher(member)

    def reserve(self, member: Member, dispatch_id: str, *, indexed: bool = False) -> None:
        """Hold one of its slots for a dispatch (``indexed``: the scheduler took it already)."""
        member.active.add(dispatch_id)
        if not indexed and self.members.get(member.name) is member:
            self.index.update(member.name, active=len(member.active))
        self.watcher(member)

    def release(self, member: Member, dispatch_id: str) -> bool:
        """Give a dispatch's slot back; says whether it held one. The queue is not told: a slot
        is given back through it (``DispatchQueue.release``), which looks at its waiting steps
        itself."""
        if dispatch_id not in member.active:
            return False
        member.active.discard(dispatch_id)
        if self.members.get(member.name) is member:
            self.index.update(member.name, active=len(member.active))
        self.watcher(member)
        return True

    def of_token(self, token_name: str) -> list[Member]:
        return [m for m in self.members.values() if m.token_name == token_name]

    def statistics(self) -> dict:
        connected = [m for m in self.members.values() if m.connected]
        return {
            "members": len(self.members),
            "connected": len(connected),
            "slots": sum(m.capacity for m in connected),
            "busySlots": sum(len(m.active) for m in connected),
        }


def _nobody(member: Member) -> None:
    return None


def _schedulable(member: Member) -> bool:
    return member.connected and is_schedulable(member.status)
