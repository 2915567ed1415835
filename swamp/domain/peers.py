"""Several orchestrators on one database: the shapes they share through it (the registry's
rows, the shared queue's steps), and the names of what they hold (``swamp.orchestrator.peers``
acts on them; ``swamp.store.pg_peers`` keeps them)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass


def liveness_lock(orchestrator: str) -> str:
    """The advisory lock an orchestrator holds for its life: free, it is gone."""
    return f"swamp orchestrator {orchestrator}"


def credential_hash(credential: str) -> str:
    """What the registry keeps of an orchestrator's peer credential."""
    return hashlib.sha256(credential.encode("utf-8", "replace")).hexdigest()


def is_peer_credential(credential: str) -> bool:
    return credential.startswith("peer.")


@dataclass(frozen=True)
class PeerRow:
    """An orchestrator serving the database, as it registered."""

    id: str
    url: str
    credential_hash: str
    ca_pem: str | None
    started_epoch: float


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
