"""Worker statuses and the worker record as data.

``idle`` and ``busy`` are schedulable; ``disconnected`` is not (a member in its grace window
keeps its place in the pool but gets no work); ``unverified`` is not (it is being probed, or its
probe failed, under ``serve --verify-on-enroll``). Nor is any status a client does not know.
"""

from __future__ import annotations

from enum import Enum

from swamp.domain.lifecycle import Lifecycle


class WorkerStatus(str, Enum):
    IDLE = "idle"
    BUSY = "busy"
    DISCONNECTED = "disconnected"
    UNVERIFIED = "unverified"


SCHEDULABLE = frozenset({WorkerStatus.IDLE.value, WorkerStatus.BUSY.value})

WORKER_LIFECYCLE = Lifecycle(
    "a worker",
    {
        WorkerStatus.IDLE: {WorkerStatus.BUSY, WorkerStatus.DISCONNECTED, WorkerStatus.IDLE},
        WorkerStatus.BUSY: {WorkerStatus.IDLE, WorkerStatus.DISCONNECTED, WorkerStatus.BUSY},
        WorkerStatus.DISCONNECTED: {WorkerStatus.IDLE, WorkerStatus.BUSY},
        # a probe never demotes a worker: only an enrollment starts unverified
        WorkerStatus.UNVERIFIED: {WorkerStatus.IDLE, WorkerStatus.UNVERIFIED,
                                  WorkerStatus.DISCONNECTED},
    },
)


def is_schedulable(status: str) -> bool:
    """Unknown statuses (from a newer orchestrator) are treated as not schedulable."""
    return status in SCHEDULABLE


def status_for(active: int) -> WorkerStatus:
    return WorkerStatus.BUSY if active > 0 else WorkerStatus.IDLE
