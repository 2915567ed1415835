"""An orchestrator that lost its liveness lock lets its workers go only once the lock has
stayed lost for as long as is safe; taken back sooner, nothing happens. (On real processes:
tests/integration/test_orchestrators.py, the lock lost and held elsewhere.)"""

from __future__ import annotations

import pytest
import trio
import trio.testing

from swamp.domain.peers import (
    LET_GO_MARGIN,
    LOCK_LOSS_NOTICED_WITHIN,
    let_go_after,
    recorded_heartbeat,
    rerun_fence,
)
from swamp.domain.workers import fence_seconds
from swamp.orchestrator.peers import DEATH_GRACE
from swamp.orchestrator.self_fence import LETTING_GO, SelfFence


class Lock:
    """The liveness lock's state as ``Peers`` keeps it (``holding``, ``until_holding``)."""

    def __init__(self) -> None:
        self.holding = False
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
        self.clock = lambda: 0.0

    def let_go(self, reason: str) -> int:
        assert reason == LETTING_GO
        self.letting_go = reason
        self.done.append(f"let go at {self.clock():g}")
        return 2

    def take_again(self) -> None:
        self.letting_go = None
        self.done.append(f"taken again at {self.clock():g}")


@pytest.mark.parametrize("heartbeat", [0.5, 1, 2, 3, 5, 10, 30])
def test_the_last_copy_stops_before_a_peer_may_start_another(heartbeat):
    """Whatever the heartbeat: noticed as late as the keepalives allow, then the wait, then a
    margin — and the peers' rerun comes no sooner (they wait the longer fence if need be)."""
    fence = fence_seconds(heartbeat)
    wait = let_go_after(death_grace=DEATH_GRACE, fence=fence)
    earliest_rerun = DEATH_GRACE + rerun_fence(fence, death_grace=DEATH_GRACE)
    assert wait >= 0 and rerun_fence(fence, death_grace=DEATH_GRACE) >= fence
    assert LOCK_LOSS_NOTICED_WITHIN + wait + LET_GO_MARGIN <= earliest_rerun + 1e-9


def test_the_default_heartbeat_rides_out_a_database_restart_of_several_seconds():
    assert let_go_after(death_grace=DEATH_GRACE, fence=fence_seconds(5)) == 8
    assert let_go_after(death_grace=DEATH_GRACE, fence=fence_seconds(1)) == 0


def run_fence(script, *, after=10.0, steady=5.0) -> tuple[list[str], Workers]:
    """Run the fence over ``script`` — (seconds from the start, holding) — on trio's clock;
    what it did to the workers, each with when."""
    lock, workers = Lock(), Workers()
    fence = SelfFence(lock, workers, after=after, steady=steady)  # type: ignore[arg-type]
    done: list[str] = []

    async def main() -> None:
        async with trio.open_nursery() as nursery:
            await nursery.start(fence.run)
            lock.hold(True)  # (as Peers: not held until registered)
            start = trio.current_time()
            workers.clock = lambda: trio.current_time() - start
            for at, holding in script:
                await trio.sleep_until(start + at)
                lock.hold(holding)
            await trio.sleep(after + steady + 1)
            nursery.cancel_scope.cancel()

    trio.run(main, clock=trio.testing.MockClock(autojump_threshold=0))
    done.extend(workers.done)
    return done, workers


def test_a_lock_taken_back_in_time_lets_nothing_go():
    done, workers = run_fence([(0, False), (9, True)])
    assert done == [] and workers.letting_go is None


def test_a_lock_lost_past_the_wait_lets_the_workers_go_until_it_is_held_steadily_again():
    done, workers = run_fence([(0, False), (11, True)])
    assert done == ["let go at 10", "taken again at 16"] and workers.letting_go is None


def test_workers_let_go_stay_away_while_the_lock_flickers():
    """Held again a moment, lost again: a peer that saw it free may bury it on its next
    look, so the workers come back only once the lock has been held a peer's grace."""
    done, _ = run_fence([(0, False), (10.5, True), (11, False), (12, True)])
    assert done == ["let go at 10", "taken again at 17"]


def test_a_moment_held_in_between_does_not_start_the_wait_afresh():
    """Lost, held 2 s (less than a peer's grace), lost again: a peer that saw it free the
    first time may take it for dead on its second look, so the wait runs from the first
    loss."""
    done, _ = run_fence([(0, False), (3, True), (5, False)])
    assert done == ["let go at 10"]
    steady, _ = run_fence([(0, False), (3, True), (9, False)])  # held 6 s: a new loss
    assert steady == ["let go at 19"]


def test_what_the_registry_keeps_of_a_heartbeat_is_rounded_up_to_whole_intervals():
    assert recorded_heartbeat(5.0, 5.0) == 5.0
    assert recorded_heartbeat(5.005, 5.0) == 10.0
    assert recorded_heartbeat(50.0, 5.0) == 50.0
    assert recorded_heartbeat(7.0, 0.0) == 7.0  # no base: as told
