"""``swamp.orchestrator.peers`` where its database or its peers fail (fakes for the tables and
the queue, no server): a slot reserved for another orchestrator's step is given back however
the step's hold ends, an unreachable claimer is a lost episode (the step is queued again), and
the default — SQLite — neither needs PostgreSQL's driver nor mistakes a server token for a
peer's credential."""

from __future__ import annotations

import socket
from functools import partial

import pytest
import trio

from swamp.domain.episodes import Ending
from swamp.domain.peers import PeerRow
from swamp.errors import ChannelClosed, DatabaseUnavailable, MalformedFrame
from swamp.orchestrator.peers import CLAIM_HOLD, LINK_RETRY, UNKNOWN, Claim, Held, Peers

CONNECT_TIMEOUT = 10  # swamp.protocol.transport.open_websocket's default


class FakeTable:
    """What Peers asks of PgPeers, in memory; ``done`` may be made to fail or hang."""

    pool = None

    def __init__(self) -> None:
        self.rows: dict[str, PeerRow] = {}
        self.claims: dict[str, bool] = {}
        self.done_fails: BaseException | None = None
        self.done_hangs = False

    async def get(self, orchestrator):
        return self.rows.get(orchestrator)

    async def orchestrators(self):
        return list(self.rows.values())

    async def claims_of(self, me):
        return dict(self.claims)

    async def done(self, queue_id, claimer):
        await trio.lowlevel.checkpoint()
        if self.done_hangs:
            await trio.sleep_forever()
        if self.done_fails is not None:
            raise self.done_fails
        self.claims.pop(queue_id, None)


class FakeQueue:
    def __init__(self) -> None:
        self.released: list[tuple[object, str]] = []

    def release(self, member, dispatch_id) -> None:
        self.released.append((member, dispatch_id))


def _peers() -> tuple[Peers, FakeTable, FakeQueue]:
    table = FakeTable()
    peers = Peers(table, "postgresql://unused.invalid/db", reconcile=None)  # type: ignore[arg-type]
    queue = FakeQueue()
    peers.queue = queue  # type: ignore[assignment]

    async def run_claimed(member, dispatch_id, params, emit):
        queue.release(member, dispatch_id)
        return {}

    peers.run_claimed = run_claimed
    return peers, table, queue


MEMBER = object()


async def test_peer_dispatch_releases_the_slot_when_the_claim_row_cannot_be_deleted():
    """The step runs on the reserved slot whatever becomes of its claim's row (deleted off
    the step's path, by the next pass: the database may be away)."""
    peers, table, queue = _peers()
    peers.held["q1"] = Held(MEMBER, "d1", "origin", trio.current_time() + CLAIM_HOLD)  # type: ignore[arg-type]
    table.claims["q1"] = True
    table.done_fails = DatabaseUnavailable("the database is away")
    async with trio.open_nursery() as nursery:
        await nursery.start(peers.outliving.serve)  # (where claimed steps run)
        await peers.dispatch("origin", {"queueId": "q1", "dispatchId": "d1"}, None)
        nursery.cancel_scope.cancel()
    assert "q1" not in peers.held
    with pytest.raises(DatabaseUnavailable):
        await peers._withdraw_pending()  # the row's deletion fails now, and is kept for later
    assert peers._done == ["q1"]
    assert queue.released == [(MEMBER, "d1")], "the slot reserved for the peer leaked"


async def test_peer_dispatch_releases_the_slot_when_cancelled_before_the_step_runs():
    """The origin's caller leaves (the call is cancelled) before the step ran: its slot goes
    back."""
    peers, table, queue = _peers()
    peers.held["q1"] = Held(MEMBER, "d1", "origin", trio.current_time() + CLAIM_HOLD)  # type: ignore[arg-type]
    table.claims["q1"] = True
    table.done_hangs = True
    async with trio.open_nursery() as nursery:
        await nursery.start(peers.outliving.serve)
        with trio.move_on_after(0.2):
            await peers.dispatch("origin", {"queueId": "q1", "dispatchId": "d1"}, None)
        nursery.cancel_scope.cancel()
    assert "q1" not in peers.held
    assert queue.released == [(MEMBER, "d1")], "the slot reserved for the peer leaked"


async def test_an_expired_hold_releases_its_slot_even_if_the_claim_row_cannot_be_deleted():
    """A hold past its time gives its slot back first; its row's deletion may fail (kept for
    the next pass), the slot is back all the same."""
    peers, table, queue = _peers()
    peers.held["q1"] = Held(MEMBER, "d1", "origin", trio.current_time() - 1)  # type: ignore[arg-type]
    table.claims["q1"] = False
    table.done_fails = DatabaseUnavailable("the database is away")
    await peers._expire_holds()
    with pytest.raises(DatabaseUnavailable):
        await peers._withdraw_pending()
    assert "q1" not in peers.held and peers._done == ["q1"]
    assert queue.released == [(MEMBER, "d1")], "the expired hold's slot leaked"


async def test_a_claimer_that_cannot_be_reached_is_a_lost_episode_not_a_crash():
    """A claimer nobody can connect to: nothing was sent, nothing ran — the step goes back to
    the queue (as from a worker without a free slot), not an error out of the dispatch."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    peers, table, _ = _peers()
    table.rows["B"] = PeerRow("B", f"ws://127.0.0.1:{port}", "hash", None, 0.0)

    async def emit(event):
        pass

    async with trio.open_nursery() as nursery:
        peers._nursery = nursery
        with trio.fail_after(10):
            end, result, _ = await peers.run_there(Claim("q1", "B", "w1", "d1"), {}, emit)
        nursery.cancel_scope.cancel()
    assert end.how is Ending.BUSY and result is None


async def test_a_peer_that_never_answers_costs_one_connect_timeout_not_one_per_step(
    autojump_clock,
):
    """A peer alive to the database and deaf to everyone (SIGSTOP): its socket accepts and
    never answers. Twenty steps that want to go there at once share one attempt and its
    failure; a step soon after fails at once; after the retry delay a new attempt is made."""
    accepted: list[trio.SocketStream] = []

    async def hold(stream: trio.SocketStream) -> None:
        accepted.append(stream)
        await trio.sleep_forever()

    peers, table, _ = _peers()
    async with trio.open_nursery() as nursery:
        [listener] = await nursery.start(partial(trio.serve_tcp, hold, 0, host="127.0.0.1"))
        port = listener.socket.getsockname()[1]
        table.rows["B"] = PeerRow("B", f"ws://127.0.0.1:{port}", "hash", None, 0.0)
        peers._nursery = nursery
        failures: list[str] = []

        async def send() -> None:
            try:
                await peers._link("B")
            except ChannelClosed as exc:
                failures.append(exc.message)

        began = trio.current_time()
        async with trio.open_nursery() as steps:
            for _ in range(20):
                steps.start_soon(send)
        took = trio.current_time() - began
        assert len(failures) == 20 and len(set(failures)) == 1, failures
        assert len(accepted) == 1 and took < 2 * CONNECT_TIMEOUT, (len(accepted), took)
        with pytest.raises(ChannelClosed):  # at once, no new connection
            await peers._link("B")
        assert len(accepted) == 1 and trio.current_time() - began == took
        await trio.sleep(LINK_RETRY)
        with pytest.raises(ChannelClosed):
            await peers._link("B")
        assert len(accepted) == 2  # tried again
        nursery.cancel_scope.cancel()


# -- SQLite mode (the default) ---------------------------------------------------------------


def test_serve_on_sqlite_does_not_need_the_postgres_driver():
    """psycopg is an optional extra (``swamp[postgres]``): serving on SQLite imports none of
    it."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['psycopg'] = None\n"
        "import swamp.orchestrator.server, swamp.orchestrator.admin_auth\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr.strip().splitlines()[-1]


async def test_a_server_token_named_peer_still_works_on_sqlite(tmp_path):
    """A server token's credential is ``NAME.SECRET``: one named ``peer`` is not taken for an
    orchestrator's peer credential (``peer:…``, a colon no name holds)."""
    from swamp.bookkeeping.server_tokens import ServerTokenBook
    from swamp.orchestrator.admin_auth import AdminAuth, Principal
    from swamp.store.datastore import Datastore
    from swamp.store.records import SqliteRecords

    db = SqliteRecords(Datastore(tmp_path / "swamp.db"))
    try:
        book = ServerTokenBook(db)
        _, credential = await book.create("peer")
        auth = AdminAuth(mode="token", server_tokens=book, local_credential=None)
        identity = await auth.identify(f"Bearer {credential}")
        assert isinstance(identity, Principal), identity
    finally:
        await db.aclose()


class CountingWaker:
    def __init__(self) -> None:
        self.marked = 0

    def wake(self) -> None:
        self.marked += 1


class TokenNews:
    """What LiveTokens asks of the peers: a waker on the tokens' channel (counted)."""

    me = "me"

    def __init__(self) -> None:
        self.waker = CountingWaker()

    def waker_on(self, channel: str) -> CountingWaker:
        return self.waker


async def test_only_a_token_written_here_tells_the_others(tmp_path):
    """A token minted, revoked or expired here tells the other orchestrators to read the
    tokens again; reading one again because another changed it — or after an enrollment, which
    changes no token's liveness — tells nobody: two orchestrators told each other of every
    re-read for ever, a core's third each (found by the fleet benchmark over two)."""
    from swamp.bookkeeping.tokens import TokenBook
    from swamp.orchestrator.live_tokens import LiveTokens
    from swamp.orchestrator.pool import Pool
    from swamp.store.datastore import Datastore
    from swamp.store.records import SqliteRecords

    store = Datastore(tmp_path / "swamp.db")
    book = TokenBook(SqliteRecords(store))
    news = TokenNews()
    live = LiveTokens(store, Pool(), book, peers=news)  # type: ignore[arg-type]
    await book.mint("t", duration_seconds=600)
    await live.reread("t")  # written here
    assert news.waker.marked == 1
    await live.token_changed("t")  # another's change, read again
    await live.reread("t", tell=False)  # an enrollment's read
    assert news.waker.marked == 1
    store.close()


# -- after a broken link: waiting for the claimer's outcome ----------------------------------


class OutcomeTable(FakeTable):
    def __init__(self) -> None:
        super().__init__()
        self.outcomes: dict[str, dict] = {}
        self.dropped: list[str] = []

    async def take_outcome(self, send_id, origin):
        await trio.lowlevel.checkpoint()
        return self.outcomes.pop(send_id, None)

    async def drop_outcome(self, send_id, origin):
        self.dropped.append(send_id)


def _waiting_peers(features=frozenset({"outliving"})):
    table = OutcomeTable()
    peers = Peers(table, "postgresql://unused.invalid/db", reconcile=None)  # type: ignore[arg-type]
    table.rows["B"] = PeerRow("B", "ws://b.invalid", "hash", None, 0.0, features)
    asked: list[str] = []
    answers: list[str] = []  # scripted: what each ask hears ("" — it could not be asked)

    async def asked_outcome(orchestrator, send_id):
        asked.append(send_id)
        return answers.pop(0) if answers else "running"

    peers._asked_outcome = asked_outcome  # type: ignore[method-assign]
    return peers, table, asked, answers


async def test_a_claimer_of_an_earlier_version_is_not_waited_for(autojump_clock):
    """It stopped the step when the link broke (that version's way): the lease rules go."""
    peers, table, asked, _ = _waiting_peers(features=frozenset())
    assert await peers._after_break("B", "s1") is None and asked == []


async def test_no_answer_and_a_refusal_decide_nothing_the_kept_outcome_does(autojump_clock):
    """Unreachable, or refused (its credential check failed on a blip): we wait — only the
    outcome, the claimer's death or its own "unknown" decide."""
    peers, table, asked, answers = _waiting_peers()
    answers += ["", "", "running"]

    async def kept_later() -> None:
        await trio.sleep(5)
        table.outcomes["s1"] = {"reply": {"how": "succeeded"}}
        peers._outcomes["s1"].set()  # (its notification)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(kept_later)
        assert await peers._after_break("B", "s1") == {"reply": {"how": "succeeded"}}
    assert len(asked) == 3


async def test_a_claimer_missing_from_a_stale_registry_copy_is_asked_not_taken_for_dead(
    autojump_clock,
):
    """Our copy of the registry is a pass old; the claimer registered since: asked."""
    peers, table, asked, answers = _waiting_peers()
    peers.known = {}  # (it is in the table)
    answers.append("unknown")  # and nothing kept: a doubt
    assert await peers._after_break("B", "s1") is UNKNOWN and asked == ["s1"]


async def test_a_claimer_that_died_leaves_what_it_kept_read_once(autojump_clock):
    peers, table, asked, _ = _waiting_peers()
    table.outcomes["s1"] = {"reply": {"how": "failed"}}
    del table.rows["B"]  # buried: what it kept before is read all the same
    assert await peers._after_break("B", "s1") == {"reply": {"how": "failed"}}
    assert await peers._after_break("B", "s2") is None and asked == []


async def test_a_caller_leaving_while_it_waits_cancels_the_step_there(autojump_clock):
    peers, table, asked, _ = _waiting_peers()
    cancelled: list[str] = []

    async def cancel_there(orchestrator, send_id):
        cancelled.append(send_id)

    peers._cancel_there = cancel_there  # type: ignore[method-assign]
    with trio.move_on_after(10):
        await peers._after_break("B", "s1")
    assert cancelled == ["s1"] and "s1" not in peers._outcomes


async def test_a_doubt_after_a_broken_link_fails_the_step_never_runs_it_twice():
    """The claimer says the step does not run there and nothing was kept: its answer went
    with the link, and so may its effects — the step is not run again (it fails, saying
    why); the claimer dead instead, the lease rules go as they always did."""
    peers, table, _, _ = _waiting_peers()

    class Broken:
        async def call(self, *args, **kwargs):
            raise ChannelClosed("the link went")

    async def link(orchestrator):
        return Broken()

    peers._link = link  # type: ignore[method-assign]
    for said, has_writes in ((UNKNOWN, True), (None, False)):

        async def after_break(orchestrator, send_id, said=said):
            return said

        peers._after_break = after_break  # type: ignore[method-assign]
        end, result, _ = await peers.run_there(Claim("q1", "B", "w1", "d1"), {}, _ignore)
        assert (end.how, end.has_writes, result) == (Ending.LOST, has_writes, None), end


async def _ignore(event) -> None:
    pass


@pytest.mark.parametrize("params", [{}, {"sendId": ""}, {"sendId": 5}, {"sendId": None}])
def test_an_outcome_or_cancel_asked_without_a_sending_id_is_malformed(params):
    peers, _, _ = _peers()
    with pytest.raises(MalformedFrame):
        peers.outcome_asked("A", params)
    with pytest.raises(MalformedFrame):
        peers.cancel_asked("A", params)
    assert peers.outcome_asked("A", {"sendId": "s1"}) == {"state": "unknown"}
    assert peers.cancel_asked("A", {"sendId": "s1"}) == {"cancelled": False}


@pytest.mark.parametrize(
    "params", [{}, {"stepId": ""}, {"stepId": 5}, {"stepId": None}, {"stepId": "x" * 65}]
)
async def test_a_step_asked_after_without_a_good_step_id_is_malformed(params):
    """``peer.step.wait`` (a taker asking whether a step ran here): a bad id is refused,
    never waited on; a good one nobody ran here is "unknown" at once."""
    peers, _, _ = _peers()
    with pytest.raises(MalformedFrame):
        await peers.step_wait_asked("A", params)
    with trio.fail_after(5):
        assert await peers.step_wait_asked("A", {"stepId": "s1"}) == {"state": "unknown"}
