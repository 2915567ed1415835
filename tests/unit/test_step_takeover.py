"""A step that outlives its orchestrator: its record on a real PostgreSQL
(``swamp.store.pg_steps``) — requests and outcomes in either order, the first outcome stands,
one taker wins a dead orchestrator's steps, a follower is woken by the end of a step another
orchestrator writes —, the request as recorded and read back (bad rows refused), and the rule
that decides what becomes of a taken-over step (``swamp.domain.takeover``)."""

from __future__ import annotations

import json

import pytest
import trio

from swamp.domain.episodes import Ending, EpisodeEnd, Move
from swamp.domain.placement import Placement
from swamp.domain.read_scope import ReadScope
from swamp.domain.takeover import answer_for, decide, lease_end, still_running
from swamp.errors import DatabaseUnavailable, MalformedFrame, NotFound
from swamp.orchestrator.dispatch import RunRequest, decode_request, encode_request
from swamp.orchestrator.step_records import StepRecords
from swamp.repo import ModelInstance
from swamp.store import pg
from swamp.store.pg_steps import PgSteps
from tests.unit.test_store_contract import records  # noqa: F401 - the fixture (both stores)

RULE = {"model": "m", "method": "command/shell.run", "retry": "unwritten"}
J = json.dumps


def lease(state: str, *, has_writes: bool = False, error: str | None = None) -> dict:
    return {"workerName": "w1", "state": state, "hasWrites": has_writes, "error": error}


# -- the rule ----------------------------------------------------------------------------------


def test_an_answer_from_the_orchestrator_that_ran_it_decides_as_any_episode():
    ran = EpisodeEnd(Ending.SUCCEEDED, "w1")
    assert decide(ran, lease("active"), **RULE).move is Move.FINISH  # (the answer wins)
    lost = EpisodeEnd(Ending.LOST, "w1", "gone", has_writes=True)
    assert decide(lost, None, **RULE).code == "write_then_drop"
    busy = EpisodeEnd(Ending.BUSY, "w1")
    assert decide(busy, None, **RULE).move is Move.REQUEUE


def test_no_answer_and_no_lease_runs_again_only_if_its_record_says_it_waited():
    then = decide(None, None, **RULE, waiting=True)
    assert then.move is Move.REQUEUE and "waited" in then.reason
    # else it may have been sent the moment its orchestrator died (no lease row yet)
    then = decide(None, None, **RULE)
    assert (then.move, then.code) == (Move.FAIL, "outcome_lost")


@pytest.mark.parametrize(
    ("left", "move", "code"),
    [
        (lease("active"), Move.FENCE_THEN_REQUEUE, ""),  # written before the reconciliation
        (lease("expired", error="its orchestrator died"), Move.FENCE_THEN_REQUEUE, ""),
        (lease("expired", has_writes=True), Move.FAIL, "write_then_drop"),
        (
            lease("failed", has_writes=True, error="worker disconnected (write-then-drop)"),
            Move.FAIL,
            "write_then_drop",
        ),
        (lease("completed"), Move.FAIL, "outcome_lost"),  # ran: never again
        (lease("failed", error="timed out"), Move.FAIL, "outcome_lost"),
        (lease("cancelled"), Move.FAIL, "cancelled"),
    ],
)
def test_the_latest_lease_decides_by_the_lease_rules(left, move, code):
    then = decide(None, left, **RULE)
    assert (then.move, then.code) == (move, code)


def test_retry_never_fails_a_step_whose_worker_was_lost():
    then = decide(None, lease("expired"), **{**RULE, "retry": "never"})
    assert (then.move, then.code) == (Move.FAIL, "worker_lost")


def test_a_lease_end_names_its_worker_and_reason():
    end = lease_end(lease("expired", error="its orchestrator (abc) died"))
    assert isinstance(end, EpisodeEnd)
    assert (end.how, end.worker, end.reason) == (Ending.LOST, "w1", "its orchestrator (abc) died")


def test_an_answer_speaks_only_for_the_episode_of_the_latest_lease():
    """An earlier episode's answer (busy on a claimer) says nothing of the latest one (which
    ran on the dead orchestrator's worker and completed): the latest lease decides — the step
    ran and is not run again."""
    earlier = {"reply": {"dispatchId": "0001", "how": "busy", "worker": "w", "reason": ""}}
    latest = {**lease("completed"), "leaseId": "0002"}
    assert answer_for(latest, [("0001", earlier)]) is None
    assert decide(None, latest, **RULE).code == "outcome_lost"
    own = {"reply": {"dispatchId": "0002", "how": "succeeded", "worker": "w", "reason": ""}}
    assert answer_for(latest, [("0001", earlier), ("0002", own)]) is own
    # no lease (not written yet): the newest answer; a refusal only if nothing else
    refused = {"error": {"code": "claim_gone", "message": "no slot"}}
    assert answer_for(None, [(None, refused), ("0001", earlier), ("0002", own)]) is own
    assert answer_for(None, [(None, refused)]) is refused
    assert answer_for(None, []) is None


def test_a_lease_still_active_at_a_living_orchestrator_means_it_runs_there():
    active = {**lease("active"), "orchestrator": "c"}
    assert still_running(active, {"c", "t"})
    assert not still_running(active, {"t"})  # its orchestrator is gone: lost
    assert not still_running({**active, "state": "expired"}, {"c"})
    assert not still_running(None, {"c"})


# -- the request as recorded ---------------------------------------------------------------------


def request() -> RunRequest:
    model = ModelInstance(
        "builder", "command/shell", {"command": "make"}, "models/builder.toml",
        env=("TOKEN",), retry="never", timeout="30m",
    )  # fmt: skip
    return RunRequest(
        model, "run", {"command": "make all"}, Placement(labels={"fleet": "edge"}),
        env_names=("EXTRA",),
        read_scope=ReadScope.of("command/shell", "builder", also=[("a", "b")]),
        queue_timeout="5m", timeout="1h", started_at="2026-12-02T00:00:00.000Z", priority=7,
        submitter="token:ci",
    )  # fmt: skip


def test_a_request_is_recorded_with_its_environment_by_name_and_read_back_whole():
    recorded = encode_request(request(), {"command": "make all"})
    assert recorded["env"] == ["EXTRA"] and recorded["model"]["env"] == ["TOKEN"]
    assert "environment" not in recorded  # names only: never a value
    back = decode_request(recorded, "s1")
    original = request()
    assert back.step_id == "s1"
    # the arguments as checked (the model's merged in): a model file's are not all JSON
    assert (back.model.name, back.model.type, back.model.args) == ("builder", "command/shell", {})
    assert (back.model.env, back.model.retry, back.model.timeout) == (("TOKEN",), "never", "30m")
    assert (back.method, back.args, back.placement) == (
        "run",
        {"command": "make all"},
        original.placement,
    )
    assert back.env_names == ("EXTRA",) and back.scope() == original.scope()
    assert (back.queue_timeout, back.timeout, back.priority, back.submitter) == (
        "5m", "1h", 7, "token:ci",
    )  # fmt: skip


@pytest.mark.parametrize(
    "damage",
    [
        {"model": "builder"},
        {"method": 3},
        {"args": []},
        {"placement": {}},  # here: not a placement on a worker
        {"placement": {"labels": {"a": 1}}},
        {"priority": True},
        {"reads": [["a"]]},
        {"env": "TOKEN"},
        {"timeout": 30},
    ],
)
def test_a_recorded_request_this_version_cannot_read_is_refused(damage):
    with pytest.raises(MalformedFrame):
        decode_request({**encode_request(request(), {}), **damage}, "s1")


def test_an_unknown_retry_policy_is_read_as_the_safer_one():
    recorded = encode_request(request(), {"command": "make all"})
    recorded["model"]["retry"] = "sometimes"
    assert decode_request(recorded, "s1").model.retry == "never"


# -- the table, on a real PostgreSQL -----------------------------------------------------------


@pytest.fixture
async def table(pg_url):
    async with pg.Pool(pg_url, size=6) as pool:
        yield await PgSteps.open(pool)


async def test_the_first_outcome_stands_whatever_order_the_writes_come_in(table):
    await table.write("a", [], [("s1", J({"reply": {"n": 1}}), 2.0)])  # (request: a batch later)
    await table.write(
        "a", [("s1", J({"method": "run"}), 1.0)], [("s1", J({"reply": {"n": 2}}), 3.0)]
    )
    row = await table.get("s1")
    assert row is not None
    assert (row.owner, row.request, row.outcome) == ("a", {"method": "run"}, {"reply": {"n": 1}})
    await table.write("a", [("s1", J({"method": "other"}), 4.0)], [])
    assert (await table.get("s1")).request == {"method": "run"}  # never replaced
    assert await table.get("nothing") is None


async def test_one_taker_wins_a_dead_orchestrators_open_steps(table):
    await table.write("dead", [(f"s{i}", "{}", float(i)) for i in range(3)], [])
    await table.write("dead", [], [("s1", J({"reply": {}}), 9.0)])  # ended: not taken
    await table.write("alive", [("mine", "{}", 1.0)], [])
    taken: dict[str, list[str]] = {}

    async def take(me: str) -> None:
        taken[me] = [row.id for row in await table.take_over("dead", me)]

    async with trio.open_nursery() as nursery:
        for me in ("b", "c", "d"):
            nursery.start_soon(take, me)
    winners = [ids for ids in taken.values() if ids]
    assert winners == [["s0", "s2"]]  # oldest first, one taker
    # (whose are taken is the reconciler's call, under the dead one's liveness lock)
    assert [row.id for row in await table.take_over("alive", "e")] == ["mine"]
    assert (await table.get("mine")).owner == "e"


async def test_a_wait_is_marked_and_cleared_in_order_and_never_after_the_end(table):
    await table.write("a", [("s1", "{}", 1.0), ("s2", "{}", 1.0)], [], [("s1", True)])
    assert (await table.get("s1")).waiting and not (await table.get("s2")).waiting
    await table.write("a", [], [], [("s1", False), ("s2", True), ("s2", False)])
    assert not (await table.get("s1")).waiting and not (await table.get("s2")).waiting
    await table.write("a", [], [("s1", J({"reply": {}}), 2.0)], [])
    await table.write("a", [], [], [("s1", True)])  # ended: left as it was
    assert not (await table.get("s1")).waiting
    [taken] = [row for row in await table.take_over("a", "b") if row.id == "s2"]
    assert taken.waiting is False


async def test_ended_steps_are_collected_after_their_life(table):
    await table.write(
        "a", [("old", "{}", 1.0), ("open", "{}", 1.0)], [("old", J({"reply": {}}), 2.0)]
    )
    assert await table.collect(3.0) == 1
    assert await table.get("old") is None and await table.get("open") is not None


async def test_a_follower_is_woken_when_another_orchestrator_writes_the_outcome(table, pg_url):
    here = StepRecords(table, "here", url=pg_url)
    there = StepRecords(table, "there", url=pg_url)
    async with trio.open_nursery() as nursery:
        await nursery.start(here.run)
        await nursery.start(there.run)
        await table.write("there", [("s1", J({"method": "run"}), 1.0)], [])
        followed: list[dict] = []
        answered = trio.Event()

        async def follow() -> None:
            followed.append((await here.follow("s1")).outcome or {})
            answered.set()

        with trio.fail_after(30):
            nursery.start_soon(follow)
            # (marked: state only the table shows — then its end must wake the follower)
            while not await _followed(table, "s1"):  # noqa: ASYNC110
                await trio.sleep(0.01)
            await there.ended("s1", {"reply": {"status": "succeeded"}})
            await answered.wait()  # (woken by the NOTIFY its end sent)
        assert followed == [{"reply": {"status": "succeeded"}}]
        with pytest.raises(NotFound, match="no step"):
            await here.follow("never-recorded")
        with trio.fail_after(10):  # ended already: answered at once
            assert (await here.follow("s1")).outcome == {"reply": {"status": "succeeded"}}
        nursery.cancel_scope.cancel()


async def _followed(table: PgSteps, step_id: str) -> bool:
    async with table.pool.connection() as conn:
        result = await conn.execute("SELECT followed FROM swamp_step WHERE id = $1", (step_id,))
    return bool(result.rows and result.rows[0][0])


# -- the leases of a step, on both stores --------------------------------------------------------


async def test_the_latest_lease_of_each_step_is_found_a_page_at_a_time(
    records,  # noqa: F811 - the fixture
    monkeypatch,
):
    """A lease's id starts with its opening time: the leases since a step opened are a range
    of the table, read a page at a time (two rows per page here)."""
    from swamp.bookkeeping import leases
    from swamp.bookkeeping.leases import LeaseBook
    from swamp.domain.leases import LeaseState

    monkeypatch.setattr(leases, "PAGE", 2)
    book = LeaseBook(records)
    second = 1_000_000_000  # nanoseconds

    def lease_id(at: int, n: int) -> str:
        return f"{at * second:016x}{n:016x}"

    for at, n, step in ((5, 1, "old"), (10, 1, "s1"), (11, 2, "s2"), (12, 3, "s1"), (13, 4, None)):
        attrs = book.opened(
            lease_id=lease_id(at, n), worker="w1", model_type="swamp/echo",
            model_name="default", method="echo", step_id=step,
        )  # fmt: skip
        if at == 10:
            attrs = book.ended(attrs, LeaseState.EXPIRED, error="lost")
        await book.insert(attrs)
    found = await book.latest_of_steps({"s1", "s2", "old", "none"}, since_epoch=9.5)
    assert sorted(found) == ["s1", "s2"]  # ("old" opened before: not looked at)
    assert found["s1"]["leaseId"] == lease_id(12, 3) and found["s1"]["state"] == "active"
    assert found["s2"]["stepId"] == "s2"


# -- written behind: a database that is away never holds up a reply ---------------------------


class AwayTable:
    """A step table whose database is away until ``back`` is set (then it records)."""

    def __init__(self) -> None:
        self.back = False
        self.written: list[tuple[list, list]] = []
        self.refused = trio.Event()

    async def write(self, owner, opened, ended, waits=()) -> None:
        if not self.back:
            self.refused.set()
            raise DatabaseUnavailable("the database is away")
        self.written.append(([s for s, _, _ in opened], [s for s, _, _ in ended]))


async def test_an_outcome_is_answered_while_the_database_is_away_and_written_later(
    autojump_clock,
):
    table = AwayTable()
    steps = StepRecords(table, "me")  # type: ignore[arg-type]
    async with trio.open_nursery() as nursery:
        await nursery.start(steps.run)
        steps.opened("s1", {"method": "run"})
        with trio.fail_after(5):
            await steps.ended("s1", {"reply": {}})  # answered: one attempt failed
        assert table.refused.is_set() and table.written == []
        table.back = True
        while not table.written:  # noqa: ASYNC110 - (the retry's pause, on the fake clock)
            await trio.sleep(1)
        assert table.written == [(["s1"], ["s1"])]  # both, in order, once it came back
        nursery.cancel_scope.cancel()


def test_a_request_that_is_not_json_is_not_recorded():
    import datetime

    steps = StepRecords(AwayTable(), "me")  # type: ignore[arg-type]
    assert not steps.opened("s1", {"args": {"when": datetime.date(2024, 1, 1)}})
    assert not steps.runs("s1")
    assert steps.opened("s2", {"args": {"when": "2024-01-01"}}) and steps.runs("s2")


async def test_what_waits_for_the_database_is_bounded(autojump_clock, monkeypatch):
    from swamp.orchestrator import step_records

    monkeypatch.setattr(step_records, "MAX_WAITING", 3)
    steps = StepRecords(AwayTable(), "me")  # type: ignore[arg-type]
    for n in range(10):
        steps.opened(f"s{n}", {})
    assert steps.dropped == 7
