"""Admission: what a socket may cost before it is trusted.

A websocket that has neither enrolled nor been accepted as an admin is *pending*. Everything a
pending socket can take is bounded, because anyone who can reach the port can open one:

- **time** — it must enroll or make its first authorized admin call within
  :data:`PENDING_DEADLINE` seconds, or it is closed (pinging does not count);
- **number** — at most :data:`MAX_PENDING` pending sockets at once; one more evicts the *oldest*
  pending one (never one whose enrollment is being decided). A real worker or CLI makes its
  first call right after connecting, so under a flood it is the flood that gets evicted, not
  the newcomer; a worker evicted in a burst of its own fleet retries with backoff;
- **work** — until it has a role a socket may have :data:`PENDING_IN_FLIGHT` request in flight
  (the :class:`~swamp.protocol.rpc.RpcChannel` answers more with ``busy``) and may send
  :data:`PENDING_FRAMES` frames in all (more closes it). That also bounds what it is sent back,
  so the close frame always fits in the socket's buffer, even when the peer never reads.
- **memory** — a message is buffered whole before we see it, so until a socket has a role its
  messages may be at most :data:`PENDING_MESSAGE_BYTES`, each in one frame (a larger or
  fragmented one closes it with code 1009): :data:`MAX_PENDING` × that is the most untrusted
  sockets can hold. Enrollment and a first admin call are small; a socket that presented an
  accepted credential of the admin scope at its upgrade, or has enrolled, may send messages up
  to :data:`TRUSTED_MESSAGE_BYTES`, in at most :data:`TRUSTED_FRAGMENTS` frames.

Admin sockets are kept here too, by principal, so that revoking a server token closes the
sockets it opened.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from swamp.protocol.frames import MAX_FRAME_BYTES

if TYPE_CHECKING:
    from swamp.orchestrator.admin_auth import Principal
    from swamp.orchestrator.connection import Connection

log = logging.getLogger("swamp.app")
MAX_PENDING = 128
PENDING_DEADLINE = 5.0
PENDING_IN_FLIGHT = 1
PENDING_FRAMES = 32
PENDING_MESSAGE_BYTES = 64 * 1024
TRUSTED_MESSAGE_BYTES = MAX_FRAME_BYTES + 4096  # over our own limit: a larger frame gets our error
# frames one message may come in: none of ours fragments; a peer that sends a message in
# thousands of tiny frames makes the websocket library keep a piece for each
PENDING_FRAGMENTS = 1
TRUSTED_FRAGMENTS = 64
ADMIN_IN_FLIGHT = 64
CLOSE_POLICY = 1008  # websocket "policy violation"
CLOSE_REVOKED = 4001


def worker_in_flight(capacity: int) -> int:
    """A worker's dispatches each make a few capability calls at once, not many."""
    return 16 + 4 * capacity


class Admission:
    def __init__(
        self, *, max_pending: int = MAX_PENDING, deadline: float = PENDING_DEADLINE
    ) -> None:
        self.max_pending = max_pending
        self.deadline = deadline
        self._pending: dict[Connection, None] = {}  # insertion order = age
        self._engaged: set[Connection] = set()  # pending, but its enrollment is being decided
        self._admins: dict[Connection, Principal] = {}
        self.evicted = 0
        self.timed_out = 0

    def __repr__(self) -> str:
        return f"<Admission pending={len(self._pending)} admins={len(self._admins)}>"

    def statistics(self) -> dict:
        return {
            "pending": len(self._pending),
            "admins": len(self._admins),
            "evicted": self.evicted,
            "timedOut": self.timed_out,
        }

    def arrived(self, connection: Connection) -> Connection | None:
        """A new socket is pending; returns the oldest pending one to evict, if over the cap."""
        evict = None
        if len(self._pending) >= self.max_pending:
            evict = next((c for c in self._pending if c not in self._engaged), None)
            if evict is not None:
                del self._pending[evict]
                self.evicted += 1
        self._pending[connection] = None
        return evict

    def engaged(self, connection: Connection, busy: bool) -> None:
        """An enrollment of this socket is being decided (``busy``), or no longer is."""
        if busy:
            self._engaged.add(connection)
        else:
            self._engaged.discard(connection)

    def trusted(self, connection: Connection, principal: Principal | None = None) -> None:
        """It enrolled (``principal`` None) or made an authorized admin call."""
        self._pending.pop(connection, None)
        self._engaged.discard(connection)
        if principal is not None:
            self._admins[connection] = principal

    def is_pending(self, connection: Connection) -> bool:
        return connection in self._pending

    def left(self, connection: Connection) -> None:
        self._pending.pop(connection, None)
        self._engaged.discard(connection)
        self._admins.pop(connection, None)

    def close_revoked_admins(self, still_valid: Callable[[Principal], bool]) -> None:
        """After a repo change: close the admin sockets of server tokens revoked meanwhile."""
        for connection in self.revoked_admins(still_valid):
            principal = self._admins[connection]
            log.info("closing %s: %s was revoked", connection.peer, principal.describe())
            connection.channel.abort(CLOSE_REVOKED, f"{principal.describe()} has been revoked")

    def revoked_admins(self, still_valid: Callable[[Principal], bool]) -> list[Connection]:
        """Admin sockets whose principal is no longer valid (checked once per principal)."""
        verdicts: dict[Principal, bool] = {}
        out = []
        for connection, principal in self._admins.items():
            if principal not in verdicts:
                verdicts[principal] = still_valid(principal)
            if not verdicts[principal]:
                out.append(connection)
        return out
