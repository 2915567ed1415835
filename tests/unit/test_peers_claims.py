"""The claim pass (``swamp.orchestrator.peers``) on a real PostgreSQL: every waiting step is
looked at, however many others' steps no local worker matches are ahead of it; a dead peer's
reconciliation that fails is tried again, never the survivor's end."""

from __future__ import annotations

from types import SimpleNamespace

from swamp.domain.peers import SharedStep
from swamp.orchestrator.peers import Peers
from swamp.store import pg
from swamp.store.pg_peers import PgPeers


class OnlyCpuSlots:
    """A claimer whose one free worker has cpu=yes and nothing else."""

    def __init__(self) -> None:
        self.reserved: list[str] = []
        self.released: list[str] = []
        self.pool = self  # (a worker here: members)
        self.members = {"w": object()}

    def reserve_for_peer(self, requirement):
        if ("cpu", "yes") not in requirement.keys:
            return None
        dispatch_id = f"d{len(self.reserved)}"
        self.reserved.append(dispatch_id)
        return SimpleNamespace(name="w"), dispatch_id

    def release(self, member, dispatch_id):
        self.released.append(dispatch_id)


async def test_a_claimable_step_behind_500_unmatchable_ones_is_claimed(pg_url):
    """500 steps of others that only a third orchestrator's workers match, then one ours
    matches: it is claimed (the pass reads them page by page)."""
    pool = pg.Pool(pg_url)
    try:
        table = await PgPeers.open(pool)
        for i in range(500):
            await table.publish(
                SharedStep(f"gpu{i:03}", "origin", {"labels": {"gpu": "a100"}}, 0, "local", i)
            )
        await table.publish(
            SharedStep("cpu", "origin", {"labels": {"cpu": "yes"}}, 0, "local", 1e6)
        )
        peers = Peers(table, pg_url, reconcile=None)  # type: ignore[arg-type]
        peers.queue = queue = OnlyCpuSlots()  # type: ignore[assignment]
        await peers._claim()
        assert queue.reserved, "the step our worker matches was never looked at"
        assert "cpu" in await table.claims_of(peers.me)
    finally:
        await pool.aclose()


async def test_a_failing_reconciliation_does_not_crash_the_survivor(pg_url, monkeypatch):
    """What the dead one left cannot be reconciled (a record no reconciliation reads): the
    watch says so and tries again later; the survivor goes on."""
    import trio

    from swamp.domain.peers import PeerRow
    from swamp.orchestrator import peers as peers_module

    monkeypatch.setattr(peers_module, "DEATH_GRACE", 0)
    pool = pg.Pool(pg_url)
    try:
        table = await PgPeers.open(pool)
        await table.register(PeerRow("dead", "ws://127.0.0.1:1", "h", None, 0.0))

        tries = []

        async def reconcile(dead: str) -> dict:
            tries.append(dead)
            raise KeyError("status")  # e.g. a run header without the field

        peers = Peers(table, pg_url, reconcile=reconcile)
        with trio.move_on_after(3):
            await peers._watch("dead")  # logs, and tries again
        assert len(tries) >= 2 and await table.get("dead") is not None
    finally:
        await pool.aclose()
