"""A worker's drain: stop taking work, finish what runs, say so, exit 0.

Three triggers start the one drain (it is idempotent): a signal (SIGTERM, SIGINT, SIGHUP),
``--max-dispatches`` (when the last allowed dispatch is accepted: the orchestrator hears of the
drain before it could send one more) and ``--idle-timeout`` (no dispatch running for that
long). Signals escalate, as a service manager expects: the first drains, the second stops the
running dispatches (they fail as "worker stopped") and exits with :data:`EXIT_FORCED`, the
third exits at once. ``--drain-timeout`` forces a drain that takes longer, as the second
signal does, and says so.
"""

from __future__ import annotations

from enum import Enum

EXIT_OK = 0  # every intentional stop: a drain that finished
EXIT_FAILED = 1  # a permanent rejection, or an unexpected error
EXIT_FORCED = 3  # a second signal stopped running dispatches
# The orchestrator could not be reached for --connect-timeout: not a rejection, so a service
# manager that does not restart 1 and 2 (the unit) starts it again.
EXIT_UNREACHABLE = 4


class Stage(str, Enum):
    RUNNING = "running"
    DRAINING = "draining"
    FORCING = "forcing"  # running dispatches are being stopped
    EXITING = "exiting"


class Action(str, Enum):
    NOTHING = "nothing"
    DRAIN = "drain"  # announce, refuse new work, exit when the last slot empties
    FORCE = "force"  # stop the running dispatches, report them, exit EXIT_FORCED
    EXIT_NOW = "exit_now"


def on_signal(stage: Stage) -> tuple[Stage, Action]:
    """First signal drains, the second forces, the third exits at once."""
    if stage is Stage.RUNNING:
        return Stage.DRAINING, Action.DRAIN
    if stage is Stage.DRAINING:
        return Stage.FORCING, Action.FORCE
    return Stage.EXITING, Action.EXIT_NOW


def on_trigger(stage: Stage) -> tuple[Stage, Action]:
    """``max-dispatches``, ``idle-timeout``: a drain, once; nothing if one is under way."""
    if stage is Stage.RUNNING:
        return Stage.DRAINING, Action.DRAIN
    return stage, Action.NOTHING


def on_drain_timeout(stage: Stage) -> tuple[Stage, Action]:
    """``--drain-timeout`` passed: a drain still waiting is forced, as a second signal would
    force it; one already forced or exiting is left to finish that."""
    if stage is Stage.DRAINING:
        return Stage.FORCING, Action.FORCE
    return stage, Action.NOTHING


def timeout_reached(seconds: float, running: int) -> str:
    """What the worker says when its drain timeout forces the stop."""
    them = "it" if running == 1 else "them"
    return (
        f"drain timeout ({seconds:g}s) reached with {running} "
        f"dispatch{'' if running == 1 else 'es'} running: stopping {them}"
    )


def refusal(
    stage: Stage, *, active: int, capacity: float, started: int, max_dispatches: int | None
) -> str | None:
    """Why a dispatch that takes a slot is refused (``worker_draining`` / ``worker_busy``), or
    ``None`` to accept it (``capacity`` is infinite for one that takes none)."""
    if stage is not Stage.RUNNING:
        return "worker_draining"
    if max_dispatches is not None and started >= max_dispatches:
        return "worker_draining"
    if active >= capacity:
        return "worker_busy"
    return None


def last_allowed(started: int, max_dispatches: int | None) -> bool:
    """Is the dispatch just accepted (``started`` counts it) the last one allowed?"""
    return max_dispatches is not None and started >= max_dispatches
