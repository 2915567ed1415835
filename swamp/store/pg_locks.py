"""Held by one process at a time: PostgreSQL session advisory locks, on connections of their own.

Several orchestrators on one database each hold a lock on their own id (a peer that can take
it knows the owner is gone: liveness), and whatever must run once (retention, the boot's
reconciliation, token deadlines, queue rescans) runs only while its lock is held. A session
advisory lock lives as long as the connection that took it: a holder that dies (``kill -9``, a
machine gone once the server notices) frees it, and the next in line takes it within moments.

:func:`held` waits until the lock is held (``pg_advisory_lock``: the server queues the
waiters, nothing polls), runs the block, and lets it go. While the block runs, the lock's
connection is watched (an idle read on its socket, no traffic); if it is lost — the server
ended it, the network dropped it — the lock is gone with it: the block is cancelled at once
and :class:`LockLost` raised, so nothing goes on believing it holds what another may hold now.
A holder that vanishes without closing (a partitioned machine) keeps the lock until the server
notices the dead connection: set the server's TCP keepalives to seconds, and still fence what
is written (``swamp.domain.holding``). The lock's own connection sends keepalives every few
seconds (:data:`KEEPALIVES`), so a holder cut off learns it within about 11 seconds
(``swamp.domain.peers.LOCK_LOSS_NOTICED_WITHIN``).
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import trio
from psycopg.conninfo import make_conninfo

from swamp.errors import ConnectionLost, LockHeld, LockLost
from swamp.store import pg

# The lock's connection carries no traffic while held: TCP keepalives every few seconds, and a
# bound on unacknowledged data, so a holder cut off from the server learns of it in seconds
# (the system's default keepalive starts after two hours), not after the next holder took over.
KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 3,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": 10000,
}
# (what ``swamp.domain.peers.LOCK_LOSS_NOTICED_WITHIN`` counts on: about 11 s)


def lock_key(name: str) -> int:
    """A lock's name as PostgreSQL's 64-bit key (the first 8 bytes of its SHA-256, signed)."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


@asynccontextmanager
async def held(url: str, name: str, *, wait: bool = True) -> AsyncIterator[None]:
    """The block runs while this process holds the lock ``name`` (waiting its turn first;
    without ``wait``, :class:`LockHeld` at once if another holds it); losing the lock cancels
    the block and raises :class:`LockLost`. What the block raises comes out as it is."""
    key = lock_key(name)
    async with await pg.connect(make_conninfo(url, **KEEPALIVES)) as conn:
        if wait:
            await conn.execute("SELECT pg_advisory_lock($1)", (key,))
        elif not (await conn.execute("SELECT pg_try_advisory_lock($1)", (key,))).rows[0][0]:
            raise LockHeld(f"the advisory lock {name!r} is held by another process")
        lost: list[str] = []
        block = trio.CancelScope()
        raised: BaseException | None = None
        async with trio.open_nursery() as nursery:

            async def watch() -> None:
                try:
                    while True:  # notifications are none of its business: only the loss
                        await conn.wait_notifications()
                except ConnectionLost as exc:
                    lost.append(exc.message)
                    block.cancel()

            nursery.start_soon(watch)
            try:
                with block:
                    yield
            except BaseException as exc:  # the block's own: raised again, as itself, below
                raised = exc
            finally:
                nursery.cancel_scope.cancel()
        if raised is not None:
            raise raised
        if lost:
            raise LockLost(f"the advisory lock {name!r} was lost with its connection: {lost[0]}")
        if not conn.closed:
            with trio.CancelScope(shield=True), trio.move_on_after(pg.CANCEL_GRACE):
                await conn.execute("SELECT pg_advisory_unlock($1)", (key,))
