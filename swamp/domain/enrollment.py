"""Enrollment admission: whether a worker that said hello joins the pool, and as what.

One decision from values: the hello (its instance and machine), what its token decided (a worker
name, or a refusal) and what the pool holds of that name and instance. The answer is to admit it
(as a name, with the status it starts in), to let it wait for a place (a fleet token that is
full: a gone machine's place frees in time) or to refuse it with a code and a reason. The
gateway's enrollment (``swamp.orchestrator.enrollment``) performs what this decides: the record,
the pool, the reply.

The instance check comes twice: :func:`instance_clash` before the token is redeemed — so a
refused worker never uses up a place — and again in :func:`admit`, once the name is known.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from swamp.domain.workers import WorkerStatus
from swamp.errors import AlreadyConnected, Conflict, FleetFull, SwampError

VERIFYING = "verification in progress"


class Hello(Protocol):
    """What the decision reads of a worker's handshake (``EnrollRequest``)."""

    @property
    def instance_id(self) -> str: ...

    @property
    def machine_id(self) -> str: ...


@dataclass(frozen=True)
class Present:
    """A member the pool already holds: the one with this instance id, or with this name."""

    name: str
    instance_id: str
    machine_id: str
    connected: bool


@dataclass(frozen=True)
class Admit:
    """Join the pool as ``name`` in ``status`` (``reason`` says why it gets no work yet)."""

    name: str
    status: WorkerStatus
    reason: str | None
    verify: bool  # probe it before it gets work (--verify-on-enroll)
    replaces: bool  # the same process's older socket is closed
    reconnect: bool  # the pool knew this process under this name


@dataclass(frozen=True)
class Wait:
    """No place on the token now: the worker waits and asks again (it is not refused)."""

    error: SwampError

    @property
    def code(self) -> str:
        return self.error.code


@dataclass(frozen=True)
class Refuse:
    """Not admitted: ``error`` carries the code and the reason the worker is told."""

    error: SwampError

    @property
    def code(self) -> str:
        return self.error.code


Decision = Admit | Wait | Refuse


def _instance_in_use(instance_id: str) -> Refuse:
    return Refuse(
        Conflict(
            f"instance id {instance_id} is already in use by another worker of the "
            "pool; each process must use a fresh one"
        )
    )


def instance_clash(hello: Hello, twin: Present | None) -> Refuse | None:
    """Before the token is redeemed: another machine's member holds this instance id."""
    if twin is not None and twin.machine_id != hello.machine_id:
        return _instance_in_use(hello.instance_id)
    return None


def admit(
    hello: Hello,
    *,
    token: str | SwampError,
    twin: Present | None,
    existing: Present | None,
    verify_on_enroll: bool,
    held_back: str | None,
    hold_back_seconds: float,
) -> Decision:
    """The admission of one hello.

    ``token`` is the worker name the token gave this machine, or the token's refusal;
    ``twin`` the member holding the hello's instance id, ``existing`` the member holding the
    name; ``held_back`` why this machine is held back (it left a dispatch unacknowledged), if
    it still is.
    """
    if isinstance(token, FleetFull):
        return Wait(token)
    if isinstance(token, SwampError):
        return Refuse(token)
    name = token
    if twin is not None and (twin.machine_id != hello.machine_id or twin.name != name):
        return _instance_in_use(hello.instance_id)
    replaces = False
    if existing is not None and existing.connected:
        if existing.instance_id != hello.instance_id:
            return Refuse(
                AlreadyConnected(
                    f"worker {name!r} is already connected from another process; if that "
                    "process is gone, its connection is dropped after missed heartbeats"
                )
            )
        replaces = True
    reconnect = existing is not None and existing.instance_id == hello.instance_id
    if held_back is not None:  # it left no dispatch of it unanswered by reconnecting
        return Admit(
            name,
            WorkerStatus.UNRESPONSIVE,
            f"{held_back} (held back for {hold_back_seconds:g}s from then, reconnects included)",
            verify=False,
            replaces=replaces,
            reconnect=reconnect,
        )
    if verify_on_enroll:
        return Admit(name, WorkerStatus.UNVERIFIED, VERIFYING, True, replaces, reconnect)
    return Admit(name, WorkerStatus.IDLE, None, False, replaces, reconnect)
