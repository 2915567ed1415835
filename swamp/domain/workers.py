"""Worker statuses and the worker record as data.

``idle`` and ``busy`` are schedulable; ``disconnected`` is not (a member in its grace window
keeps its place in the pool but gets no work); ``unverified`` is not (it is being probed, or its
probe failed, under ``serve --verify-on-enroll``); ``draining`` is not (it finishes what it runs,
then leaves); ``unresponsive`` is not (it said nothing of a dispatch it was sent: the dispatch was
taken back, and the machine gets no more for a while, reconnects included). Nor is any status a
client does not know.
"""

from __future__ import annotations

import re
from enum import Enum

from swamp.domain.lifecycle import Lifecycle
from swamp.errors import UserError


class WorkerStatus(str, Enum):
    IDLE = "idle"
    BUSY = "busy"
    DISCONNECTED = "disconnected"
    UNVERIFIED = "unverified"
    DRAINING = "draining"
    UNRESPONSIVE = "unresponsive"


SCHEDULABLE = frozenset({WorkerStatus.IDLE.value, WorkerStatus.BUSY.value})

WORKER_LIFECYCLE = Lifecycle(
    "a worker",
    {
        WorkerStatus.IDLE: {
            WorkerStatus.BUSY,
            WorkerStatus.DISCONNECTED,
            WorkerStatus.IDLE,
            WorkerStatus.DRAINING,
            WorkerStatus.UNRESPONSIVE,
        },
        WorkerStatus.BUSY: {
            WorkerStatus.IDLE,
            WorkerStatus.DISCONNECTED,
            WorkerStatus.BUSY,
            WorkerStatus.DRAINING,
            WorkerStatus.UNRESPONSIVE,
        },
        WorkerStatus.DISCONNECTED: {WorkerStatus.IDLE, WorkerStatus.BUSY},
        # a probe never demotes a worker: only an enrollment starts unverified
        WorkerStatus.UNVERIFIED: {
            WorkerStatus.IDLE,
            WorkerStatus.UNVERIFIED,
            WorkerStatus.DISCONNECTED,
            WorkerStatus.DRAINING,
        },
        # announced by the worker when its drain starts; it leaves when the last slot empties
        WorkerStatus.DRAINING: {WorkerStatus.DRAINING, WorkerStatus.DISCONNECTED},
        # held back for a while (reconnects included): it may still drain and leave
        WorkerStatus.UNRESPONSIVE: {
            WorkerStatus.UNRESPONSIVE,
            WorkerStatus.IDLE,
            WorkerStatus.BUSY,
            WorkerStatus.UNVERIFIED,  # released under --verify-on-enroll: probed first
            WorkerStatus.DISCONNECTED,
            WorkerStatus.DRAINING,
        },
    },
)


def is_schedulable(status: str) -> bool:
    """Unknown statuses (from a newer orchestrator) are treated as not schedulable."""
    return status in SCHEDULABLE


# -- what a worker says about itself at enrollment ------------------------------------------------
# Checked with full matches: these strings end up in the pool, in records, in terminals and logs.

INSTANCE_ID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")
_INSTANCE_ID_PREFIX = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}(-.*)?")
MACHINE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
PLATFORM_WORD = re.compile(r"[a-z0-9][a-z0-9_.-]{0,31}")
VERSION = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+_-]{0,63}")
# a token name (64) and, for a fleet member, '-' and up to 64 hex digits of suffix
WORKER_NAME = re.compile(r"[a-z0-9][a-z0-9_-]{0,129}")


def looks_like_instance_id(name: str) -> bool:
    """A token or worker name that an instance id could equal (or a fleet name could grow into).

    Such names are refused, so a ``--target`` can never mean a name and an instance id at once.
    """
    return _INSTANCE_ID_PREFIX.fullmatch(name) is not None


def _check(pattern: re.Pattern, value: object, what: str, rule: str) -> str:
    if not isinstance(value, str) or pattern.fullmatch(value) is None:
        shown = value if not isinstance(value, str) or len(value) <= 80 else value[:80] + "…"
        raise UserError(f"enrollment needs {what!r}: {rule}, got {shown!r}")
    return value


def check_instance_id(value: object) -> str:
    return _check(INSTANCE_ID, value, "instanceId", "a lowercase UUID")


def check_machine_id(value: object) -> str:
    return _check(MACHINE_ID, value, "machineId", "1-128 letters, digits, '.', '_' or '-'")


def check_platform_word(value: object, what: str) -> str:
    return _check(PLATFORM_WORD, value, what, "1-32 lowercase letters, digits, '.', '_' or '-'")


def check_worker_name(value: object) -> str:
    if not isinstance(value, str) or WORKER_NAME.fullmatch(value) is None:
        raise UserError(f"invalid worker name {value!r}")
    return value


def check_version(value: object) -> str:
    return _check(VERSION, value, "version", "1-64 letters, digits, '.', '+', '_' or '-'")


HEARTBEATS_PER_SECOND = 200  # what an orchestrator budgets for all its workers' heartbeats


def heartbeat_interval(base: float, members: int) -> float:
    """How often a newly enrolled worker pings: ``serve --heartbeat`` in a small pool; in a
    large one, long enough that the whole pool sends about :data:`HEARTBEATS_PER_SECOND`
    (10,000 workers: every 50 s). A socket that closes is noticed at once whatever the
    interval; it bounds only how long a frozen or cut-off machine keeps its place."""
    return max(base, members / HEARTBEATS_PER_SECOND)


HEARTBEATS_MISSED = 3  # the RPC channel's default: silent this many intervals means gone
FENCE_MARGIN = 2.0


def fence_seconds(heartbeat: float) -> float:
    """How long after losing a worker told ``heartbeat`` its step may run elsewhere: by then
    the worker, if it is alive behind a partition, has given up on its orchestrator and
    killed its commands (and its reaper has, if it is frozen)."""
    return heartbeat * HEARTBEATS_MISSED + FENCE_MARGIN
