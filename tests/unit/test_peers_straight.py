"""The straight path: a step of a requirement another orchestrator claimed last is sent
straight to it. A real ``Peers`` (hints), a real ``DispatchQueue`` and ``DispatchService`` on
SQLite; the table and the peer on the other end are stand-ins (``run_there`` is scripted). A
straight send that did not run comes back and waits for a claim; a miss forgets only its own
hint; a step never goes straight past one of its kind waiting ahead of it; the hints' cap lets
the oldest go; the receiver refuses what it cannot read and reserves nothing."""

from __future__ import annotations

import types

import pytest
import trio
import trio.testing

from swamp.bookkeeping.leases import LeaseBook
from swamp.domain.episodes import Ending, EpisodeEnd
from swamp.domain.peers import PeerRow, SharedStep
from swamp.domain.placement import Placement
from swamp.domain.scheduler import Requirement
from swamp.errors import ClaimGone, DispatchFailed, MalformedFrame
from swamp.models.builtin import ECHO
from swamp.orchestrator.bookkeeper import Bookkeeper
from swamp.orchestrator.credentials import Credentials
from swamp.orchestrator.dispatch import DispatchService, RunRequest
from swamp.orchestrator.episode import Episodes
from swamp.orchestrator.peers import CLAIMED, MAX_HINTS, PASSED, Claim, Peers
from swamp.orchestrator.pool import Pool
from swamp.orchestrator.queue import DispatchQueue, StepInfo
from swamp.plugins import default_registry
from swamp.protocol.messages import DispatchResult
from swamp.repo import ModelInstance
from swamp.store.datastore import Datastore
from swamp.store.records import SqliteRecords

EDGE = Placement(labels={"fleet": "edge"})
R = Requirement.of(EDGE)


class FakeTable:
    pool = None

    def __init__(self) -> None:
        self.published: list[str] = []

    async def publish(self, step, *, wake, holder=None, holder_prefix=""):
        await trio.lowlevel.checkpoint()
        self.published.append(step.queue_id)

    async def get(self, orchestrator):
        return None


def _row(orchestrator: str) -> PeerRow:
    return PeerRow(orchestrator, f"wss://{orchestrator}.invalid", "", None, 0.0)


def _peers() -> tuple[Peers, FakeTable]:
    table = FakeTable()
    peers = Peers(table, "postgresql://unused.invalid/db", reconcile=None)  # type: ignore[arg-type]
    peers.known = {o: _row(o) for o in ("B", "C")}
    return peers, table


@pytest.fixture
async def origin(tmp_path):
    """An orchestrator without workers on a shared database: its queue and dispatch."""
    store = Datastore(tmp_path / "swamp.db", orchestrator=True)
    peers, table = _peers()
    pool = Pool()
    bookkeeper = Bookkeeper(LeaseBook(SqliteRecords(store)))
    queue = DispatchQueue(
        pool, bookkeeper.leases.db, bookkeeper, tokens=lambda name: None, peers=peers
    )
    peers.queue = queue
    service = DispatchService(
        store,
        bookkeeper.leases.db,
        default_registry(),
        pool,
        Episodes(bookkeeper, Credentials()),
        queue,
        environ={},
        peers=peers,
        queue_timeout=0,
    )
    async with trio.open_nursery() as nursery:
        await nursery.start(bookkeeper.run)
        yield service, peers, table
        nursery.cancel_scope.cancel()
    store.close()


def _request(priority: int = 0) -> RunRequest:
    return RunRequest(
        model=ModelInstance(name="default", type=ECHO.type, args={}, source="<test>"),
        method="echo",
        args={"message": "hi"},
        placement=EDGE,
        priority=priority,
    )


SUCCEEDED = DispatchResult(status="succeeded").to_json()


def _claim_now(peers: Peers, queue_id: str, claimer: str = "B") -> None:
    """The claimer's notification, as ``_hear`` hands it on."""
    peers._claimed_now({"step": queue_id, "claimer": claimer, "worker": "w", "dispatch": "d"})


# -- the origin: what a straight send that did not run becomes ----------------------------------


async def test_a_straight_send_refused_before_anything_ran_waits_for_a_claim(origin):
    """The hinted orchestrator refuses the straight send before reserving or running anything
    (one of an earlier version, or a placement it cannot read): nothing ran, and the step
    waits for a claim as the first did — it does not fail."""
    service, peers, table = origin
    sent: list[Claim] = []

    async def run_there(claim, params, emit):
        sent.append(claim)
        if claim.direct:
            refused = "(malformed_frame) peer.dispatch needs queueId as text"
            return EpisodeEnd(Ending.REFUSED, "", refused), None, ""
        return EpisodeEnd(Ending.SUCCEEDED, "w", ""), SUCCEEDED, "d"

    peers.run_there = run_there  # type: ignore[method-assign]
    peers.learn(R, "B")  # B claimed the last step of its kind
    outcome: list[object] = []

    async def run() -> None:
        try:
            outcome.append(await service.run(_request(), _noop))
        except DispatchFailed as exc:
            outcome.append(exc)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(run)
            await trio.testing.wait_all_tasks_blocked()
            if table.published:
                _claim_now(peers, table.published[0])
    assert [c.direct for c in sent][:1] == [True]
    assert not isinstance(outcome[0], DispatchFailed), (
        f"a straight send refused before it ran failed the step: {outcome[0]}"
    )


async def test_a_missed_straight_send_does_not_forget_a_newer_hint(origin):
    """While a step is sent straight to B, C claims a step of the same kind (the hint now
    names C). B answers busy: B's miss does not forget C's hint (the next step goes to C);
    the step that came back waits for a claim."""
    service, peers, table = origin
    sent: list[str] = []

    async def run_there(claim, params, emit):
        sent.append(claim.orchestrator if claim.direct else f"claim:{claim.orchestrator}")
        if claim.direct and claim.orchestrator == "B":
            peers.learn(R, "C")  # C claimed another step of this kind meanwhile
            return EpisodeEnd(Ending.BUSY, "", "no worker of this orchestrator is free"), None, ""
        return EpisodeEnd(Ending.SUCCEEDED, "w", ""), SUCCEEDED, "d"

    peers.run_there = run_there  # type: ignore[method-assign]
    peers.learn(R, "B")
    with trio.move_on_after(2):
        await service.run(_request(), _noop)
    assert sent[:1] == ["B"] and peers.hint(R) == "C", sent


# -- the origin's queue: who goes first ---------------------------------------------------------


async def test_a_straight_step_does_not_jump_a_step_of_its_kind_waiting_ahead(origin):
    """Step X (priority 10) waits here (published); a hint for its kind is learned; step Y
    (priority 0) arrives: it does not go straight past X — the queue's order holds."""
    service, peers, table = origin
    queue = service.queue
    x_grant: list[object] = []

    async def wait_x() -> None:
        x_grant.append(
            await queue.acquire(EDGE, _info(10), deadline=trio.current_time() + 3, emit=_noop)
        )

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_x)
        await trio.testing.wait_all_tasks_blocked()
        assert table.published, "X waits, published"
        peers.learn(R, "B")
        with trio.move_on_after(0.5) as waited:
            y = await queue.acquire(EDGE, _info(0), deadline=trio.current_time() + 0.5, emit=_noop)
        nursery.cancel_scope.cancel()
    assert waited.cancelled_caught or not (y.claim and y.claim.direct), (
        "a later, lower-priority step went straight while one of its kind waits ahead of it"
    )


# -- the hints ----------------------------------------------------------------------------------


async def test_a_hint_learned_again_is_not_the_oldest():
    """Past MAX_HINTS the oldest goes — a hint learned again is the newest, not the oldest."""
    peers, _ = _peers()
    first = Requirement.of(Placement(labels={"n": "0"}))
    peers.learn(first, "B")
    for n in range(1, MAX_HINTS):
        peers.learn(Requirement.of(Placement(labels={"n": str(n)})), "B")
    peers.learn(first, "C")  # claimed again, just now
    peers.learn(Requirement.of(Placement(labels={"n": "new"})), "B")
    assert peers.hint(first) == "C", "the freshest hint was evicted as 'the oldest'"


# -- the receiver: a straight peer.dispatch -----------------------------------------------------


class SlotQueue:
    def __init__(self, free: int) -> None:
        self.free = free
        self.released: list[str] = []
        self.asked: list[Requirement] = []

    def reserve_for_peer(self, requirement):
        self.asked.append(requirement)
        if not self.free:
            return None
        self.free -= 1
        return object(), f"d{self.free}"

    def release(self, member, dispatch_id):
        self.free += 1
        self.released.append(dispatch_id)


@pytest.mark.parametrize(
    "placement",
    [
        None,
        "fleet=edge",
        {},
        {"labels": []},
        {"target": ""},
        {"target": 5},
        {"labels": {"fleet": 1}},
        {"labels": {"fleet": "edge"}, "platform": ["linux"]},
    ],
)
async def test_a_straight_dispatch_without_a_readable_placement_is_malformed(placement):
    peers, _ = _peers()
    queue = SlotQueue(free=1)
    peers.queue = queue  # type: ignore[assignment]

    async def run_claimed(member, dispatch_id, params, emit):
        raise AssertionError("ran")

    peers.run_claimed = run_claimed
    params = {} if placement is None else {"placement": placement}
    with pytest.raises(MalformedFrame):
        await peers.dispatch("A", params, None)
    assert queue.asked == [] and queue.free == 1


async def test_a_straight_dispatch_with_no_free_worker_is_claim_gone_and_reserves_nothing():
    peers, _ = _peers()
    queue = SlotQueue(free=0)
    peers.queue = queue  # type: ignore[assignment]

    async def run_claimed(member, dispatch_id, params, emit):
        raise AssertionError("ran")

    peers.run_claimed = run_claimed
    with pytest.raises(ClaimGone):
        await peers.dispatch("A", {"placement": EDGE.to_json()}, None)
    assert queue.asked == [R]


async def _noop(event) -> None:
    return None


def _info(priority: int) -> StepInfo:
    return StepInfo(ECHO.type, "default", "echo", priority=priority)


class EdgeQueue(SlotQueue):
    """Its one free worker is ``w1``, labelled fleet=edge."""

    def reserve_for_peer(self, requirement):
        slot = super().reserve_for_peer(requirement)
        if slot is None:
            return None
        member = types.SimpleNamespace(
            name="w1",
            instance_id="inst-1",
            labels={"fleet": "edge"},
            platform="linux",
            arch="x86_64",
        )
        return member, slot[1]


@pytest.mark.parametrize(
    ("waiting", "runs"),
    [
        ({}, True),
        ({R: {"C"}}, False),  # another's of its kind waits there: it goes first
        ({Requirement(target="w1"): {"C"}}, False),  # one for that very worker
        ({Requirement.of(Placement(labels={"fleet": "core"})): {"C"}}, True),  # not for it
        ({Requirement(target="w2"): {"C"}}, True),
        ({Requirement(target="inst-1"): {"C"}}, False),  # …by its instance id
        ({R: {"A"}}, True),  # the sender's own of its kind (it sends none straight past one)
        ({R: {"A", "C"}}, False),
        ({Requirement(target="w1"): {"A"}}, False),  # the sender's own, of another kind
        ({R: {"gone"}}, True),  # an orchestrator that is no more (its rows go with it)
    ],
)
async def test_a_straight_step_waits_its_turn_behind_others_steps_its_worker_could_take(
    waiting, runs
):
    """Sent straight while steps of other orchestrators that the free worker here could take
    wait in the shared queue: it is refused (it then waits for a claim, in order), the slot
    goes back and a pass claims theirs — a stream of straight sends never starves them."""
    peers, _ = _peers()
    queue = EdgeQueue(free=1)
    peers.queue = queue  # type: ignore[assignment]
    peers.waiting_kinds = {kind: set(origins) for kind, origins in waiting.items()}
    peers.known["A"] = _row("A")  # (the sender serves the database too)
    ran: list[str] = []

    async def run_claimed(member, dispatch_id, params, emit):
        ran.append(dispatch_id)
        queue.release(member, dispatch_id)
        return {}

    peers.run_claimed = run_claimed
    async with trio.open_nursery() as nursery:
        await nursery.start(peers.outliving.serve)
        if runs:
            await peers.dispatch("A", {"placement": EDGE.to_json(), "sendId": "s1"}, None)
        else:
            with pytest.raises(ClaimGone, match="waits its turn"):
                await peers.dispatch("A", {"placement": EDGE.to_json(), "sendId": "s1"}, None)
            assert peers._wake.is_set()  # a pass claims theirs now
        nursery.cancel_scope.cancel()
    assert (len(ran) == 1) == runs and queue.free == 1


async def test_a_pass_notes_the_kinds_of_others_steps_it_left_waiting():
    """What a pass could not claim (no free worker here for it) is noted; the next pass that
    leaves none waiting forgets it."""
    peers, table = _peers()
    queue = SlotQueue(free=0)
    queue.pool = types.SimpleNamespace(members={"w1": object()})  # type: ignore[attr-defined]
    peers.queue = queue  # type: ignore[assignment]
    waiting = [SharedStep("q1", "C", EDGE.to_json(), 0, "local", 1.0)]

    async def claimable(me, *, after=None, limit):
        await trio.lowlevel.checkpoint()
        return list(waiting)

    table.claimable = claimable  # type: ignore[attr-defined]
    await peers._claim()
    assert peers.waiting_kinds == {R: {"C"}} and peers.others_waiting == 1
    waiting.clear()
    await peers._claim()
    assert peers.waiting_kinds == {} and peers.others_waiting == 0


async def test_a_publication_heard_does_not_take_a_slot_an_older_step_waits_for():
    """Heard just now (the refused step itself, published again, say): it does not take the
    freed slot before another's older step of a kind the worker could take; the pass,
    woken, claims in priority and age order."""
    peers, table = _peers()
    queue = EdgeQueue(free=1)
    peers.queue = queue  # type: ignore[assignment]
    peers.waiting_kinds = {R: {"C"}}
    claims: list[str] = []

    async def claim(queue_id, claimer, worker, dispatch_id, *, wake):
        claims.append(queue_id)
        return True

    table.claim = claim  # type: ignore[attr-defined]
    heard = SharedStep("qA", "A", EDGE.to_json(), 0, "local", 2.0)
    assert await peers._claim_one(queue, heard, in_turn=True) == PASSED  # type: ignore[arg-type]
    assert claims == [] and queue.free == 1 and peers._wake.is_set()
    assert peers.waiting_kinds[R] == {"A", "C"}
    older = SharedStep("qC", "C", EDGE.to_json(), 0, "local", 1.0)
    assert await peers._claim_one(queue, older) == CLAIMED  # type: ignore[arg-type]  # (a pass)
    assert claims == ["qC"]


async def test_a_claim_lost_to_another_notes_nothing():
    peers, table = _peers()
    queue = EdgeQueue(free=1)
    queue.pool = types.SimpleNamespace(members={"w1": object()})  # type: ignore[attr-defined]
    peers.queue = queue  # type: ignore[assignment]

    async def claimable(me, *, after=None, limit):
        await trio.lowlevel.checkpoint()
        return [SharedStep("q1", "C", EDGE.to_json(), 0, "local", 1.0)]

    async def claim(queue_id, claimer, worker, dispatch_id, *, wake):
        return False  # another orchestrator's claim won

    table.claimable, table.claim = claimable, claim  # type: ignore[attr-defined]
    await peers._claim()
    assert peers.waiting_kinds == {} and queue.free == 1
