"""An orchestrator that lost its liveness lock lets its workers go only once the lock has
stayed lost for as long as is safe; taken back sooner, nothing happens. (On real processes:
tests/integration/test_orchestrators.py, the lock lost and held elsewhere.)"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from swamp.domain.peers import LET_GO_MARGIN, let_go_after
from swamp.orchestrator.self_fence import LETTING_GO, SelfFence


class Lock:
    """The liveness lock's state as ``Peers`` keeps it (``holding``, ``until_holding``)."""

    def __init__(self) -> None:
        self.holding = True
        self._changed = trio.Event()

    def hold(self, holding: bool) -> None:
        self.holding = holding
        self._changed.set()
        self._changed = trio.Event()

    async def until_holding(self, holding: bool = True) -> None:
        while self.holding != holding:
            await self._changed.wait()


class Workers:
    """What the fence does to the workers (``Membership.let_go`` / ``take_again``)."""

    def __init__(self) -> None:
        self.letting_go: str | None = None
        self.done: list[str] = []

    def let_go(self, reason: str) -> int:
        self.letting_go = reason
        self.done.append("let go")
        return 2

    def take_again(self) -> None:
        self.letting_go = None
        self.done.append("taken again")


def test_the_wait_leaves_room_for_the_peers_fence_and_a_late_notice():
    # the default --heartbeat (5 s): the fence is 17 s, a peer looks again after 5 s, the lock's
    # connection learns of a cut within 10 s
    assert let_go_after(death_grace=5, fence=17, noticed_within=10) == 10
    assert 5 + 17 - 10 - let_go_after(death_grace=5, fence=17, noticed_within=10) == LET_GO_MARGIN
    # short heartbeats leave no time: at once
    assert let_go_after(death_grace=5, fence=5, noticed_within=10) == 0


@pytest.mark.parametrize("lost_for, let_go", [(9.0, False), (11.0, True)])
def test_workers_are_let_go_only_once_the_lock_stayed_lost(lost_for, let_go):
    lock, workers = Lock(), Workers()
    fence = SelfFence(lock, workers, after=10.0)  # type: ignore[arg-type]

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(fence.run)
            lock.hold(False)
            await trio.sleep(lost_for)
            assert (workers.letting_go == LETTING_GO) is let_go
            lock.hold(True)
            await trio.sleep(1)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    assert workers.done == (["let go", "taken again"] if let_go else [])
    assert workers.letting_go is None and fence.let_go == int(let_go)
