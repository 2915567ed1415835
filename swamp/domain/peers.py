"""Several orchestrators on one database: the shapes they share through it (the registry's
rows, the shared queue's steps), and the names of what they hold (``swamp.orchestrator.peers``
acts on them; ``swamp.store.pg_peers`` keeps them)."""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass

from swamp.domain.workers import fence_seconds


def liveness_lock(orchestrator: str) -> str:
    """The advisory lock an orchestrator holds for its life: free, it is gone."""
    return f"swamp orchestrator {orchestrator}"


def credential_hash(credential: str) -> str:
    """What the registry keeps of an orchestrator's peer credential."""
    return hashlib.sha256(credential.encode("utf-8", "replace")).hexdigest()


def claims_channel(orchestrator: str) -> str:
    """The NOTIFY channel an orchestrator hears the claims of its steps on (its prefix and
    the id stay within PostgreSQL's 63 bytes)."""
    return f"{CLAIMS_PREFIX}{orchestrator[:32]}"


CLAIMS_PREFIX = "swamp_claims_"
PEER_PREFIX = "peer:"  # no server token's name holds a colon: never one of theirs


def is_peer_credential(credential: str) -> bool:
    return credential.startswith(PEER_PREFIX)


def peer_credential(orchestrator: str, secret: str) -> str:
    return f"{PEER_PREFIX}{orchestrator}.{secret}"


def credential_orchestrator(credential: str) -> str | None:
    """Whose peer credential it says it is (to be checked against its hash)."""
    if not is_peer_credential(credential):
        return None
    orchestrator, dot, secret = credential[len(PEER_PREFIX) :].partition(".")
    return orchestrator if dot and orchestrator and secret and "." not in secret else None


@dataclass(frozen=True)
class PeerRow:
    """An orchestrator serving the database, as it registered."""

    id: str
    url: str
    credential_hash: str
    ca_pem: str | None
    started_epoch: float
    # what it can do beyond the first version of several orchestrators (an earlier one's row
    # says nothing): ``outliving`` — a step it runs for another outlives a broken link
    features: frozenset[str] = frozenset()
    # the longest heartbeat it has told a worker (0: not said, an earlier version): its
    # workers cut off with it stop their copies only that many intervals later
    heartbeat: float = 0.0


FEATURES = frozenset({"outliving", "takeover"})  # this version's


@dataclass(frozen=True)
class SharedStep:
    """A step waiting in the shared queue: enough to decide who can run it, nothing of what
    it runs (its arguments and environment go from the origin to the claimer only)."""

    queue_id: str
    origin: str
    placement: dict
    priority: int
    submitter: str
    queued_epoch: float
    claimed_by: str | None = None
    worker: str | None = None
    dispatch_id: str | None = None
    taken: bool = False


# The longest an orchestrator's liveness lock connection goes on believing it holds the lock
# once cut off: ``swamp.store.pg_locks`` sets its keepalives so (the first probe after 3 s of
# silence, then every 2 s, the connection given up at the first probe past the 10 s of
# ``tcp_user_timeout``: 11 s), and a second more.
LOCK_LOSS_NOTICED_WITHIN = 12.0
LET_GO_MARGIN = 2.0  # seconds kept between the last of our copies stopping and another's start


def rerun_fence(fence: float, *, death_grace: float) -> float:
    """How long after an orchestrator was reconciled (taken for dead) its steps wait before
    they run again elsewhere: the lease's ``fence``, and never less than an orchestrator cut
    off needs to notice it lost its lock and let its workers go (:func:`let_go_after`) —
    short heartbeats give short fences, the lock's keepalives do not shorten."""
    return max(fence, LOCK_LOSS_NOTICED_WITHIN + LET_GO_MARGIN - death_grace)


def let_go_after(*, death_grace: float, fence: float) -> float:
    """How long an orchestrator that lost its liveness lock (and has not taken it back) may
    keep its workers before it must let them go — close their sockets, so they stop the steps
    they run for it and move to an orchestrator that holds the database.

    Its peers may take it for dead once the server freed its lock: they look again
    ``death_grace`` later, reconcile it, and run its steps again :func:`rerun_fence` after
    that — the earliest another copy can start. It learns of the loss up to
    :data:`LOCK_LOSS_NOTICED_WITHIN` late (a partition is told by keepalives, not by a
    reset), and a margin is kept. Every orchestrator must have the same ``fence`` (the same
    ``--heartbeat``)."""
    earliest_rerun = death_grace + rerun_fence(fence, death_grace=death_grace)
    return max(0.0, earliest_rerun - LOCK_LOSS_NOTICED_WITHIN - LET_GO_MARGIN)


def dead_fence(fence: float, told: float, *, death_grace: float) -> float:
    """The :func:`rerun_fence` of an orchestrator's steps once it was taken for dead: from
    ``fence`` (this one's: the same ``--heartbeat`` everywhere) or from the longest heartbeat
    it told its workers (``told``: it grows with the pool), whichever is longer — its workers,
    cut off with it, kill their copies only after that many heartbeats of silence."""
    return rerun_fence(max(fence, fence_seconds(told)), death_grace=death_grace)


def recorded_heartbeat(told: float, base: float) -> float:
    """What the registry keeps of a heartbeat ``told``: rounded up to a whole number of
    ``base`` intervals, so a growing pool writes it now and then, not at every enrollment."""
    return math.ceil(told / base - 1e-9) * base if base > 0 else told
