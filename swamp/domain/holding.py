"""Which orchestrator holds a worker's socket, and since which connection: the fence of every
write made for the worker.

With several orchestrators on one database a worker is connected to one of them at a time, and
moves (its orchestrator died, the network parted them, it was given a list). Each connection
*takes* the worker: its holding record names the orchestrator and an *epoch* one higher than
the last, whoever held it. A write made for the worker — a lease, a result, its status — is
made for the holding its orchestrator had when it made it, and refused once another connection
has taken the worker since (:func:`fence`), so an orchestrator that lost a worker, crashed or
cut off, cannot overwrite what the new one writes: the epoch of Temporal's shard ``range_id``,
on swamp's versions.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Holding:
    """A worker's connection: to which orchestrator, the how-many-th, from when (ISO)."""

    worker: str
    orchestrator: str
    epoch: int
    since: str

    def to_json(self) -> dict:
        return {
            "worker": self.worker,
            "orchestrator": self.orchestrator,
            "epoch": self.epoch,
            "since": self.since,
        }

    @classmethod
    def from_json(cls, data: dict) -> Holding:
        epoch = data["epoch"]
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 1:
            raise ValueError(f"a holding's epoch is a whole number from 1, got {epoch!r}")
        return cls(str(data["worker"]), str(data["orchestrator"]), epoch, str(data["since"]))


def taken(current: Holding | None, worker: str, orchestrator: str, now: str) -> Holding:
    """The worker connected to ``orchestrator``: the next epoch, whoever held it before (the
    same orchestrator again too: a reconnection is a new connection)."""
    return Holding(worker, orchestrator, (current.epoch if current else 0) + 1, now)


def fence(current: Holding | None, held: Holding) -> str | None:
    """Why a write made for ``held`` is refused now that the worker's holding is ``current``;
    ``None``: it still holds."""
    if current is None:
        return f"worker {held.worker} has no holding any more: the write for it is refused"
    if (current.orchestrator, current.epoch) != (held.orchestrator, held.epoch):
        return (
            f"worker {held.worker} connected to {current.orchestrator} since (epoch "
            f"{current.epoch}): a write for its connection to {held.orchestrator} (epoch "
            f"{held.epoch}) is refused"
        )
    return None
