"""An orchestrator that lost its hold on a shared database lets its workers go in time.

Its peers take it for dead once the server freed its liveness lock, and run its steps again
after the fence. If it were cut off from the database but not from its workers, its own copies
would run on beside theirs. So once its lock has been lost for as long as is safe
(:func:`swamp.domain.peers.let_go_after`), it closes every worker's socket — each stops the
steps it ran here, as on any lost connection, and moves to an orchestrator it can reach — and
takes no worker until the lock is held again. Taken back in time (a dropped connection, the
server restarted quickly), nothing is let go; reconciled by a peer meanwhile, it stops
(``Peers.hold_liveness``).

The wait counts from the first loss until the lock has been held again for ``steady``
seconds (a peer's grace): a peer that saw it free once and looks again later must not find
the wait started afresh by a moment's hold in between.
"""

from __future__ import annotations

import logging

import trio

from swamp.orchestrator.membership import Membership
from swamp.orchestrator.peers import DEATH_GRACE, Peers

log = logging.getLogger("swamp.serve")

LETTING_GO = (
    "this orchestrator lost its hold on its PostgreSQL database: it takes no workers and sends "
    "no steps to workers until it holds it again (another orchestrator of the list will)"
)


class SelfFence:
    def __init__(
        self, peers: Peers, membership: Membership, *, after: float, steady: float = DEATH_GRACE
    ) -> None:
        self.peers = peers
        self.membership = membership
        self.after = after  # seconds the lock may be lost before the workers are let go
        self.steady = steady  # seconds held again before a loss is forgotten
        self.let_go = 0  # how many times they were (for the tests and the log)

    async def run(self, *, task_status=trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await self.peers.until_holding(False)
            lost_at = trio.current_time()
            if await self._back_in_time(lost_at + self.after):
                log.info(
                    "took its liveness lock back within %gs and held it %gs: its workers stay",
                    self.after,
                    self.steady,
                )
                continue
            closed = self.membership.let_go(LETTING_GO)
            self.let_go += 1
            log.warning(
                "its liveness lock was lost and not held again within %gs: let its %d "
                "worker(s) go (their steps stop; they move to another orchestrator); it takes "
                "none until it holds the lock again",
                self.after,
                closed,
            )
            await self._steady()
            self.membership.take_again()
            log.info("holds its liveness lock again: takes workers again")

    async def _steady(self) -> None:
        """Until the lock has been held for ``steady`` seconds without a loss (a peer that
        saw it free just before may take it for dead on its next look: its workers must not
        be back by then)."""
        while True:
            await self.peers.until_holding(True)
            with trio.move_on_after(self.steady):
                await self.peers.until_holding(False)
                continue
            return

    async def _back_in_time(self, deadline: float) -> bool:
        """Whether the lock is held again by ``deadline`` and then held for ``steady``
        seconds without a loss (a loss meanwhile keeps counting toward ``deadline``)."""
        while True:
            with trio.move_on_at(deadline):
                await self.peers.until_holding(True)
            if not self.peers.holding:
                return False  # the deadline passed
            with trio.move_on_after(self.steady):
                await self.peers.until_holding(False)
                continue  # lost again before it was steady: the first loss's deadline holds
            return True
