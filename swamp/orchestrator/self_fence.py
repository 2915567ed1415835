"""An orchestrator that lost its hold on a shared database lets its workers go in time.

Its peers take it for dead once the server freed its liveness lock, and run its steps again
after the fence. If it were cut off from the database but not from its workers, its own copies
would run on beside theirs. So once its lock has been lost for as long as is safe
(:func:`swamp.domain.peers.let_go_after`), it closes every worker's socket — each stops the
steps it ran here, as on any lost connection, and moves to an orchestrator it can reach — and
takes no worker until the lock is held again. Taken back in time (a dropped connection, the
server restarted quickly), nothing is let go; reconciled by a peer meanwhile, it stops
(``Peers.hold_liveness``).
"""

from __future__ import annotations

import logging

import trio

from swamp.domain.peers import let_go_after
from swamp.orchestrator.membership import Membership
from swamp.orchestrator.peers import DEATH_GRACE, Peers

log = logging.getLogger("swamp.serve")

LETTING_GO = (
    "this orchestrator lost its hold on its PostgreSQL database: it takes no workers and sends "
    "no steps to workers until it holds it again (another orchestrator of the list will)"
)


class SelfFence:
    def __init__(self, peers: Peers, membership: Membership, *, after: float) -> None:
        self.peers = peers
        self.membership = membership
        self.after = after  # seconds the lock may be lost before the workers are let go
        self.let_go = 0  # how many times they were (for the tests and the log)

    @classmethod
    def given(cls, peers: Peers, membership: Membership, *, fence: float) -> SelfFence:
        """With the wait its peers' ``fence`` (theirs is ours: one ``--heartbeat`` for all)
        and this database's lock connections allow."""
        from swamp.store.pg_locks import NOTICED_WITHIN  # (the driver: serving one)

        after = let_go_after(death_grace=DEATH_GRACE, fence=fence, noticed_within=NOTICED_WITHIN)
        return cls(peers, membership, after=after)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self.peers.until_holding(False)
            with trio.move_on_after(self.after):
                await self.peers.until_holding(True)
                continue  # taken back in time
            closed = self.membership.let_go(LETTING_GO)
            self.let_go += 1
            log.warning(
                "its liveness lock has been lost for %gs: let its %d worker(s) go (their steps "
                "stop; they move to another orchestrator) and takes none until it holds the "
                "lock again",
                self.after,
                closed,
            )
            await self.peers.until_holding(True)
            self.membership.take_again()
            log.info("holds its liveness lock again: takes workers again")
