"""Placement and the least-loaded choice of a worker: decide, then act.

``choose_worker`` is a plain function over a snapshot of the pool: it returns the worker to use
(or why there is none). The orchestrator reserves the slot and performs the I/O afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from swamp.domain.workers import INSTANCE_ID, is_schedulable


@dataclass(frozen=True)
class Placement:
    """A step's requirement. Empty means "run in the orchestrator's own process"."""

    target: str | None = None
    labels: dict[str, str] = field(default_factory=dict)
    platform: str | None = None

    def is_remote(self) -> bool:
        return bool(self.target or self.labels or self.platform)

    def describe(self) -> str:
        if self.target:
            return f"target {self.target!r}"
        parts = []
        if self.labels:
            parts.append("labels " + ",".join(f"{k}={v}" for k, v in sorted(self.labels.items())))
        if self.platform:
            parts.append(f"platform {self.platform!r}")
        return " and ".join(parts) or "any worker"

    def to_json(self) -> dict:
        out: dict = {}
        if self.target:
            out["target"] = self.target
        if self.labels:
            out["labels"] = dict(self.labels)
        if self.platform:
            out["platform"] = self.platform
        return out


@dataclass(frozen=True)
class WorkerView:
    """What scheduling needs to know of a pool member."""

    name: str
    instance_id: str
    labels: dict[str, str]
    platform: str
    arch: str
    status: str
    connected: bool
    capacity: int
    active: int

    @property
    def free(self) -> int:
        return self.capacity - self.active


def resolve_target(target: str, workers: Iterable[WorkerView]) -> WorkerView | None:
    """The one worker a target names, or ``None``.

    Identity is the orchestrator's: a target is the *name* it gave a worker. An instance id
    (the per-process UUID a worker chooses itself) also works, but only when it is well formed,
    no worker is named that, and exactly one worker in the pool has it — so a worker that calls
    its instance another worker's name, or copies another's instance id, receives nothing.
    """
    candidates = list(workers)
    for worker in candidates:
        if worker.name == target:
            return worker
    if INSTANCE_ID.fullmatch(target) is None:
        return None
    same = [w for w in candidates if w.instance_id == target]
    return same[0] if len(same) == 1 else None


def unmet(placement: Placement, *, labels: dict, platform: str, arch: str) -> list[str]:
    """What of ``placement``'s labels and platform a worker with these lacks (its target aside),
    e.g. ``["gpu=true", "platform linux/arm64"]``; empty when it has all of it."""
    missing = [f"{k}={v}" for k, v in placement.labels.items() if labels.get(k) != v]
    if placement.platform:
        os_part, _, arch_part = placement.platform.partition("/")
        if (os_part and os_part != platform) or (arch_part and arch_part != arch):
            missing.append(f"platform {placement.platform}")
    return missing


def matches(placement: Placement, worker: WorkerView) -> bool:
    """Does this worker satisfy the labels and platform, regardless of load and status? (A
    target is resolved against the whole pool: :func:`resolve_target`.)"""
    if placement.target:
        return placement.target == worker.name
    for key, value in placement.labels.items():
        if worker.labels.get(key) != value:
            return False
    if placement.platform:
        os_part, _, arch_part = placement.platform.partition("/")
        if os_part and os_part != worker.platform:
            return False
        if arch_part and arch_part != worker.arch:
            return False
    return True


@dataclass(frozen=True)
class Choice:
    """The decision: a worker, or none with the counts that explain why."""

    worker: WorkerView | None
    matching: int  # connected, schedulable workers that match the placement
    full: int  # of those, how many have no free slot


def choose_worker(placement: Placement, workers: Iterable[WorkerView]) -> Choice:
    """Least-loaded first (most free slots), then name, among connected, matching workers."""
    if placement.target:
        target = resolve_target(placement.target, workers)
        if target is None:
            return Choice(worker=None, matching=0, full=0)
        placement, workers = Placement(target=target.name), [target]
    best: WorkerView | None = None
    matching = full = 0
    for worker in workers:
        if not worker.connected or not is_schedulable(worker.status):
            continue
        if not matches(placement, worker):
            continue
        matching += 1
        if worker.free <= 0:
            full += 1
            continue
        if best is None or (-worker.free, worker.name) < (-best.free, best.name):
            best = worker
    return Choice(worker=best, matching=matching, full=full)
