"""Short-lived bearer credentials for the data plane, held in memory only.

A *dispatch* credential is issued per dispatch, scoped to that dispatch's model, kept fresh for
as long as the dispatch runs, and revoked when it ends; a restart invalidates them all. Only a
hash of each credential is kept. (Workers hold no other credential than their enrollment token:
an unused session credential was an unneeded secret, so there is none.)
"""

from __future__ import annotations

import hashlib
import secrets
import time
from dataclasses import dataclass

DEFAULT_TTL = 15 * 60


@dataclass
class Grant:
    worker: str
    dispatch_id: str
    expires: float


def _digest(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class Credentials:
    def __init__(self, *, ttl: float = DEFAULT_TTL, clock=time.time) -> None:
        self.ttl = ttl
        self.clock = clock
        self._grants: dict[str, Grant] = {}

    def __repr__(self) -> str:
        return f"<Credentials live={len(self._grants)}>"

    def _issue(self, grant: Grant) -> str:
        token = secrets.token_hex(32)
        self._grants[_digest(token)] = grant
        return token

    def issue_dispatch(self, worker: str, dispatch_id: str) -> str:
        return self._issue(Grant(worker, dispatch_id, self.clock() + self.ttl))

    def extend(self, token: str) -> None:
        grant = self._grants.get(_digest(token))
        if grant is not None:
            grant.expires = self.clock() + self.ttl

    def verify(self, token: str) -> Grant | None:
        digest = _digest(token)
        grant = self._grants.get(digest)
        if grant is None:
            return None
        if grant.expires <= self.clock():
            del self._grants[digest]
            return None
        return grant

    def revoke(self, token: str) -> None:
        self._grants.pop(_digest(token), None)

    def revoke_worker(self, worker: str) -> None:
        for digest in [d for d, g in self._grants.items() if g.worker == worker]:
            del self._grants[digest]
